"""Mistakes in what the user gave (a config value, an input file): run.py prints ``error: <message>`` as one
line and exits with status 2, without a traceback (``ZM_DEBUG=1`` shows it). The message names what to fix:
the config key and the allowed values, or the file and the line.

The subclasses also derive from the builtin a caller would catch for the same fault (ValueError,
FileNotFoundError), so library callers keep catching what they caught.

No project imports: every layer (config schema, tasks, checkpoints) raises these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "InputFileError", "MissingFileError", "UserError", "parse_json", "read_json"]


class UserError(Exception):
    """A fault in the user's input; ``str(e)`` is the whole one-line message."""


class ConfigError(UserError, ValueError):
    """A composed config that is malformed, or that cannot run on this machine."""


class InputFileError(UserError, ValueError):
    """An input file that cannot be parsed: the message names the file and the line."""


class MissingFileError(UserError, FileNotFoundError):
    """An input file the config names that does not exist."""


def parse_json(text: str, source: str | Path, first_line: int = 1) -> Any:
    """``json.loads(text)``; a syntax error as InputFileError ``<source>:<line>: not valid JSON (...)``, the line
    counted in the file (``first_line``: the file line ``text`` starts on, e.g. a JSONL record's)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputFileError(f"{source}:{first_line + e.lineno - 1}: not valid JSON ({e.msg}, column {e.colno})") from None


def read_json(path: str | Path, what: str = "a JSON object") -> dict:
    """A JSON file that must hold an object: MissingFileError / InputFileError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"file not found: {path} ({what})")
    obj = parse_json(path.read_text(encoding="utf-8"), path)
    if not isinstance(obj, dict):
        raise InputFileError(f"{path}: expected {what}, found a JSON {type(obj).__name__}")
    return obj
