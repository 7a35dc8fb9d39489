"""scripts/repro_table.py on the committed two-seed sweep (tests/plots/data/sweep_tiny): the numbers REPORT.md
quotes are means over seeds, and arm differences are also paired by seed."""

import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import repro_table  # noqa: E402

RUNS = str(REPO / "tests/plots/data/sweep_tiny/*/*")


def test_groups_and_paired_differences():
    t = repro_table.table(RUNS, last=2)
    groups = {g["arm"]: g for g in t["groups"]}
    assert set(groups) == {"bi", "stock"} and all(g["seeds"] == 2 for g in groups.values())
    assert groups["bi"]["gap_step0"] == 0.0 and groups["stock"]["gap_step0"] > 0.0
    for name in ("gap_last", "reward_last"):
        d = next(x for x in t["differences"] if x["metric"] == name)
        bi, stock = groups["bi"][name + "_per_seed"], groups["stock"][name + "_per_seed"]
        per_seed = [a - b for a, b in zip(bi, stock)]  # both groups list seeds 0, 1 in order
        assert d["pairs"] == 2
        assert math.isclose(d["paired_diff"], sum(per_seed) / 2, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(d["diff"], d["paired_diff"], rel_tol=1e-9, abs_tol=1e-15)  # equal means, same seeds
    assert "paired by seed" in repro_table.markdown(t)


def test_paired_ci_matches_seeds_not_positions():
    d, h, n = repro_table.paired_ci({0: 1.0, 1: 3.0, 2: None}, {1: 1.0, 0: 0.5, 5: 9.0})
    assert n == 2 and math.isclose(d, ((1.0 - 0.5) + (3.0 - 1.0)) / 2) and h is not None
