"""scripts/sweep.py and scripts/unpack_sweep.py on the CPU: 2 tiny math experiments x 2 seeds, one run killed
mid-way (SIGKILL to its process group after its first checkpoint), the sweep run again (completed runs
skipped, the killed one resumed from its checkpoint), and the archive unpacked into <exp>/<seed>/ folders that
the figures read. The second sweep runs with --freeze: the resumed run's code comes from the sweep's own copy.
Random-init tiny model, a few short steps: ~1 min on 2 cores."""

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from zeromismatch.plots import load_runs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import unpack_sweep  # noqa: E402

EXPS = ["tiny_math_op4_bi", "tiny_math_op4_stock"]
STEPS = 10


def sweep_cmd(tmp: Path, *extra: str) -> list[str]:
    sets = [
        "rl.sft_warm_start=false", "rl.prompts_per_step=2", "rl.samples_per_prompt=2", "rl.max_new_tokens=8",
        "rl.eval_every=5", "rl.checkpoint_every=1", "rl.drop_uniform_groups=false", "task.offline.n_train=200",
        f"task.offline.dir={tmp / 'data'}", f"task.tokenizer_cache={tmp / 'tok'}", "logging.wandb.mode=offline",
    ]
    return [sys.executable, str(REPO / "scripts" / "sweep.py"), "--exps", ",".join(EXPS), "--seeds", "0,1",
            "--steps", str(STEPS), "--parallel", "2", "--threads", "1", "--poll", "0.2", "--root", str(tmp / "root"),
            "--archive", str(tmp / "sweep.tar.gz"), *[a for s in sets for a in ("--set", s)], *extra]


def manifest(tmp: Path) -> dict:
    try:
        return json.loads((tmp / "root" / "sweep.json").read_text())
    except (OSError, ValueError):
        return {}


def kill_one_after_checkpoint(proc: subprocess.Popen, tmp: Path, timeout: float = 240) -> str:
    """SIGKILL the first run seen running with a checkpoint written; its <exp>/<seed>."""
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        for r in manifest(tmp).get("runs", []):
            d = Path(r["dir"])
            if r["state"] == "running" and r["pid"] and (d / "checkpoint.pt").is_file():
                status = json.loads((d / "status.json").read_text())["status"]
                if status == "running":
                    os.killpg(r["pid"], signal.SIGKILL)
                    return f"{r['exp']}/{r['seed']}"
        time.sleep(0.1)
    pytest.fail("no run was seen mid-way with a checkpoint")


def train_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [r["step"] for r in rows if "train/loss" in r]


@pytest.mark.slow
def test_sweep_kill_resume_unpack(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    first = subprocess.Popen(sweep_cmd(tmp_path), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    killed = kill_one_after_checkpoint(first, tmp_path)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 1, out  # not every run completed
    runs = {f"{r['exp']}/{r['seed']}": r for r in manifest(tmp_path)["runs"]}
    assert runs[killed]["state"] == "killed", out
    assert all(r["state"] == "completed" for name, r in runs.items() if name != killed), out
    done_before = {n: (tmp_path / "root" / n / "metrics.jsonl").stat().st_mtime for n in runs if n != killed}

    second = subprocess.run(sweep_cmd(tmp_path, "--freeze"), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    runs = {f"{r['exp']}/{r['seed']}": r for r in manifest(tmp_path)["runs"]}
    assert runs[killed]["state"] == "completed"
    assert runs[killed]["resumed_from"] == ["scratch", "checkpoint"]
    for name, mtime in done_before.items():
        assert runs[name]["state"] == "skipped" and runs[name]["attempts"] == 1
        assert (tmp_path / "root" / name / "metrics.jsonl").stat().st_mtime == mtime  # not run again
    assert train_steps(tmp_path / "root" / killed) == list(range(STEPS))  # each step once across the kill
    code = (tmp_path / "root" / "_code").resolve()
    exp, seed = killed.split("/")
    launched = [line for line in (tmp_path / "root" / "_logs" / exp / f"{seed}.log").read_text().splitlines()
                if line.startswith("$ ")]
    assert launched[0].split()[2] == str(REPO / "run.py")  # first attempt: the live tree
    assert launched[-1].split()[2] == str(code / "run.py")  # resumed under --freeze: the sweep's copy
    assert (code / "src" / "zeromismatch" / "tasks" / "agent" / "supervisor.py").is_file()
    assert (code / "conf" / "exp" / f"{exp}.yaml").is_file()

    with tarfile.open(tmp_path / "sweep.tar.gz") as tar:
        names = tar.getnames()
    assert not any(n.endswith(".pt") for n in names)  # checkpoints stay behind
    assert not any(n.startswith("_code") for n in names)  # nor does the copy of the code
    dest = tmp_path / "results" / "repro"
    written = unpack_sweep.unpack(tmp_path / "sweep.tar.gz", dest)
    assert written == sorted(f"{e}/{s}" for e in EXPS for s in (0, 1))
    for name in written:
        d = dest / name
        assert json.loads((d / "status.json").read_text())["status"] == "completed"
        assert (d / "config.json").is_file() and train_steps(d) == list(range(STEPS))
        assert list((d / "wandb").glob("offline-run-*/run-*.wandb"))  # the offline W&B run travels
    assert json.loads((dest / "sweep.json").read_text())["counts"] == {"completed": 1, "skipped": 3}
    loaded = load_runs(str(dest / "*" / "*"))
    assert sorted({(r.arm, r.offpolicy) for r in loaded}) == [("bi", 4), ("stock", 4)]
    assert unpack_sweep.unpack(tmp_path / "sweep.tar.gz", dest) == []  # existing folders are kept
