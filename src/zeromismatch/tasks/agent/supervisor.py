"""The process inside a sandbox that the host talks to (sandbox.py starts it as ``python3 -I -S supervisor.py
config.json``, the system's Python, standard library only: the project is not visible in the sandbox).

It copies the seed files into the work dir, runs the task's setup, starts the rollout's ONE persistent bash and
then answers JSON lines from the host (control pipe in, result pipe out):

    {"op": "run", "cmd": "...", "timeout": 120}  -> {"output", "exit_code", "timed_out", "output_limit", "restarted"}
    {"op": "verify", "script": "/tests/test.sh", "reward_path": ..., "timeout": ...} -> {"reward_text", "exit_code", ...}
    {"op": "exit"}

Each command is written to a file the shell sources (so a syntax error or a command that reads stdin cannot eat
what follows), followed by a printf of a fresh random marker and ``$?``: cd, exported variables and functions
persist across commands. Output is read as it comes and kept head and tail (never buffered whole).

The agent runs as the same uid as this process, so it must not be able to reach it: the supervisor makes itself
non-dumpable (its /proc entries, fds and memory are then closed to the agent, which has no capabilities), and
the host reads results only from the result pipe, which nobody else holds. If the agent kills it, the host sees
the pipe close and scores the rollout 0. Before the verifier runs, every other process in the sandbox is
killed (the agent's shell and anything it left behind) and the verifier runs as a fresh bash with a clean
environment.
"""

import ctypes
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time

PR_SET_DUMPABLE = 4
READ_CHUNK = 65536
MARK_MARGIN = READ_CHUNK + 256  # tail bytes kept beyond output_tail: the marker and what followed it in a read


class Captured:
    """A byte stream kept as its first ``head`` and last ``tail`` bytes (plus a margin to find the end marker)."""

    def __init__(self, head: int, tail: int):
        self.head_n, self.tail_n = head, tail
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, data: bytes) -> None:
        if len(self.head) < self.head_n:
            self.head += data[: self.head_n - len(self.head)]
        self.tail += data
        excess = len(self.tail) - (self.tail_n + MARK_MARGIN)
        if excess > 0:
            del self.tail[:excess]
        self.total += len(data)

    def find(self, needle: bytes) -> int | None:
        """Stream offset where ``needle`` starts (searched in the kept tail), else None."""
        i = self.tail.find(needle)
        return None if i < 0 else self.total - len(self.tail) + i

    def text(self, end: int | None = None) -> tuple[str, bool]:
        """The stream up to offset ``end`` (default all) as head + tail, and whether bytes were left out."""
        end = self.total if end is None else end
        tail_start = self.total - len(self.tail)
        if end <= self.head_n:
            data, cut = bytes(self.head[:end]), False
        else:
            start = max(self.head_n, end - self.tail_n)
            tail = bytes(self.tail[max(0, start - tail_start) : end - tail_start])
            omitted = start - self.head_n
            data = bytes(self.head) + (f"\n[... {omitted} bytes omitted ...]\n".encode() if omitted else b"") + tail
            cut = omitted > 0
        return data.decode("utf-8", "replace"), cut


def other_pids(keep: set[int]) -> list[int]:
    """Live (non-zombie) processes of this PID namespace, except ``keep``, init (1) and this process."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in keep or pid in (1, os.getpid()):
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            pids.append(pid)
    return pids


def kill_all_but(keep: set[int], rounds: int = 500) -> None:
    """SIGKILL every other process until none is left (repeated: a fork bomb forks while we kill), then give the
    killed a moment to be reaped: a zombie still counts against RLIMIT_NPROC, so the next fork could fail."""
    for _ in range(rounds):
        pids = other_pids(keep)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)
    for _ in range(200):
        try:  # our own dead children (the shell, a verifier) are ours to reap
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep | {1, os.getpid()}]:
            return
        time.sleep(0.01)


def spawn(args: list, **kwargs) -> subprocess.Popen:
    """Popen, retried for a few seconds while the process limit is reached (EAGAIN): the processes just killed
    may not all be reaped yet."""
    for attempt in range(50):
        try:
            return subprocess.Popen(args, **kwargs)
        except BlockingIOError:
            if attempt == 49:
                raise
            time.sleep(0.1)


class Supervisor:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.workdir = cfg["workdir"]
        self.ctrl = os.fdopen(cfg["ctrl_fd"], "rb", buffering=0)
        self.res = os.fdopen(cfg["res_fd"], "wb", buffering=0)
        self.shell: subprocess.Popen | None = None
        self.cmd_no = 0

    # ----- child processes

    def child_limits(self) -> None:  # preexec in a child: the CPU-time limit (the host set the others on bwrap)
        cpu = int(self.cfg["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

    def env(self, home: str) -> dict:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb",
               "USER": "agent", "SHELL": "/bin/bash", "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_AUTHOR_NAME": "agent", "GIT_AUTHOR_EMAIL": "agent@sandbox",
               "GIT_COMMITTER_NAME": "agent", "GIT_COMMITTER_EMAIL": "agent@sandbox"}
        env.update(self.cfg.get("env", {}))
        return env

    def start_shell(self) -> None:
        self.shell = spawn(
            ["/bin/bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=self.workdir, env=self.env(self.cfg["home"]), close_fds=True,
            preexec_fn=self.child_limits,
        )

    def read_until(self, proc: subprocess.Popen, marker: bytes | None, timeout: float):
        """Read ``proc``'s stdout into a Captured until ``marker`` (None: EOF), the timeout or the output limit.
        Returns (captured, marker offset or None, why it stopped: 'marker' | 'eof' | 'timeout' | 'output_limit')."""
        cap = Captured(int(self.cfg["output_head"]), int(self.cfg["output_tail"]))
        fd, deadline = proc.stdout.fileno(), time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return cap, None, "timeout"
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            data = os.read(fd, READ_CHUNK)
            if not data:
                return cap, None, "eof"
            cap.add(data)
            if marker is not None:
                at = cap.find(marker)
                if at is not None:
                    return cap, at, "marker"
            if cap.total > int(self.cfg["max_output_bytes"]):
                return cap, None, "output_limit"

    # ----- ops

    def run(self, cmd: str, timeout: float) -> dict:
        restarted = False
        if self.shell is None or self.shell.poll() is not None:
            self.start_shell()
            restarted = True
        self.cmd_no += 1
        path = f"{self.cfg['cmd_dir']}/cmd-{self.cmd_no}.sh"
        with open(path, "w", errors="replace") as f:
            f.write(cmd if cmd.endswith("\n") else cmd + "\n")
        token = secrets.token_hex(16).encode()
        line = f"source {path} </dev/null; printf '\\n{token.decode()}:%d\\n' \"$?\"\n".encode()
        try:
            self.shell.stdin.write(line)
            self.shell.stdin.flush()
        except BrokenPipeError:  # the shell exited between commands
            self.start_shell()
            return self.run(cmd, timeout) | {"restarted": True}
        cap, at, why = self.read_until(self.shell, b"\n" + token + b":", timeout)
        try:
            os.remove(path)
        except OSError:  # the agent removed it
            pass
        if why in ("timeout", "output_limit"):
            # stop the command: everything but the shell dies; the shell then prints the marker itself
            kill_all_but({self.shell.pid})
            _, _, why2 = self.read_until(self.shell, b"\n" + token + b":", 5.0)
            if why2 != "marker":  # the shell itself was busy (a builtin loop): a fresh one
                self.shell.kill()
                self.shell.wait()
                self.shell = None
        exit_code = None
        if why == "marker":
            rest = bytes(cap.tail[at - (cap.total - len(cap.tail)) + len(token) + 2 :])
            digits = rest.split(b"\n", 1)[0]
            exit_code = int(digits) if digits.isdigit() else None
        elif why == "eof":  # the agent's command exited the shell
            self.shell.wait()
            self.shell = None
        text, cut = cap.text(at)
        return {"output": text, "exit_code": exit_code, "timed_out": why == "timeout",
                "output_limit": why == "output_limit", "truncated": cut, "restarted": restarted,
                "shell_exited": why == "eof"}

    def verify(self, script: str, reward_path: str, timeout: float) -> dict:
        kill_all_but(set())  # the agent's shell and everything it left: nothing of the episode may interfere
        if self.shell is not None:
            self.shell.wait()
            self.shell = None
        try:
            os.remove(reward_path)
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(reward_path), exist_ok=True)
        home = self.cfg["verifier_home"]
        os.makedirs(home, exist_ok=True)
        proc = spawn(
            ["/bin/bash", "--noprofile", "--norc", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=self.workdir, env=self.env(home), close_fds=True,
            preexec_fn=self.child_limits,
        )
        cap, _, why = self.read_until(proc, None, timeout)
        if why != "eof":
            kill_all_but(set())
        code = proc.wait()
        reward_text = None
        try:
            with open(reward_path, "rb") as f:
                reward_text = f.read(64).decode("utf-8", "replace")
        except OSError:
            pass
        text, _ = cap.text()
        return {"reward_text": reward_text, "exit_code": code, "timed_out": why == "timeout", "output": text}

    # ----- setup and loop

    def setup(self) -> dict:
        shutil.copytree(self.cfg["seed_dir"], self.workdir, dirs_exist_ok=True, symlinks=True)
        os.makedirs(self.cfg["home"], exist_ok=True)
        out = {"ready": True}
        if self.cfg.get("setup"):
            res = self.run(self.cfg["setup"], float(self.cfg["setup_timeout_s"]))
            kill_all_but(set())  # setup leaves nothing running; the agent gets a fresh shell
            if self.shell is not None:
                self.shell.wait()
                self.shell = None
            if res["exit_code"] != 0:
                out = {"ready": False, "error": f"setup failed (exit {res['exit_code']}): {res['output'][-2000:]}"}
        if out["ready"]:
            self.start_shell()
        return out

    def reply(self, obj: dict) -> None:
        self.res.write((json.dumps(obj) + "\n").encode())

    def serve(self) -> None:
        self.reply(self.setup())
        buf = b""
        while True:
            data = self.ctrl.read(READ_CHUNK)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if req["op"] == "exit":
                    return
                try:
                    if req["op"] == "run":
                        self.reply(self.run(req["cmd"], float(req["timeout"])))
                    elif req["op"] == "verify":
                        self.reply(self.verify(req["script"], req["reward_path"], float(req["timeout"])))
                    else:
                        self.reply({"error": f"unknown op {req['op']!r}"})
                except Exception as e:  # noqa: BLE001 - the agent's doing (no process left to fork): it is told
                    self.reply({"error": f"{type(e).__name__}: {e}"})


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    try:
        Supervisor(cfg).serve()
    finally:
        kill_all_but(set())


if __name__ == "__main__":
    main()
