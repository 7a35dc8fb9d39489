import random

import pytest

from zeromismatch.rl.offpolicy import RunAheadBuffer, age, keep
from zeromismatch.rl.types import Group

# ---- drop rule ------------------------------------------------------------------------------------


def test_age_uses_oldest_turn_of_any_sample(make_sample):
    # one sample started at 10, another at 12 with a second turn at 13: age measured from 10
    g = Group("p", [make_sample(turn_versions=(12, 13)), make_sample(turn_versions=(10,))])
    assert age(g, 14) == 4
    with pytest.raises(ValueError):
        age(g, 9)


@pytest.mark.parametrize("n, consumer, kept", [(4, 14, True), (4, 15, False), (0, 10, True), (0, 11, False)])
def test_keep_boundaries(make_group, n, consumer, kept):
    g = make_group("p", version=10)
    assert keep(g, consumer, n) is kept


def test_keep_rejects_negative_n(make_group):
    with pytest.raises(ValueError):
        keep(make_group("p"), 0, -1)


# ---- slots ----------------------------------------------------------------------------------------


def test_buffer_capacity_is_n_plus_one_times_prompts_per_step():
    buf = RunAheadBuffer(n=4, prompts_per_step=3)
    assert buf.capacity == 15
    for i in range(15):
        assert buf.can_admit()
        buf.admit(i)
    assert not buf.can_admit() and buf.slots_held == 15
    with pytest.raises(RuntimeError):
        buf.admit(99)


def test_slots_free_only_when_trained_weights_reach_generator(make_group):
    buf = RunAheadBuffer(n=1, prompts_per_step=2)  # 4 slots
    tickets = [buf.admit(i) for i in range(4)]
    for i, t in enumerate(tickets):
        buf.complete(t, make_group(i, version=0))
    batch = buf.assemble_batch(0)
    assert [g.prompt_id for g in batch.groups] == [0, 1]
    # trained on, but the new weights are not in the generator yet: slots still held
    assert buf.slots_held == 4 and not buf.can_admit()
    with pytest.raises(ValueError):
        buf.release_after_weights_reached_generator(1)  # step 1 not even assembled
    assert buf.release_after_weights_reached_generator(0) == 2
    assert buf.generator_version == 1 and buf.slots_held == 2
    with pytest.raises(ValueError):
        buf.release_after_weights_reached_generator(0)  # already live
    # new admissions are stamped with the new version; groups 2, 3 (version 0) are age 1 at step 1: kept
    t4, t5 = buf.admit(4), buf.admit(5)
    batch = buf.assemble_batch(1)
    assert [g.prompt_id for g in batch.groups] == [2, 3]
    assert batch.stats["train_batch/policy_age"] == 1.0 and batch.stats["offpolicy/dropped_stale"] == 0
    buf.complete(t4, make_group(4, version=1))
    buf.complete(t5, make_group(5, version=1))
    # a lagging generator may skip a version: release(2) frees steps 1 and 2 at once
    assert buf.assemble_batch(2) is not None
    assert buf.release_after_weights_reached_generator(2) == 4
    assert buf.slots_held == 0 and buf.generator_version == 3


def test_complete_checks_ticket_and_version_stamps(make_group):
    buf = RunAheadBuffer(n=1, prompts_per_step=1)
    t = buf.admit("a")
    with pytest.raises(ValueError):
        buf.complete(t, make_group("b"))  # wrong prompt
    with pytest.raises(ValueError):
        buf.complete(t, make_group("a", version=1))  # generator never had version 1
    buf.complete(t, make_group("a", version=0))
    with pytest.raises(KeyError):
        buf.complete(t, make_group("a"))  # twice


def test_n0_is_synchronous_on_policy(make_group):
    p = 2
    buf = RunAheadBuffer(n=0, prompts_per_step=p)
    for step in range(3):
        # the generator may only run this step's prompts, with this step's weights
        tickets = [buf.admit((step, i)) for i in range(p)]
        assert not buf.can_admit()
        for i, t in enumerate(tickets):
            buf.complete(t, make_group((step, i), version=buf.generator_version))
        batch = buf.assemble_batch(step)
        assert batch.stats["train_batch/policy_age_max"] == 0.0
        assert not buf.can_admit()  # nothing for step + 1 until the new weights are live
        buf.release_after_weights_reached_generator(step)
        assert buf.generator_version == step + 1


# ---- batch assembly -------------------------------------------------------------------------------


def test_stale_group_dropped_counted_and_slot_freed_at_once(make_group):
    buf = RunAheadBuffer(n=1, prompts_per_step=1)  # 2 slots
    ta, tb = buf.admit("a"), buf.admit("b")  # both at version 0; "a" is a long rollout
    buf.complete(tb, make_group("b", version=0))
    assert [g.prompt_id for g in buf.assemble_batch(0).groups] == ["b"]
    buf.release_after_weights_reached_generator(0)
    tc = buf.admit("c")
    buf.complete(tc, make_group("c", version=1))
    assert [g.prompt_id for g in buf.assemble_batch(1).groups] == ["c"]
    buf.release_after_weights_reached_generator(1)
    td = buf.admit("d")
    buf.complete(ta, make_group("a", version=0))  # finally done: age 2 at step 2
    assert buf.slots_held == 2
    assert buf.assemble_batch(2) is None  # "a" dropped, "d" still generating
    assert buf.slots_held == 1 and buf.can_admit()  # the stale group's slot is free already
    buf.complete(td, make_group("d", version=2))
    batch = buf.assemble_batch(2)
    assert [g.prompt_id for g in batch.groups] == ["d"]
    assert batch.stats["offpolicy/dropped_stale"] == 1.0 and buf.dropped_stale_total == 1


def test_filter_replaces_rejected_groups_without_deadlock(make_group):
    # N = 0 with a zero-spread filter: the rejected group's slot must free at once, or the step
    # would wait forever for a replacement that could never be admitted.
    spread = lambda g: bool(g.rewards.max() > g.rewards.min())  # noqa: E731
    buf = RunAheadBuffer(n=0, prompts_per_step=2, group_filter=spread)
    ta, tb = buf.admit("a"), buf.admit("b")
    buf.complete(ta, make_group("a", rewards=(1.0, 1.0)))
    buf.complete(tb, make_group("b", rewards=(0.0, 1.0)))
    assert buf.assemble_batch(0) is None
    assert buf.can_admit() and buf.generator_version == 0  # replacement runs with the same weights
    tc = buf.admit("c")
    buf.complete(tc, make_group("c", rewards=(1.0, 0.0)))
    batch = buf.assemble_batch(0)
    assert [g.prompt_id for g in batch.groups] == ["b", "c"]
    assert batch.stats["offpolicy/dropped_filtered"] == 1.0
    with pytest.raises(ValueError):
        buf.assemble_batch(0)  # steps are assembled once, in order


def simulate(make_group, n, p, latency, steps=30, train_ticks=3, sync_ticks=1, rewards=None, **buffer_kw):
    """Single-threaded discrete-event run of generator and trainer through the buffer.

    Each tick: new weights that arrived are released, the generator fills every free slot, groups whose
    generation (latency(i) ticks for the i-th admitted group) is done complete, and an idle trainer
    assembles the next batch; training takes train_ticks and the weights reach the generator sync_ticks
    later. The trainer does not wait for its weights to arrive before assembling the next step (async).
    """
    buf = RunAheadBuffer(n=n, prompts_per_step=p, **buffer_kw)
    rewards = rewards or (lambda i: (0.0, 1.0))
    in_flight = []  # (finish_tick, ticket, prompt_id, version)
    batches, trained_until, arrivals = [], None, []  # arrivals: (tick, step) weights reach generator
    admitted, step, tick = 0, 0, 0
    while len(batches) < steps:
        for when, s in [a for a in arrivals if a[0] <= tick]:
            buf.release_after_weights_reached_generator(s)
            arrivals.remove((when, s))
        while buf.can_admit():
            in_flight.append((tick + latency(admitted), buf.admit(admitted), admitted, buf.generator_version))
            admitted += 1
        done = sorted(x for x in in_flight if x[0] <= tick)
        for x in done:
            in_flight.remove(x)
            buf.complete(x[1], make_group(x[2], rewards=rewards(x[2]), version=x[3]))
        if trained_until is None or tick >= trained_until:
            batch = buf.assemble_batch(step)
            if batch is not None:
                batches.append(batch)
                trained_until = tick + train_ticks
                arrivals.append((trained_until + sync_ticks, step))
                step += 1
        assert buf.slots_held <= buf.capacity
        tick += 1
    return batches, buf


@pytest.mark.parametrize("n", [0, 1, 3])
def test_in_order_completion_never_drops_and_runs_exactly_n_ahead(make_group, n):
    batches, buf = simulate(make_group, n, p=4, latency=lambda i: 1)
    ages = [b.stats["train_batch/policy_age_max"] for b in batches]
    assert max(ages) == n  # a fast generator uses the whole window...
    assert buf.dropped_stale_total == 0  # ...and the buffer alone keeps it inside the window
    assert all(b.stats["train_batch/policy_age"] == n for b in batches[n + 1 :])  # steady state


@pytest.mark.parametrize("n", [1, 2])
def test_out_of_order_completion_drops_only_what_is_too_old(make_group, n):
    rng = random.Random(0)
    lat = [rng.choice([1, 1, 1, 2, 25]) for _ in range(10_000)]  # occasional very long rollouts
    batches, buf = simulate(make_group, n, p=4, latency=lambda i: lat[i])
    assert buf.dropped_stale_total > 0
    assert all(b.stats["train_batch/policy_age_max"] <= n for b in batches)
    assert all(len(b.groups) == 4 for b in batches)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_admission_order_never_drops_stale_even_with_stragglers_and_filter(make_group, n):
    # Same stragglers, plus a zero-spread filter that rejects every third group. Consuming in admission
    # order, the (N + 1) * P window alone keeps every group fresh: the drop rule never fires.
    rng = random.Random(0)
    lat = [rng.choice([1, 1, 1, 2, 25]) for _ in range(10_000)]
    batches, buf = simulate(
        make_group,
        n,
        p=4,
        latency=lambda i: lat[i],
        order="admission",
        rewards=lambda i: (1.0, 1.0) if i % 3 == 0 else (0.0, 1.0),
        group_filter=lambda g: bool(g.rewards.max() > g.rewards.min()),
    )
    assert buf.dropped_stale_total == 0 and buf.dropped_filtered_total > 0
    assert all(b.stats["train_batch/policy_age_max"] <= n for b in batches)
    # batches are in admission order: prompt ids strictly increase across the whole run
    ids = [g.prompt_id for b in batches for g in b.groups]
    assert ids == sorted(ids) and all(i % 3 for i in ids)


def test_admission_order_waits_for_the_oldest_group(make_group):
    buf = RunAheadBuffer(n=1, prompts_per_step=1, order="admission")
    ta, tb = buf.admit("a"), buf.admit("b")
    buf.complete(tb, make_group("b"))
    assert buf.assemble_batch(0) is None and buf.num_ready == 1  # "b" waits behind "a"
    buf.complete(ta, make_group("a"))
    assert [g.prompt_id for g in buf.assemble_batch(0).groups] == ["a"]
    buf.release_after_weights_reached_generator(0)
    assert [g.prompt_id for g in buf.assemble_batch(1).groups] == ["b"]
