"""The weight-sync path without Ray: a trainer process and a generator process (on one GPU, or the CPU),
two trained versions broadcast through WeightSync, then the generator samples with them and the trainer
rescores; the check is bitwise.

    python -m zeromismatch.orchestration.weight_sync_check --device cuda --transport cuda_ipc --numerics bi --dtype bfloat16
    python -m zeromismatch.orchestration.weight_sync_check --device cpu --transport gloo     # what CI runs

Trainer (rank 0): the tiny preset from a seed, two AdamW steps on random tokens, each followed by
WeightSync.send(version, weights). Generator (rank 1): the same initial model in an Engine; each recv is
swapped in with Engine.update_weights; after the last, it samples prompts and saves tokens and raw
logprobs. The parent then checks: versions 1 and 2 arrived in order, the generator's weights equal the
trainer's bit for bit, and the trainer's logprobs of the sampled tokens equal the generator's (diff 0 in
bi and bi_chunk). Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.multiprocessing as mp

from ..generator import Engine, SamplingParams
from ..models.qwen3_5 import build_model
from ..numerics.modes import MODES
from ..parity.check import random_prompts
from ..trainer.scoring import next_token_logprobs
from .ray_actors import free_port
from .weight_sync import TRANSPORTS, WeightSync, layout_of

STEPS, N_PROMPTS, NEW_TOKENS = 2, 4, 16


def _model(args, device):
    return build_model("tiny", args["numerics"], seed=0, device=torch.device(device), dtype=getattr(torch, args["dtype"]))


def _trainer(args, sync: WeightSync, out: str) -> None:
    model = _model(args, args["device"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for version in range(1, STEPS + 1):
        ids = torch.randint(0, model.config.vocab_size, (48,), generator=g).tolist()
        lp = next_token_logprobs(model, [ids])[0]
        opt.zero_grad()
        (-lp.sum()).backward()
        opt.step()
        sync.send(version, {k: v.detach() for k, v in model.state_dict().items()})
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, os.path.join(out, "trainer.pt"))
    sync.store.wait(["generated"])  # the generator's samples are on disk: rescore them here
    gen = torch.load(os.path.join(out, "generator.pt"))
    with torch.no_grad():
        lps = next_token_logprobs(model, gen["tokens"])
    torch.save([lp.cpu() for lp in lps], os.path.join(out, "rescored.pt"))


def _generator(args, sync: WeightSync, out: str) -> None:
    model = _model(args, args["device"]).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    engine = Engine(model, max_slots=4, max_batched_tokens=128)
    layout, versions = layout_of(model.state_dict()), []
    for _ in range(STEPS):
        version, weights = sync.recv(layout)
        engine.update_weights(weights, version=version)
        versions.append(engine.version)
    prompts = random_prompts(N_PROMPTS, model.config.vocab_size, seed=2, max_len=40)
    params = [SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=i) for i in range(N_PROMPTS)]
    outs = engine.generate(prompts, params)
    torch.save({"versions": versions, "weights": {k: v.cpu() for k, v in model.state_dict().items()},
                "tokens": [o.all_tokens for o in outs], "logprobs": [o.logprob_tensor.cpu() for o in outs],
                "n_prompt": [len(p) for p in prompts]}, os.path.join(out, "generator.pt"))
    sync.store.set("generated", "1")


def _role(rank: int, args: dict, port: int, out: str) -> None:
    sync = WeightSync("127.0.0.1", port, rank, 2, args["transport"], device=args["device"])
    (_trainer if rank == 0 else _generator)(args, sync, out)


def check(device: str = "cpu", transport: str = "gloo", numerics: str = "bi", dtype: str = "float32") -> dict:
    """Run both processes; returns {"versions", "weights_equal", "logprobs_equal", "max_abs_diff"}."""
    args = {"device": device, "transport": transport, "numerics": numerics, "dtype": dtype}
    with tempfile.TemporaryDirectory(prefix="zm_wsync_") as out:
        mp.spawn(_role, args=(args, free_port(), out), nprocs=2, join=True)
        trained = torch.load(os.path.join(out, "trainer.pt"))
        gen = torch.load(os.path.join(out, "generator.pt"))
        rescored = torch.load(os.path.join(out, "rescored.pt"))
    weights_equal = set(trained) == set(gen["weights"]) and all(torch.equal(trained[k], gen["weights"][k]) for k in trained)
    diffs, equal = [], True
    for lp, glp, n in zip(rescored, gen["logprobs"], gen["n_prompt"]):
        t = lp[n - 1:]  # logprobs of the sampled tokens (next_token_logprobs: one per token after the first)
        equal &= torch.equal(t, glp)
        diffs.append(float((t - glp).abs().max()) if t.shape == glp.shape else float("inf"))
    return {"versions": gen["versions"], "weights_equal": weights_equal, "logprobs_equal": bool(equal),
            "max_abs_diff": max(diffs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--transport", default="gloo", choices=TRANSPORTS)
    ap.add_argument("--numerics", default="bi", choices=sorted(MODES))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    a = ap.parse_args(argv)
    res = check(a.device, a.transport, a.numerics, a.dtype)
    print(res)
    ok = res["versions"] == list(range(1, STEPS + 1)) and res["weights_equal"] and (
        a.numerics == "stock" or res["logprobs_equal"])
    print("weight sync check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
