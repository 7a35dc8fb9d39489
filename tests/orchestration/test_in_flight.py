"""A checkpoint taken while groups are still generating keeps them as (ticket, prompt, stream position); the
resumed worker regenerates them from the same prompts and sampling seeds, so no prompt of the stream is lost
or admitted twice, and under unchanged weights the regenerated rollouts are the ones the uninterrupted
worker produces (bi numerics: a request's tokens do not depend on what it is batched with)."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from zeromismatch.model_init import load_model
from zeromismatch.orchestration.build import build_rollout_worker, for_generation
from zeromismatch.tasks.registry import build_task

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def _cfg():
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=["job=rl", "task=toy", "model=tiny", "numerics=bi", "rl.offpolicy=1",
                                            "rl.prompts_per_step=2", "rl.samples_per_prompt=2", "rl.max_new_tokens=8"])


def _complete_groups(worker) -> dict:
    worker.drain()
    return {g.prompt_id: [s.token_ids.tolist() for s in g.samples] for g in worker.buffer.untrained_groups()}


def test_in_flight_groups_are_regenerated_with_their_seeds():
    cfg = _cfg()
    torch.manual_seed(0)
    model = for_generation(load_model(cfg))
    task = build_task(cfg, vocab_size=model.config.vocab_size)

    reference = build_rollout_worker(cfg, model, task, version=0)
    reference.admit_available()
    expected = _complete_groups(reference)

    worker = build_rollout_worker(cfg, model, task, version=0)
    worker.admit_available()
    for _ in range(3):  # stop mid-generation: every group has tokens, none is complete
        assert worker.step() == 0
    with worker.lock:
        state = worker.state()
    assert len(state["in_flight"]) == 4 and worker.tokens_generated == 0 and worker.engine.has_work()
    assert sorted(t for t, _, _ in state["in_flight"]) == sorted(state["buffer"]._in_flight)
    buf = io.BytesIO()
    torch.save(state, buf)  # what the checkpoint file holds
    resume = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)

    resumed = build_rollout_worker(cfg, model, task, version=0, resume=resume)
    assert resumed.buffer.num_in_flight == len(state["in_flight"])
    assert _complete_groups(resumed) == expected  # same prompts, same seeds, same tokens
    assert resumed.prompts_consumed == reference.prompts_consumed == 4  # (N + 1) * P prompts, none twice
    resumed.buffer.assemble_batch(0)
    resumed.apply_weights(1, model.state_dict())
    resumed.admit_available()
    assert next(iter(resumed.groups.values())).item.prompt_id == 4  # the stream continues where it was


def test_resume_when_the_checkpoint_preceded_the_weight_swap():
    """An async checkpoint is written right after the trainer publishes version v + 1, possibly before the
    generator took it: the buffer still says version v. The resumed generator runs v + 1 from its first
    token, so the buffer must know (else the first completed group fails its admission-stamp check)."""
    cfg = _cfg()
    torch.manual_seed(0)
    model = for_generation(load_model(cfg))
    task = build_task(cfg, vocab_size=model.config.vocab_size)
    worker = build_rollout_worker(cfg, model, task, version=0)
    worker.admit_available()
    worker.drain()
    assert worker.buffer.assemble_batch(0) is not None  # step 0 trained; its weights not yet in the generator
    with worker.lock:
        state = worker.state()
    assert state["buffer"].generator_version == 0 and not state["buffer"].can_admit()

    resumed = build_rollout_worker(cfg, model, task, version=1, resume=state)
    assert resumed.buffer.generator_version == 1
    assert resumed.admit_available() == 2  # step 0's slots are free under version 1
    resumed.drain()
    batch = resumed.buffer.assemble_batch(1)
    assert batch is not None and max(1 - g.min_admission_version for g in batch.groups) <= 1
