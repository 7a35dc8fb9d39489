"""The offline task family: deterministic, held-out disjoint from train, and every template's scripted solution
passes its verifier while doing nothing fails it."""

import random

import pytest

from zeromismatch.tasks.agent.offline import FAMILIES, TEMPLATES, make_task, offline_agent_splits
from zeromismatch.tasks.agent.sandbox import Sandbox

from .conftest import SMALL


def test_splits_are_deterministic_and_disjoint():
    a, b = offline_agent_splits(300, 30, seed=1), offline_agent_splits(300, 30, seed=1)
    assert [t.to_json() for t in a["train"] + a["heldout"]] == [t.to_json() for t in b["train"] + b["heldout"]]
    assert not {t.instruction for t in a["heldout"]} & {t.instruction for t in a["train"]}
    assert {t.family for t in a["train"]} == set(FAMILIES)
    assert offline_agent_splits(300, 30, seed=2)["train"][0].to_json() != a["train"][0].to_json()
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        offline_agent_splits(10, 2, seed=0, families=["file", "nope"])


@pytest.mark.parametrize("template", TEMPLATES, ids=[fn.__name__ for _, fn in TEMPLATES])
def test_solution_passes_and_doing_nothing_fails(template):
    _, fn = template
    draws = (make_task(random.Random(f"{fn.__name__}:{k}"), 0, "t") for k in range(10_000))
    spec = next(s for s in draws if s.instance_id.endswith(fn.__name__.replace("_", "-")))
    for commands, want in ((spec.solution, 1.0), ((), 0.0)):
        with Sandbox(spec.sandbox_spec(), SMALL) as box:
            for c in commands:
                assert box.run(c).exit_code == 0
            assert box.verify(spec.test_sh, spec.test_files) == want, (spec.instruction, box.last_verify)
