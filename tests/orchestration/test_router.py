"""The router of the Ray backend: least-loaded assignment, groups stay on their generator, a dead
generator's groups come back for reassignment exactly once."""

import pytest

from zeromismatch.orchestration.router import Router


def test_least_loaded_with_ties_to_the_lowest_index():
    r = Router(3)
    assert [r.assign(t, ("start", t)) for t in range(5)] == [0, 1, 2, 0, 1]
    assert r.load() == [2, 2, 1]
    r.done(0)  # generator 0 finishes a group: it is now among the least loaded
    assert r.load() == [1, 2, 1]
    assert r.assign(5, ("start", 5)) == 0


def test_a_group_stays_on_its_generator_until_done():
    r = Router(2)
    r.assign(7, "s7")
    r.assign(8, "s8")
    for _ in range(3):  # more admissions never move an assigned group
        r.assign(max(r._where) + 1, "x")
    assert r.generator_of(7) == 0 and r.generator_of(8) == 1
    assert r.done(7) == "s7" and r.generator_of(7) is None
    with pytest.raises(ValueError):
        r.assign(8, "again")


def test_lost_generator_returns_its_groups_in_ticket_order_once():
    r = Router(2)
    for t in range(6):
        r.assign(t, ("start", t))
    r.done(2)
    assert r.lost(0) == [("start", 0), ("start", 4)]
    assert r.lost(0) == []
    assert r.load() == [0, 3]
    assert [s for s in r.in_flight()] == [("start", 1), ("start", 3), ("start", 5)]
    assert r.assign(9, ("start", 9)) == 0  # the restarted generator is the least loaded
