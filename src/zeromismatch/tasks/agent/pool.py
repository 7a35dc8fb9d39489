"""Sandboxes for concurrent rollouts: any number alive, at most ``max_concurrent`` of them working at once.

    pool = SandboxPool(limits, max_concurrent=2)
    box = pool.acquire(spec)          # a fresh sandbox on a free slot (never waits for one)
    ... box.run(...) ...              # waits while max_concurrent sandboxes are starting / running a command
    pool.release(box)                 # closes it and frees its slot

A live sandbox between commands (its episode waiting for the model's next turn) costs memory only, so what is
bounded by the machine's cores is the work: starting a sandbox, a command, a verifier run. Bounding the live
sandboxes instead would deadlock a rollout worker whose threads wait for slots held by episodes that need those
threads for their next step. Each live sandbox holds a slot; the slot is also its host uid when the host runs as
root (sandbox.py), so two live sandboxes never share a process count.

A uid's lock file also says whether the uid is known to be empty: ``clean`` is written when a sandbox's close
proved that nothing of it runs (sandbox.py, teardown) and is erased when the uid is claimed again, so the next
sandbox on it skips the /proc scan; after a holder that died without closing, the next start scans.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from pathlib import Path

from ..base import ToolError
from .sandbox import Sandbox, SandboxLimits, SandboxSpec

MAX_LIVE = 4096  # slots (host uids uid_base .. uid_base + MAX_LIVE - 1)
UID_LOCKS = Path(tempfile.gettempdir()) / "zeromismatch-sandbox-uids"
CLEAN = b"clean"  # a uid lock file's content once a close proved that nothing runs as the uid


def claim_uid(uid: int) -> int | None:
    """An open fd holding an exclusive flock on ``uid``'s lock file, or None if another process holds it."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(UID_LOCKS / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def default_concurrency() -> int:
    """The cores this process may use (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class SandboxPool:
    def __init__(self, limits: SandboxLimits | None = None, max_concurrent: int | None = None,
                 max_live: int = MAX_LIVE):
        self.limits = limits or SandboxLimits()
        self.max_concurrent = int(max_concurrent or default_concurrency())
        if self.max_concurrent < 1:
            raise ValueError(f"task.sandbox_concurrency={max_concurrent!r}: expected an integer >= 1")
        self.max_live = int(max_live)
        self.gate = threading.BoundedSemaphore(self.max_concurrent)
        self._lock = threading.Lock()
        self._free = list(range(self.max_live))
        self._slots: dict[int, int] = {}  # id(box) -> slot
        self._claims: dict[int, int] = {}  # slot -> fd of its uid lock (root only)
        self._claim_uids = os.geteuid() == 0  # as another user every sandbox runs as that user: no uid to share

    def _take_slot(self) -> tuple[int, bool]:
        """A free slot whose uid this process now holds, and whether that uid is known to run nothing."""
        with self._lock:
            for i, slot in enumerate(self._free):
                fd = claim_uid(self.limits.uid_base + slot) if self._claim_uids else -1
                if fd is not None:
                    del self._free[i]
                    clean = False
                    if fd >= 0:
                        self._claims[slot] = fd
                        clean = os.pread(fd, len(CLEAN), 0) == CLEAN
                        os.ftruncate(fd, 0)  # in use: a holder that dies leaves it unproven
                    return slot, clean
        raise ToolError(f"more than {self.max_live} sandboxes alive at once (uids {self.limits.uid_base}.. "
                        "counted over every process on this machine)")

    def acquire(self, spec: SandboxSpec) -> Sandbox:
        slot, clean = self._take_slot()
        try:
            box = Sandbox(spec, self.limits, slot=slot, gate=self.gate, uid_clean=clean)
        except BaseException:
            self._give(slot)
            raise
        with self._lock:
            self._slots[id(box)] = slot
        return box

    def release(self, box: Sandbox) -> None:
        box.close()
        with self._lock:
            slot = self._slots.pop(id(box), None)
        if slot is not None:
            self._give(slot, clean=box.emptied)

    def _give(self, slot: int, clean: bool = False) -> None:
        with self._lock:
            fd = self._claims.pop(slot, None)
            if fd is not None:
                if clean:
                    os.pwrite(fd, CLEAN, 0)
                os.close(fd)  # drops the flock: another process may take this uid now
            self._free.append(slot)
            self._free.sort()

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._slots)
