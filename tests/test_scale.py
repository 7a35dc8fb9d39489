"""+scale=small (conf/scale/small.yaml): every math experiment at the ~29M qwen3_5_small preset on one GPU (and
+scale=small_search every search experiment, +scale=small_agent every terminal-agent one), the published recipe values kept where the scale does not change them, and a command line that gives +scale before
+exp (so that the experiment undoes the scale) stopped with one line."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from zeromismatch.config_schema import check_runnable, resolve_config, validate_config
from zeromismatch.errors import ConfigError
from zeromismatch.models.qwen3_5 import build_model

CONF = Path(__file__).resolve().parents[1] / "conf"
MATH_EXPS = sorted(p.stem for p in (CONF / "exp").glob("math_*.yaml"))
SEARCH_EXPS = sorted(p.stem for p in (CONF / "exp").glob("search_*.yaml"))
AGENT_EXPS = sorted(p.stem for p in (CONF / "exp").glob("agent_*.yaml"))
SCALE_OF = {exp: ("small_moe", "qwen3_5_small_moe") if "_moe_" in exp else ("small", "qwen3_5_small") for exp in MATH_EXPS}
SCALE_OF.update({exp: ("small_search", "qwen3_5_small") for exp in SEARCH_EXPS})
SCALE_OF.update({exp: ("small_agent", "qwen3_5_small") for exp in AGENT_EXPS})


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    resolve_config(cfg)
    return cfg


@pytest.mark.parametrize("exp", MATH_EXPS + SEARCH_EXPS + AGENT_EXPS)
def test_small_scale_of_every_experiment(exp):
    published = _compose(f"+exp={exp}")
    scale, preset = SCALE_OF[exp]
    cfg = _compose(f"+exp={exp}", f"+scale={scale}")
    validate_config(cfg)
    check_runnable(cfg, cuda_available=True)  # no weights needed: the SFT warm start trains them
    assert (cfg.model.preset, cfg.task.source, cfg.trainer.dtype, cfg.device) == (preset, "offline", "bfloat16", "cuda")
    assert cfg.model.get("checkpoint") is None  # the published 9B checkpoint path is the scale's to drop
    assert build_model(preset, "stock", seed=0).config.is_moe == published_is_moe(published)
    # what the experiment is about is the experiment's, not the scale's
    for key in ("numerics.name", "rl.offpolicy", "rl.loss", "rl.clip_low", "rl.clip_high", "rl.temperature",
                "rl.prompts_per_step", "rl.samples_per_prompt", "rl.steps", "rl.eval_every", "rl.adv_std_norm", "rl.dppo_delta",
                "run_name", "task.last_number_fallback"):
        if OmegaConf.select(published, key) is None and key.startswith("task."):
            continue  # a math-only task key
        assert OmegaConf.select(published, key) == OmegaConf.select(cfg, key), key
    assert cfg.rl.max_new_tokens < published.rl.max_new_tokens and cfg.trainer.lr > published.trainer.lr


def published_is_moe(cfg) -> bool:
    return cfg.model.preset == "qwen3_5_35b_a3b"


def test_scale_before_exp_is_one_line_error():
    cfg = _compose("+scale=small", "+exp=math_op32_stock")
    with pytest.raises(ConfigError, match=r"^model.preset='qwen3_5_9b': scale=small sets 'qwen3_5_small' .*"
                                          r"give \+scale=small after \+exp=\.\.\."):
        validate_config(cfg)


@pytest.mark.parametrize("preset", ["qwen3_5_small", "qwen3_5_small_moe"])
def test_small_preset_size(preset):
    model = build_model(preset, "stock", seed=0)
    assert 20e6 < model.num_parameters() < 80e6
    assert model.config.layer_types.count("full_attention") == 2 and model.config.num_hidden_layers == 8


@pytest.mark.parametrize("offpolicy", [4, 32])
def test_window_slots_decode_every_admitted_rollout(offpolicy):
    """generator.max_slots=window (the small scales): the rollout engine has a slot for every rollout the run-ahead
    window admits, (offpolicy + 1) x prompts x samples, and steps wide enough to decode them all at once."""
    from zeromismatch.orchestration.build import build_rollout_engine

    cfg = _compose(f"+exp=math_op{offpolicy}_bi", "+scale=small", "device=cpu", "model.preset=tiny", "trainer.dtype=float32")
    assert cfg.generator.max_slots == "window"
    model = build_model("tiny", "bi", seed=0)
    engine = build_rollout_engine(cfg, model, _Task(), version=0)
    assert engine.max_slots == (offpolicy + 1) * cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
    assert engine.max_batched_tokens >= engine.max_slots


class _Task:
    max_turns, max_context_tokens, max_tokens_per_turn = 1, None, None


def test_window_slots_need_a_window():
    from zeromismatch.generator.backends import build_engine

    with pytest.raises(ValueError, match="generator.max_slots=window"):
        build_engine(build_model("tiny", "bi", seed=0), {"max_slots": "window"}, max_model_len=64)
