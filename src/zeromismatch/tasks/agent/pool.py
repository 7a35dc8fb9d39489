"""Sandboxes for concurrent rollouts, bounded by the machine's cores.

    pool = SandboxPool(limits, max_concurrent=4)
    box = pool.acquire(spec)          # blocks while max_concurrent sandboxes are live
    ... box.run(...) ...
    pool.release(box)                 # closes it and frees its slot

Each live sandbox holds a slot; a slot is also its host uid when the host runs as root (sandbox.py), so two live
sandboxes never share a process count.
"""

from __future__ import annotations

import os
import threading

from .sandbox import Sandbox, SandboxLimits, SandboxSpec


def default_concurrency() -> int:
    """The cores this process may use (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class SandboxPool:
    def __init__(self, limits: SandboxLimits | None = None, max_concurrent: int | None = None):
        self.limits = limits or SandboxLimits()
        self.max_concurrent = int(max_concurrent or default_concurrency())
        if self.max_concurrent < 1:
            raise ValueError(f"task.sandbox_concurrency={max_concurrent!r}: expected an integer >= 1")
        self._free = list(range(self.max_concurrent))
        self._cond = threading.Condition()
        self._slots: dict[int, int] = {}  # id(box) -> slot

    def acquire(self, spec: SandboxSpec) -> Sandbox:
        with self._cond:
            self._cond.wait_for(lambda: self._free)
            slot = self._free.pop(0)
        try:
            box = Sandbox(spec, self.limits, slot=slot)
        except BaseException:
            self._give(slot)
            raise
        with self._cond:
            self._slots[id(box)] = slot
        return box

    def release(self, box: Sandbox) -> None:
        box.close()
        with self._cond:
            slot = self._slots.pop(id(box), None)
        if slot is not None:
            self._give(slot)

    def _give(self, slot: int) -> None:
        with self._cond:
            self._free.append(slot)
            self._free.sort()
            self._cond.notify()

    @property
    def live(self) -> int:
        with self._cond:
            return len(self._slots)
