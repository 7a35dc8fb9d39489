"""The published task-row layout, loaded from fixture rows this test writes (jsonl and parquet)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zeromismatch.errors import InputFileError, MissingFileError
from zeromismatch.tasks.agent.rows import load_task_rows
from zeromismatch.tasks.agent.sandbox import Sandbox

from .conftest import SMALL

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if cmp -s /app/out.txt /tests/data/expected.txt; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def _row(i, **meta):
    m = {"instance_id": f"task-{i}", "image": "ghcr.io/example/img:1", "workdir": "/app",
         "tmax": {"test_sh": TEST_SH, "fixtures": {"data/expected.txt": "ok\n"},
                  "reward_path": "/logs/verifier/reward.txt"}}
    m.update(meta)
    return {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": f"Write ok to out.txt ({i})"}],
            "label": None, "metadata": m}


def test_jsonl_rows_load_and_their_verifier_runs(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_row(i)) + "\n" for i in range(3)))
    specs = load_task_rows(path)
    assert [s.instance_id for s in specs] == ["task-0", "task-1", "task-2"]
    s = specs[1]
    assert s.instruction == "Write ok to out.txt (1)" and s.workdir == "/app" and s.image == "ghcr.io/example/img:1"
    assert s.test_files == {"data/expected.txt": "ok\n"} and s.reward_path == "/logs/verifier/reward.txt"
    for cmd, want in (("echo ok > out.txt", 1.0), ("echo no > out.txt", 0.0)):
        with Sandbox(s.sandbox_spec(), SMALL) as box:
            assert box.run(f"{cmd}; pwd").output.strip() == "/app"
            assert box.verify(s.test_sh, s.test_files) == want


def test_parquet_rows_with_metadata_as_json_strings(tmp_path):
    rows = [_row(0), _row(1)]
    for r in rows:
        r["metadata"] = json.dumps(r["metadata"])
        r["prompt"] = r["prompt"][-1]["content"]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    specs = load_task_rows(path)
    assert [s.instruction for s in specs] == ["Write ok to out.txt (0)", "Write ok to out.txt (1)"]


@pytest.mark.parametrize("meta, message", [
    ({"tmax": {"fixtures": {}}}, "metadata.tmax.test_sh"),
    ({"workdir": "relative/dir"}, "metadata.workdir='relative/dir'"),
    ({"tmax": {"test_sh": "x", "fixtures": {"../escape": "x"}}}, "fixtures key '../escape'"),
    ({"instance_id": ""}, "metadata.instance_id"),
])
def test_malformed_rows_name_the_file_line_and_key(tmp_path, meta, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n\n" + json.dumps(_row(1, **meta)) + "\n")
    with pytest.raises(InputFileError) as e:
        load_task_rows(path)
    assert str(e.value).startswith(f"{path}:3: ") and message in str(e.value)


def test_missing_file_and_duplicate_ids(tmp_path):
    with pytest.raises(MissingFileError, match="task.rows"):
        load_task_rows(tmp_path / "absent.jsonl")
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_row(0)) + "\n" + json.dumps(_row(0)) + "\n")
    with pytest.raises(InputFileError, match="'task-0' occurs more than once"):
        load_task_rows(path)
