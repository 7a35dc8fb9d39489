"""Which generator runs which prompt group: least loaded first, and a group stays where it started.

    router = Router(n_generators)
    g = router.assign(ticket, start)   # start: what the generator needs to (re)start the group
    start = router.done(ticket)        # the group came back complete
    router.lost(g)                     # generator g died: its groups' starts, to assign again (prompts + seeds)

Load is the number of groups a generator holds (each group is samples_per_prompt sequences, so groups are
the unit of work); ties go to the lowest index, so the assignment is a function of the admission sequence.
Every turn of a multi-turn rollout runs on the generator the group was assigned to: the episode and its kept
cache live there, and nothing moves a group while its generator lives.
"""

from __future__ import annotations

__all__ = ["Router"]


class Router:
    def __init__(self, n_generators: int):
        if n_generators < 1:
            raise ValueError("need at least one generator")
        self.n = n_generators
        self._where: dict[int, int] = {}  # ticket -> generator
        self._starts: dict[int, object] = {}  # ticket -> start (ticket, item, position)
        self._load = [0] * n_generators

    def assign(self, ticket: int, start) -> int:
        if ticket in self._where:
            raise ValueError(f"ticket {ticket} is already on generator {self._where[ticket]}")
        g = min(range(self.n), key=lambda i: (self._load[i], i))
        self._where[ticket], self._starts[ticket] = g, start
        self._load[g] += 1
        return g

    def done(self, ticket: int):
        """Forget a completed group; returns its start."""
        g = self._where.pop(ticket)
        self._load[g] -= 1
        return self._starts.pop(ticket)

    def lost(self, g: int) -> list:
        """Generator ``g`` is gone with its in-flight work: unassign its groups and return their starts
        (in ticket order) for assigning again."""
        tickets = sorted(t for t, where in self._where.items() if where == g)
        starts = [self._starts[t] for t in tickets]
        for t in tickets:
            self.done(t)
        return starts

    def load(self) -> list[int]:
        return list(self._load)

    def in_flight(self) -> list:
        """Every assigned group's start, in ticket order (what a checkpoint keeps)."""
        return [self._starts[t] for t in sorted(self._starts)]

    def generator_of(self, ticket: int) -> int | None:
        return self._where.get(ticket)
