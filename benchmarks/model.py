"""Trainer forward (no grad) per numerics mode -> $OUT/model_forward.json: qwen3_5_mid in bf16, 8 packed
sequences of 1024 tokens, median of 3 after a warmup (do_bench), GEMM policy the default."""

import torch
from common import DEV, bench, log, parse_args, write_json


def main():
    args = parse_args(__doc__, lambda ap: ap.add_argument("--preset", default="qwen3_5_mid"))
    from zeromismatch.models.qwen3_5 import build_model

    model = build_model(args.preset, "stock", seed=1).to(device=DEV, dtype=torch.bfloat16)
    cu = [i * 1024 for i in range(9)]
    ids = torch.randint(0, model.config.vocab_size, (cu[-1],), device=DEV)
    res = {"preset": args.preset, "tokens": cu[-1], "sequences": len(cu) - 1}
    for mode in ("stock", "bi", "bi_chunk"):
        model.set_numerics(mode)
        with torch.no_grad():
            ms = bench(lambda: model(ids, cu), warmup=1, rep=3)
        res[mode] = {"fwd_ms": ms, "tokens_per_s": cu[-1] / ms * 1e3}
        log("model", mode, res[mode])
        write_json(args, "model_forward", res)
    log("wrote", write_json(args, "model_forward", res))


if __name__ == "__main__":
    main()
