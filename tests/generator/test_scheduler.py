"""scheduler.schedule in isolation, on fake sequences: decode-first, token budget, max_seqs, and the 64-token
block-boundary rules for prefill pieces (budget cuts and the last boundary before the end of known tokens)."""

import random
from dataclasses import dataclass

import pytest

from zeromismatch.generator.cache import BLOCK_SIZE
from zeromismatch.generator.scheduler import schedule


@dataclass(eq=False)
class FakeSeq:
    name: str
    num_tokens: int
    num_computed: int = 0

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed


def decode(name, n=100):
    return FakeSeq(name, n, n - 1)


def plan(work):
    return [(w.seq.name, w.n_tokens) for w in work]


def test_decode_rows_first_whatever_the_running_order():
    seqs = [FakeSeq("p0", 30), decode("d0"), FakeSeq("p1", 20), decode("d1", 7)]
    assert plan(schedule(seqs, 1000, 8)) == [("d0", 1), ("d1", 1), ("p0", 30), ("p1", 20)]


def test_decode_rows_always_scheduled_even_over_the_budget():
    seqs = [FakeSeq("p", 50)] + [decode(f"d{i}") for i in range(5)]
    # budget 2 < 5 decodes: every decode row still runs, no prefill gets any token
    assert plan(schedule(seqs, 2, 8)) == [(f"d{i}", 1) for i in range(5)]


def test_prefill_gets_what_the_decodes_leave():
    seqs = [decode("d0"), decode("d1"), FakeSeq("p0", 40), FakeSeq("p1", 40)]
    # 100 - 2 decodes = 98: p0 whole (40), p1 would fit whole too (40 <= 58)
    assert plan(schedule(seqs, 100, 8)) == [("d0", 1), ("d1", 1), ("p0", 40), ("p1", 40)]
    # 60 - 2 = 58: p0 40, p1 cut to 18 -> no block boundary inside [0, 18): p1 waits, budget unused
    assert plan(schedule(seqs, 60, 8)) == [("d0", 1), ("d1", 1), ("p0", 40)]


def test_budget_cut_stops_at_a_block_boundary():
    s = FakeSeq("p", 300)
    assert plan(schedule([s], 100, 4)) == [("p", 64)]  # 100 -> down to the boundary at 64
    s.num_computed = 64
    assert plan(schedule([s], 150, 4)) == [("p", 128)]  # 64 + 150 = 214 -> boundary 192
    s.num_computed = 70  # unaligned start (a multi-turn continuation): boundaries stay absolute
    assert plan(schedule([s], 100, 4)) == [("p", 58)]  # 170 -> 128
    s.num_computed = 70
    assert plan(schedule([s], 50, 4)) == []  # 120 -> 64 <= 70: no boundary reachable, nothing to run


def test_budget_cut_skips_to_a_later_sequence_that_fits():
    big, small = FakeSeq("big", 500), FakeSeq("small", 10)
    # big cannot reach a boundary with 40 tokens; the budget goes to small instead of being wasted
    assert plan(schedule([big, small], 40, 4)) == [("small", 10)]


@pytest.mark.parametrize(
    "n_tokens, pieces",
    [
        (10, [10]),
        (64, [64]),  # last boundary strictly before the end is 0: one piece
        (65, [64, 1]),
        (128, [64, 64]),
        (200, [192, 8]),  # only the LAST boundary is forced, earlier ones are passed inside the piece
        (257, [256, 1]),
    ],
)
def test_prefill_stops_at_the_last_boundary_before_the_end(n_tokens, pieces):
    s, got = FakeSeq("p", n_tokens), []
    while s.num_uncomputed:
        (w,) = schedule([s], 10_000, 4)
        got.append(w.n_tokens)
        s.num_computed += w.n_tokens
    assert got == pieces


def test_a_piece_samples_only_when_it_reaches_the_last_known_token():
    s = FakeSeq("p", 200)
    (first,) = schedule([s], 10_000, 4)  # 192 tokens: stops at the last boundary, samples nothing
    s.num_computed += first.n_tokens
    assert not first.samples  # fixed when scheduled, not moved by the sequence's progress
    (rest,) = schedule([s], 10_000, 4)
    assert rest.n_tokens == 8 and rest.samples
    assert schedule([decode("d")], 10, 4)[0].samples


def test_max_seqs_caps_the_rows():
    seqs = [FakeSeq(f"p{i}", 10) for i in range(5)]
    assert plan(schedule(seqs, 1000, 3)) == [("p0", 10), ("p1", 10), ("p2", 10)]
    seqs = [decode(f"d{i}") for i in range(3)] + [FakeSeq("p", 10)]
    assert plan(schedule(seqs, 1000, 3)) == [("d0", 1), ("d1", 1), ("d2", 1)]


def test_fully_computed_sequences_are_not_scheduled():
    done = FakeSeq("done", 50, 50)
    assert schedule([done], 100, 4) == []


def test_random_invariants():
    """Property check over random mixes: decode rows all present and first, budget respected once decodes
    are paid for, every budget-cut piece ends on a block boundary, no piece crosses the last boundary
    before the end of the known tokens, no sequence twice, no empty piece."""
    rng = random.Random(0)
    for _ in range(3000):
        seqs = []
        for i in range(rng.randint(1, 10)):
            if rng.random() < 0.4:
                seqs.append(decode(f"s{i}", rng.randint(1, 600)))
            else:
                n = rng.randint(1, 600)
                seqs.append(FakeSeq(f"s{i}", n, rng.choice([0, 0, rng.randint(0, n - 1), rng.randrange(0, n, 64)])))
        budget, max_seqs = rng.randint(1, 400), rng.randint(len(seqs), 12)
        work = schedule(seqs, budget, max_seqs)
        n_dec = sum(s.num_uncomputed == 1 for s in seqs)
        assert [w.seq for w in work[:n_dec]] == [s for s in seqs if s.num_uncomputed == 1]
        assert all(w.n_tokens == 1 for w in work[:n_dec])
        assert len({id(w.seq) for w in work}) == len(work) <= max_seqs
        prefill_tokens = sum(w.n_tokens for w in work[n_dec:])
        assert prefill_tokens <= max(0, budget - n_dec)
        for w in work[n_dec:]:
            s, n = w.seq, w.n_tokens
            assert 1 <= n <= s.num_uncomputed
            end = s.num_computed + n
            if n < s.num_uncomputed:
                assert end % BLOCK_SIZE == 0, (s, n, budget)
            last = (s.num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
            assert not (s.num_computed < last < end), (s, n)


def test_prefill_held_back_schedules_decode_rows_only():
    seqs = [FakeSeq("p0", 30), decode("d0"), FakeSeq("p1", 20), decode("d1", 7)]
    assert plan(schedule(seqs, 1000, 8, prefill=False)) == [("d0", 1), ("d1", 1)]
    assert plan(schedule(seqs[::2], 1000, 8, prefill=False)) == []  # the engine never holds back without decode rows
