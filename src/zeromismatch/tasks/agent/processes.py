"""A sandbox's processes seen from the host (sandbox.py): dropping to a slot's uid, waiting on a pipe or pidfd,
and the two ways a close makes sure nothing of a sandbox still runs: the PID namespace's init (its exit, which
the kernel reports only once every process of the namespace is gone) or, without that, a /proc scan of the
slot's uid."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import time
from pathlib import Path

from ..base import ToolError


def readable(fd: int, timeout_s: float) -> bool:
    """poll, not select: a run holds a pipe per live sandbox, and select fails on fds >= 1024."""
    p = select.poll()
    p.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(p.poll(max(0, int(timeout_s * 1000))))


def as_uid(uid: int) -> list[str]:
    """The command prefix that drops to ``uid`` (its own group, no others). setpriv (util-linux) rather than
    Popen(user=, group=): with those CPython forks instead of vforking, and forking a generator's process (a
    CUDA context, GBs of host memory) takes ~2.5x as long per sandbox start (benchmarks/sandbox.py --cuda-gb)."""
    if shutil.which("setpriv") is None:
        raise ToolError("setpriv not found: install util-linux (apt-get install -y util-linux)")
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def namespace_init_pidfd(info_r: int, timeout_s: float = 5.0) -> int | None:
    """A pidfd of the sandbox's PID-namespace init, from what bwrap wrote to ``--info-fd`` (its host pid and
    namespace ids), or None if that cannot be had (the caller then falls back to the /proc scan). The pid is
    checked to be in the sandbox's PID namespace after the pidfd is opened: a pid freed and reused in between
    belongs to another namespace, and is never signalled."""
    buf, info = b"", None
    while info is None and readable(info_r, timeout_s):  # bwrap writes one JSON object
        data = os.read(info_r, 1 << 12)
        if not data:
            break
        buf += data
        with contextlib.suppress(ValueError):
            info = json.loads(buf)
    try:
        pid, ns = int(info["child-pid"]), int(info["pid-namespace"])
        fd = os.pidfd_open(pid)
    except (KeyError, TypeError, ValueError, OSError, AttributeError):
        return None
    try:
        if os.readlink(f"/proc/{pid}/ns/pid") == f"pid:[{ns}]":
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def kill_and_wait(pidfd: int, timeout_s: float) -> bool:
    """SIGKILL the namespace init behind ``pidfd`` and wait for its exit, which the kernel reports only once
    every other process of its namespace is gone. True when that was seen within ``timeout_s``."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:  # exited already
        pass
    except OSError:
        return False
    return readable(pidfd, timeout_s)


def kill_uid(uid: int, rounds: int = 200) -> int:
    """SIGKILL every process whose real uid is ``uid`` until none is left; returns how many were signalled."""
    n = 0
    for _ in range(rounds):
        pids = [p for p in pids_of_uid(uid) if p != os.getpid()]
        if not pids:
            return n
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except OSError:
                pass
        time.sleep(0.01)
    return n


def pids_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid``. A /proc/<pid> dir is owned by its process's effective
    uid, or by root when the process is not dumpable, so only dirs owned by ``uid`` or root have their status read:
    one stat per process instead of a read of every status file: with 1,600 processes of other uids alive a call
    took 43 ms reading every status and 3.8 ms this way, but ~140 ms with 2,000 other root processes alive (our
    2-core CPU machine), whose status files are all read. Hence a scan only where no namespace proof exists."""
    pids = []
    for entry in os.scandir("/proc"):
        name = entry.name
        if name.isdigit():
            try:
                if entry.stat().st_uid not in (uid, 0):
                    continue
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            uid_line = next((ln for ln in status.splitlines() if ln.startswith("Uid:")), "")
            state = next((ln for ln in status.splitlines() if ln.startswith("State:")), "")
            if uid_line.split()[1:2] == [str(uid)] and state.split()[1:2] not in (["Z"], ["X"]):
                pids.append(int(name))
    return pids
