"""Child process that runs math-verify for ``reward.MathVerifier``.

Protocol over stdin/stdout, one JSON request per line: ``{"gold": str, "pred": str}`` and one
reply line, ``1`` or ``0``. The parent kills this process when a reply is late, which is the
only reliable way to stop sympy once it is stuck (e.g. evaluating ``2^{2^{2^{2^{100}}}}``).
"""

from __future__ import annotations

import json
import logging
import sys
from functools import lru_cache

from math_verify import parse, verify


def _parse(text: str):
    # parsing_timeout=None: math-verify's own timeout is signal.alarm, which we do not want here;
    # the parent enforces a wall-clock limit by killing this process instead.
    return parse(text, parsing_timeout=None)


# Gold answers repeat across a group of samples (and across epochs): parse each once.
_parse_gold = lru_cache(maxsize=8192)(_parse)


def judge(gold: str, pred: str) -> bool:
    gold_parsed = _parse_gold(gold)
    pred_parsed = _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def main() -> None:
    # math-verify warns once that its timeout is off (we know) and logs every failed parse.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = judge(req["gold"], req["pred"])
        except Exception:  # any failure of parsing or comparison grades as wrong
            ok = False
        out.write("1\n" if ok else "0\n")
        out.flush()


if __name__ == "__main__":
    main()
