"""The schema of run.py's config, checked right after composition, before any work.

    check_config(cfg)        # validate_config + check_runnable; raises ConfigError (one line) on the first fault

``validate_config``: every key of every group (job variants by job.name, model, numerics, task variants by
task.name, rl, generator variants by generator.backend, trainer, logging, and the top level) has a type and
a range here. An unknown key, a wrong type or an out-of-range value fails with one line naming the key, the
value, what is allowed and the group's file, e.g.
``rl.steps='abc': expected an integer >= 1 (conf/rl/default.yaml)``. conf/recipe/ and conf/exp/ are
``@package _global_``: their keys land in these groups and are checked with them.

``check_runnable``: what this machine cannot run, said before anything is built: a task or generator
backend configured as not implemented, a CUDA device on a machine without one, a published-size preset on
the CPU, a real-size RL / eval run without local weights, a checkpoint directory that does not exist.

A new config key is added in two places: its yaml file (default + comment) and its Check below.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config import to_plain
from . import config_checks as checks
from .errors import ConfigError, MissingFileError
from .models.qwen3_5.config import PRESETS, Qwen35Config
from .numerics.modes import MODES
from .ops.gdn.constants import CHUNK_DOTS
from .ops.linear.policy import GEMM_POLICIES, HEAD_FORMS
from .plots.figures import FIGURES
from .rl.losses import PRESETS as LOSSES
from .tasks.search.format import FORMATS as SEARCH_FORMATS
from .tasks.agent.actions import FORMATS as ACTION_FORMATS
from .tasks.agent.offline import FAMILIES as AGENT_FAMILIES
from .tasks.agent.sandbox import SandboxLimits

__all__ = ["SCHEMA", "check_config", "check_runnable", "hydra_error_line", "resolve_config", "validate_config"]

# --------------------------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Check:
    """One key: ``ok(value)`` decides, ``allowed`` says what is accepted (it ends the error line)."""

    ok: Callable[[Any], bool]
    allowed: str
    required: bool = True  # False: the key may be absent (added with +key=...)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bounds(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> tuple[Callable[[Any], bool], str]:
    def ok(v):
        return (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or (v < hi if hi_open else v <= hi))

    parts = [f"{'>' if lo_open else '>='} {lo:g}"] if lo is not None else []
    parts += [f"{'<' if hi_open else '<='} {hi:g}"] if hi is not None else []
    return ok, " and ".join(parts)


def _optional(check: Check, optional: bool) -> Check:
    if not optional:
        return check
    return Check(lambda v: v is None or check.ok(v), f"{check.allowed} or null", check.required)


def integer(lo: int | None = None, hi: int | None = None, optional: bool = False) -> Check:
    in_range, text = _bounds(lo, hi, False, False)
    return _optional(Check(lambda v: _is_int(v) and in_range(v), f"an integer {text}".rstrip()), optional)


def number(lo: float | None = None, hi: float | None = None, *, lo_open=False, hi_open=False, optional=False) -> Check:
    in_range, text = _bounds(lo, hi, lo_open, hi_open)
    return _optional(Check(lambda v: _is_num(v) and in_range(v), f"a number {text}".rstrip()), optional)


BOOL = Check(lambda v: isinstance(v, bool), "true or false")
STR = Check(lambda v: isinstance(v, str) and v != "", "a non-empty string")
OPT_STR = _optional(STR, True)
MAPPING = Check(lambda v: isinstance(v, dict), "a mapping {key: value, ...}")
ANY = Check(lambda v: True, "anything")


def one_of(*choices: Any, optional: bool = False) -> Check:
    return _optional(Check(lambda v: v in choices, "one of " + ", ".join(map(str, choices))), optional)


def list_of(item: Check, length: int | None = None, optional: bool = False) -> Check:
    def ok(v):
        return isinstance(v, list) and (length is None or len(v) == length) and all(item.ok(x) for x in v)

    what = f"a list of {length}" if length is not None else "a list"
    return _optional(Check(ok, f"{what} of {item.allowed.removeprefix('a ').removeprefix('an ')}"), optional)


def either(a: Check, b: Check) -> Check:
    return Check(lambda v: a.ok(v) or b.ok(v), f"{a.allowed}, or {b.allowed}")


def optional_key(check: Check) -> Check:
    return dataclasses.replace(check, required=False)


Group = dict  # key -> Check | Group (a nested mapping with known keys)

# ----------------------------------------------------------------------------------------- the groups

POSITIVE_INT = integer(1)
COUNT = integer(0)  # 0 = off / never where the yaml says so

JOB: dict[str, Group] = {  # conf/job/<name>.yaml, by job.name
    "rl": {"name": STR, "resume": OPT_STR,
           "sft": optional_key(MAPPING)},  # SFT warm-start knobs (conf/job/sft.yaml keys) of this run
    "sft": {
        "name": STR, "data": STR, "steps": POSITIVE_INT, "batch_size": POSITIVE_INT, "max_seq_len": POSITIVE_INT,
        "lr": number(0, lo_open=True), "eval_every": COUNT, "save_to": OPT_STR,
        "levels": list_of(integer(1, 4), optional=True), "warmup_steps": COUNT, "min_lr_ratio": number(0, 1),
        "time_limit_s": number(0, lo_open=True, optional=True), "threads": POSITIVE_INT, "seed": COUNT, "cache_dir": STR,
        "train_reward_prompts": POSITIVE_INT, "train_reward_temperature": number(0), "max_new_tokens": POSITIVE_INT,
        "measure_numerics": one_of(*MODES), "progress": BOOL,
    },  # fmt: skip
    "eval": {
        "name": STR, "split": one_of("eval", "train"), "samples_per_prompt": POSITIVE_INT, "temperature": number(0),
        "max_new_tokens": POSITIVE_INT, "n": integer(1, optional=True),
        "sft": optional_key(MAPPING),  # SFT knobs of the checkpoint to evaluate (conf/job/sft.yaml keys)
    },  # fmt: skip
    "parity": {
        "name": STR, "n_prompts": POSITIVE_INT, "max_new_tokens": POSITIVE_INT, "max_slots": POSITIVE_INT,
        "audit": BOOL, "seed": COUNT, "out": OPT_STR,
    },  # fmt: skip
    "bench": {
        "name": STR, "modes": list_of(one_of(*MODES)), "batch": POSITIVE_INT, "seq_len": POSITIVE_INT,
        "gen_prompts": POSITIVE_INT, "gen_tokens": POSITIVE_INT, "repeats": POSITIVE_INT, "out": OPT_STR,
    },  # fmt: skip
    "plot": {
        "name": STR, "runs": either(STR, list_of(STR)), "out": STR, "source": one_of("jsonl", "wandb", "auto"),
        "figures": either(one_of("all"), list_of(one_of(*FIGURES))), "metrics": list_of(STR),
        "ema": number(0, 1, hi_open=True), "mismatch_ema": number(0, 1, hi_open=True),
        "formats": list_of(one_of("png", "pdf", "svg")), "dpi": POSITIVE_INT, "jobs": list_of(STR), "strict": BOOL,
    },  # fmt: skip
    "retriever": {"name": STR, "port": integer(0, 65535), "corpus": OPT_STR, "topk": integer(1, 100), "index_cache": STR},
    "smoke": {"name": STR, "steps": POSITIVE_INT, "batch_size": POSITIVE_INT, "seq_len": POSITIVE_INT,
              "lr": number(0, lo_open=True)},  # fmt: skip
}

MODEL: Group = {
    "preset": one_of(*PRESETS),
    "overrides": Check(
        lambda v: isinstance(v, dict) and set(v) <= {f.name for f in dataclasses.fields(Qwen35Config)},
        "a mapping of Qwen35Config fields (models/qwen3_5/config.py)",
    ),
    "checkpoint": OPT_STR,
    "tokenizer": OPT_STR,
}

NUMERICS: Group = {"name": one_of(*MODES), "gemm_policy": one_of(*GEMM_POLICIES), "chunk_dots": one_of(*CHUNK_DOTS),
                    "lm_head": one_of(*HEAD_FORMS)}

_NOT_IMPLEMENTED_TASK = {"name": STR, "implemented": BOOL}
# what a multi-turn task's yaml sets for its rollouts (orchestration/build.py episode_settings)
EPISODE_KEYS: Group = {
    "max_turns": POSITIVE_INT, "max_tokens_per_turn": integer(1, optional=True),
    "max_context_tokens": integer(2, optional=True), "env_workers": POSITIVE_INT,
}  # fmt: skip
TASK: dict[str, Group] = {  # conf/task/<name>.yaml, by task.name
    "math": {
        "name": STR, "implemented": BOOL, "source": one_of("offline", "hub"),
        "offline": {"dir": STR, "n_train": POSITIVE_INT, "seed": COUNT, "train": STR, "eval": STR, "sft": STR,
                    "levels": list_of(integer(1, 4), optional=True)},
        "hub": {"train": STR, "train_split": STR, "eval": STR, "eval_split": STR},
        "prompt_template": Check(lambda v: isinstance(v, str) and "{problem}" in v, "a string containing {problem}"),
        "reward": one_of("math_verify"), "reward_timeout_s": number(0, lo_open=True), "last_number_fallback": BOOL,
        "chat_template_kwargs": MAPPING, "tokenizer_cache": STR,
    },  # fmt: skip
    "toy": {"name": STR, "implemented": BOOL},
    "toy_multiturn": {
        "name": STR, "implemented": BOOL, **EPISODE_KEYS, "tool_error_turn": integer(0, optional=True),
    },  # fmt: skip
    "search": {
        "name": STR, "implemented": BOOL, "source": one_of("offline", "files"), "format": one_of(*SEARCH_FORMATS),
        "prompt_template": _optional(Check(lambda v: isinstance(v, str) and "{question}" in v, "a string containing {question}"), True),
        "offline": {"dir": STR, "n_people": integer(2, 576), "n_heldout": POSITIVE_INT, "seed": COUNT, "corpus": STR,
                    "train": STR, "eval": STR, "sft": STR, "levels": list_of(integer(1, 2), optional=True)},
        "files": {"train": OPT_STR, "eval": OPT_STR, "corpus": OPT_STR, "data_source": OPT_STR,
                  "n_eval": integer(1, optional=True)},
        "retriever": {"url": _optional(Check(lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
                                             "an http(s):// URL"), True),
                      "topk": integer(1, 100), "index_cache": STR, "timeout_s": number(0, lo_open=True),
                      "retries": COUNT, "startup_timeout_s": number(0, lo_open=True), "max_restarts": COUNT},
        **EPISODE_KEYS, "max_tool_tokens": POSITIVE_INT, "reward": one_of("exact_match"),
        "mask_tool_tokens": BOOL, "chat_template_kwargs": MAPPING, "tokenizer_cache": STR,
    },  # fmt: skip
    "agent": {
        "name": STR, "implemented": BOOL, "source": one_of("offline", "rows"),
        "offline": {"dir": STR, "sft": STR, "levels": Check(lambda v: v is None, "null (agent tasks have no levels)"),
                    "n_train": POSITIVE_INT, "n_heldout": COUNT, "seed": COUNT, "n_sft": POSITIVE_INT,
                    "families": list_of(one_of(*AGENT_FAMILIES), optional=True)},
        "rows": {"train": OPT_STR, "eval": OPT_STR},
        **EPISODE_KEYS, "action_format": one_of(*ACTION_FORMATS),
        "episode_timeout_s": number(0, lo_open=True), "time_scale": number(0, lo_open=True),
        "sandbox_concurrency": integer(1, optional=True),
        "sandbox": {k: (POSITIVE_INT if f.type in ("int", int) else number(0, lo_open=True))
                    for k, f in SandboxLimits.__dataclass_fields__.items()},
        "tokenizer_cache": STR,
    },  # fmt: skip
}

RL: Group = {
    "offpolicy": COUNT, "prompts_per_step": POSITIVE_INT, "samples_per_prompt": POSITIVE_INT,
    "max_new_tokens": POSITIVE_INT, "temperature": number(0), "steps": POSITIVE_INT, "eval_every": COUNT,
    "loss": one_of(*LOSSES), "clip_low": number(0, 1), "clip_high": number(0), "dppo_delta": number(0, lo_open=True),
    "log_ratio_clamp": number(0, lo_open=True), "adv_std_norm": BOOL, "drop_uniform_groups": BOOL,
    "tis_cap": number(0, lo_open=True, optional=True),
    "icepop": Check(lambda v: v is None or (list_of(number(0), 2).ok(v) and v[0] <= v[1]), "null or [low, high] with 0 <= low <= high"),
    "swap_policy": one_of("keep", "recompute"), "deterministic": BOOL,
    "backend": one_of("threaded", "ray"),
    "dynamic_sampling": BOOL, "staleness_split": BOOL, "checkpoint_every": COUNT, "max_prompt_len": POSITIVE_INT,
    "sft_warm_start": BOOL,
}  # fmt: skip

SLOTS = either(POSITIVE_INT, one_of("window"))  # window: a slot for every rollout the run-ahead window admits
GENERATOR: dict[str, Group] = {  # conf/generator/<backend>.yaml, by generator.backend
    "embedded": {"backend": STR, "max_slots": SLOTS, "max_batched_tokens": POSITIVE_INT,
                 "max_model_len": integer(1, optional=True), "prefix_caching": BOOL, "piece_interval": POSITIVE_INT},
    "vllm": {"backend": STR, "max_slots": POSITIVE_INT, "max_batched_tokens": POSITIVE_INT,
             "max_model_len": integer(1, optional=True)},
    "vllm_native": {"backend": STR, "max_slots": POSITIVE_INT, "max_batched_tokens": POSITIVE_INT,
                    "max_model_len": integer(1, optional=True)},
}  # fmt: skip

TRAINER: Group = {
    "optimizer": one_of("adamw"), "lr": number(0, lo_open=True), "betas": list_of(number(0, 1, hi_open=True), 2),
    "eps": number(0, lo_open=True), "weight_decay": number(0), "grad_clip": number(0, lo_open=True, optional=True),
    "microbatch_tokens": POSITIVE_INT, "dtype": one_of("float32", "bfloat16", "float16"),
    "activation_checkpointing": BOOL,
}  # fmt: skip

LOGGING: Group = {
    "root": STR, "run_dir": STR, "jsonl": STR,
    "wandb": {"mode": one_of("auto", "offline", "online", "disabled"), "project": STR, "entity": OPT_STR,
              "group": OPT_STR, "tags": list_of(STR)},
}  # fmt: skip

_RESOURCES: Group = {"num_cpus": number(0), "num_gpus": number(0)}
RAY: Group = {
    "address": OPT_STR, "num_cpus": POSITIVE_INT, "num_gpus": COUNT, "object_store_mb": integer(75),
    "generators": POSITIVE_INT, "trainer_ranks": Check(lambda v: _is_int(v) and v >= 1 and v & (v - 1) == 0, "a power of two >= 1"),
    "generator_resources": _RESOURCES, "trainer_resources": _RESOURCES, "max_restarts": COUNT,
    "weight_sync": one_of("auto", "gloo", "nccl", "cuda_ipc"),
}  # fmt: skip

DEVICE = Check(lambda v: isinstance(v, str) and re.fullmatch(r"cpu|cuda(:\d+)?", v) is not None, "cpu, cuda or cuda:<index>")

# top-level key -> its Check, its Group, or (selector key, {selector value: Group}) for the variant groups
SCHEMA: dict[str, Any] = {
    "seed": COUNT,
    "device": DEVICE,
    "run_name": STR,
    "job": ("name", JOB),
    "model": MODEL,
    "numerics": NUMERICS,
    "task": ("name", TASK),
    "rl": RL,
    "generator": ("backend", GENERATOR),
    "trainer": TRAINER,
    "logging": LOGGING,
    "ray": RAY,
}
# keys that are gone: a config that still sets one fails with what replaced it
REMOVED: dict[str, str] = {
    "rl.disaggregated": "removed; the disaggregated run (trainer and generators in processes of their own) is "
                        "rl.backend=ray (conf/ray/default.yaml, docs/distributed.md)",
}  # fmt: skip
_DEFAULT_OPTION = {"rl": "default", "trainer": "default", "logging": "default", "ray": "default"}
_SELECTOR_OPTION = {"job": "name", "task": "name", "generator": "backend", "model": "preset", "numerics": "name"}

# ------------------------------------------------------------------------------------------ validation


def _source(group: str, node: Any, choices: Mapping[str, str] | None) -> str:
    """The yaml file that declares ``group``'s keys: the chosen option (Hydra's runtime choices when given)."""
    option = (choices or {}).get(group) or _DEFAULT_OPTION.get(group)
    if option is None and isinstance(node, dict):
        option = node.get(_SELECTOR_OPTION.get(group, ""))
    return f"conf/{group}/{option}.yaml" if option else "conf/config.yaml"


def _fail(key: str, value: Any, allowed: str, source: str) -> ConfigError:
    return ConfigError(f"{key}={value!r}: expected {allowed} ({source})")


def _removed(key: str, value: Any) -> ConfigError:
    shown = str(value).lower() if isinstance(value, bool) else value
    return ConfigError(f"{key}={shown}: {REMOVED[key]}")


def _check_group(prefix: str, node: Any, schema: Group, source: str) -> None:
    if not isinstance(node, dict):
        raise _fail(prefix, node, f"a mapping with keys {', '.join(schema)}", source)
    for key, value in node.items():
        full = f"{prefix}.{key}"
        if key not in schema and full in REMOVED:
            raise _removed(full, value)
        if key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"did you mean {prefix}.{close[0]}? " if close else ""
            raise ConfigError(f"{full}: unknown key; {hint}{prefix} takes {', '.join(schema)} ({source})")
        spec = schema[key]
        if isinstance(spec, dict):
            _check_group(full, value, spec, source)
        elif not spec.ok(value):
            raise _fail(full, value, spec.allowed, source)
    for key, spec in schema.items():
        if key not in node and (isinstance(spec, dict) or spec.required):
            raise ConfigError(f"{prefix}.{key}: missing; expected {getattr(spec, 'allowed', 'a mapping')} ({source})")


SCALE: Group = {"name": STR, "preset": one_of(*PRESETS)}


def _check_scale(scale: Any, plain: dict) -> None:
    """The optional scale group (+scale=<name>, conf/scale/): known keys, and its model preset still in place.
    A config composed after it (an +exp=... given after +scale=... on the command line) would silently undo
    the scale's settings; the preset is the one key every experiment sets."""
    if scale is None:
        return
    _check_group("scale", scale, SCALE, f"conf/scale/{scale.get('name') if isinstance(scale, dict) else scale}.yaml")
    preset = (plain.get("model") or {}).get("preset")
    if preset != scale["preset"]:
        raise ConfigError(
            f"model.preset={preset!r}: scale={scale['name']} sets {scale['preset']!r} and a later config undid it; "
            f"give +scale={scale['name']} after +exp=... on the command line (conf/scale/{scale['name']}.yaml)"
        )


def validate_config(cfg: Any, choices: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError (one line) for the first unknown key, wrong type or out-of-range value of the
    composed config (``choices``: Hydra's runtime group choices, to name the right yaml file)."""
    plain = to_plain(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    plain.pop("hydra", None)
    _check_scale(plain.pop("scale", None), plain)
    for key, value in plain.items():
        if key not in SCHEMA:
            close = difflib.get_close_matches(str(key), list(SCHEMA), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"{key}: unknown top-level key{hint} (conf/config.yaml)")
    for key, spec in SCHEMA.items():
        if key not in plain:
            raise ConfigError(f"{key}: missing (conf/config.yaml)")
        value, source = plain[key], _source(key, plain[key], choices)
        if isinstance(spec, Check):
            if not spec.ok(value):
                raise _fail(key, value, spec.allowed, "conf/config.yaml")
        elif isinstance(spec, tuple):
            selector, variants = spec
            variant = value.get(selector) if isinstance(value, dict) else None
            if variant not in variants:
                raise _fail(f"{key}.{selector}", variant, "one of " + ", ".join(variants), source)
            _check_group(key, value, variants[variant], source)
        else:
            _check_group(key, value, spec, source)


# ------------------------------------------------------------------------------------- machine checks

GPU_ONLY_PRESETS = ("qwen3_5_9b", "qwen3_5_35b_a3b")  # published sizes: fp32 weights alone are 36 / 140 GB
TASK_JOBS = ("rl", "sft", "eval")  # jobs that read cfg.task and cfg.generator


def check_runnable(cfg: Any, cuda_available: bool | None = None) -> None:
    """Raise ConfigError (or MissingFileError) when this validated config cannot run here; nothing is built.
    ``cuda_available`` defaults to torch.cuda.is_available()."""
    job, task, model = cfg.job.name, cfg.task, cfg.model
    if job in TASK_JOBS:
        if not task.get("implemented", True):
            raise ConfigError(
                f"task={task.name} is not implemented yet: conf/task/{task.name}.yaml records the published recipe "
                "only (no task code, data or reward in the repo); implemented tasks: math, search, agent, toy, toy_multiturn"
            )
        if task.name == "agent":
            checks.agent(task)
    if job == "rl" and cfg.rl.get("backend") == "ray":
        if cfg.generator.backend != "embedded":
            raise ConfigError(
                f"rl.backend=ray runs the embedded engine in its generator actors; generator={cfg.generator.backend} "
                "runs with rl.backend=threaded"
            )
        checks.ray(cfg)
    if job in (*TASK_JOBS, "parity") and cfg.generator.backend != "embedded":
        checks.vllm(cfg)
    if job in TASK_JOBS and task.name == "search" and task.get("source") == "files":
        checks.search_files(task)
    if job == "plot":
        return
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if str(cfg.device).startswith("cuda") and not cuda:
        fix = (
            f"model={model.preset} needs a GPU machine (and model.checkpoint=<local checkpoint dir>)"
            if model.preset in GPU_ONLY_PRESETS
            else "use device=cpu"
        )
        raise ConfigError(f"device={cfg.device}: this machine has no CUDA device (torch {torch.__version__}); {fix}")
    if cfg.device == "cpu" and model.preset in GPU_ONLY_PRESETS:
        raise ConfigError(
            f"model={model.preset} needs a GPU (device=cuda); on this CPU use model=tiny, tiny_moe or qwen3_5_mid"
        )
    if model.get("checkpoint"):
        if not Path(model.checkpoint).is_dir():
            raise MissingFileError(f"file not found: {model.checkpoint} (model.checkpoint: a local checkpoint directory)")
    elif job in ("rl", "eval") and model.preset in GPU_ONLY_PRESETS:
        raise ConfigError(
            f"model={model.preset} has no weights: set model.checkpoint=<local Hugging Face checkpoint dir> "
            "(random init of a published-size model is not a run; weights cannot be downloaded here)"
        )


def resolve_config(cfg: DictConfig) -> None:
    """OmegaConf.resolve (one value for ${now:...} etc. everywhere in the run), an interpolation error as a
    one-line ConfigError naming the key."""
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{_failing_key(cfg) or 'config'}: {str(e).splitlines()[0]}") from e


def _failing_key(cfg: DictConfig) -> str | None:
    """The key whose interpolation fails (OmegaConf.resolve does not say; to_container does)."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        return getattr(e, "full_key", None)
    return None


def check_config(cfg: Any, choices: Mapping[str, str] | None = None, cuda_available: bool | None = None) -> None:
    """validate_config, then check_runnable: the whole check run.py makes before a job starts."""
    validate_config(cfg, choices)
    check_runnable(cfg, cuda_available)


def hydra_error_line(ex: BaseException) -> str:
    """Hydra's multi-line composition error (an override of an unknown key, a missing group option, a
    malformed override) as one line; option lists joined by commas."""
    text, cause = str(ex), ex.__cause__
    key = getattr(ex, "full_key", None) or getattr(cause, "full_key", None)
    given = re.search(rf"use \+{re.escape(key)}=(.*)$", text, re.M) if key in REMOVED else None
    if given:  # an override of a key that is gone: say what replaced it
        return str(_removed(key, given.group(1)))
    if isinstance(cause, OmegaConfBaseException):
        first = str(cause).splitlines()[0]
        text = f"unknown key\n{text}" if "is not in struct" in first else f"{text}\n{first}"
    if key:
        text = f"{key}: {text}"
    parts: list[list[str]] = []  # [line, option, option, ...]: Hydra lists a group's options one per tab-indented line
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Config search path"):
            break
        if not line or line.startswith(("full_key:", "object_type=", "reference_type=", "See https://")):
            continue
        if raw.startswith("\t") and parts and parts[-1][0].endswith(":"):
            parts[-1].append(line)
        else:
            parts.append([line.removeprefix("In 'config': ").rstrip(".")])
    return "; ".join(p[0] + (" " + ", ".join(p[1:]) if len(p) > 1 else "") for p in parts)
