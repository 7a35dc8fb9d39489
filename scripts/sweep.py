#!/usr/bin/env python
"""Run many experiments x seeds concurrently on one machine (one GPU), each in its own run folder, and pack
every run folder into one archive.

    python scripts/sweep.py --exps math_op4_bi,math_op4_stock --seeds 0,1,2 --steps 100 --scale small \
        --parallel 8 --deadline 480 --root sweeps/h200 --archive "$OUT/sweep.tar.gz"

Each run is `python run.py +exp=<exp> [+scale=<scale>] seed=<seed> rl.steps=<steps> [--set ...]` with its
folder fixed at <root>/<exp>/<seed>/ (config.json, metrics.jsonl, summary.json, status.json, run.log, .hydra/,
the offline W&B run, checkpoint.pt). Runs start seed-major (every experiment's seed 0 first), so a sweep cut
short still compares every arm. Each process gets `--threads` cores of its own (CPU affinity and the OpenMP /
MKL thread counts); default: the machine's cores divided by --parallel.

Resuming: run the same command again. A run whose status.json says completed is skipped; a run stopped
mid-way (killed, interrupted, failed) with a checkpoint.pt continues from it through job.resume=<its folder>;
one without a checkpoint is moved to <root>/_aborted/ and starts over. Failed runs are retried only with
--retry-failed (a failure is usually not transient).

--freeze: the runs use a copy of run.py, conf/ and src/ made in <root>/_code/ when the sweep starts, so that
edits or a fresh copy of the working tree during the sweep cannot reach running processes (a run reads files
of the tree long after it starts: each terminal-agent sandbox copies tasks/agent/supervisor.py). Data, caches
and run folders stay relative to the repo root. Running the sweep again makes a new copy.

--deadline S: S seconds after the start, running processes get SIGINT (then SIGKILL after --grace seconds),
runs not yet started stay pending, and the archive is written; so is it on SIGTERM / SIGINT of the sweep.
The archive (tar.gz, written atomically) holds <exp>/<seed>/ of every run folder except checkpoints,
_logs/<exp>/<seed>.log (each process's console output), _logs/sft/<hash>.json (the summary of each SFT warm
start in the cache) and sweep.json (the command, commit, machine and each
run's status, attempts and wall time, and GPU memory / utilization every 15 s). scripts/unpack_sweep.py lays it out as results/repro/<exp>/<seed>/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATUS = "status.json"
CHECKPOINT = "checkpoint.pt"
MANIFEST = "sweep.json"
PACK_EXCLUDE_SUFFIXES = (".pt", ".tmp", ".lock")  # checkpoints (model + optimizer) stay on the machine
SFT_CACHE = REPO / ".cache" / "sft"  # conf/job/sft.yaml cache_dir: each warm start's summary.json is packed
CODE = ("run.py", "conf", "src")  # what --freeze copies: everything a run imports or composes
GPU_SAMPLE_S = 15.0  # seconds between nvidia-smi readings of memory and utilization


@dataclass
class Run:
    exp: str
    seed: int
    dir: str
    state: str = "pending"  # pending | running | completed | failed | interrupted | killed | skipped
    attempts: int = 0
    resumed_from: list[str] = field(default_factory=list)  # "checkpoint" or "scratch", per attempt
    rc: int | None = None
    wall_s: float = 0.0
    pid: int | None = None
    cores: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.exp}/{self.seed}"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exps", required=True,
                   help="comma-separated conf/exp names; NAME:S1+S2 runs that one at seeds S1, S2 instead of --seeds")
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--steps", type=int, default=None, help="rl.steps of every run (default: each experiment's)")
    p.add_argument("--scale", default=None, help="conf/scale option given after +exp (e.g. small)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Hydra override for every run (repeatable)")
    p.add_argument("--parallel", type=int, default=4, help="runs at a time")
    p.add_argument("--threads", type=int, default=None, help="cores per run (default: cores // parallel)")
    p.add_argument("--deadline", type=float, default=None, help="seconds from the start before running runs are stopped")
    p.add_argument("--grace", type=float, default=20.0, help="seconds between SIGINT and SIGKILL at the deadline")
    p.add_argument("--root", default="sweeps/latest", help="folder of the run folders")
    p.add_argument("--archive", default=None, help="tar.gz to write (default: <root>/sweep.tar.gz)")
    p.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    p.add_argument("--freeze", action="store_true",
                   help="run every process from a copy of run.py, conf/ and src/ in <root>/_code/ (see above)")
    p.add_argument("--retry-failed", action="store_true", help="run failed runs again (resuming from their checkpoint)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between checks of the running processes")
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s != ""]
    args.seeds_of = {}
    for item in (e for e in args.exps.split(",") if e):
        name, _, seeds = item.partition(":")
        args.seeds_of[name] = [int(s) for s in seeds.split("+")] if seeds else args.seeds
    args.exps = list(args.seeds_of)
    missing = [e for e in args.exps if not (REPO / "conf" / "exp" / f"{e}.yaml").is_file()]
    if missing:
        p.error(f"--exps: no conf/exp/{missing[0]}.yaml")
    if args.scale and not (REPO / "conf" / "scale" / f"{args.scale}.yaml").is_file():
        p.error(f"--scale: no conf/scale/{args.scale}.yaml")
    if args.parallel < 1:
        p.error("--parallel must be >= 1")
    return args


def read_status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / STATUS).read_text())["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plan(args, root: Path, previous: dict) -> list[Run]:
    """Every (exp, seed) run, seed-major, with what the last sweep in this root recorded (attempts)."""
    runs = []
    for seed in sorted({s for seeds in args.seeds_of.values() for s in seeds}):
        for exp in (e for e in args.exps if seed in args.seeds_of[e]):
            run = Run(exp, seed, str(root / exp / str(seed)))
            old = previous.get(run.name)
            if old:
                run.attempts, run.resumed_from, run.wall_s = old["attempts"], list(old["resumed_from"]), old["wall_s"]
            runs.append(run)
    return runs


def command(args, run: Run, resume: bool, code: Path = REPO) -> list[str]:
    cmd = [sys.executable, str(code / "run.py"), f"+exp={run.exp}"]
    if args.scale:
        cmd.append(f"+scale={args.scale}")  # after +exp: the scale's values win
    cmd += [f"seed={run.seed}", f"logging.run_dir={run.dir}"]
    if args.steps is not None:
        cmd.append(f"rl.steps={args.steps}")
    cmd += args.sets
    if resume:
        cmd.append(f"job.resume={run.dir}")
    return cmd


def core_slots(n_slots: int, threads: int | None) -> list[list[int]]:
    """Disjoint core sets, one per slot (wrapping around when there are more threads than cores)."""
    cores = sorted(os.sched_getaffinity(0))
    per = threads or max(1, len(cores) // n_slots)
    return [[cores[(i * per + j) % len(cores)] for j in range(per)] for i in range(n_slots)]


def machine() -> dict:
    info = {"host": socket.gethostname(), "cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        info["gpu"] = q.stdout.strip() or q.stderr.strip()
    return info


def gpu_reading() -> dict | None:
    """{memory_used_mib, utilization_pct} of GPU 0 from nvidia-smi, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    try:
        used, util = (float(x) for x in q.stdout.splitlines()[0].split(","))
    except (ValueError, IndexError):
        return None
    return {"memory_used_mib": used, "utilization_pct": util}


def freeze_code(root: Path) -> Path:
    """A fresh copy of the code the runs use, in <root>/_code/ (caches of compiled Python left out)."""
    code = root / "_code"
    tmp = root / "_code.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in CODE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, tmp / name)
    shutil.rmtree(code, ignore_errors=True)
    tmp.replace(code)
    return code.resolve()


def git_commit() -> str:
    q = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return q.stdout.strip() if q.returncode == 0 else "unknown"


class Sweep:
    def __init__(self, args):
        self.args = args
        self.root = Path(args.root)
        self.root.mkdir(parents=True, exist_ok=True)
        previous = self._previous()
        self.runs = plan(args, self.root, previous)
        self.slots = core_slots(args.parallel, args.threads)
        self.code = freeze_code(self.root) if args.freeze else REPO
        self.procs: dict[int, tuple[Run, subprocess.Popen, float, int]] = {}  # slot -> (run, process, start, slot)
        self.t0 = time.time()
        self.stopping = False
        settings = {k: v for k, v in vars(args).items() if k != "poll"}
        self.manifest = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "commit": args.commit or git_commit(),
            "machine": machine(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0)),
            "sweeps_before": previous.get("_sweeps", 0),
            "settings": settings,
        }

    def _previous(self) -> dict:
        path = self.root / MANIFEST
        if not path.is_file():
            return {}
        old = json.loads(path.read_text())
        out = {f"{r['exp']}/{r['seed']}": r for r in old.get("runs", [])}
        out["_sweeps"] = old.get("sweeps_before", 0) + 1
        return out

    # ------------------------------------------------------------------------------------------ state

    def _classify(self, run: Run) -> str:
        """What to do with a run before starting: skip, resume (from its checkpoint) or fresh."""
        d = Path(run.dir)
        status = read_status(d)
        if status == "completed":
            return "skip"
        if status == "failed" and not self.args.retry_failed:
            return "failed"
        if (d / CHECKPOINT).is_file():
            return "resume"
        if d.exists() and any(d.iterdir()):  # a partial run without a checkpoint: keep it aside, start over
            aside = self.root / "_aborted" / f"{run.exp}_{run.seed}_{time.strftime('%Y%m%d-%H%M%S')}"
            aside.parent.mkdir(parents=True, exist_ok=True)
            d.rename(aside)
        return "fresh"

    def write_manifest(self) -> None:
        self.manifest["updated_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.manifest["elapsed_s"] = round(time.time() - self.t0, 1)
        self.manifest["runs"] = [asdict(r) for r in self.runs]
        counts: dict[str, int] = {}
        for r in self.runs:
            counts[r.state] = counts.get(r.state, 0) + 1
        self.manifest["counts"] = counts
        tmp = self.root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2) + "\n")
        tmp.replace(self.root / MANIFEST)

    # ----------------------------------------------------------------------------------------- running

    def _start(self, run: Run, slot: int, resume: bool) -> None:
        cores = self.slots[slot]
        env = dict(os.environ, OMP_NUM_THREADS=str(len(cores)), MKL_NUM_THREADS=str(len(cores)),
                   PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.code / "src"), env.get("PYTHONPATH")]))
        log = self.root / "_logs" / run.exp / f"{run.seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = command(self.args, run, resume, self.code)
        with open(log, "a") as fh:
            fh.write(f"\n=== attempt {run.attempts + 1} ({'resume' if resume else 'fresh'}) "
                     f"{time.strftime('%Y-%m-%dT%H:%M:%S')} cores {cores}\n$ {' '.join(cmd)}\n")
            fh.flush()
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, process_group=0,
                                    preexec_fn=lambda: os.sched_setaffinity(0, cores))
        run.state, run.pid, run.cores, run.rc = "running", proc.pid, cores, None
        run.attempts += 1
        run.resumed_from.append("checkpoint" if resume else "scratch")
        self.procs[slot] = (run, proc, time.time(), slot)
        print(f"[{self._clock()}] start {run.name} ({'resume' if resume else 'fresh'}) pid {proc.pid} cores {cores}",
              flush=True)

    def _reap(self) -> None:
        for slot, (run, proc, t_start, _) in list(self.procs.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.procs[slot]
            run.rc, run.pid = rc, None
            run.wall_s = round(run.wall_s + time.time() - t_start, 1)
            status = read_status(Path(run.dir))
            if rc == 0 and status == "completed":
                run.state = "completed"
            elif self.stopping:
                run.state = "interrupted"
            elif rc < 0:
                run.state = "killed"
            else:
                run.state = "failed"
            print(f"[{self._clock()}] {run.state} {run.name} rc={rc} after {run.wall_s:.0f} s", flush=True)
            self.write_manifest()

    def _sample_gpu(self) -> None:
        reading = gpu_reading()
        if reading:
            reading.update(t_s=round(time.time() - self.t0), running=len(self.procs))
            self.manifest.setdefault("gpu_samples", []).append(reading)

    def _clock(self) -> str:
        return f"{time.time() - self.t0:6.0f}s"

    def stop(self, *_):
        """Stop every running process (SIGINT to its group, SIGKILL after the grace period)."""
        if self.stopping:
            return
        self.stopping = True
        print(f"[{self._clock()}] stopping {len(self.procs)} running run(s)", flush=True)
        for run, proc, _, _ in self.procs.values():
            _signal_group(proc.pid, signal.SIGINT)
        end = time.time() + self.args.grace
        while self.procs and time.time() < end:
            time.sleep(0.2)
            self._reap()
        for run, proc, _, _ in self.procs.values():
            _signal_group(proc.pid, signal.SIGKILL)
        for run, proc, _, _ in list(self.procs.values()):
            proc.wait()
        self._reap()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        todo = []
        for run in self.runs:
            action = self._classify(run)
            if action == "skip":
                run.state = "skipped"
                print(f"skip {run.name}: completed before", flush=True)
            elif action == "failed":
                run.state = "failed"
                print(f"skip {run.name}: failed before (--retry-failed runs it again)", flush=True)
            else:
                todo.append((run, action == "resume"))
        self.write_manifest()
        deadline = self.t0 + self.args.deadline if self.args.deadline else None
        next_sample = time.time()
        while (todo or self.procs) and not self.stopping:
            if time.time() >= next_sample:
                self._sample_gpu()
                next_sample = time.time() + GPU_SAMPLE_S
            free = [s for s in range(self.args.parallel) if s not in self.procs]
            while todo and free:
                run, resume = todo.pop(0)
                self._start(run, free.pop(0), resume)
                self.write_manifest()
            time.sleep(self.args.poll)
            self._reap()
            if deadline and time.time() >= deadline:
                print(f"[{self._clock()}] deadline ({self.args.deadline:g} s)", flush=True)
                self.stop()
        if self.procs:
            self.stop()
        self.manifest["ended_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.write_manifest()
        archive = Path(self.args.archive) if self.args.archive else self.root / "sweep.tar.gz"
        n = pack(self.root, self.runs, archive)
        print(f"packed {n} run folder(s) into {archive} ({archive.stat().st_size / 1e6:.1f} MB); "
              f"states: {self.manifest['counts']}", flush=True)
        return 0 if all(r.state in ("completed", "skipped") for r in self.runs) else 1


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Checkpoints and temporary files stay behind; so do links (W&B's latest-run and debug*.log point into
    the run folder or outside it)."""
    if info.name.endswith(PACK_EXCLUDE_SUFFIXES) or not (info.isfile() or info.isdir()):
        return None
    return info


def pack(root: Path, runs: list[Run], archive: Path) -> int:
    """<exp>/<seed>/ of every run folder that exists (checkpoints left out), _logs/ and sweep.json, into
    `archive` (written beside it, then renamed)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    n = 0
    with tarfile.open(tmp, "w:gz") as tar:
        for run in runs:
            d = Path(run.dir)
            if d.is_dir():
                tar.add(d, arcname=f"{run.exp}/{run.seed}", filter=_keep)
                n += 1
        if (root / "_logs").is_dir():
            tar.add(root / "_logs", arcname="_logs", filter=_keep)
        for summary in sorted(SFT_CACHE.glob("*/summary.json")):  # the warm starts the runs loaded
            tar.add(summary, arcname=f"_logs/sft/{summary.parent.name}.json")
        tar.add(root / MANIFEST, arcname=MANIFEST)
    tmp.replace(archive)
    return n


def main(argv=None) -> int:
    return Sweep(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
