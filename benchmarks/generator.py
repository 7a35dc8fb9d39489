"""Generator decode on the GPU -> $OUT/h200_generator.json and $OUT/h200_generator.png.

For each model (qwen3_5_mid; a 9B-shaped model: Qwen3.5-9B's width with --layers_9b of its layers, random bf16
weights), each numerics mode and each concurrency c (1, 16, 64, 256 sequences of --prompt random tokens): the
engine prefills the c prompts, runs --warmup decode steps, then times --steps decode steps; inter-token
latency = wall time per step, decode tokens/s = c / latency. Three engine variants in the same process: "after"
(the CUDA defaults: decode by CUDA-graph replay, batched Gumbel-max sampling on the GPU), "before" (eager
forward, every row sampled on the CPU from its generator, as the engine sampled before the device path; fewer
steps: --before_steps) and "eager_device" (eager forward, GPU sampling: what the graphs alone bring). For
"after" the graph replay alone is timed too (the forward's GPU time; the rest of a step is host work and
sampling). "fp32_head": as "after" with numerics lm_head=fp32 (the fp32 GEMM of a kept fp32 copy of the weight,
ops/linear/head.py). "unstaged": as "after" with stage_ahead=False (each decode step scheduled only after the last
one's samples are read back: the GPU idles while the host works).

Memory floor per step = (weights read: every parameter but the embedding table, lm_head at bf16; KV read: c x
the mean context x the attention layers' K and V; GDN state read and written once: c x layers x fp32 ssm) /
the measured device copy bandwidth. `floor_fp32_head_ms` counts the lm_head as the fp32 copy the forward reads.

    PYTHONPATH=src python benchmarks/generator.py --out DIR --commit SHA
"""

from __future__ import annotations

import gc
import math
import os
import time

import torch
from common import DEV, bench, kernel_profile, log, op_profile, parse_args, write_json

CONCURRENCY = (1, 16, 64, 256)
MODES = ("stock", "bi", "bi_chunk")


def extra_args(ap):
    ap.add_argument("--models", default="qwen3_5_mid,qwen3_5_9b_shaped")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--layers_9b", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--before_steps", type=int, default=4)
    ap.add_argument("--variants", default="after,before,eager_device")
    ap.add_argument("--eager_device_concurrency", default="1,64", help="eager forward + GPU sampling: at these c")
    ap.add_argument("--deadline_s", type=float, default=420.0, help="stop starting new measurements after this")
    ap.add_argument("--profile", action="store_true",
                    help="the top kernels of a decode graph replay and the ops of an eager decode step per (model, mode, "
                         "c) -> h200_generator_profile.txt")


def build(name: str, layers_9b: int, seed: int = 0):
    """A bf16 model with random weights drawn on the GPU (normal std 0.02; norms, dt_bias, A_log as
    init_weights)."""
    from zeromismatch.models.qwen3_5 import Qwen35ForCausalLM, get_preset

    cfg = get_preset("qwen3_5_mid") if name == "qwen3_5_mid" else get_preset("qwen3_5_9b", num_hidden_layers=layers_9b)
    torch.manual_seed(seed)
    with torch.device(DEV):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = Qwen35ForCausalLM(cfg, "stock")
        finally:
            torch.set_default_dtype(prev)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            leaf = pname.rsplit(".", 1)[-1]
            if "norm" in pname:
                p.fill_(1.0 if ".linear_attn.norm." in pname else 0.0)
            elif leaf == "dt_bias":
                p.fill_(1.0)
            elif leaf == "A_log":
                p.copy_(torch.empty(p.shape, device=DEV).uniform_(0.01, 16).log())
            else:
                p.normal_(0.0, 0.02)
    return model.eval()


def copy_bandwidth() -> float:
    """Bytes per second of a 4 GB device-to-device copy (read + write counted)."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device=DEV).random_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), warmup=3, rep=20)
    del x, y
    return 2 * (2 << 30) / (ms * 1e-3)


def floor_bytes(model, c: int, ctx: float) -> dict[str, float]:
    cfg = model.config
    embed = model.model.embed_tokens.weight
    head = model.lm_head.weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed or p is head)
    n_attn = sum(t != "linear_attention" for t in cfg.layer_types)
    n_gdn = len(cfg.layer_types) - n_attn
    kv = c * ctx * n_attn * 2 * cfg.num_key_value_heads * cfg.head_dim * head.element_size()
    state = c * n_gdn * 2 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    return {"weights": weights, "kv": kv, "state": state, "lm_head_bf16": head.numel() * head.element_size()}


def measure(eng, model, c: int, prompt: int, warmup: int, steps: int, seed: int,
            profile: tuple[str, str] | None = None) -> dict:
    """One concurrency's decode timings; profile = (file, title): append the top kernels of a graph replay."""
    from zeromismatch.generator import SamplingParams

    g = torch.Generator().manual_seed(seed)
    for i in range(c):
        ids = torch.randint(0, model.config.vocab_size, (prompt,), generator=g).tolist()
        # with a profile, one more token: an eager step profiled after the timed ones
        eng.add_request(ids, SamplingParams(max_new_tokens=1 + warmup + steps + bool(profile), seed=i))
    t0 = time.perf_counter()
    while eng.waiting or any(s.num_uncomputed > 1 for s in eng.running):
        eng.step()
    prefill_s = time.perf_counter() - t0
    for _ in range(warmup):
        eng.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    done = []
    for _ in range(steps):
        done += eng.step()  # each step ends with its device-to-host transfer of the tokens
    wall = time.perf_counter() - t0
    if profile and eng.cuda_graphs:
        eng.runner.cuda_graphs = False  # the same step, eager: its ops by name and shape
        try:
            with open(profile[0], "a") as f:
                f.write(op_profile(lambda: done.extend(eng.step()), profile[1]) + "\n")
        finally:
            eng.runner.cuda_graphs = True
    while eng.has_work():  # (none left when every sequence reached decode in the same step)
        done += eng.step()
    itl = wall / steps
    out = {"c": c, "prefill_s": prefill_s, "itl_ms": itl * 1e3, "tokens_per_s": c / itl, "steps": steps,
           "ctx_mean": prompt + 1 + warmup + steps / 2, "finished": len(done)}
    if eng.cuda_graphs:
        from zeromismatch.generator.model_runner import bucket_of

        bb = bucket_of(c, eng.runner.batch_buckets)
        graphs = [gr for (b, _), gr in eng.runner.graphs.items() if b == bb]
        if graphs:
            out["graph_replay_ms"] = bench(graphs[-1].replay, warmup=3, rep=20)
            out["bucket"] = bb
            if profile:
                with open(profile[0], "a") as f:
                    f.write(kernel_profile(graphs[-1].replay, profile[1], reps=5) + "\n")
    return out


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(results["models"])
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 8), squeeze=False)
    colors = {"stock": "tab:gray", "bi": "tab:blue", "bi_chunk": "tab:orange"}
    for j, name in enumerate(models):
        m = results["models"][name]
        for mode, per in m["modes"].items():
            for variant, style in (("after", "-o"), ("before", "--x")):
                rows = per.get(variant, [])
                if not rows:
                    continue
                cs = [r["c"] for r in rows]
                axes[0][j].plot(cs, [r["tokens_per_s"] for r in rows], style, color=colors[mode],
                                label=f"{mode} {variant}")
                axes[1][j].plot(cs, [r["itl_ms"] / r["floor_ms"] for r in rows], style, color=colors[mode],
                                label=f"{mode} {variant}")
        for ax, ylabel in ((axes[0][j], "decode tokens/s"), (axes[1][j], "inter-token latency / memory floor")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("concurrent sequences")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][j].set_title(name)
        axes[1][j].axhline(1.0, color="k", lw=0.8)
        axes[0][j].legend(fontsize=7)
    fig.suptitle(f"generator decode on {torch.cuda.get_device_name(0)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    args = parse_args(__doc__, extra_args)
    from zeromismatch.generator import Engine

    t_start = time.perf_counter()
    conc = [int(x) for x in args.concurrency.split(",")]
    variants = args.variants.split(",")
    bw = copy_bandwidth()
    res = {"setup": {k: getattr(args, k) for k in ("prompt", "warmup", "steps", "before_steps", "layers_9b")},
           "copy_bandwidth_Bps": bw, "models": {}}
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    for name in args.models.split(","):
        model = build(name, args.layers_9b)
        entry = res["models"][name] = {"parameters": model.num_parameters(), "config": {
            k: getattr(model.config, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")},
            "modes": {}}
        for mode in args.modes.split(","):
            model.set_numerics(mode)
            per = entry["modes"][mode] = {}
            for variant in variants:
                after = variant in ("after", "fp32_head", "unstaged")
                graphs, device_sampling = after, variant != "before"
                model.set_numerics({"name": mode, "lm_head": "fp32"} if variant == "fp32_head" else mode)
                steps, warmup = (args.steps, args.warmup) if device_sampling else (args.before_steps, 1)
                run_c = conc if variant != "eager_device" else [c for c in conc if str(c) in
                                                                 args.eager_device_concurrency.split(",")]

                def new_engine():  # every prompt's prefill pieces in the same steps: all sequences reach decode together
                    return Engine(model, max_slots=max(conc), max_batched_tokens=max(conc) * args.prompt,
                                  prefix_caching=False,
                                  max_model_len=args.prompt + 2 + args.warmup + max(args.steps, args.before_steps),
                                  cuda_graphs=graphs, device_sampling=device_sampling,
                                  stage_ahead=variant != "unstaged")

                eng = new_engine()
                per[variant] = []
                per.setdefault("memory", eng.memory)
                for c in run_c:
                    if time.perf_counter() - t_start > args.deadline_s:
                        log("deadline: skipping", name, mode, variant, c)
                        continue
                    try:
                        prof = ((os.path.join(args.out, "h200_generator_profile.txt"), f"{name} {mode} {variant} c={c}")
                                if args.profile and variant == "after" else None)
                        r = measure(eng, model, c, args.prompt, warmup, steps, seed=c, profile=prof)
                    except Exception as e:  # recorded; the other measurements go on
                        log("FAILED", name, mode, variant, c, repr(e))
                        per[variant + "_errors"] = per.get(variant + "_errors", []) + [f"c={c}: {e!r}"]
                        eng = new_engine()
                        continue
                    fb = floor_bytes(model, c, r["ctx_mean"])
                    r["floor_bytes"] = fb
                    r["floor_ms"] = (fb["weights"] + fb["kv"] + fb["state"]) / bw * 1e3
                    r["floor_fp32_head_ms"] = r["floor_ms"] + fb["lm_head_bf16"] / bw * 1e3
                    r["itl_vs_floor"] = r["itl_ms"] / r["floor_ms"]
                    per[variant].append(r)
                    log(name, mode, variant, {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()
                                              if k != "floor_bytes"})
                    write_json(args, "h200_generator", res)
                per[variant + "_runner_stats"] = dict(eng.runner.stats)
                del eng
                gc.collect()
                torch.cuda.empty_cache()
        for variant in variants:  # bi / bi_chunk inter-token latency relative to stock, per concurrency
            stock = {r["c"]: r["itl_ms"] for r in entry["modes"].get("stock", {}).get(variant, [])}
            for mode, per in entry["modes"].items():
                for r in per.get(variant, []):
                    if r["c"] in stock:
                        r["itl_vs_stock"] = r["itl_ms"] / stock[r["c"]]
        for per in entry["modes"].values():  # the speed-up of the device path, per concurrency
            before = {r["c"]: r["itl_ms"] for r in per.get("before", [])}
            for r in per.get("after", []):
                if r["c"] in before:
                    r["speedup_vs_before"] = before[r["c"]] / r["itl_ms"]
            unstaged = {r["c"]: r["itl_ms"] for r in per.get("unstaged", [])}
            for r in per.get("after", []):
                if r["c"] in unstaged:
                    r["itl_vs_unstaged"] = r["itl_ms"] / unstaged[r["c"]]
        write_json(args, "h200_generator", res)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    path = write_json(args, "h200_generator", res)
    try:
        plot(res, os.path.join(args.out, "h200_generator.png"))
    except Exception as e:  # the JSON is the result; the figure can be redrawn from it
        log("plot failed:", repr(e))
    log("wrote", path)
    print(f"{'model':<20}{'mode':<9}{'c':>4}{'itl ms':>9}{'tok/s':>10}{'x floor':>9}{'x stock':>9}{'x before':>9}")
    for name, m in res["models"].items():
        for mode, per in m["modes"].items():
            for r in per.get("after", []):
                print(f"{name:<20}{mode:<9}{r['c']:>4}{r['itl_ms']:>9.3f}{r['tokens_per_s']:>10.0f}"
                      f"{r['itl_vs_floor']:>9.2f}{r.get('itl_vs_stock', math.nan):>9.2f}"
                      f"{r.get('speedup_vs_before', math.nan):>9.1f}")


if __name__ == "__main__":
    main()
