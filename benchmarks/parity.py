"""Trainer vs generator logprobs on the GPU in bf16 (the library check, zeromismatch.parity.check_parity), as
numbers for results/gpu/ (tests/gpu asserts the same equalities):

- $OUT/parity_presets.json: tiny, tiny_moe, qwen3_5_mid x stock, bi, bi_chunk; 16 prompts of 3-150 tokens,
  20-69 new tokens, 8 slots, 256 batched tokens; max / mean abs diff, sequences equal, generation seconds
- $OUT/parity_sweep.json: the randomized sweep's draws (tests/gpu/test_gpu_sweep.py) in bi and bi_chunk: per
  draw the config, max_abs_diff and sequences equal
"""

import time
import traceback

import torch
from common import DEV, log, parse_args, write_json

from zeromismatch.generator import SamplingParams
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.parity import check_parity, random_prompts, sweep



def extra_args(ap):
    ap.add_argument("--presets", default="tiny,tiny_moe,qwen3_5_mid")
    ap.add_argument("--draws", type=int, default=6)
    ap.add_argument("--skip", default="", help="presets | sweep")


def preset_row(preset, mode):
    model = build_model(preset, mode, seed=1).to(device=DEV, dtype=torch.bfloat16)
    prompts = random_prompts(16, model.config.vocab_size, seed=0, min_len=3, max_len=150)
    params = [SamplingParams(max_new_tokens=20 + 7 * i % 50, seed=i) for i in range(16)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    res = check_parity(model, prompts, params, max_slots=8, max_batched_tokens=256)
    torch.cuda.synchronize()
    return dict(res.stats, seconds=time.perf_counter() - t)


def run(args, name, keys, fn):
    out = {}
    for key in keys:
        try:
            out[key] = fn(key)
        except Exception:
            out[key] = {"error": traceback.format_exc()[-3000:]}
        log(name, key, {a: b for a, b in out[key].items() if a in ("max_abs_diff", "sequences_equal", "error")})
        write_json(args, name, out)
        torch.cuda.empty_cache()
    return out


def sweep_row(key):
    draw, mode = key.rsplit(":", 1)
    cfg, work = sweep.draw(int(draw))
    res = sweep.check_draw(cfg, work, mode, device=DEV, dtype=torch.bfloat16)
    return dict(res.stats, config=repr(cfg), prompt_lengths=[len(p) for p in work["prompts"]], bitwise=res.bitwise)


def main():
    args = parse_args(__doc__, extra_args)
    modes = ("stock", "bi", "bi_chunk")
    if "presets" not in args.skip:
        run(args, "parity_presets", [f"{p}:{m}" for p in args.presets.split(",") for m in modes],
            lambda key: preset_row(*key.split(":")))
    if "sweep" not in args.skip:
        out = run(args, "parity_sweep", [f"{d}:{m}" for d in range(args.draws) for m in ("bi", "bi_chunk")], sweep_row)
        out["all_bitwise"] = all(r.get("bitwise") is True for r in out.values())
        write_json(args, "parity_sweep", out)


if __name__ == "__main__":
    main()
