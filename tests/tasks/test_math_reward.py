"""Math reward: math-verify semantics on easy cases, adversarial inputs, threads, recovery."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from zeromismatch.tasks.math.prompts import extract_answer, last_boxed
from zeromismatch.tasks.math.reward import MathVerifier, batch_reward, final_answer, math_reward

CALL_LIMIT_S = 5.0


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier() as v:
        v.score("Answer: \\frac{1}{2}", "0.5")  # start the worker outside the timed calls
        yield v


@pytest.fixture(scope="module", autouse=True)
def warm_default():
    math_reward("Answer: \\frac{1}{2}", "0.5")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Some work.\nAnswer: 42", "42"),
        ("Answer: 1\nwait, no.\nAnswer: 7", "7"),
        ("**Answer:** $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("answer: 12", "12"),
        ("Answer:\n\n  -3 ", "-3"),
        ("Answer: \\(x^2\\)", "x^2"),
        ("no final line", None),
        ("Answer:   ", None),
        (None, None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_final_answer_fallbacks():
    assert final_answer("so the result is \\boxed{\\frac{3}{4}} done") == "\\frac{3}{4}"
    assert final_answer("first \\boxed{1} then \\boxed{2}") == "2"
    assert final_answer("we get 3, then 4.5 apples") is None  # no marker: no answer (the published verifier)
    assert final_answer("we get 3, then 4.5 apples", last_number_fallback=True) == "4.5"
    assert final_answer("\\boxed{5}\nAnswer: 9") == "9"  # the Answer: line wins
    assert last_boxed("\\boxed{unterminated") is None
    assert final_answer("nothing here") is None


@pytest.mark.parametrize(
    "response, gold",
    [
        ("Answer: 42", "42"),
        ("Answer: 042", "42"),
        ("Answer: -7", "-7"),
        ("Answer: 5", 5),  # some AIME dumps store int answers
        ("Answer: \\frac{1}{2}", "0.5"),  # math-verify compares numerically
        ("Answer: 0.5", "\\frac{1}{2}"),
        ("Answer: 1/2", "\\frac{1}{2}"),
        ("Answer: $\\dfrac{2}{4}$", "\\frac{1}{2}"),
        ("Answer: \\sqrt{2}", "\\sqrt{2}"),
        ("Answer: 3\\pi", "3\\pi"),
        ("Answer: 1,000", "1000"),
        ("Answer: x = 5", "5"),
        ("Answer: \\boxed{12}", "12"),
        ("thus \\boxed{12}", "12"),
    ],
)
def test_correct(verifier, response, gold):
    assert verifier.score(response, gold) == 1.0


@pytest.mark.parametrize(
    "response, gold",
    [
        ("Answer: 41", "42"),
        ("Answer: 3", "3\\pi"),
        ("Answer: 0.51", "\\frac{1}{2}"),
        ("Answer: 42\nthe answer is 7", "7"),  # only the last Answer: line counts
        ("\\boxed{12} and 13", "13"),  # a boxed answer beats a later number
    ],
)
def test_wrong(verifier, response, gold):
    assert verifier.score(response, gold) == 0.0


# Order matters a little: after a timeout the replacement worker starts in the background, and
# the in-process cases that follow overlap with its start-up, as in a real batch.
ADVERSARIAL = {
    "power_tower": "Answer: 2^{2^{2^{2^{2^{100}}}}}",  # sympy never returns: needs the hard timeout
    "huge_number": "Answer: " + "9" * 200_000,
    "huge_number_bare": "7" * 200_000,
    "garbage": "asdf }{ \\\\ $$ \\frac{ ^^^ Answer: ]]]",
    "unicode": "Answer: ∞ ≠ 😀 \u202e ☃ \ud800",
    "factorial": "Answer: 100000!",
    "nested_braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "huge_number_boxed": "\\boxed{" + "1" * 200_000 + "}",
    "long_garbage": "lorem ipsum " * 100_000,
    "empty": "",
    "none": None,
    "not_a_string": 12345,
    "nested_frac": "Answer: " + "\\frac{1}{" * 20 + "2" + "}" * 20,  # short enough to reach sympy
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_scores_zero_quickly(verifier, name):
    start = time.monotonic()
    assert verifier.score(ADVERSARIAL[name], "5") == 0.0
    assert time.monotonic() - start < CALL_LIMIT_S


@pytest.mark.parametrize(
    "gold", [None, "", "   ", 3.5, [1], True, pytest.param("9" * 10_000, id="10k_digits")]
)
def test_bad_gold_scores_zero(verifier, gold):
    assert verifier.score("Answer: 5", gold) == 0.0


def test_recovers_after_timeout_and_crash(verifier):
    before = verifier.restarts
    assert verifier.score("Answer: 10^{10^{10^{10}}}", "1") == 0.0  # timeout: worker killed
    assert verifier.restarts == before + 1
    assert verifier.score("Answer: \\frac{1}{2}", "0.5") == 1.0  # a fresh worker took over

    verifier._proc.kill()  # a crash between calls (e.g. sympy blowing the C stack)
    verifier._proc.wait()
    start = time.monotonic()
    assert verifier.score("Answer: \\frac{1}{2}", "0.5") == 1.0
    assert time.monotonic() - start < CALL_LIMIT_S
    assert verifier.restarts == before + 2


def test_from_worker_threads():
    # math-verify's own signal-based timeout raises off the main thread; ours must not.
    results = {}

    def work():
        results["one"] = math_reward("Answer: \\frac{1}{2}", "0.5")
        results["batch"] = batch_reward(["Answer: 4", "Answer: \\sqrt{4}", None], ["4", "2", "1"])

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=60)
    assert results == {"one": 1.0, "batch": [1.0, 1.0, 0.0]}

    cases = [("Answer: \\frac{%d}{2}" % (2 * i), str(i)) for i in range(20)]
    cases += [(f"Answer: {i + 1}", str(i)) for i in range(20)]
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda rg: math_reward(*rg), cases))
    assert scores == [1.0] * 20 + [0.0] * 20


def test_batch_length_mismatch():
    with pytest.raises(ValueError, match="2 responses but 1 gold"):
        batch_reward(["a", "b"], ["1"])


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s"):
        MathVerifier(timeout_s=0)


def test_unmarked_number_scores_zero_unless_the_fallback_is_on():
    """The published verifier grades only a marked final answer: a number that merely appears in the work
    earns nothing; the last-number fallback is an explicit, non-default option."""
    assert math_reward("work mentions 34", "34") == 0.0
    assert math_reward("work mentions 34\nAnswer: 34", "34") == 1.0
    assert math_reward("work mentions 34 so \\boxed{34}", "34") == 1.0
    assert math_reward("... = 12", "12") == 0.0
    with MathVerifier(last_number_fallback=True) as loose:
        assert loose.score("work mentions 34", "34") == 1.0
        assert loose.score("... = 12", "12") == 1.0
        assert loose.score("work mentions 34\nAnswer: 35", "34") == 0.0  # a marker still wins


def test_math_task_reward_follows_config():
    """cfg.task.last_number_fallback is off in conf/task/math.yaml and in every experiment."""
    conf = Path(__file__).resolve().parents[2] / "conf"
    exps = sorted(p.stem for p in (conf / "exp").glob("*.yaml"))
    assert exps
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        for exp in exps:
            cfg = compose("config", overrides=[f"+exp={exp}"])
            if cfg.task.name == "math":
                assert cfg.task.last_number_fallback is False, exp
