"""Multi-turn rollouts through RolloutWorker (generator/episodes.py) on the built-in toy_multiturn task: the Sample layout
(model turns in the loss, tool tokens out), parity of every model token of every turn with the trainer's packed
forward (bi, bi_chunk: torch.equal), admission versions per turn and the group age across a weight swap,
truncation by the turn limit and the context cap (reward 0), ToolError and closing episodes."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.generator.episodes import EpisodeLimits
from zeromismatch.models.qwen3_5 import build_model
from zeromismatch.orchestration import RolloutWorker
from zeromismatch.rl.losses import loss_config
from zeromismatch.rl.metrics import mismatch_metrics
from zeromismatch.rl.offpolicy import Batch, RunAheadBuffer, age
from zeromismatch.rl.types import Group
from zeromismatch.tasks.base import TurnResult
from zeromismatch.tasks.toy_multiturn import ToyEpisode, ToyMultiTurnTask, tool_output
from zeromismatch.trainer.trainer import Trainer, aligned_logprobs

VOCAB = 2048


def make_worker(model, task, *, g=3, prompts=2, max_slots=4, max_turns=3, context=None, per_turn=8, policy="keep",
                env_workers=2, temperature=1.0, num_blocks=None):
    engine = Engine(model, max_slots=max_slots, max_batched_tokens=128, max_model_len=512, swap_policy=policy,
                    num_blocks=num_blocks)
    params = SamplingParams(temperature=temperature, max_new_tokens=per_turn, stop_token_ids=task.stop_token_ids)
    return RolloutWorker(engine, task, RunAheadBuffer(0, prompts), g, params, seed=0, swap_policy=policy,
                         limits=EpisodeLimits(max_turns, context), env_workers=env_workers)


def run_groups(worker) -> list[Group]:
    worker.admit_available()
    worker.drain()
    worker.close()
    return worker.buffer.untrained_groups()


def samples_of(groups):
    return [s for g in groups for s in g.samples]


def long_prompt_task(**kw) -> ToyMultiTurnTask:
    # prompts past one 64-token block: the samples of a group share prefix-cache entries
    return ToyMultiTurnTask(VOCAB, seed=0, min_len=70, max_len=140, **kw)


def assert_layout(s, task):
    """prompt + turn 0 + tool 0 + turn 1 + ...: loss mask on the model tokens, NaN / -1 on the rest, and the tool
    tokens are the toy tool's output for the turn before them."""
    p = s.prompt_ids.numel()
    pos, model_pos = p, []
    for k, turn in enumerate(s.turns):
        n = len(turn.tokens)
        assert s.token_ids[pos : pos + n].tolist() == list(turn.tokens)
        model_pos += range(pos, pos + n)
        pos += n
        if k + 1 < len(s.turns):
            tool = tool_output(turn.tokens, k, VOCAB)
            assert s.token_ids[pos : pos + len(tool)].tolist() == tool
            pos += len(tool)
    assert pos == s.token_ids.numel()
    mask = torch.zeros_like(s.loss_mask)
    mask[model_pos] = 1
    assert torch.equal(s.loss_mask, mask)
    assert torch.isnan(s.gen_logprobs[~mask.bool()]).all() and torch.isfinite(s.gen_logprobs[mask.bool()]).all()
    assert (s.gen_version[~mask.bool()] == -1).all() and (s.gen_version[mask.bool()] >= 0).all()


# ------------------------------------------------------------------------------------------ parity across turns
@pytest.mark.parametrize("numerics", ["bi", "bi_chunk"])
def test_every_turn_is_bitwise_with_the_trainer(tiny_models, numerics):
    """6 episodes of 2-3 turns on 4 slots and 5 KV blocks (sequences preempted and recomputed, continuous
    batching), tool output appended, prefix-cache hits between the samples of a group: the trainer's packed
    forward over each whole sequence gives every model token's logprob bit for bit."""
    model = tiny_models("tiny", numerics)
    task = long_prompt_task()
    worker = make_worker(model, task, num_blocks=5)
    groups = run_groups(worker)
    samples = samples_of(groups)
    assert len(samples) == 6 and task.live_episodes == 0
    assert {len(s.turns) for s in samples} == {2, 3} and all(s.finish == "done" for s in samples)
    assert worker.engine.stats["prefix_hit_tokens"] > 0
    assert worker.engine.stats["parked_preemptions"] + worker.engine.stats["preemptions"] > 0
    assert len(worker.engine.free_slots) == 4  # every parked request released
    for s in samples:
        assert_layout(s, task)
    with torch.no_grad():
        trainer = aligned_logprobs(model, samples)
    for s, lp in zip(samples, trainer):
        m = s.loss_mask.bool()
        assert torch.equal(lp[m], s.gen_logprobs[m])
        assert s.reward == sum(t.tokens[0] < VOCAB // 2 for t in s.turns) / len(s.turns)  # the episode's reward


def test_stock_runs_and_differs(tiny_models):
    model = tiny_models("tiny", "stock")
    samples = samples_of(run_groups(make_worker(model, long_prompt_task())))
    with torch.no_grad():
        trainer = aligned_logprobs(model, samples)
    diffs = [(lp - s.gen_logprobs)[s.loss_mask.bool()].abs().max() for s, lp in zip(samples, trainer)]
    assert max(diffs) > 0


def perturbed(model, seed=9, scale=0.02):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def run_with_swap(numerics, policy):
    """Two groups (offpolicy 1, one prompt a step); as soon as the first is complete it is trained (step 0) and
    version 1 goes to the generator: the second group's later turns are admitted under it."""
    gen_model = build_model("tiny", numerics, seed=1).eval()
    v0 = copy.deepcopy(gen_model)
    new = perturbed(gen_model)
    v1 = copy.deepcopy(gen_model)
    v1.load_state_dict(new)
    task = long_prompt_task()
    engine = Engine(gen_model, max_slots=4, max_batched_tokens=128, max_model_len=512, swap_policy=policy)
    params = SamplingParams(max_new_tokens=8)
    worker = RolloutWorker(engine, task, RunAheadBuffer(1, 1), 3, params, seed=0, swap_policy=policy,
                           limits=EpisodeLimits(3), env_workers=2)
    assert worker.admit_available() == 2
    while worker.buffer.num_ready == 0:
        worker.step()
    first = worker.buffer.assemble_batch(0)
    worker.apply_weights(1, new)
    worker.drain()
    worker.close()
    second = worker.buffer.assemble_batch(1)
    return first.groups[0], second, v0, v1, task


@pytest.mark.parametrize("numerics", ["bi", "bi_chunk"])
@pytest.mark.parametrize("policy", ["keep", "recompute"])
def test_weight_swap_between_turns(numerics, policy):
    """Admission versions per turn (a turn started after the swap says 1), the group's age from its oldest turn,
    and parity per token under the weights that sampled it: tokens sampled before the swap equal the trainer
    under version 0; under 'recompute' the tokens after it equal the trainer under version 1 (their whole
    context was recomputed). Under 'keep' a post-swap token decodes from a cache of both versions, so no
    single-version rescoring reproduces it: the precision part of the staleness split. Such samples say so
    (Sample.mixed_versions); every sample that does not is reproduced token by token under its versions."""
    first, second, v0, v1, task = run_with_swap(numerics, policy)
    assert task.live_episodes == 0
    versions = [[t.admission_version for t in s.turns] for s in second.groups[0].samples]
    assert all(v == sorted(v) for v in versions)  # a later turn is never admitted under older weights
    assert any(v[0] == 0 and v[-1] == 1 for v in versions)  # some episode spans the swap between turns
    assert all(t.admission_version == 0 for s in first.samples for t in s.turns)
    # the group's age is measured from its oldest turn: admitted under 0, consumed by step 1
    assert second.groups[0].min_admission_version == 0 and age(second.groups[0], 1) == 1
    assert second.stats["train_batch/policy_age_max"] == 1.0
    samples = first.samples + second.groups[0].samples
    with torch.no_grad():
        lp0, lp1 = aligned_logprobs(v0, samples), aligned_logprobs(v1, samples)
    n_new = 0
    for s, a, b in zip(samples, lp0, lp1):
        m = s.loss_mask.bool()
        old, newer = m & (s.gen_version == 0), m & (s.gen_version == 1)
        assert torch.equal(a[old], s.gen_logprobs[old])
        n_new += int(newer.sum())
        assert s.mixed_versions is not None and not (policy == "recompute" and s.mixed_versions)
        if policy == "keep" and old.any() and newer.any():
            assert s.mixed_versions  # its later turn decoded on the cache its first turn left under version 0
        if not s.mixed_versions:
            assert torch.equal(b[newer], s.gen_logprobs[newer])
    assert n_new > 0
    assert any(s.mixed_versions for s in samples) is (policy == "keep")


# --------------------------------------------------------------------------------------------- masks
def test_loss_and_metrics_ignore_tool_tokens(tiny_models):
    """Garbage in the generator fields of tool tokens changes neither the mismatch metrics nor the train step
    (loss, gradients, updated weights)."""
    model = tiny_models("tiny", "bi")
    samples = samples_of(run_groups(make_worker(model, long_prompt_task(), g=6, prompts=1)))
    assert len({s.reward for s in samples}) > 1  # the group carries a learning signal
    garbage = []
    for s in samples:
        t = copy.deepcopy(s)
        tool = (t.loss_mask == 0) & (torch.arange(t.token_ids.numel()) >= t.prompt_ids.numel())
        assert tool.any()
        t.gen_logprobs[tool] = 7.5
        t.gen_version[tool] = 0
        garbage.append(t)
    with torch.no_grad():
        lps = aligned_logprobs(model, samples)
    for a, b, lp in zip(samples, garbage, lps):
        assert mismatch_metrics(lp, a.gen_logprobs, a.loss_mask) == mismatch_metrics(lp, b.gen_logprobs, b.loss_mask)

    def train(batch_samples):
        trainer = Trainer(copy.deepcopy(model).train().requires_grad_(True), lr=1e-3, loss=loss_config("dapo"),
                          grad_clip=None, drop_zero_spread=False)
        m = trainer.train_step(Batch(0, [Group(0, batch_samples)]))
        return {k: v for k, v in m.items() if not k.startswith("perf/")}, trainer.model.state_dict()

    (m_a, w_a), (m_b, w_b) = train(samples), train(garbage)
    assert m_a == m_b and m_a["bit_wise/logprob_diff/abs_mean"] == 0.0
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)


# ------------------------------------------------------------------------------------- concurrency
class _BlockingTask(ToyMultiTurnTask):
    """Sample 0's tool call blocks until every other episode has finished: they can only finish if the engine
    keeps decoding while that tool runs."""

    def __init__(self, n_others):
        super().__init__(VOCAB, seed=0)
        self.n_others, self.finished, self.lock = n_others, 0, threading.Lock()
        self.others_done = threading.Event()

    def start_episode(self, item, sample_index):
        with self._lock:
            self.live_episodes += 1
        return _BlockingEpisode(self, item, sample_index)


class _BlockingEpisode(ToyEpisode):
    def __init__(self, task, item, j):
        super().__init__(task, item)
        self.j = j

    def step(self, response_ids, finish_reason):
        self.responses.append(list(response_ids))
        if self.j == 0 and len(self.responses) == 1:
            assert self.task.others_done.wait(timeout=60), "the engine did not decode while a tool ran"
            return TurnResult([1, 2, 3])
        return TurnResult(done=True)

    def close(self):
        super().close()
        if self.j != 0:
            with self.task.lock:
                self.task.finished += 1
                if self.task.finished == self.task.n_others:
                    self.task.others_done.set()


def test_other_sequences_decode_while_a_tool_runs(tiny_models):
    task = _BlockingTask(n_others=3)
    worker = make_worker(tiny_models("tiny", "bi"), task, g=4, prompts=1)
    samples = samples_of(run_groups(worker))
    assert [len(s.turns) for s in samples] == [2, 1, 1, 1] and task.live_episodes == 0


class _HangingTask(ToyMultiTurnTask):
    """Every tool call hangs until released: a stuck sandbox."""

    def __init__(self):
        super().__init__(VOCAB, seed=0)
        self.release = threading.Event()

    def start_episode(self, item, sample_index):
        episode = super().start_episode(item, sample_index)
        episode.step = lambda response_ids, finish_reason: (self.release.wait(60), TurnResult(done=True))[1]
        return episode


def test_close_closes_episodes_whose_tool_hangs(tiny_models):
    task = _HangingTask()
    worker = make_worker(tiny_models("tiny", "bi"), task, g=2, prompts=1)
    worker.admit_available()
    while len(worker.episodes.pending) < 2:  # both first turns done, both tools hanging
        worker.step()
    t0 = time.perf_counter()
    worker.episodes.close(wait_s=0.2)
    assert time.perf_counter() - t0 < 5 and task.live_episodes == 0
    task.release.set()
