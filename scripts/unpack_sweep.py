#!/usr/bin/env python
"""Lay out a sweep archive (scripts/sweep.py) as <dest>/<exp>/<seed>/ run folders.

    python scripts/unpack_sweep.py sweep.tar.gz                 # -> results/repro/<exp>/<seed>/
    python scripts/unpack_sweep.py sweep.tar.gz --dest DIR [--replace]

Writes every run folder of the archive, <dest>/sweep.json (the sweep's manifest: command, commit, machine,
each run's status) and <dest>/_logs/. A run folder that already exists under <dest> is left alone (and named)
unless --replace. Members outside <exp>/<seed>/, _logs/ and sweep.json, absolute paths, '..' and links are
refused: the archive is data, not a script.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

RUN = re.compile(r"^[A-Za-z0-9_.-]+/\d+$")


def run_of(name: str) -> str | None:
    """The <exp>/<seed> a member belongs to, or None for sweep.json / _logs/."""
    parts = PurePosixPath(name).parts
    if parts[0] in ("sweep.json", "_logs"):
        return None
    return "/".join(parts[:2]) if len(parts) >= 2 and RUN.match("/".join(parts[:2])) else ""


def check_member(m: tarfile.TarInfo) -> None:
    p = PurePosixPath(m.name)
    if p.is_absolute() or ".." in p.parts or not (m.isfile() or m.isdir()):
        raise SystemExit(f"error: {m.name}: refused (absolute path, '..', or not a plain file or folder)")
    if run_of(m.name) == "":
        raise SystemExit(f"error: {m.name}: not under <exp>/<seed>/, _logs/ or sweep.json; not a sweep archive")


def unpack(archive: str | Path, dest: str | Path = "results/repro", replace: bool = False) -> list[str]:
    """Unpack `archive` into `dest`; returns the <exp>/<seed> run folders written."""
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise SystemExit(f"error: {archive}: no such archive")
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for m in members:
            check_member(m)
        runs = sorted({r for m in members if (r := run_of(m.name))})
        if not runs:
            raise SystemExit(f"error: {archive}: holds no <exp>/<seed>/ run folders")
        with tempfile.TemporaryDirectory(dir=dest.parent if dest.parent.exists() else None) as tmp:
            tar.extractall(tmp, members=members, filter="data")
            dest.mkdir(parents=True, exist_ok=True)
            written = []
            for run in runs:
                target = dest / run
                if target.exists():
                    if not replace:
                        print(f"kept {target}: exists (--replace overwrites it)")
                        continue
                    shutil.rmtree(target)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(Path(tmp) / run), target)
                written.append(run)
            if (Path(tmp) / "_logs").is_dir():
                shutil.copytree(Path(tmp) / "_logs", dest / "_logs", dirs_exist_ok=True)
            if (Path(tmp) / "sweep.json").is_file():
                shutil.copy2(Path(tmp) / "sweep.json", dest / "sweep.json")
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archive")
    p.add_argument("--dest", default="results/repro")
    p.add_argument("--replace", action="store_true", help="overwrite run folders that exist")
    args = p.parse_args(argv)
    written = unpack(args.archive, args.dest, args.replace)
    print(f"{len(written)} run folder(s) into {args.dest}: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
