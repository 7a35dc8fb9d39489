"""The sandbox as the agent uses it: one shell across commands, the verifier, the pool."""

import os
import threading
import time

import pytest

from zeromismatch.tasks.agent.pool import SandboxPool
from zeromismatch.tasks.agent.sandbox import Sandbox, SandboxSpec, _remove_orphans, parse_reward

from .conftest import SMALL

VERIFIER = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /work/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def test_the_shell_persists_across_commands(box):
    box.run("mkdir -p a/b && cd a/b && export GREETING=hi && f() { echo fn-$1; }")
    r = box.run("pwd; echo $GREETING; f x; cat /work/notes.txt")
    assert r.output.split() == ["/work/a/b", "hi", "fn-x", "hello"] and r.exit_code == 0
    assert box.run("false").exit_code == 1
    assert box.run("(exit 7)").exit_code == 7


def test_commands_that_read_stdin_or_have_syntax_errors_do_not_break_the_shell(box):
    r = box.run("cat; read x; echo read=$x")
    assert r.output.strip() == "read=" and not r.timed_out
    r = box.run("echo 'unclosed")
    assert r.exit_code not in (0, None) and "unexpected EOF" in r.output
    r = box.run("exit 3")
    assert r.shell_exited
    r = box.run("echo back")
    assert r.output.strip() == "back" and r.restarted


def test_verifier_scores_correct_and_wrong_solutions():
    for answer, want in (("42", 1.0), ("41", 0.0)):
        with Sandbox(SandboxSpec(), SMALL) as b:
            b.run(f"echo {answer} > answer.txt")
            assert b.verify(VERIFIER, {"expected.txt": "42\n"}) == want


def test_verifier_runs_after_the_agents_processes_are_gone_and_ignores_a_planted_reward():
    with Sandbox(SandboxSpec(), SMALL) as b:
        # a background writer that keeps planting reward 1, and a reward file written before submit
        b.run("mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
              "(while true; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done) &")
        assert b.verify(VERIFIER, {"expected.txt": "42\n"}) == 0.0


def test_verifier_without_a_reward_file_scores_zero():
    with Sandbox(SandboxSpec(), SMALL) as b:
        assert b.verify("#!/bin/bash\nexit 0\n") == 0.0
    assert [parse_reward(t) for t in ("1", "1.0\n", " 0 ", "", None, "yes", "2")] == [1, 1, 0, 0, 0, 0, 1]


def test_pool_bounds_work_not_live_sandboxes():
    """More live sandboxes than cores (episodes waiting for the model hold theirs), at most max_concurrent
    commands at once, each live sandbox on its own slot."""
    pool = SandboxPool(SMALL, max_concurrent=2)
    boxes = [pool.acquire(SandboxSpec()) for _ in range(5)]
    assert pool.live == 5 and len({b.uid for b in boxes}) == 5 or os.geteuid() != 0
    running, peak, lock = [0], [0], threading.Lock()

    def use(box):
        with pool.gate:  # what run() holds, observed from outside
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
        box.run("sleep 0.2")

    t0 = time.monotonic()
    threads = [threading.Thread(target=use, args=(b,)) for b in boxes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 2 and time.monotonic() - t0 >= 0.6  # 5 commands of 0.2 s through 2 gates: >= 3 rounds
    for b in boxes:
        pool.release(b)
    assert pool.live == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="slot uids exist only when the host runs as root")
def test_two_pools_never_share_a_uid():
    """A second run on the same machine (here: a second pool) skips uids a live sandbox of the first holds,
    so its sandboxes' start-up kill never reaches the first run's processes."""
    first, second = SandboxPool(SMALL, max_concurrent=1), SandboxPool(SMALL, max_concurrent=1)
    a = first.acquire(SandboxSpec())
    try:
        a.run("sleep 30 &")
        b = second.acquire(SandboxSpec())
        try:
            assert b.uid != a.uid
            assert a.run("echo alive").output.strip() == "alive"  # b's start did not kill a's uid
        finally:
            second.release(b)
    finally:
        first.release(a)
    c = second.acquire(SandboxSpec())  # a's uid is free again once a is gone
    assert c.uid == a.uid
    second.release(c)


def test_dirs_of_dead_processes_are_removed(tmp_path):
    dead = tmp_path / "box-999999999-abc"  # no such pid
    mine = tmp_path / f"box-{os.getpid()}-live"
    for d in (dead, mine):
        (d / "seed").mkdir(parents=True)
    _remove_orphans(tmp_path)
    assert not dead.exists() and mine.exists()
    with Sandbox(SandboxSpec(), SMALL) as b:
        assert b.dir.name.startswith(f"box-{os.getpid()}-") and b.dir.is_dir()
    assert not b.dir.exists()
