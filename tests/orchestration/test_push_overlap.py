"""The weight push overlaps the next trainer step (orchestration/ray_actors.TrainerRank, ray_run.start_push):
trainer rank 0, here in this process (one rank, no Ray), starts the broadcast of version 1 and trains step 2
while it is in flight; the generator's end then receives version 1 with version 1's weights bit for bit (a kept
copy, untouched by the step that ran meanwhile), and the next push carries version 2.

The push is held in flight deterministically: a gloo broadcast root waits until every receiver has joined, and
the receiving end joins only after step 2 returned."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from zeromismatch.orchestration.ray_actors import TrainerRank, free_port
from zeromismatch.orchestration.weight_sync import WeightSync, layout_of
from zeromismatch.trainer.fsdp_check import DEFAULTS, synthetic_batches

CONF = str(Path(__file__).resolve().parents[2] / "conf")


@pytest.fixture
def rank(monkeypatch, tmp_path):
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):  # setup() sets them
        monkeypatch.setenv(key, "")
    n = torch.get_num_threads()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config", overrides=["job=rl", "task=toy", "model=tiny", "numerics=bi", "trainer.lr=1e-3",
                                           f"logging.run_dir={tmp_path}"])
    r = TrainerRank(OmegaConf.to_container(cfg, resolve=True), 0, 1)
    assert r.setup("127.0.0.1", free_port()) == 0
    yield r
    torch.set_num_threads(n)


def _open(rank: TrainerRank) -> WeightSync:
    """The weight-sync group of rank 0 and one receiving end (both ends block until the other joins)."""
    port, ends = free_port(), {}
    joiner = threading.Thread(target=lambda: ends.update(gen=WeightSync("127.0.0.1", port, 1, 2, "gloo")))
    joiner.start()
    rank.open_sync("127.0.0.1", port, 2, "gloo")
    joiner.join()
    return ends["gen"]


def test_step_trains_while_the_previous_push_is_in_flight(rank):
    gen = _open(rank)
    b1, b2 = synthetic_batches(rank.trainer.model, {**DEFAULTS, "steps": 2})
    rank.train_step(b1)
    v1 = {k: v.clone() for k, v in rank.kept[1].items()}

    pushed = {}
    push = threading.Thread(target=lambda: pushed.update(version=rank.send_weights(1)))
    push.start()
    out = {}
    step = threading.Thread(target=lambda: out.update(metrics=rank.train_step(b2)))
    step.start()
    step.join(timeout=120)  # a step that waited for the push would still be running: nobody receives yet
    assert not step.is_alive(), "the step waited for the push in flight"
    metrics = out["metrics"]
    assert push.is_alive() and rank.trainer.version == 2
    assert metrics["perf/weight_sync/overlap_seconds"] > 0

    layout = layout_of(v1)
    version, received = gen.recv(layout)
    push.join()
    assert version == pushed["version"] == 1
    assert all(torch.equal(received[k], v1[k]) for k in v1)  # version 1's weights, as they were
    v2 = rank.trainer.weights()
    assert not all(torch.equal(v1[k], v2[k]) for k in v1)  # step 2 moved them

    push = threading.Thread(target=rank.send_weights)  # default: the newest version
    push.start()
    version, received = gen.recv(layout)
    push.join()
    assert version == 2 and all(torch.equal(received[k], v2[k]) for k in v2)
    assert sorted(rank.kept) == [1, 2]  # the newest two only
