"""One rollout's sandbox: bubblewrap namespaces + rlimits around one persistent bash (supervisor.py inside).

    limits = SandboxLimits(command_timeout_s=120)
    with Sandbox(SandboxSpec(files={"data.txt": "..."}, setup="git init -q"), limits, slot=0) as box:
        r = box.run("cd sub && export X=1")        # CommandResult(output, exit_code, timed_out, ...)
        r = box.run("echo $X; pwd")                 # the same shell: cd and exports stuck
        reward = box.verify("#!/bin/bash\n...", {"fixture.txt": "..."})   # 1.0 / 0.0

Isolation (bwrap, from Debian's ``bubblewrap`` package; .ci/run installs it):
- filesystem: an empty root, read-only; the system's /usr (/bin, /lib, /sbin as its symlinks) and
  /etc/alternatives read-only; a fresh /proc (its own PID namespace) and minimal /dev; writable only
  size-limited tmpfs mounts: the work dir (seed files copied in), /tmp (also HOME) and the reward file's
  directory. Nothing of the host's home, the repo, the host's /tmp or other rollouts is mounted.
- network: its own network namespace (only its own loopback: the host's 127.0.0.1 services are unreachable).
- processes: its own PID, IPC, UTS and cgroup namespaces and a user namespace (uid 1000, no capabilities);
  ``--die-with-parent`` and a new session (no terminal to inject into).
- rlimits on everything inside (set on bwrap, inherited): address space, process count, file size, open files;
  CPU time on each child of the supervisor. The process limit is counted per host uid, so when the host runs
  as root each pool slot runs as its own unprivileged host uid (``uid_base + slot``): a fork bomb in one
  sandbox cannot starve another, and root's exemption from RLIMIT_NPROC does not apply. As a non-root user
  every sandbox runs as that user and shares its process count (the limit is then raised by the user's
  current process count).
- a per-command wall-clock timeout and an output cap (head and tail kept), enforced by the supervisor.

Teardown (``close``, also at interpreter exit and when the process dies: ``--die-with-parent``): the
supervisor is told to exit, bwrap's process group is killed, then the PID namespace's init (bwrap's
``--info-fd`` child-pid, held as a pidfd): when a namespace's init exits, the kernel kills every process of the
namespace and waits for them before the init's pidfd reports its exit, so that report proves that nothing of the
sandbox runs any more, whatever it forked, daemonized or nested. Only without that proof (no pidfd) is every
process still running as the slot's uid found in /proc and killed: a scan of every process on the machine,
~0.14 s with 2,000 others alive (our 2-core CPU machine). Then the host dir is removed. bwrap is started from
one long-lived thread: ``--die-with-parent`` is a parent-death signal, which Linux sends when the *thread*
that forked exits, so sandboxes must not be forked from short-lived worker threads.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import functools
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from ..base import ToolError
from . import processes
from .processes import as_uid, readable

SUPERVISOR = Path(__file__).with_name("supervisor.py")
INNER_UID = 1000
HARNESS = "/.harness"  # supervisor.py and its config, read-only
SEED = "/.seed"  # the task's files, read-only; copied into the work dir at start
CMD_DIR = "/.cmd"  # the command files the shell sources (tmpfs)
TESTS = "/tests"  # test.sh and its fixtures, written by the host after submit (read-only inside)
SYSTEM_RO = ("/usr", "/etc/alternatives")
SYMLINKS = {"/bin": "usr/bin", "/lib": "usr/lib", "/lib64": "usr/lib64", "/sbin": "usr/sbin"}


@dataclass(frozen=True)
class SandboxLimits:
    """What a sandbox may use (conf/task/agent.yaml: task.sandbox)."""

    command_timeout_s: float = 120.0  # wall clock per command
    setup_timeout_s: float = 60.0
    verifier_timeout_s: float = 120.0
    start_timeout_s: float = 30.0  # bwrap + supervisor + seed copy + setup must answer within this
    cpu_s: int = 600  # RLIMIT_CPU per process
    memory_mb: int = 2048  # RLIMIT_AS per process
    processes: int = 256  # RLIMIT_NPROC (per host uid: per sandbox when the host runs as root)
    file_size_mb: int = 64  # RLIMIT_FSIZE
    open_files: int = 512  # RLIMIT_NOFILE
    disk_mb: int = 256  # size of each writable tmpfs (work dir, /tmp, the reward dir)
    output_head_bytes: int = 8192  # the output of a command keeps its first and last bytes
    output_tail_bytes: int = 8192
    max_output_bytes: int = 16 << 20  # a command printing more is stopped like a timeout
    uid_base: int = 1_200_000  # host uid of pool slot i is uid_base + i (root only)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"task.sandbox.{name}={value!r}: expected a number > 0")


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox starts with: ``files`` (path relative to ``workdir`` -> text) copied into the work dir,
    ``setup`` a shell script run there before the agent's shell starts (its processes are killed after)."""

    files: dict[str, str] = field(default_factory=dict)
    workdir: str = "/work"
    setup: str | None = None
    reward_path: str = "/logs/verifier/reward.txt"

    def __post_init__(self) -> None:
        for path in (self.workdir, self.reward_path):
            p = PurePosixPath(path)
            if not p.is_absolute() or ".." in p.parts or len(p.parts) < 2:
                raise ValueError(f"sandbox path {path!r}: expected an absolute path below / without '..'")
        for rel in self.files:
            _safe_relpath(rel)


@dataclass(frozen=True)
class CommandResult:
    output: str
    exit_code: int | None  # None: timed out, output limit, or the shell exited
    timed_out: bool = False
    output_limit: bool = False
    truncated: bool = False  # the middle of the output was left out
    restarted: bool = False  # a fresh shell ran it (the previous one exited or had to be killed)
    shell_exited: bool = False


class SandboxGone(RuntimeError):
    """The supervisor stopped answering (the agent killed it, or it died): the rollout cannot go on."""


def _safe_relpath(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"file path {rel!r}: expected a relative path without '..'")
    return p


@functools.cache
def bwrap_available() -> str | None:
    """None when bwrap runs here, else why not (one line). Checked once per process: it launches a bwrap."""
    if shutil.which("bwrap") is None:
        return "bwrap not found: install bubblewrap (apt-get install -y bubblewrap)"
    r = subprocess.run(["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
                        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "/bin/true"],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else f"bwrap cannot create namespaces here: {r.stderr.strip()}"


# ------------------------------------------------------------------------------------ launching


class _Launcher:
    """Forks every bwrap from one daemon thread that lives as long as the process (module doc)."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="sandbox-launcher", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fut, args, kwargs = self.jobs.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(subprocess.Popen(args, **kwargs))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(e)

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        fut: cf.Future = cf.Future()
        self.jobs.put((fut, args, kwargs))
        return fut.result()


_launcher: _Launcher | None = None
_launcher_lock = threading.Lock()
_live: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()


def _get_launcher() -> _Launcher:
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = _Launcher()
        return _launcher


@atexit.register
def _close_all() -> None:
    for box in list(_live):
        box.close()


_swept: set[str] = set()


def _remove_orphans(base: Path) -> None:
    """Once per process and base dir: remove the host dirs of sandboxes whose process is gone (a process killed
    by a signal runs no atexit; its sandboxes died with it, their dirs did not)."""
    if str(base) in _swept:
        return
    _swept.add(str(base))
    for d in base.glob("box-*-*"):
        pid = d.name.split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------ the sandbox


class Sandbox:
    """A running sandbox (module doc). Methods are called from one thread at a time."""

    def __init__(self, spec: SandboxSpec, limits: SandboxLimits | None = None, *, slot: int = 0,
                 root: str | os.PathLike | None = None, gate: threading.Semaphore | None = None,
                 uid_clean: bool = False):
        """``gate``: held while the sandbox starts and while it runs a command or the verifier (pool.py). ``root``
        (default the temp dir) holds the host dir; as root it must be traversable by the slot uids.
        ``uid_clean``: the caller knows that no process runs as the slot's uid (pool.py: its last sandbox's close
        proved it), so the start skips the /proc scan."""
        self.spec, self.limits = spec, limits or SandboxLimits()
        self.gate = gate or contextlib.nullcontext()
        self.as_root = os.geteuid() == 0
        self.uid = self.limits.uid_base + slot if self.as_root else os.geteuid()
        base = Path(root or tempfile.gettempdir()) / "zeromismatch-sandboxes"
        base.mkdir(mode=0o711, parents=True, exist_ok=True)
        _remove_orphans(base)
        self.dir = Path(tempfile.mkdtemp(prefix=f"box-{os.getpid()}-", dir=base))
        self.proc: subprocess.Popen | None = None
        self._ns_init: int | None = None  # pidfd of the PID namespace's init (module doc: teardown)
        self.uid_clean = uid_clean
        self.emptied = False  # set by close(): nothing of the sandbox runs, proven through the pidfd
        self._closed = False
        _live.add(self)
        try:
            with self.gate:
                self._start()
        except BaseException:
            self.close()
            raise

    # ----- start

    def _write_dirs(self) -> dict:
        os.chmod(self.dir, 0o755)
        seed, tests, harness = self.dir / "seed", self.dir / "tests", self.dir / "harness"
        for d in (seed, tests, harness):
            d.mkdir()
        for rel, text in self.spec.files.items():
            path = seed / _safe_relpath(rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if text.startswith("#!"):
                path.chmod(0o755)
        shutil.copy(SUPERVISOR, harness / "supervisor.py")
        (harness / "passwd").write_text(f"agent:x:{INNER_UID}:{INNER_UID}:agent:/tmp:/bin/bash\n")
        (harness / "group").write_text(f"agent:x:{INNER_UID}:\n")
        for dirpath, dirnames, filenames in os.walk(self.dir):
            for name in dirnames + filenames:
                p = Path(dirpath, name)
                p.chmod(p.stat().st_mode | 0o444 | (0o111 if p.is_dir() else 0))
        return {"seed": seed, "tests": tests, "harness": harness}

    def _bwrap_args(self, dirs: dict, info_fd: int) -> list[str]:
        lim = self.limits
        size = str(lim.disk_mb << 20)
        args = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(INNER_UID), "--gid", str(INNER_UID),
                "--die-with-parent", "--new-session", "--hostname", "sandbox", "--info-fd", str(info_fd)]
        for path in SYSTEM_RO:
            if Path(path).exists():
                args += ["--ro-bind", path, path]
        for link, target in SYMLINKS.items():
            args += ["--symlink", target, link]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--ro-bind", str(dirs["harness"] / "passwd"), "/etc/passwd",
                 "--ro-bind", str(dirs["harness"] / "group"), "/etc/group",
                 "--ro-bind", str(dirs["harness"]), HARNESS, "--ro-bind", str(dirs["seed"]), SEED,
                 "--ro-bind", str(dirs["tests"]), TESTS,
                 "--size", str(1 << 20), "--tmpfs", CMD_DIR,
                 "--size", size, "--tmpfs", "/tmp"]
        reward_dir = str(PurePosixPath(self.spec.reward_path).parent)
        writable = [self.spec.workdir]
        if not any(PurePosixPath(reward_dir).is_relative_to(w) for w in writable + ["/tmp"]):
            writable.append(reward_dir)
        for w in writable:
            args += ["--size", size, "--tmpfs", w]
        args += ["--remount-ro", "/", "--chdir", "/", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin"]
        return args

    def _prlimit(self) -> list[str]:
        lim = self.limits
        nproc = lim.processes + (0 if self.as_root else len(processes.pids_of_uid(self.uid)))
        mb = 1 << 20
        return ["prlimit", f"--nproc={nproc}", f"--as={lim.memory_mb * mb}", f"--fsize={lim.file_size_mb * mb}",
                f"--nofile={lim.open_files}", f"--core=0", "--"]

    def _start(self) -> None:
        why = bwrap_available()
        if why:
            raise ToolError(why)
        dirs = self._write_dirs()
        ctrl_r, self._ctrl_w = os.pipe()
        self._res_r, res_w = os.pipe()
        lim = self.limits
        config = {"ctrl_fd": ctrl_r, "res_fd": res_w, "workdir": self.spec.workdir, "seed_dir": SEED,
                  "cmd_dir": CMD_DIR, "home": "/tmp", "verifier_home": "/tmp/.verifier-home",
                  "setup": self.spec.setup, "setup_timeout_s": lim.setup_timeout_s, "cpu_s": lim.cpu_s,
                  "output_head": lim.output_head_bytes, "output_tail": lim.output_tail_bytes,
                  "max_output_bytes": lim.max_output_bytes}
        (dirs["harness"] / "config.json").write_text(json.dumps(config))
        (dirs["harness"] / "config.json").chmod(0o444)
        info_r, info_w = os.pipe()
        args = self._prlimit() + self._bwrap_args(dirs, info_w) + [
            "/usr/bin/python3", "-I", "-S", f"{HARNESS}/supervisor.py", f"{HARNESS}/config.json"]
        kwargs = {"pass_fds": (ctrl_r, res_w, info_w), "stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
                  "stderr": subprocess.PIPE, "start_new_session": True}
        if self.as_root:
            if not self.uid_clean:
                processes.kill_uid(self.uid)  # a slot's uid runs nothing of an earlier sandbox
            args = as_uid(self.uid) + args
        try:
            try:
                self.proc = _get_launcher().popen(args, **kwargs)
            except OSError as e:
                raise ToolError(f"sandbox could not start: {' '.join(args[:2])}...: {e}") from e
            finally:
                for fd in (ctrl_r, res_w, info_w):
                    os.close(fd)
            self._res_buf = b""
            try:
                ready = self._read_reply(lim.start_timeout_s)
            except SandboxGone as e:
                raise ToolError(f"sandbox could not start: {e}") from e
            if not ready.get("ready"):
                raise ToolError(f"sandbox setup failed: {ready.get('error')}")
            self._ns_init = processes.namespace_init_pidfd(info_r)
        finally:
            os.close(info_r)

    # ----- talking to the supervisor

    def _request(self, req: dict, timeout: float) -> dict:
        if self._closed:
            raise SandboxGone("the sandbox is closed")
        with self.gate:
            try:
                os.write(self._ctrl_w, (json.dumps(req) + "\n").encode())
            except OSError as e:
                time.sleep(0.2)  # let it exit, so its status and stderr can be said
                raise SandboxGone(f"the sandbox's supervisor is gone ({e}){self._stderr_tail()}") from e
            return self._read_reply(timeout)

    def _read_reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._res_buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxGone(f"no answer from the sandbox within {timeout:.0f} s")
            if readable(self._res_r, left):
                data = os.read(self._res_r, 1 << 16)
                if not data:
                    raise SandboxGone(f"the sandbox's supervisor exited{self._stderr_tail()}")
                self._res_buf += data
        line, self._res_buf = self._res_buf.split(b"\n", 1)
        return json.loads(line)

    def _stderr_tail(self) -> str:
        if self.proc is None or self.proc.poll() is None:
            return ""
        err = self.proc.stderr.read().decode(errors="replace").strip()[-500:] if self.proc.stderr else ""
        return f" (status {self.proc.returncode}{': ' + err if err else ''})"

    # ----- API

    def run(self, cmd: str, timeout_s: float | None = None) -> CommandResult:
        """Run ``cmd`` in the persistent shell; a timeout stops it (the shell stays). Raises SandboxGone."""
        timeout = float(timeout_s or self.limits.command_timeout_s)
        r = self._request({"op": "run", "cmd": cmd, "timeout": timeout}, timeout + 30.0)
        if "error" in r:  # the supervisor could not run it (no process left to fork): the agent is told
            return CommandResult(output=f"[the sandbox could not run the command: {r['error']}]", exit_code=None)
        return CommandResult(**r)

    def verify(self, test_sh: str, files: dict[str, str] | None = None, timeout_s: float | None = None) -> float:
        """Kill the agent's processes, put ``test_sh`` and its fixture ``files`` into /tests, run the verifier in
        a fresh bash in the work dir, and read the reward file it wrote: 1.0 when it holds a number >= 1, else
        0.0 (missing, empty, unreadable). Raises SandboxGone."""
        tests = self.dir / "tests"
        for rel, text in (files or {}).items():
            path = tests / _safe_relpath(rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (tests / "test.sh").write_text(test_sh)
        for p in tests.rglob("*"):
            p.chmod(0o755)
        timeout = float(timeout_s or self.limits.verifier_timeout_s)
        r = self._request({"op": "verify", "script": f"{TESTS}/test.sh", "reward_path": self.spec.reward_path,
                           "timeout": timeout}, timeout + 30.0)
        self.last_verify = r
        return parse_reward(r.get("reward_text"))

    def close(self) -> None:
        """Stop everything inside and remove the host dir. Idempotent; never raises."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        if self.proc is not None:
            try:
                os.write(self._ctrl_w, b'{"op": "exit"}\n')
            except OSError:
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
            if self.proc.stderr:
                self.proc.stderr.close()
            for fd in (self._ctrl_w, self._res_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._ns_init is not None:
            self.emptied = processes.kill_and_wait(self._ns_init, timeout_s=10.0)
            os.close(self._ns_init)
            self._ns_init = None
        if self.as_root and not self.emptied:
            processes.kill_uid(self.uid)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_reward(text: str | None) -> float:
    """A reward file's content as 0.0 / 1.0: 1.0 when it is a number >= 1 (``1``, ``1.0``), else 0.0."""
    try:
        return 1.0 if float((text or "").strip()) >= 1.0 else 0.0
    except ValueError:
        return 0.0
