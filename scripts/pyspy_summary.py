#!/usr/bin/env python
"""Where one thread of a `py-spy record --format raw --threads --idle` profile spends its samples: the share of
its samples whose stack contains each given frame name (a frame may sit under another, so shares overlap).

    python scripts/pyspy_summary.py prof.txt --thread generator Engine.step ModelRunner._eager ChunkGDN.cached
"""

from __future__ import annotations

import argparse
import collections


def shares(path: str, thread: str, frames: list[str]) -> tuple[int, dict[str, int]]:
    total, hits = 0, collections.Counter()
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack.split(";", 1)[0].endswith(f": {thread}"):  # the first frame names the thread
            continue
        total += int(n)
        for f in frames:
            if f in stack:
                hits[f] += int(n)
    return total, {f: hits[f] for f in frames}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile")
    p.add_argument("frames", nargs="+", help="frame names (substrings of py-spy's 'function (file:line)')")
    p.add_argument("--thread", default="generator", help="thread name (py-spy: 'thread (<tid>): <name>')")
    a = p.parse_args()
    total, hits = shares(a.profile, a.thread, a.frames)
    print(f"{a.thread}: {total} samples")
    for f, n in hits.items():
        print(f"{n / max(total, 1):6.1%}  {f}")


if __name__ == "__main__":
    main()
