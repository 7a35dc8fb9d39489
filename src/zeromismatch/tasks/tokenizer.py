"""Tokenizers: train a tiny byte-level BPE for the offline presets and load any local tokenizer
(rendering a math prompt through the chat template: tasks/math/prompts.py).

The tiny tokenizer follows Qwen's conventions (``<|im_start|>``/``<|im_end|>`` chat markup, eos
``<|im_end|>``, pad ``<|endoftext|>``, one token per digit) so that code paths written for the
real Qwen3.5 tokenizer work unchanged on tiny presets.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
TINY_VOCAB_SIZE = 2048
MAX_TINY_VOCAB = 4096

# Qwen-style ChatML, without Qwen3.5's thinking/tool branches (tiny models never use them).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = TINY_VOCAB_SIZE, out_dir: str | os.PathLike | None = None
):
    """Train a byte-level BPE on ``texts``, save it to ``out_dir`` (``tokenizer.json`` +
    ``tokenizer_config.json`` with the chat template) and return it loaded back through
    ``load_tokenizer``, so the caller holds exactly what later runs will load.
    Without ``out_dir`` it goes through a temporary directory.

    ``vocab_size`` is an upper bound: BPE stops early when no pair occurs twice, which happens on
    the small, repetitive offline corpus (about 500 tokens); size the model's embedding from
    ``vocab_size``, not ``len(tokenizer)``. Deterministic: same texts, same order, same bytes.
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
