#!/usr/bin/env python
"""Copy a wheel without the files under some path prefixes, its RECORD rewritten to match.

    python scripts/slim_wheel.py IN.whl OUT_DIR PREFIX [PREFIX ...]

The copy keeps the wheel's file name (pip installs it as the same version). Used by scripts/gpu_wheels.sh to
bring Ray under the size a transfer to a GPU machine may carry.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def slim(src: Path, out_dir: Path, prefixes: tuple[str, ...]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            name = info.filename
            if name.startswith(prefixes):
                dropped += 1
                continue
            data = zin.read(info)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(x for x in lines if not x.startswith(prefixes)) + "\n").encode()
            zout.writestr(info, data)
    print(f"{dst}: dropped {dropped} files, {src.stat().st_size / 1e6:.1f} -> {dst.stat().st_size / 1e6:.1f} MB")
    return dst


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    slim(Path(sys.argv[1]), Path(sys.argv[2]), tuple(sys.argv[3:]))
