"""The published terminal-task rows: one task per row, in a .jsonl or .parquet file.

    {"prompt": "..." | [{"role": "user", "content": "..."}], "label": ...,
     "metadata": {"instance_id": "...", "image": "...", "workdir": "/app",
                  "tmax": {"test_sh": "#!/bin/bash ...", "fixtures": {"relpath": "text"}, "reward_path": "..."}}}

    specs = load_task_rows("tasks.jsonl")        # [AgentTaskSpec]

``metadata`` may also be a JSON string (parquet files often store it so). The fixtures are the verifier's files:
they go beside test.sh into /tests after the agent submits. The container ``image`` is recorded but not pulled
(no registry is reachable from our machines): the task runs on this machine's /usr in its sandbox, with an
empty work dir, so a task that needs its image's contents fails its verifier. A malformed row raises one
InputFileError naming the file, the row and the key.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pyarrow.parquet as pq

from ...errors import InputFileError, MissingFileError, parse_json
from .spec import REWARD_PATH, WORKDIR, AgentTaskSpec


def _rows(path: Path) -> list[tuple[str, dict]]:
    """(where, row) per row: ``<file>, row <i>`` for parquet, ``<file>:<line>`` for jsonl."""
    if path.suffix == ".parquet":
        return [(f"{path}, row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            row = parse_json(line, path, first_line=i + 1)
            if not isinstance(row, dict):
                raise InputFileError(f"{path}:{i + 1}: a row must be a JSON object")
            rows.append((f"{path}:{i + 1}", row))
    return rows


def _prompt_text(prompt, where: str) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        users = [m.get("content") for m in prompt if m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    raise InputFileError(f"{where}: prompt must be a string or a list of chat messages with a user message")


def _abs_path(value, default: str, where: str) -> str:
    value = default if value is None else value
    p = PurePosixPath(str(value))
    if not p.is_absolute() or ".." in p.parts or len(p.parts) < 2:
        raise InputFileError(f"{where}={value!r}: expected an absolute path below / without '..'")
    return str(p)


def row_to_spec(row: dict, where: str) -> AgentTaskSpec:
    meta = row.get("metadata")
    if isinstance(meta, str):
        meta = parse_json(meta, where)
    if not isinstance(meta, dict):
        raise InputFileError(f"{where}: metadata must be an object (or a JSON string of one)")
    tmax = meta.get("tmax")
    if isinstance(tmax, str):
        tmax = parse_json(tmax, where)
    if not isinstance(tmax, dict) or not isinstance(tmax.get("test_sh"), str) or not tmax["test_sh"].strip():
        raise InputFileError(f"{where}: metadata.tmax.test_sh must be the verifier script's text")
    fixtures = tmax.get("fixtures") or {}
    if not isinstance(fixtures, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in fixtures.items()):
        raise InputFileError(f"{where}: metadata.tmax.fixtures must map relative paths to text")
    for rel in fixtures:
        p = PurePosixPath(rel)
        if p.is_absolute() or ".." in p.parts or not p.parts or rel == "test.sh":
            raise InputFileError(f"{where}: metadata.tmax.fixtures key {rel!r}: expected a relative path without "
                                 "'..' (and not test.sh)")
    instance_id = meta.get("instance_id")
    if not isinstance(instance_id, str) or not instance_id:
        raise InputFileError(f"{where}: metadata.instance_id must be a non-empty string")
    return AgentTaskSpec(
        instance_id=instance_id, instruction=_prompt_text(row.get("prompt"), where), test_sh=tmax["test_sh"],
        test_files=dict(fixtures), workdir=_abs_path(meta.get("workdir"), WORKDIR, f"{where}: metadata.workdir"),
        reward_path=_abs_path(tmax.get("reward_path"), REWARD_PATH, f"{where}: metadata.tmax.reward_path"),
        family="published", image=meta.get("image"),
    )


def load_task_rows(path: str | Path) -> list[AgentTaskSpec]:
    """Every row of ``path`` (.jsonl or .parquet) as an AgentTaskSpec, in file order."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"file not found: {path} (task.rows)")
    specs = [row_to_spec(row, where) for where, row in _rows(path)]
    ids = [s.instance_id for s in specs]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise InputFileError(f"{path}: instance_id {dup!r} occurs more than once")
    if not specs:
        raise InputFileError(f"{path}: no task rows")
    return specs


def write_task_rows(path: str | Path, specs: list[AgentTaskSpec]) -> None:
    """Write specs in the published row layout (.jsonl): the inverse of load_task_rows for their fields."""
    with open(path, "w") as f:
        for s in specs:
            meta = {"instance_id": s.instance_id, "image": s.image, "workdir": s.workdir,
                    "tmax": {"test_sh": s.test_sh, "fixtures": s.test_files, "reward_path": s.reward_path}}
            f.write(json.dumps({"prompt": [{"role": "user", "content": s.instruction}], "label": None,
                                "metadata": meta}) + "\n")
