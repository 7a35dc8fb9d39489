"""offpolicy-N bookkeeping, as pure single-threaded logic.

Versions and steps. Weight version v = trainer weights after v optimizer steps (one step per batch).
Training step s consumes one batch with weights version s and produces version s + 1, so the
consumer version of step s is s. A run resumed at version V starts with step V (initial_version).

Age and drop rule. Every turn is stamped with the generator's weight version at admission. A group's
age is consumer_version - (oldest admission version of any of its turns); the group is kept iff
age <= N. Tokens decoded after a hot swap are newer than their turn's admission, so the age bounds
the staleness of every token of the group from above.

Run-ahead buffer. Generation is bounded by slots: (N + 1) * prompts_per_step groups may exist between
admission and release. A group takes a slot when admitted to the generator and keeps it while it
generates, waits as a complete group, and after it has been trained on by step s, until the weights of
step s (version s + 1) have reached the generator. Groups dropped by the assembler (stale, or rejected
by the optional filter) free their slot at once: they will never be trained on, and holding their slots
until the step finishes could deadlock (with N = 0 every slot would be held while the step waits for a
replacement that cannot be admitted).
Why (N + 1) * P bounds the age: when the generator admits a group g under version v, the slots of all
groups trained by steps < v are free, and dropped groups freed theirs, so fewer than (N + 1) * P
earlier-admitted groups can still be trained on. If batches take groups in admission order, g is
therefore trained by step v + N at the latest: age <= N, no stale drop ever. Taking groups in completion
order, a long rollout is overtaken by later ones and can age past N; the drop rule catches those.

N = 0 is synchronous on-policy: P slots, all freed only once the step's new weights are live, so the
generator can only run the current step's prompts, with the current weights, and every age is 0.

Batch assembly pops complete groups in FIFO order, drops stale ones, and returns exactly
prompts_per_step groups; a partial batch is kept across calls until it fills. Two FIFO orders:
- "completion" (default): the order of `complete` calls. The trainer never waits for a straggler, but
  which groups form a batch depends on timing, and long rollouts age (and get dropped).
- "admission": the order of `admit` calls; the head waits for the oldest group still generating.
  Which prompts form each batch then depends only on the admission sequence and the filter's verdicts,
  not on timing (reproducible across runs), and by the argument above no group is ever stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .metrics import policy_age_metrics, rollout_metrics
from .types import Group

__all__ = ["age", "keep", "Batch", "RunAheadBuffer"]


def window_groups(n: int, prompts_per_step: int) -> int:
    """How many groups the run-ahead buffer holds at once (admitted, generating or waiting): (N + 1) x P."""
    return (n + 1) * prompts_per_step


def age(group: Group, consumer_version: int) -> int:
    """consumer_version - group.min_admission_version. Negative ages are bookkeeping bugs and raise."""
    a = consumer_version - group.min_admission_version
    if a < 0:
        raise ValueError(
            f"group {group.prompt_id!r} was admitted under version {group.min_admission_version}, "
            f"newer than its consumer version {consumer_version}"
        )
    return a


def keep(group: Group, consumer_version: int, n: int) -> bool:
    """offpolicy-N drop rule: keep iff age <= N (N = 4: age 4 kept, age 5 dropped)."""
    if n < 0:
        raise ValueError("N must be >= 0")
    return age(group, consumer_version) <= n


@dataclass
class Batch:
    """prompts_per_step groups for training step `step` (consumer version == step), in FIFO order.

    stats: policy_age_metrics and rollout_metrics of the groups, plus what assembling this batch dropped:
      offpolicy/dropped_stale, offpolicy/dropped_filtered  (counts during this step's assembly)
      offpolicy/generator_version                          (generator's version when the batch completed)
    """

    step: int
    groups: list[Group]
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class _Ticket:
    prompt_id: str | int
    version: int


class RunAheadBuffer:
    """Slots, complete groups and batch assembly for offpolicy-N.

    Generator side: `can_admit()`, `admit(prompt_id) -> ticket` when starting a group,
    `complete(ticket, group)` when all its samples are finished.
    Trainer side: `assemble_batch(step)` until it returns a Batch; after training the step, push the
    weights and call `release_after_weights_reached_generator(step)` once the generator runs them.

    group_filter: optional predicate applied to fresh complete groups during assembly; rejected groups
    are dropped and replaced (DAPO dynamic sampling: pass "reward spread > 0").
    order: "completion" or "admission" FIFO (module docstring).
    """

    def __init__(
        self,
        n: int,
        prompts_per_step: int,
        *,
        initial_version: int = 0,
        group_filter: Callable[[Group], bool] | None = None,
        order: Literal["completion", "admission"] = "completion",
    ) -> None:
        if n < 0 or prompts_per_step < 1 or initial_version < 0:
            raise ValueError("need N >= 0, prompts_per_step >= 1, initial_version >= 0")
        if order not in ("completion", "admission"):
            raise ValueError(f"unknown order {order!r}")
        self.order = order
        self.n = n
        self.prompts_per_step = prompts_per_step
        self.capacity = window_groups(n, prompts_per_step)
        self.group_filter = group_filter
        self.generator_version = initial_version  # weights the generator runs now
        self.next_step = initial_version  # the step assemble_batch will build
        self.dropped_stale_total = 0
        self.dropped_filtered_total = 0

        self._next_ticket = 0
        self._in_flight: dict[int, _Ticket] = {}  # admitted, still generating
        self._ready: dict[int, Group] = {}  # ticket -> complete group; dict order = completion order
        self._pending: list[Group] = []  # kept for next_step's batch, batch not full yet
        self._awaiting_release: dict[int, int] = {}  # step -> slots of groups it trained on
        self._dropped_stale_step = 0
        self._dropped_filtered_step = 0

    # ---- slot accounting -------------------------------------------------------------------------

    @property
    def slots_held(self) -> int:
        return (
            len(self._in_flight)
            + len(self._ready)
            + len(self._pending)
            + sum(self._awaiting_release.values())
        )

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def num_ready(self) -> int:
        return len(self._ready)

    def can_admit(self) -> bool:
        return self.slots_held < self.capacity

    def admit(self, prompt_id: str | int) -> int:
        """Take a slot for a new group under the current generator version; returns its ticket."""
        if not self.can_admit():
            raise RuntimeError(f"run-ahead buffer full ({self.capacity} slots)")
        ticket = self._next_ticket
        self._next_ticket += 1
        self._in_flight[ticket] = _Ticket(prompt_id, self.generator_version)
        return ticket

    def complete(self, ticket: int, group: Group) -> None:
        """Hand over a finished group. Its turns must have been admitted at or after the slot's
        admission and not under weights the generator has not seen: anything else is a stamping bug."""
        t = self._in_flight.get(ticket)
        if t is None:
            raise KeyError(f"unknown or already completed ticket {ticket}")
        if group.prompt_id != t.prompt_id:
            raise ValueError(f"ticket {ticket} is for prompt {t.prompt_id!r}, got {group.prompt_id!r}")
        versions = [turn.admission_version for s in group.samples for turn in s.turns]
        if min(versions) < t.version or max(versions) > self.generator_version:
            raise ValueError(
                f"turn admission versions {min(versions)}..{max(versions)} outside "
                f"[{t.version}, {self.generator_version}] for ticket {ticket}"
            )
        del self._in_flight[ticket]
        self._ready[ticket] = group

    def untrained_groups(self) -> list[Group]:
        """Complete groups not yet trained on (the partial batch, then those waiting): what a checkpoint keeps."""
        return [*self._pending, *self._ready.values()]

    def abandon_in_flight(self) -> int:
        """Forget groups still generating (their rollouts were lost, e.g. an async run resumed from a
        checkpoint): free their slots so the generator can admit replacements. Returns how many."""
        n = len(self._in_flight)
        self._in_flight.clear()
        return n

    def release_after_weights_reached_generator(self, step: int) -> int:
        """The weights produced by `step` (version step + 1) are live in the generator: free the slots of
        the groups trained by steps <= step. Versions may be skipped (a lagging generator loads only the
        newest weights). Returns the number of slots freed."""
        if step >= self.next_step:
            raise ValueError(f"step {step} has not been assembled yet (next step is {self.next_step})")
        if step + 1 <= self.generator_version:
            raise ValueError(f"generator already runs version {self.generator_version} >= {step + 1}")
        freed = 0
        for s in [s for s in self._awaiting_release if s <= step]:
            freed += self._awaiting_release.pop(s)
        self.generator_version = step + 1
        return freed

    # ---- batch assembly --------------------------------------------------------------------------

    def _pop_next(self) -> Group | None:
        """Next complete group in FIFO order, or None (none complete, or the admission-order head is
        still generating)."""
        if not self._ready:
            return None
        if self.order == "completion":
            ticket = next(iter(self._ready))
        else:
            ticket = min(self._ready)  # tickets increase with admission
            if self._in_flight and min(self._in_flight) < ticket:
                return None
        return self._ready.pop(ticket)

    def assemble_batch(self, step: int) -> Batch | None:
        """Pop complete groups (FIFO) into the batch of `step`; return it once it holds
        prompts_per_step groups, else None (call again after more groups complete).

        Steps are assembled in order: step must equal next_step. Stale groups (age > N at consumer
        version `step`) and filtered groups are dropped, counted, and their slots freed immediately.
        """
        if step != self.next_step:
            raise ValueError(f"expected step {self.next_step}, got {step}")
        while len(self._pending) < self.prompts_per_step:
            g = self._pop_next()
            if g is None:
                break
            if not keep(g, step, self.n):
                self._dropped_stale_step += 1
            elif self.group_filter is not None and not self.group_filter(g):
                self._dropped_filtered_step += 1
            else:
                self._pending.append(g)
        if len(self._pending) < self.prompts_per_step:
            return None

        groups, self._pending = self._pending, []
        self._awaiting_release[step] = len(groups)
        stats = {**policy_age_metrics(groups, consumer_version=step), **rollout_metrics(groups)}
        stats["offpolicy/dropped_stale"] = float(self._dropped_stale_step)
        stats["offpolicy/dropped_filtered"] = float(self._dropped_filtered_step)
        stats["offpolicy/generator_version"] = float(self.generator_version)
        self.dropped_stale_total += self._dropped_stale_step
        self.dropped_filtered_total += self._dropped_filtered_step
        self._dropped_stale_step = self._dropped_filtered_step = 0
        self.next_step += 1
        return Batch(step=step, groups=groups, stats=stats)
