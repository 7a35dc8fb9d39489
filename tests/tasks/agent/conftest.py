"""Sandbox fixtures: small limits (CI's 2-core machine), and a check after every test that nothing a sandbox
started is still running."""

import os
import subprocess
import time

import pytest

from zeromismatch.tasks.agent.sandbox import Sandbox, SandboxLimits, SandboxSpec, bwrap_available

SMALL = SandboxLimits(command_timeout_s=10, cpu_s=20, memory_mb=256, processes=48, file_size_mb=8,
                      open_files=64, disk_mb=16, output_head_bytes=2048, output_tail_bytes=2048,
                      max_output_bytes=1 << 20, uid_base=1_290_000)


def _sandbox_processes() -> list[str]:
    """Processes of the tests' sandboxes (ps lines): as root, anything running as one of SMALL's slot uids (a
    run's sandboxes elsewhere on the machine use other uids); otherwise any bwrap."""
    out = subprocess.run(["ps", "-eo", "pid,uid,stat,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    found = []
    for line in out:
        pid, uid, stat, args = line.split(None, 3)
        if "Z" in stat or int(pid) == os.getpid():
            continue
        if (SMALL.uid_base <= int(uid) < SMALL.uid_base + 64) if os.geteuid() == 0 else args.startswith("bwrap "):
            found.append(line)
    return found


@pytest.fixture(scope="session", autouse=True)
def _bwrap():
    why = bwrap_available()
    if why:
        pytest.fail(f"the sandbox tests need bubblewrap: {why} (.ci/run installs it)")


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    deadline = time.monotonic() + 5
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes() == [], "a sandbox left processes running"


@pytest.fixture
def box():
    with Sandbox(SandboxSpec(files={"notes.txt": "hello\n"}), SMALL) as b:
        yield b
