"""Binary math reward: 1.0 when math-verify judges the final answer equal to the gold answer.

Final answer = text after the last ``Answer:`` (the DAPO prompt asks for it); without one, the
last ``\\boxed{}``; without either, none: the response scores 0, as in the published verifier, which
grades only a marked final answer ("work mentions 34" with gold 34 scores 0). ``last_number_fallback``
(cfg.task.last_number_fallback, off in every experiment) takes the last number of an unmarked response
instead, a looser grader for diagnosing models that do not write the marker.

Why a worker process. math-verify guards ``parse``/``verify`` with ``signal.alarm``, which only
works on the main thread, and rollouts are scored from other threads. Disabling it
(``parsing_timeout=None``, ``timeout_seconds=None``) leaves sympy unbounded: a 40-character
``\\boxed{2^{2^{2^{2^{2^{100}}}}}}`` never returns, and 5k nested braces take ~50 s. A Python
thread cannot be stopped, so sympy runs in one long-lived child process, and a late reply gets the
child killed (and replaced) with a score of 0. That works from any thread, costs one pipe
round trip per non-trivial answer, and never spawns per call.

Two cheap filters run before the pipe: answers longer than ``MAX_ANSWER_CHARS`` or with a digit
run longer than ``MAX_DIGITS`` score 0 (no genuine final answer looks like that, and it keeps
huge strings off the pipe); and when both sides are plain integers (almost all of DAPO-Math and
all of AIME) they are compared as Python ints, which is what math-verify would conclude anyway.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from zeromismatch.tasks.math.prompts import extract_answer, last_boxed, last_number

MAX_ANSWER_CHARS = 256
MAX_DIGITS = 100
DEFAULT_TIMEOUT_S = 2.0  # genuine comparisons of short answers take < 0.3 s

# Bounded digit counts: int() refuses > 4300 digits, and a long gold must not raise here.
_INT_RE = re.compile(r"[+-]?\d{1,%d}" % MAX_DIGITS)
_BOXED_INT_RE = re.compile(r"\\boxed\{\s*([+-]?\d{1,%d})\s*\}" % MAX_DIGITS)
_LONG_DIGITS_RE = re.compile(r"\d{%d}" % (MAX_DIGITS + 1))


def final_answer(response: str | None, last_number_fallback: bool = False) -> str | None:
    """The answer a response commits to (see module doc), or None when it commits to nothing."""
    if not isinstance(response, str):
        return None
    answer = extract_answer(response)
    if answer is None:
        answer = last_boxed(response)
    if answer is None and last_number_fallback:
        answer = last_number(response)
    return answer or None


def _as_int(text: str) -> int | None:
    """``text`` as an int if it is a plain (optionally boxed) integer, else None."""
    if m := _INT_RE.fullmatch(text):
        return int(m.group(0))
    if m := _BOXED_INT_RE.fullmatch(text):
        return int(m.group(1))
    return None


def _as_latex(answer: str) -> str:
    # A bare answer is boxed so math-verify's LaTeX extractor takes all of it: unboxed,
    # "\sqrt{2}" parses to nothing and "3\pi" to 3.
    if "\\boxed" in answer or "$" in answer:
        return answer
    return "\\boxed{" + answer + "}"


def _gold_text(gold) -> str | None:
    # Gold answers come as str, or as ints in some AIME dumps; anything else is a data bug.
    if isinstance(gold, bool) or gold is None:
        return None
    if isinstance(gold, int):
        return str(gold)
    if isinstance(gold, str) and gold.strip():
        return gold.strip()
    return None


class MathVerifier:
    """Scores responses against gold answers; thread-safe; math-verify runs in a child process.

    ``timeout_s`` bounds one comparison (a late one scores 0 and the child is replaced);
    ``last_number_fallback`` grades an unmarked response by its last number (module doc).
    Use as a context manager or call ``close()``; the module-level helpers share one instance.
    Raises RuntimeError only if the child cannot start at all (math-verify not importable).
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, startup_timeout_s: float = 120.0,
                 last_number_fallback: bool = False):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.last_number_fallback = last_number_fallback
        self.startup_timeout_s = startup_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner_pid = os.getpid()
        self._buf = b""
        self._ready = False  # the child has printed "ready" (math-verify imported)
        self.restarts = 0  # children lost to timeouts or crashes; worth logging

    # ----- public API -----

    def score(self, response: str | None, gold) -> float:
        """1.0 or 0.0 (module doc); never raises on bad input."""
        gold_text = _gold_text(gold)
        pred = final_answer(response, self.last_number_fallback)
        if gold_text is None or pred is None:
            return 0.0
        if len(pred) > MAX_ANSWER_CHARS or _LONG_DIGITS_RE.search(pred):
            return 0.0
        gold_int, pred_int = _as_int(gold_text), _as_int(pred)
        if gold_int is not None and pred_int is not None:
            return float(gold_int == pred_int)
        return 1.0 if self._judge(_as_latex(gold_text), _as_latex(pred)) else 0.0

    def score_batch(self, responses: Sequence[str | None], golds: Sequence) -> list[float]:
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
        return [self.score(r, g) for r, g in zip(responses, golds)]

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- child process -----

    def _judge(self, gold: str, pred: str) -> bool:
        request = (json.dumps({"gold": gold, "pred": pred}) + "\n").encode()
        with self._lock:
            proc = self._ensure_started()
            try:
                proc.stdin.write(request)
                proc.stdin.flush()
                reply = self._read_line(time.monotonic() + self.timeout_s)
            except OSError:  # child died since the last call
                reply = None
            if reply is None:  # too slow, or crashed: either way this answer scores 0
                self._kill(failed=True)
                # Start the replacement now, so its ~1 s import of sympy overlaps with the
                # caller's next (often integer, in-process) answers instead of delaying them.
                self._spawn()
                return False
            return reply == b"1"

    def _spawn(self) -> None:
        src_root = str(Path(__file__).resolve().parents[3])  # .../src, so no install is needed
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src_root, env.get("PYTHONPATH")]))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "zeromismatch.tasks.math._verify_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            # Own session: a Ctrl-C aimed at the trainer should not spray worker tracebacks;
            # the worker exits by itself when our end of stdin closes.
            start_new_session=True,
        )
        self._buf, self._ready = b"", False

    def _ensure_started(self) -> subprocess.Popen:
        if os.getpid() != self._owner_pid:
            # Forked copy of this object: the pipes belong to the parent's child. Start our own.
            self._proc, self._buf, self._owner_pid = None, b"", os.getpid()
        if self._proc is not None and self._proc.poll() is not None:  # died on its own
            self._kill(failed=True)
        if self._proc is None:
            self._spawn()
        if not self._ready:
            if self._read_line(time.monotonic() + self.startup_timeout_s) != b"ready":
                self._kill()
                raise RuntimeError(
                    "math-verify worker did not start; check that `python -m "
                    "zeromismatch.tasks.math._verify_worker` runs (is math-verify installed?)"
                )
            self._ready = True
        return self._proc

    def _read_line(self, deadline: float) -> bytes | None:
        """Next line from the child without its newline; None on timeout or EOF."""
        fd = self._proc.stdout.fileno()
        # poll, not select: a trainer can hold more than FD_SETSIZE (1024) descriptors.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            chunk = os.read(fd, 4096)
            if not chunk:  # EOF: the child crashed (e.g. C stack overflow in sympy)
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.strip()

    def _kill(self, failed: bool = False) -> None:
        proc, self._proc, self._buf, self._ready = self._proc, None, b"", False
        if proc is None:
            return
        self.restarts += failed
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def __del__(self):
        try:
            self._kill()
        except Exception:
            pass


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """The shared verifier behind ``math_reward``/``batch_reward`` (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
            atexit.register(_default.close)
        return _default


def math_reward(response: str | None, gold) -> float:
    """1.0 if the response's final answer equals ``gold`` per math-verify, else 0.0. Never raises
    on bad input (garbage, huge numbers, pathological LaTeX, None); safe from any thread."""
    return default_verifier().score(response, gold)


def batch_reward(responses: Sequence[str | None], golds: Sequence) -> list[float]:
    """``math_reward`` over pairs; ValueError if the two lengths differ."""
    return default_verifier().score_batch(responses, golds)
