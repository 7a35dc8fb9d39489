"""A randomized multi-turn workload under memory pressure: requests arrive, finish turns and park, continue with
tool output or are released, weights swap under both policies, and few slots and blocks force preemption and
prefix-cache eviction, with the CUDA-graph runner's path (run without capture on the CPU). At every forward the
cache manager's state must be consistent, since on CUDA a bad slot or block reaches a kernel as an address:
- every scheduled sequence is running and holds its own slot, in range, and a block table covering its piece;
- no free slot is held, no slot held twice; free blocks have no references, and every block's reference count
  is the number of live sequences and prefix-cache entries that hold it;
- the graph path sees only decode rows that sample (a graph returns a logit row for every row).
At the end every request is released and nothing leaks."""

import random

import pytest
from gen_helpers import MICRO, VOCAB, assert_no_leak

from zeromismatch.generator import Engine, SamplingParams
from zeromismatch.generator.cache import BLOCK_SIZE
from zeromismatch.generator.scheduler import Work
from zeromismatch.models.qwen3_5 import build_model


def check_state(eng: Engine, work) -> None:
    live = eng.running + list(eng.parked.values())
    held = [s.slot for s in live if s.slot >= 0]
    assert len(held) == len(set(held)), "a slot held by two sequences"
    assert all(0 <= s < eng.max_slots for s in held)
    assert not set(held) & set(eng.free_slots), "a held slot is on the free list"
    assert len(eng.free_slots) == len(set(eng.free_slots)) == eng.max_slots - len(held)
    refs = [0] * eng.num_blocks
    for s in live + list(eng.waiting):
        for b in s.block_table:
            refs[b] += 1
    if eng.prefix is not None:
        for e in eng.prefix.entries.values():
            refs[e.block] += 1
    assert refs == eng.alloc.ref, "block reference counts disagree with their holders"
    assert all(eng.alloc.ref[b] == 0 for b in eng.alloc.free) and len(set(eng.alloc.free)) == len(eng.alloc.free)
    for w in work:
        s = w.seq
        assert s in eng.running and s.slot >= 0
        assert len(s.block_table) * BLOCK_SIZE >= s.num_computed + w.n_tokens


def run_workload(seed: int, mode: str, iterations: int = 300, device_sampling: bool = False) -> dict:
    """The workload of `seed` (experiments/gpu/bounds_check.py runs it with the kernels interpreted)."""
    rng = random.Random(seed)
    model = build_model("tiny", mode, seed=1, **MICRO).eval()
    eng = Engine(model, max_slots=rng.choice([4, 6, 8]), num_blocks=rng.choice([8, 10, 12]),
                 max_batched_tokens=rng.choice([64, 128]), max_model_len=512, cuda_graphs=True,
                 device_sampling=device_sampling)
    execute, replay, replay_staged = eng.runner.execute, eng.runner._replay, eng.runner.replay_staged
    eng.stats["one_token_pieces"] = 0  # one-token pieces that sample nothing (a prefill cut at a block boundary)

    def checked_execute(work, tap=None):
        check_state(eng, work)
        eng.stats["one_token_pieces"] += sum(w.n_tokens == 1 and not w.samples for w in work)
        return execute(work, tap)

    def checked_replay(work):
        assert all(w.n_tokens == 1 and w.samples for w in work), "a graph replay of a row that does not sample"
        return replay(work)

    def checked_replay_staged(staged):  # a step queued a step ahead (Engine.stage_ahead) is checked the same way
        check_state(eng, [Work(s, 1) for s in staged.seqs])
        assert all(s.num_uncomputed == 1 for s in staged.seqs), "a staged row that is not the next decode row"
        return replay_staged(staged)

    eng.runner.execute, eng.runner._replay, eng.runner.replay_staged = (checked_execute, checked_replay,
                                                                        checked_replay_staged)
    turns: dict[int, int] = {}
    prompts: list[list[int]] = []
    for i in range(iterations):
        if len(turns) < 30 and rng.random() < 0.3:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 150))]
            if prompts and rng.random() < 0.5:  # a sample of an earlier prompt's group: prefix-cache hits
                prompt = rng.choice(prompts)[: rng.randint(BLOCK_SIZE + 1, 150)] + prompt[:10]
            prompts.append(prompt)
            rid = eng.add_request(prompt, SamplingParams(seed=i, max_new_tokens=rng.randint(1, 20), keep_cache=True))
            turns[rid] = 0
        if rng.random() < 0.05:
            sd = {k: v + 1e-3 for k, v in model.state_dict().items()}
            eng.update_weights(sd, policy=rng.choice(["keep", "recompute"]))
        if eng.has_work():
            eng.step()
        for rid in list(eng.parked):
            r, seq = rng.random(), eng.parked[rid]
            if r < 0.3 and turns[rid] < 4 and len(seq.tokens) + 60 < 512:
                turns[rid] += 1
                tool = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
                eng.continue_request(rid, tool, SamplingParams(seed=rid, max_new_tokens=rng.randint(1, 15),
                                                               keep_cache=True))
            elif r < 0.45:
                eng.release(rid)
    while eng.has_work() or eng.parked:
        eng.step()
        for rid in list(eng.parked):
            eng.release(rid)
    assert_no_leak(eng)
    return {**eng.stats, **eng.runner.stats}


SEEDS = [0, 1, 4, 5]
HARD_PATHS = ("preemptions", "parked_preemptions", "prefix_hit_tokens", "one_token_pieces", "mixed_steps",
              "staged_steps")


@pytest.fixture(scope="module")
def reached():
    """How often the workloads took each hard path, summed over the seeds the test below ran."""
    return dict.fromkeys(HARD_PATHS, 0)


@pytest.mark.parametrize("mode,seed", [("bi", s) for s in SEEDS] + [("bi_chunk", SEEDS[0])])
def test_random_multi_turn_workload_keeps_the_cache_consistent(mode, seed, reached):
    stats = run_workload(seed, mode)
    assert stats["steps"] > 100
    for k in HARD_PATHS:
        reached[k] += stats[k]


def test_the_workloads_reach_the_hard_paths(reached):
    """The workloads above are not idle (else the checks could pass without reaching what they guard): they
    preempt running and parked sequences, hit the prefix cache and cut one-token pieces at block boundaries, run
    decode rows by graph beside eager prefill pieces, and replay steps staged a step ahead."""
    if not any(reached.values()):
        pytest.skip("run with the workload test above")
    missing = [k for k in HARD_PATHS if not reached[k]]
    assert not missing, reached
