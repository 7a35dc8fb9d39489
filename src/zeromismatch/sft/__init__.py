"""Supervised warm start of a (tiny) preset on the task's demonstrations (math: the offline worked solutions;
search: scripted search / read / answer episodes), cached, so that RL starts from a model that is sometimes right (train reward at temperature 1.0 in [0.1, 0.7]: RL groups have reward
variance).

    ensure_sft_checkpoint(cfg) -> Path     # what the RL and eval jobs call, whatever cfg.job is
    run_sft(cfg) -> SFTResult              # the same, with the model, the summary and whether it was cached

Training (train.py): a random init of cfg.model.preset (+ overrides) from job.seed; AdamW (lr job.lr;
betas, eps, weight decay, grad clip from cfg.trainer); linear warm-up then cosine decay to min_lr_ratio * lr
over exactly job.steps steps. Each step packs batch_size examples of the task's SFT jsonl (data.py; tokenized by
``Task.sft_example``: the chat-formatted prompt exactly as the RL prompts are rendered, then the demonstration)
into one varlen forward; the loss is the mean NLL of the tokens the example's loss mask marks: the model's
turns (math: the worked solution + eos), never the prompt or tool output (a search episode's <information>). Examples come from job.levels (null = all levels), shuffled by
job.seed, cycled.

Determinism: the weights are a function of the settings, not of the machine's load. The step count alone
drives training and the lr schedule; torch runs on job.threads threads (default 1) whatever
OMP_NUM_THREADS or the core count say, because the CPU kernels split their sums by thread count (10 steps of
the default SFT on torch 2.13.0+cpu / MKL: all 56 tensors differ between 1 and 2 threads). One thread also
keeps a busy machine from stalling the run: beside other jobs on 2 cores those 10 steps took 21 s on 1
thread and 149 s on 2. job.time_limit_s (default null) is only a guard: passing it raises and caches nothing.
tests/sft/test_warm_start.py checks bitwise-equal weights with a CPU-bound process beside the run, another
ambient thread count and a slowed clock.

Numerics: SFT always trains under ``stock`` (plain torch, chunked GDN: the fastest trainer forward on CPU) in
fp32. Parity concerns the RL trainer and generator running the SAME weights; SFT only picks the starting
weights, which every numerics arm then loads identically, so the run's numerics are not in the cache key.

Measured after training (stored in summary.json, not in the key): train reward at
``train_reward_temperature`` on the first ``train_reward_prompts`` prompts of the RL order (the prompts an RL
run of cfg.seed starts on), one sample each, and held-out greedy accuracy, both generated under
``measure_numerics``. A train reward outside [0.1, 0.7] is warned about.

Seed: job.seed (init and example order) is fixed in conf/job/sft.yaml rather than tied to cfg.seed, so RL
runs of every seed start from the same weights. The defaults (level-2 problems, 130 steps x 32, lr 1e-3)
reach a train reward of about 0.27 at T=1.0 (results/main_job/fresh_clone/record.json); level-2 problems
(a*b +- c) are the ones a tiny model learns fastest.

Cache (warm_start.py): ``<job.cache_dir>/<16 hex of sha256(key)>/`` holds the checkpoint (config.json +
safetensors), the tokenizer files and summary.json. key (``sft_key``) = model preset and overrides, sha256 of
the SFT data file, the tokenizer's fingerprint, the chat-template kwargs, the training settings
(SFTSettings.KEY_FIELDS: steps, batch, lr schedule, seed, levels, threads, optimizer), the SFT numerics and
dtype, the platform (device, CPU vector ISA or GPU model, torch version) and SFT_VERSION. A run whose key
exists loads it ("SFT cache hit"). Only a run that trained every step stores its entry, written into a
temporary directory beside it, fsynced and renamed into place under the entry's lock; a concurrent run of
the same key waits on that lock and then loads the entry.
"""

from .data import SFTBatches, load_sft_records
from .settings import SFTSettings, settings_from_cfg, sft_job_config
from .train import SFTTimeLimitError, lr_factor, pinned_threads, train_sft
from .warm_start import SFTResult, ensure_sft_checkpoint, measure, run_sft, sft_key

__all__ = [
    "SFTBatches",
    "SFTResult",
    "SFTSettings",
    "SFTTimeLimitError",
    "ensure_sft_checkpoint",
    "load_sft_records",
    "lr_factor",
    "measure",
    "pinned_threads",
    "run_sft",
    "settings_from_cfg",
    "sft_job_config",
    "sft_key",
    "train_sft",
]
