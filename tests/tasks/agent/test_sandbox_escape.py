"""Escape attempts from inside a sandbox, each checked on the host afterwards: the attempt is contained, the
sandbox (and the test run) goes on, and nothing is left running (conftest's autouse check).

No test sends traffic off this machine: the only network target is a listener the test opens on the host's
127.0.0.1, which the sandbox must not reach."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from zeromismatch.tasks.agent import processes
from zeromismatch.tasks.agent.pool import SandboxPool
from zeromismatch.tasks.agent.processes import kill_uid
from zeromismatch.tasks.agent.sandbox import Sandbox, SandboxSpec

from .conftest import SMALL, _sandbox_processes

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def canaries(tmp_path):
    """A canary file in the host's temp dir and one in the repo; both must survive every attempt."""
    host = tmp_path / "canary.txt"
    repo = REPO / f".sandbox-canary-{os.getpid()}"
    for p in (host, repo):
        p.write_text("alive\n")
    yield host, repo
    repo.unlink(missing_ok=True)


def test_cannot_delete_or_overwrite_host_files(box, canaries):
    host, repo = canaries
    for path in (host, repo, REPO / "README.md"):
        r = box.run(f"rm -f {path}; echo overwritten > {path}; ls -la {path.parent}; echo done")
        assert "done" in r.output
    r = box.run("rm -rf /usr/bin/true /etc/passwd /tests 2>&1; touch /usr/x /newfile 2>&1; echo $?")
    assert "Read-only file system" in r.output
    assert host.read_text() == "alive\n" and repo.read_text() == "alive\n"
    assert "zeromismatch" in (REPO / "README.md").read_text()
    assert Path("/usr/bin/true").exists() and Path("/etc/passwd").exists()


def test_cannot_read_host_files(box):
    shadow = Path("/etc/shadow")
    r = box.run(f"cat {REPO}/README.md; ls {REPO}; cat /etc/shadow; cat /root/.bashrc; ls /home /root /work/wt; "
                f"cat /proc/{os.getpid()}/cmdline; ls /proc/{os.getpid()}/")
    assert "No such file or directory" in r.output
    assert "Bitwise-exact" not in r.output and "pyproject.toml" not in r.output and "pytest" not in r.output
    if shadow.exists() and os.access(shadow, os.R_OK):
        first = shadow.read_text().splitlines()[0]
        assert first not in r.output
    # its PID 1 is its own (bwrap's init), not the host's
    assert "bwrap" in box.run("cat /proc/1/cmdline | tr '\\0' ' '").output
    assert box.run("ls /proc | grep -c '^[0-9]'").output.strip().isdigit()
    assert int(box.run("ls /proc | grep -c '^[0-9]'").output) < 10  # a handful of its own processes only


def test_fork_bomb_is_bounded(box):
    host_before = len(os.listdir("/proc"))
    box.run(":(){ :|:& };:", timeout_s=2)
    time.sleep(1.0)
    if os.geteuid() == 0:  # the slot's uid: the sandbox's processes only
        assert len(subprocess.run(["pgrep", "-u", str(box.uid)], capture_output=True, text=True).stdout.split()) \
            <= SMALL.processes
    assert len(os.listdir("/proc")) < host_before + SMALL.processes + 50
    r = box.run("echo still here", timeout_s=5)  # a builtin: the shell answers even with no process left to fork
    assert "still here" in r.output
    r = box.run("ls /", timeout_s=2)  # no process left to fork: the command fails or times out, the sandbox stays
    assert box.verify("#!/bin/bash\nmkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt\n") == 1.0


def test_a_recursive_script_in_the_verifier_is_contained():
    with Sandbox(SandboxSpec(), SMALL) as b:
        b.run("printf '#!/bin/bash\\n./run.sh & ./run.sh\\n' > run.sh && chmod +x run.sh")
        t0 = time.monotonic()
        assert b.verify("#!/bin/bash\ncd /work && ./run.sh\n", timeout_s=2) == 0.0
        assert time.monotonic() - t0 < 15 and b.last_verify["timed_out"]


def test_memory_beyond_the_limit_fails_inside(box):
    r = box.run("python3 -c 'x = bytearray(600 << 20); print(\"allocated\")'; echo rc=$?")
    assert "MemoryError" in r.output and "allocated" not in r.output and "rc=1" in r.output
    assert box.run("echo ok").output.strip() == "ok"


def test_disk_fill_is_bounded(box):
    r = box.run("dd if=/dev/zero of=big bs=1M count=100 2>&1; ls -l big; echo rc=$?")
    assert "File size limit exceeded" in r.output or "File too large" in r.output
    assert int(box.run("stat -c %s big").output) <= SMALL.file_size_mb << 20
    r = box.run("for i in $(seq 10); do head -c 7M /dev/zero > f$i || break; done 2>&1; du -sm /work | cut -f1")
    assert "No space left on device" in r.output
    assert int(r.output.split()[-1]) <= SMALL.disk_mb
    r = box.run("for i in $(seq 10); do head -c 7M /dev/zero > /tmp/f$i || break; done 2>&1 | tail -1")
    assert "No space left on device" in r.output


def test_no_network_and_host_loopback_unreachable(box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted, probed = [], threading.Event()

    def accept():
        while not probed.is_set():
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    probe = textwrap.dedent(f"""\
        python3 -c '
        import socket
        print("interfaces", [n for _, n in socket.if_nameindex()])
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2); print("CONNECTED")
        except OSError as e:
            print("refused", type(e).__name__)
        '
        (echo hi > /dev/tcp/127.0.0.1/{port}) 2>&1 && echo BASH-CONNECTED
        """)
    r = box.run(probe)
    probed.set()
    t.join()
    listener.close()
    assert "interfaces ['lo']" in r.output
    assert "refused" in r.output and "CONNECTED" not in r.output
    assert accepted == []


def test_stdout_flood_is_truncated(box):
    t0 = time.monotonic()
    r = box.run("yes 'flood flood flood'")
    assert time.monotonic() - t0 < SMALL.command_timeout_s
    assert r.output_limit and r.truncated and r.exit_code is None
    assert len(r.output) <= SMALL.output_head_bytes + SMALL.output_tail_bytes + 100
    assert r.output.startswith("flood flood flood") and "bytes omitted" in r.output
    assert box.run("echo ok").output.strip() == "ok"


def test_sleep_past_the_timeout_is_stopped_and_the_shell_stays(box):
    box.run("mkdir -p deep && cd deep && export KEEP=1")
    t0 = time.monotonic()
    r = box.run("echo before; sleep 30; echo after", timeout_s=1)
    assert r.timed_out and 1 <= time.monotonic() - t0 < 8
    assert "before" in r.output and "after" not in r.output
    r = box.run("pwd; echo KEEP=$KEEP")
    assert r.output.split() == ["/work/deep", "KEEP=1"] and not r.restarted


@pytest.mark.parametrize("proof", ["namespace", "scan"])
def test_background_processes_are_killed_at_close(proof, monkeypatch):
    """Daemonized, setsid and double-forked processes die at close: through the PID namespace's init (its
    pidfd), or, where that cannot be had, through the /proc scan of the slot's uid."""
    if proof == "scan":
        monkeypatch.setattr(processes, "namespace_init_pidfd", lambda info_r: None)
    with Sandbox(SandboxSpec(), SMALL) as b:
        b.run("nohup sleep 3001 >/dev/null 2>&1 & setsid sleep 3002 & (sleep 3003 &) ; echo started")
        # `nohup` and `setsid` exec their sleep a moment after the shell returns: wait for all three.
        deadline = time.monotonic() + 5
        while b.run("ps -eo args").output.count("sleep 300") < 3:
            assert time.monotonic() < deadline, b.run("ps aux").output
            time.sleep(0.05)
        assert subprocess.run(["pgrep", "-f", "sleep 300[123]"], capture_output=True).returncode == 0
    assert b.emptied == (proof == "namespace")
    assert subprocess.run(["pgrep", "-f", "sleep 300[123]"], capture_output=True).returncode == 1


def test_processes_in_nested_namespaces_die_with_the_sandbox():
    """A process in a user and PID namespace of its own, made inside the sandbox, is still in the sandbox's PID
    namespace: the init's exit that close waits for covers it."""
    with Sandbox(SandboxSpec(), SMALL) as b:
        if b.run("unshare -Urpf --mount-proc true").exit_code != 0:
            pytest.skip("this kernel lets no nested user namespace be made inside the sandbox")
        b.run("unshare -Urpf --mount-proc sh -c 'sleep 3008 & sleep 3009' >/dev/null 2>&1 &")
        deadline = time.monotonic() + 5
        while subprocess.run(["pgrep", "-f", "^sleep 300[89]"], capture_output=True, text=True).stdout.count("\n") < 2:
            assert time.monotonic() < deadline, b.run("ps -eo pid,args").output
            time.sleep(0.05)
    assert b.emptied
    assert subprocess.run(["pgrep", "-f", "sleep 300[89]"], capture_output=True).returncode == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="slot uids exist only when the host runs as root")
def test_a_proven_close_spares_the_next_start_its_scan(monkeypatch):
    """A close that saw the namespace's init exit needs no /proc scan, nor does the next sandbox on that uid;
    a uid whose last holder left it unproven is scanned, and what runs as it is killed."""
    scans = []
    real = processes.pids_of_uid
    monkeypatch.setattr(processes, "pids_of_uid", lambda uid: scans.append(uid) or real(uid))
    pool = SandboxPool(SMALL, max_concurrent=1)
    first = pool.acquire(SandboxSpec())
    first.run("setsid nohup sleep 3005 >/dev/null 2>&1 & (sleep 3006 &); echo ok")
    scans.clear()
    pool.release(first)
    assert first.emptied and scans == []
    again = pool.acquire(SandboxSpec())
    assert again.uid == first.uid and again.uid_clean and scans == []
    slot = pool._slots.pop(id(again))
    again.close()
    pool._give(slot)  # given back unproven, as a holder that died leaves its uid
    stray = subprocess.Popen(processes.as_uid(again.uid) + ["sleep", "3007"])
    try:
        time.sleep(0.2)  # setpriv has dropped to the uid
        third = pool.acquire(SandboxSpec())
        assert third.uid == again.uid and not third.uid_clean and third.uid in scans
        assert stray.wait(timeout=5) == -signal.SIGKILL  # the start's scan killed it
        pool.release(third)
    finally:
        stray.kill()
        stray.wait()


def test_the_namespace_pidfd_is_never_taken_for_another_process():
    """bwrap's child-pid is checked against its PID namespace once the pidfd is open: a pid reused by a process
    of another namespace gives no pidfd (and so is never signalled)."""
    own_ns = int(os.readlink("/proc/self/ns/pid").split("[")[1].rstrip("]"))
    for ns, taken in ((own_ns, True), (own_ns + 1, False)):
        r, w = os.pipe()
        os.write(w, json.dumps({"child-pid": os.getpid(), "pid-namespace": ns}).encode())
        os.close(w)
        fd = processes.namespace_init_pidfd(r)
        os.close(r)
        assert (fd is not None) == taken
        if fd is not None:
            os.close(fd)


def test_a_crashed_host_process_takes_its_sandbox_with_it(tmp_path):
    script = tmp_path / "host.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        sys.path.insert(0, {str(REPO / 'src')!r})
        from zeromismatch.tasks.agent.sandbox import Sandbox, SandboxLimits, SandboxSpec
        box = Sandbox(SandboxSpec(), SandboxLimits(**{asdict(SMALL)!r}), slot=5)
        box.run("setsid nohup sleep 3004 >/dev/null 2>&1 &")
        print("ready", flush=True)
        time.sleep(60)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert subprocess.run(["pgrep", "-f", "sleep 3004"], capture_output=True).returncode == 0
        os.kill(proc.pid, signal.SIGKILL)  # no atexit, no close(): only --die-with-parent
        proc.wait()
        deadline = time.monotonic() + 5
        while subprocess.run(["pgrep", "-f", "sleep 3004"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "the sandbox outlived its host process"
            time.sleep(0.05)
    finally:
        proc.kill()
        if os.geteuid() == 0:
            kill_uid(SMALL.uid_base + 5)
    assert not _sandbox_processes()
