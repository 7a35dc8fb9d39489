"""Tokenizers: train a tiny byte-level BPE for the offline presets (cached by content: ``cached_tiny_tokenizer``),
load any local tokenizer, and pick a run's tokenizer (``run_tokenizer``: model.tokenizer, the checkpoint's, or
the task's tiny one).

The tiny tokenizer follows Qwen's conventions (``<|im_start|>``/``<|im_end|>`` chat markup, eos
``<|im_end|>``, pad ``<|endoftext|>``, one token per digit) so that code paths written for the
real Qwen3.5 tokenizer work unchanged on tiny presets.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from ..config import cfg_get, to_plain
from ..errors import InputFileError, read_json
from ..models.qwen3_5 import get_preset
from .base import locked, publish_dir

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
TINY_VOCAB_SIZE = 2048
MAX_TINY_VOCAB = 4096
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_TOKENIZER_CACHE_VERSION = 1  # bump when train_tokenizer's output changes for the same corpus

# Qwen-style ChatML, without Qwen3.5's thinking/tool branches (tiny models never use them).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = TINY_VOCAB_SIZE,
    out_dir: str | os.PathLike | None = None,
    added_tokens: Sequence[str] = (),
):
    """Train a byte-level BPE on ``texts``, save it to ``out_dir`` (``tokenizer.json`` +
    ``tokenizer_config.json`` with the chat template) and return it loaded back through
    ``load_tokenizer``, so the caller holds exactly what later runs will load.
    Without ``out_dir`` it goes through a temporary directory.

    ``vocab_size`` is an upper bound: BPE stops early when no pair occurs twice, which happens on
    the small, repetitive offline corpus (about 500 tokens); size the model's embedding from
    ``vocab_size``, not ``len(tokenizer)``. Deterministic: same texts, same order, same bytes.

    ``added_tokens`` (a task's markup, e.g. ``<search>``) are appended after training as single, non-special
    tokens: always one id, decoded as written (skip_special_tokens keeps them), usable as stop tokens.
    """
    if not len(SPECIAL_TOKENS) + 256 < vocab_size <= MAX_TINY_VOCAB:
        raise ValueError(
            f"vocab_size must be in ({len(SPECIAL_TOKENS) + 256}, {MAX_TINY_VOCAB}] for a tiny "
            f"byte-level tokenizer (256 byte tokens + specials), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    # Digits split one per token before byte-level BPE (as Qwen does): numbers then have one
    # spelling, which is what lets a tiny model learn arithmetic at all.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk>
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_with_markup(texts), trainer=trainer)
    if added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])

    if out_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            return _save_and_load(tok, tmp)
    return _save_and_load(tok, out_dir)


def _save_and_load(tok: Tokenizer, out_dir: str | os.PathLike):
    """Write ``tok`` as a transformers tokenizer directory and load it back."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    # Written by hand rather than by save_pretrained: transformers 5 would record its own
    # class name ("TokenizersBackend") and move the template to chat_template.jinja, which
    # transformers 4.x and other readers of tokenizer_config.json do not understand.
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "additional_special_tokens": [IM_START],
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return load_tokenizer(out)


def _with_markup(texts: Iterable[str]):
    # Chat markup words are in every rendered sequence; make sure the trainer sees them
    # (twice, to pass min_frequency=2).
    yield from ("user\n", "assistant\n") * 2
    yield from texts


def load_tokenizer(path: str | os.PathLike):
    """A tokenizer from a local directory (ours, or a real Qwen3.5 checkpoint); never the hub."""
    # a required dependency, imported here because it costs ~0.6 s: the math-verify worker process imports
    # this package at every (re)start and has a few seconds per call
    from transformers import AutoTokenizer

    if not Path(path, "tokenizer.json").is_file() and not Path(path, "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json / tokenizer_config.json in this directory")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.chat_template is None:
        raise ValueError(f"{path}: tokenizer has no chat_template; render_prompt needs one")
    return tok


def cached_tiny_tokenizer(
    corpus: list[str], vocab_size: int, cache_dir: str | os.PathLike, added_tokens: Sequence[str] = ()
):
    """``train_tokenizer(corpus, vocab_size, added_tokens=...)``, trained once and cached in
    ``<cache_dir>/<16 hex of sha256(version, vocab_size, added tokens, corpus)>/`` (published whole, under a
    lock: parallel runs train it once)."""
    header = f"v{_TOKENIZER_CACHE_VERSION}:vocab={vocab_size}"
    if added_tokens:  # absent from the key when empty, so tokenizers cached before added tokens existed stay valid
        header += ":added=" + json.dumps(list(added_tokens))
    h = hashlib.sha256(header.encode())
    for text in corpus:
        h.update(text.encode())
        h.update(b"\0")
    out = Path(cache_dir) / h.hexdigest()[:16]
    if not all((out / f).is_file() for f in TOKENIZER_FILES):
        with locked(out):
            if not all((out / f).is_file() for f in TOKENIZER_FILES):
                publish_dir(out, lambda tmp: train_tokenizer(corpus, vocab_size, tmp, added_tokens))
    return load_tokenizer(out)


def has_tokenizer(path: str | os.PathLike | None) -> bool:
    return path is not None and any(Path(path, f).is_file() for f in TOKENIZER_FILES)


def model_vocab_size(cfg: Any) -> int:
    """The vocabulary the model will have: the checkpoint's config.json, else preset + overrides."""
    model = cfg_get(cfg, "model")
    ckpt = cfg_get(model, "checkpoint")
    if ckpt:
        d = read_json(Path(ckpt, "config.json"), "the model config of model.checkpoint")
        text = d.get("text_config", d)
        if not isinstance(text, dict) or not isinstance(text.get("vocab_size"), int):
            raise InputFileError(f"{Path(ckpt, 'config.json')}: no integer vocab_size")
        return text["vocab_size"]
    return int(get_preset(cfg_get(model, "preset"), **(to_plain(cfg_get(model, "overrides", {})) or {})).vocab_size)


def run_tokenizer(cfg: Any, tiny: Callable[[Any, int], Any]):
    """The run's tokenizer, first that applies: cfg.model.tokenizer (a local dir); the tokenizer files in
    cfg.model.checkpoint; for tiny vocabularies (<= 4096, the tiny presets) ``tiny(cfg.task, vocab_size)``, the
    task's own tiny BPE. Real presets without a checkpoint raise: their tokenizer cannot be made up."""
    model = cfg_get(cfg, "model")
    if cfg_get(model, "tokenizer"):
        return load_tokenizer(cfg_get(model, "tokenizer"))
    ckpt = cfg_get(model, "checkpoint")
    if has_tokenizer(ckpt):
        return load_tokenizer(ckpt)
    vocab = model_vocab_size(cfg)
    if vocab <= MAX_TINY_VOCAB:
        return tiny(cfg_get(cfg, "task"), vocab)
    where = f"checkpoint {ckpt} has no tokenizer files" if ckpt else "no model.checkpoint is set"
    raise ValueError(
        f"model {cfg_get(model, 'preset')} (vocab {vocab}) needs its real tokenizer, but {where}: "
        "set model.checkpoint to a local HF checkpoint dir or model.tokenizer to a tokenizer dir"
    )


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's files when it was loaded from a directory (ours always are), else of its
    vocabulary and chat template."""
    h = hashlib.sha256()
    src = getattr(tokenizer, "name_or_path", None)
    if src and all(Path(src, f).is_file() for f in TOKENIZER_FILES):
        for f in TOKENIZER_FILES:
            h.update(Path(src, f).read_bytes())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
        h.update(str(tokenizer.chat_template).encode())
    return h.hexdigest()
