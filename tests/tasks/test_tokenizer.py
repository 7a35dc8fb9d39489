"""Tiny-preset tokenizer: training speed and determinism, round trips, chat template, loading."""

import json
import time

import pytest
from transformers import AutoTokenizer

from zeromismatch.tasks.math.offline import offline_math_splits, tokenizer_corpus
from zeromismatch.tasks.math.prompts import dapo_prompt, render_prompt
from zeromismatch.tasks.tokenizer import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    load_tokenizer,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def splits():
    return offline_math_splits(20000, seed=0)  # the default offline corpus size


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, splits):
    out = tmp_path_factory.mktemp("tok")
    start = time.monotonic()
    train_tokenizer(tokenizer_corpus(splits["train"] + splits["heldout"]), 2048, out)
    assert time.monotonic() - start < 20, "tokenizer training must stay fast on 2 cores"
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def test_saved_files(tok_dir):
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (config["eos_token"], config["pad_token"]) == (IM_END, ENDOFTEXT)
    assert (tok_dir / "tokenizer.json").is_file()


def test_special_tokens(tok):
    assert tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    assert tok.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) == [0, 1, 2]
    assert tok.bos_token is None
    assert len(tok) <= 2048
    ids = tok.encode(f"{IM_START}user\nhi{IM_END}", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2  # markup stays one token each, never split into bytes


def test_round_trip(tok, splits):
    texts = [p.problem for p in splits["heldout"]] + [p.solution for p in splits["train"][:200]]
    texts += ["héllo wörld ☃ 😀 \t tabs\n\nand  double  spaces", "x^2 + \\frac{1}{2} = $3$", ""]
    for text in texts:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_digits_are_single_tokens(tok):
    pieces = tok.convert_ids_to_tokens(tok.encode("12345", add_special_tokens=False))
    assert pieces == list("12345")


def test_compresses_the_corpus(tok, splits):
    # Trained merges must actually help on in-domain text (bytes would be ~1 token per char).
    solution = splits["train"][0].solution
    assert len(tok.encode(solution, add_special_tokens=False)) < 0.8 * len(solution)
    prompt_ids = tok.encode(dapo_prompt(""), add_special_tokens=False)
    assert len(prompt_ids) < 0.25 * len(dapo_prompt(""))


def test_render_prompt(tok, splits):
    problem = splits["heldout"][0].problem
    ids = render_prompt(tok, problem)
    expected = f"{IM_START}user\n{dapo_prompt(problem)}{IM_END}\n{IM_START}assistant\n"
    assert tok.decode(ids) == expected
    assert ids[0] == tok.convert_tokens_to_ids(IM_START)
    assert tok.decode(render_prompt(tok, "raw text", dapo_template=False)) == (
        f"{IM_START}user\nraw text{IM_END}\n{IM_START}assistant\n"
    )


def test_auto_tokenizer_loads_it(tok_dir, tok, splits):
    auto = AutoTokenizer.from_pretrained(str(tok_dir))
    text = splits["train"][1].solution
    assert auto.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert render_prompt(auto, "1 + 1?") == render_prompt(tok, "1 + 1?")


def test_deterministic(tmp_path, splits):
    corpus = tokenizer_corpus(splits["train"][:1000])
    train_tokenizer(corpus, 1024, tmp_path / "a")
    train_tokenizer(corpus, 1024, tmp_path / "b")
    assert (tmp_path / "a/tokenizer.json").read_bytes() == (tmp_path / "b/tokenizer.json").read_bytes()


def test_in_memory_and_bad_arguments(tmp_path):
    tok = train_tokenizer(["a b c", "a b c", "abc abc"], 300)  # no out_dir: temporary directory
    assert tok.decode(tok.encode("abc a")) == "abc a"
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], 5000, tmp_path / "big")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
