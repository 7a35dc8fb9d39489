"""SFT demonstrations for the agent task: each generated train task's scripted solution, played in a real sandbox
so the demonstration holds the observations the agent will see, and kept only if the verifier scores it 1.

    path = ensure_agent_demos(cfg.task, train, user_message)   # task.offline.sft, written once (locked, atomic)

A record: ``{"instance_id", "prompt": <user message>, "response": <the turns' texts, one per line>, "turns": [{"role": "assistant", "text": "<bash>..</bash>"},
{"role": "tool", "text": "<output exit=0>..</output>"}, ..., {"role": "assistant", "text": "<submit/>"}]}``;
``AgentTask.sft_example`` tokenizes it.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from pathlib import Path
from typing import Any

from ...config import cfg_get, to_plain
from ..offline_files import ensure_generated, source_sha
from . import actions, offline, sandbox, supervisor
from .actions import action_format
from .pool import SandboxPool, default_concurrency
from .spec import AgentTaskSpec

DEMOS_VERSION = 2


def play_solution(spec: AgentTaskSpec, pool: SandboxPool, fmt) -> list[dict]:
    """The scripted solution as turns, played in a sandbox; raises if the verifier does not score it 1 (a task
    whose own solution fails is a bug in the generator)."""
    box = pool.acquire(spec.sandbox_spec())
    try:
        turns = []
        for cmd in spec.solution:
            turns.append({"role": "assistant", "text": f"<bash>{cmd}</bash>"})
            turns.append({"role": "tool", "text": fmt.observation(box.run(cmd))})
        turns.append({"role": "assistant", "text": "<submit/>"})
        if box.verify(spec.test_sh, spec.test_files) != 1.0:
            raise RuntimeError(f"task {spec.instance_id}: its scripted solution fails its verifier "
                               f"({box.last_verify})")
        return turns
    finally:
        pool.release(box)


def demos_meta(cfg_task: Any) -> dict:
    """What the demonstrations depend on: the task settings and the source of the generator, the action format
    and the sandbox (an edit to any of them writes them anew)."""
    off = cfg_get(cfg_task, "offline")
    return {"version": DEMOS_VERSION, "n_train": int(cfg_get(off, "n_train", 2000)),
            "n_sft": int(cfg_get(off, "n_sft", 256)), "seed": int(cfg_get(off, "seed", 0)),
            "families": to_plain(cfg_get(off, "families")), "format": cfg_get(cfg_task, "action_format", "tags"),
            "sources": {m.__name__.rsplit(".", 1)[1]: source_sha(m.__file__)
                        for m in (offline, actions, sandbox, supervisor)}}


def ensure_agent_demos(cfg_task: Any, train: list[AgentTaskSpec], user_message) -> Path:
    """task.offline.sft: the demonstrations of the first ``task.offline.n_sft`` train tasks (module doc), written
    unless present for the same ``demos_meta``; ``user_message(spec, fmt)`` renders each prompt."""
    off = cfg_get(cfg_task, "offline")
    root = Path(cfg_get(off, "dir", "data/offline_agent"))
    fmt = action_format(cfg_get(cfg_task, "action_format", "tags"))
    specs = train[: int(cfg_get(off, "n_sft", 256))]

    def write(tmp: Path) -> dict[str, Path]:
        pool = SandboxPool(sandbox.SandboxLimits(command_timeout_s=30), default_concurrency())
        with cf.ThreadPoolExecutor(pool.max_concurrent) as ex:
            all_turns = list(ex.map(lambda s: play_solution(s, pool, fmt), specs))
        tmp.mkdir(parents=True, exist_ok=True)
        with open(tmp / "sft.jsonl", "w") as f:
            for spec, turns in zip(specs, all_turns):
                f.write(json.dumps({"instance_id": spec.instance_id, "prompt": user_message(spec, fmt),
                                    "response": "\n".join(t["text"] for t in turns), "family": spec.family,
                                    "turns": turns}) + "\n")
        return {"sft": tmp / "sft.jsonl"}

    paths = ensure_generated(root, {"sft": Path(cfg_get(off, "sft", root / "sft.jsonl"))}, {"sft": "sft.jsonl"},
                             demos_meta(cfg_task), write, cfg_key="task.offline",
                             writer="zeromismatch.tasks.agent.demos")
    return paths["sft"]
