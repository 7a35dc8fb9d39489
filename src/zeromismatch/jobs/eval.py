"""`python run.py job=eval`: a checkpoint's accuracy on the task's held-out set (evaluation.py).

    python run.py job=eval model=tiny                          # the SFT checkpoint of this config (cached)
    python run.py job=eval model.checkpoint=<dir> job.temperature=0

Evaluates cfg.model.checkpoint, or, without one, the SFT checkpoint of this config (loaded from the cache,
trained first on a miss), with cfg.job's temperature (0 = greedy, what the RL job logs) /
samples_per_prompt / max_new_tokens / n / split.
"""

from __future__ import annotations

from ..evaluation import VALIDATION_METRIC, evaluate
from ..logging import MetricsLogger
from ..model_init import load_model
from ..sft import ensure_sft_checkpoint
from ..tasks.registry import build_task, get_tokenizer
from ..tasks.tokenizer import has_tokenizer, load_tokenizer


def main(cfg) -> dict:
    job = cfg.job
    checkpoint = cfg.model.get("checkpoint") or str(ensure_sft_checkpoint(cfg))
    tokenizer = load_tokenizer(checkpoint) if has_tokenizer(checkpoint) and not cfg.model.get("tokenizer") else get_tokenizer(cfg)
    model = load_model(cfg, checkpoint=checkpoint)
    temperature = float(job.get("temperature", 0.0))
    greedy = temperature == 0.0
    with build_task(cfg, tokenizer) as task:
        res = evaluate(
            model,
            task,
            n=job.get("n"),
            greedy=greedy,
            max_new_tokens=int(job.max_new_tokens),
            temperature=temperature,
            samples_per_prompt=int(job.get("samples_per_prompt", 1)),
            seed=int(cfg.seed),
            split=str(job.get("split", "eval")),
            cfg_generator=cfg.get("generator"),
        )
    mode = "greedy" if greedy else f"temperature {temperature}, {res['samples'] // max(res['n'], 1)} sample(s)/prompt"
    print(
        f"eval: accuracy {res['accuracy']:.3f} on {res['n']} {job.get('split', 'eval')} prompts ({mode}); "
        f"mean length {res['mean_len']:.1f} tokens; checkpoint {checkpoint}; numerics {cfg.numerics.name}",
        flush=True,
    )
    with MetricsLogger.from_cfg(cfg) as log:
        log.log({VALIDATION_METRIC: res["accuracy"], "eval/mean_len": res["mean_len"], "eval/truncated": res["truncated"]}, step=0)
        log.summary({VALIDATION_METRIC: res["accuracy"], "eval/n": res["n"]})
        run_dir = str(log.run_dir)
    return {**res, "checkpoint": str(checkpoint), "run_dir": run_dir}
