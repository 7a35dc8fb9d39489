"""Bad input files fail with one line naming the file and the line (zeromismatch.errors), and run.py prints
that line alone, exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zeromismatch.errors import InputFileError, MissingFileError, UserError, parse_json, read_json
from zeromismatch.models.qwen3_5 import build_model, load_checkpoint, save_checkpoint
from zeromismatch.sft.data import load_sft_records
from zeromismatch.tasks.math.data import load_math_problems
from zeromismatch.tasks.math.task import ensure_offline_math, model_vocab_size

ROOT = Path(__file__).resolve().parents[1]
GOOD = json.dumps({"prompt": "What is 1+1?", "response": "2\nAnswer: 2", "answer": "2", "level": 1})


def _one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message and isinstance(e.value, UserError)
    return message


def test_parse_json_counts_lines_in_the_file():
    with pytest.raises(InputFileError) as e:
        parse_json('{"a": 1,\n "b": }', "x.json", first_line=10)
    assert _one_line(e) == "x.json:11: not valid JSON (Expecting value, column 7)"
    with pytest.raises(MissingFileError, match=r"^file not found: /no/such.json \(a thing\)$"):
        read_json("/no/such.json", "a thing")


def test_malformed_sft_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text(f'{GOOD}\n\n{GOOD}\n{{"prompt": "x" "response": "y"}}\n')
    with pytest.raises(InputFileError) as e:
        load_sft_records(path)
    assert _one_line(e) == f"{path}:4: not valid JSON (Expecting ',' delimiter, column 16)"
    path.write_text(f"{GOOD}\n[1, 2]\n")
    with pytest.raises(InputFileError) as e:
        load_sft_records(path)
    assert _one_line(e) == f"{path}:2: needs a JSON object with string 'prompt' and 'response'"


def test_malformed_problem_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    row = json.dumps({"problem": "What is 1+1?", "answer": "2"})
    path.write_text(f"{row}\n{row}\n{{oops\n")
    with pytest.raises(InputFileError) as e:
        load_math_problems(path)
    assert _one_line(e) == f"{path}:3: not valid JSON (Expecting property name enclosed in double quotes, column 2)"
    with pytest.raises(MissingFileError, match=r"^file not found: ./missing.jsonl$"):
        load_math_problems("./missing.jsonl")


def test_missing_eval_file_is_named_before_anything_is_written(tmp_path):
    task = {
        "name": "math",
        "offline": {"dir": str(tmp_path / "offline"), "n_train": 50, "seed": 0,
                    "eval": str(tmp_path / "mine" / "heldout.parquet")},
    }  # fmt: skip
    with pytest.raises(MissingFileError) as e:
        ensure_offline_math(task)
    assert _one_line(e) == f"file not found: {tmp_path / 'mine' / 'heldout.parquet'} (task.offline.eval)"
    assert not (tmp_path / "offline").exists()


@pytest.mark.parametrize(
    "text, error",
    [
        ('{"vocab_size": 2048,\n "hidden_size": 256,,}', "{path}:2: not valid JSON (Expecting property name enclosed in double quotes, column 21)"),
        ("", "{path}:1: not valid JSON (Expecting value, column 1)"),
        ("[1, 2]", "{path}: expected a model config object, found a JSON list"),
    ],
)
def test_corrupt_model_config_is_one_line(tmp_path, text, error):
    save_checkpoint(build_model("tiny", "stock", seed=0), tmp_path)
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(InputFileError) as e:
        load_checkpoint(tmp_path)
    assert _one_line(e) == error.format(path=path)
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)  # no chain
    with pytest.raises(InputFileError):
        model_vocab_size({"model": {"checkpoint": str(tmp_path)}})


def test_corrupt_checkpoint_index_is_one_line(tmp_path):
    save_checkpoint(build_model("tiny", "stock", seed=0), tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": ')
    with pytest.raises(InputFileError) as e:
        load_checkpoint(tmp_path)
    assert _one_line(e) == f"{index}:1: not valid JSON (Expecting value, column 16)"


def test_rl_checkpoint_from_before_the_merged_projections_is_one_line(tmp_path):
    """A checkpoint.pt whose model stores gate_proj / up_proj on their own (runs before the merged projections)
    stops the resume with one line naming the file and what to do; a current one loads."""
    import torch

    from zeromismatch.models.qwen3_5.checkpoint import checkpoint_tensors
    from zeromismatch.orchestration.checkpoint import load_rl_checkpoint

    sd = build_model("tiny", "stock", seed=0).state_dict()
    for name, model in (("old", checkpoint_tensors(sd)), ("new", sd)):
        (tmp_path / name).mkdir()
        torch.save({"trainer": {"model": model, "version": 3}}, tmp_path / name / "checkpoint.pt")
    with pytest.raises(InputFileError) as e:
        load_rl_checkpoint(tmp_path / "old")
    assert _one_line(e).startswith(f"{tmp_path / 'old' / 'checkpoint.pt'}: its model stores model.layers.0.")
    assert "resume it from a checkout before that commit" in str(e.value)
    assert load_rl_checkpoint(tmp_path / "new")["trainer"]["version"] == 3


def test_missing_checkpoint_files_keep_their_builtin_type(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no config.json in checkpoint directory"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_run_py_prints_a_corrupt_checkpoint_as_one_line(tmp_path):
    ckpt = tmp_path / "ckpt"
    save_checkpoint(build_model("tiny", "stock", seed=0), ckpt)
    (ckpt / "config.json").write_text('{"vocab_size": 2048,')
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    cmd = [sys.executable, str(ROOT / "run.py"), "job=smoke", f"model.checkpoint={ckpt}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == f"error: {ckpt / 'config.json'}:1: not valid JSON (Expecting property name enclosed in double quotes, column 21)\n"
