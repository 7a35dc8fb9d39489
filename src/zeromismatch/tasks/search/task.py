"""The Search-R1 task: multi-turn question answering with a retriever tool, exact-match reward.

    tok = get_tokenizer(cfg)                              # tiny presets: BPE on the KB, tags as single tokens
    task = SearchTask(cfg.task, tok, seed=cfg.seed)
    ep = task.start_episode(next(task.train_prompts()), 0)
    ep.step(turn_ids, "stop")   # <search> q </search> -> TurnResult(<information> ids); <answer> a </answer> -> done
    ep.reward()                 # SQuAD-normalized exact match against any gold answer; no answer -> 0

Data (cfg.task.source): ``offline`` (default) the generated knowledge base of offline.py (written once under
task.offline.dir); ``files``: a Search-R1 parquet pair (task.files.train / eval) and, for a managed retriever,
a wiki-style corpus (task.files.corpus). The retriever (cfg.task.retriever): ``url`` set -> that server;
null -> a managed BM25 server over the corpus (service.py), started at the first search, stopped at close.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import zeromismatch.tasks.search.offline as offline_module
from zeromismatch.config import cfg_get, to_plain
from zeromismatch.errors import MissingFileError
from zeromismatch.tasks.base import Episode, PromptItem, Task, TurnResult, cycle_shuffled
from zeromismatch.tasks.offline_files import ensure_generated, source_sha
from zeromismatch.tasks.search.client import RetrieverClient
from zeromismatch.tasks.search.data import load_corpus_jsonl, load_search_r1_parquet
from zeromismatch.tasks.search.format import Action, ToolFormat, format_passages, get_format
from zeromismatch.tasks.search.offline import generate_kb, tokenizer_corpus, write_offline_search
from zeromismatch.tasks.search.reward import exact_match
from zeromismatch.tasks.search.service import RetrieverService
from zeromismatch.tasks.tokenizer import ENDOFTEXT, IM_END, cached_tiny_tokenizer, render_chat, run_tokenizer

OFFLINE_FILES = {"corpus": "corpus.jsonl", "train": "train.parquet", "eval": "heldout.parquet", "sft": "sft.jsonl"}


# ------------------------------------------------------------------------------------------- data


def _offline(cfg_task: Any) -> tuple[Path, dict]:
    off = cfg_get(cfg_task, "offline")
    root = Path(cfg_get(off, "dir", "data/offline_search"))
    args = {"n_people": int(cfg_get(off, "n_people", 300)), "n_heldout": int(cfg_get(off, "n_heldout", 40)),
            "seed": int(cfg_get(off, "seed", 0)), "topk": int(cfg_get(cfg_get(cfg_task, "retriever"), "topk", 3))}  # fmt: skip
    return root, args


def ensure_offline_search(cfg_task: Any) -> dict[str, Path]:
    """The offline KB's files (corpus, train, eval, sft) that cfg.task.offline names, written by
    ``write_offline_search`` when missing or generated from other settings (once across processes)."""
    root, args = _offline(cfg_task)
    off = cfg_get(cfg_task, "offline")
    paths = {k: Path(cfg_get(off, k, root / n)) for k, n in OFFLINE_FILES.items()}
    return ensure_generated(
        root, paths, OFFLINE_FILES, {**args, "generator_sha256": source_sha(offline_module.__file__)},
        lambda tmp: write_offline_search(tmp, **args),
        cfg_key="task.offline", writer="zeromismatch.tasks.search.task.ensure_offline_search",
    )  # fmt: skip


def _data_files(cfg_task: Any) -> dict[str, Path | None]:
    source = cfg_get(cfg_task, "source", "offline")
    if source == "offline":
        return dict(ensure_offline_search(cfg_task))
    if source != "files":
        raise ValueError(f"task.source must be 'offline' or 'files', got {source!r}")
    files = cfg_get(cfg_task, "files")
    out = {}
    for key in ("train", "eval", "corpus"):
        value = cfg_get(files, key)
        if value is not None and not Path(value).is_file():
            raise MissingFileError(f"file not found: {value} (task.files.{key})")
        out[key] = Path(value) if value is not None else None
    if out["train"] is None or out["eval"] is None:
        raise MissingFileError("task.source=files needs task.files.train and task.files.eval (Search-R1 parquet files)")
    return out


# --------------------------------------------------------------------------------------------- task


class SearchEpisode(Episode):
    """One rollout: each model turn is parsed by the task's format; a search is answered with the retrieved
    passages (tokens the worker appends, masked), an answer ends the episode, anything else (also a turn cut at
    the per-turn cap) gets the format's correction message, as in Search-R1; the worker's turn limit and context
    cap end an episode that never answers (reward 0). A retriever failure raises ToolError."""

    def __init__(self, task: "SearchTask", item: PromptItem):
        super().__init__(task, item)
        self.answer: str | None = None
        self.actions: list[Action] = []

    def step(self, response_ids: Sequence[int], finish_reason: str | None) -> TurnResult:
        self.responses.append(list(response_ids))
        action = self.task.format.parse(self.task.decode_turn(response_ids))
        self.actions.append(action)
        if action.kind == "answer":
            self.answer = action.text
            return TurnResult(done=True)
        if action.kind == "search":
            text = self.task.format.information(format_passages(self.task.retrieve(action.text)))
        else:
            text = self.task.format.invalid()
        return TurnResult(self.task.encode(text)[: self.task.max_tool_tokens])

    def reward(self) -> float:
        return exact_match(self.answer, self.item.gold)


class SearchTask(Task):
    name = "search"

    def __init__(self, cfg_task: Any, tokenizer, seed: int = 0):
        self.cfg, self.tokenizer, self.seed = cfg_task, tokenizer, int(seed)
        self.format: ToolFormat = get_format(cfg_get(cfg_task, "format", "search_r1"))
        self.template = cfg_get(cfg_task, "prompt_template")
        self.template_kwargs = dict(to_plain(cfg_get(cfg_task, "chat_template_kwargs", {})) or {})
        self.max_turns = 4
        self.configure_episodes(cfg_task)  # max_turns, max_tokens_per_turn, max_context_tokens, env_workers
        self.max_tool_tokens = int(cfg_get(cfg_task, "max_tool_tokens", 500))
        rcfg = cfg_get(cfg_task, "retriever")
        self.topk = int(cfg_get(rcfg, "topk", 3))
        self.files = _data_files(cfg_task)
        data_source = cfg_get(cfg_get(cfg_task, "files"), "data_source") if cfg_get(cfg_task, "source") == "files" else None
        self._train = load_search_r1_parquet(self.files["train"], data_source)
        self._eval = load_search_r1_parquet(self.files["eval"], data_source)
        n_eval = cfg_get(cfg_get(cfg_task, "files"), "n_eval")
        if n_eval and cfg_get(cfg_task, "source") == "files":
            self._eval = self._eval[: int(n_eval)]
        self._ids: dict[tuple[str, int], list[int]] = {}
        self._docs: dict[str, dict] | None = None  # corpus by id, for SFT demonstrations
        self._stop = self._stop_ids()
        self._url = cfg_get(rcfg, "url")
        if self._url is None and self.files.get("corpus") is None:
            raise MissingFileError("task.retriever.url is null and there is no corpus to serve: set task.files.corpus "
                                   "(a corpus JSONL) or task.retriever.url (a running retriever's /retrieve URL)")  # fmt: skip
        self._rcfg = rcfg
        self._service: RetrieverService | None = None
        self._client: RetrieverClient | None = None
        self._lock = threading.Lock()

    # ----- retriever

    def client(self) -> RetrieverClient:
        """The retriever client, starting the managed server on first use."""
        with self._lock:
            if self._client is None:
                timeout, retries = float(cfg_get(self._rcfg, "timeout_s", 10.0)), int(cfg_get(self._rcfg, "retries", 3))
                if self._url:
                    self._client = RetrieverClient(self._url, timeout, retries)
                else:
                    self._service = RetrieverService(
                        self.files["corpus"], self.topk, str(cfg_get(self._rcfg, "index_cache", ".cache/bm25")),
                        float(cfg_get(self._rcfg, "startup_timeout_s", 120.0)), int(cfg_get(self._rcfg, "max_restarts", 2)),
                    )  # fmt: skip
                    self._client = self._service.client(timeout, retries)
            return self._client

    def retrieve(self, query: str) -> list[dict]:
        return self.client().retrieve([query], self.topk)[0]

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            if self._service is not None:
                self._service.stop()
            self._client = self._service = None

    # ----- Task protocol

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stop

    def _stop_ids(self) -> tuple[int, ...]:
        """eos / <|im_end|> / <|endoftext|>, and the format's closing tags where they are single tokens (the
        tiny tokenizer; a real tokenizer spells them in pieces and its turns end at eos)."""
        vocab = self.tokenizer.get_vocab()
        ids = {int(self.tokenizer.eos_token_id)} if self.tokenizer.eos_token_id is not None else set()
        ids |= {int(vocab[t]) for t in (IM_END, ENDOFTEXT, *self.format.stop_strings) if t in vocab}
        return tuple(sorted(ids))

    def render(self, question: str) -> list[int]:
        return render_chat(self.tokenizer, self.format.prompt(question, self.template), **self.template_kwargs)

    def _item(self, split: str, idx: int, qa) -> PromptItem:
        key = (split, idx)
        if key not in self._ids:
            self._ids[key] = self.render(qa.question)
        return PromptItem(idx, list(self._ids[key]), qa.golden_answers)

    def train_prompts(self, start: int = 0) -> Iterator[PromptItem]:
        for idx in cycle_shuffled(len(self._train), self.seed, start):
            yield self._item("train", idx, self._train[idx])

    def eval_prompts(self) -> list[PromptItem]:
        return [self._item("eval", i, qa) for i, qa in enumerate(self._eval)]

    def start_episode(self, item: PromptItem, sample_index: int) -> SearchEpisode:
        return SearchEpisode(self, item)

    def reward(self, response_ids: Sequence[int], gold: Any) -> float:
        """A single response's score (its first answer tag), for single-turn callers."""
        action = self.format.parse(self.decode_turn(response_ids))
        return exact_match(action.text if action.kind == "answer" else None, gold)

    # ----- tokens

    def decode_turn(self, ids: Sequence[int]) -> str:
        """A model turn's text, markup kept, end-of-turn specials dropped."""
        stops = {t for t in self._stop if self.tokenizer.convert_ids_to_tokens(t) in (IM_END, ENDOFTEXT)}
        return self.tokenizer.decode([int(t) for t in ids if int(t) not in stops], skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def sft_example(self, record: dict) -> tuple[list[int], list[int]]:
        """A scripted demonstration (offline.py's sft.jsonl): the prompt, then per search the search turn
        (trained) and the passages the retriever returned for it (masked), then the answer turn (trained)."""
        if self._docs is None:
            if self.files.get("corpus") is None:
                raise MissingFileError("SFT demonstrations need the corpus their passages come from (task.files.corpus)")
            self._docs = {d["id"]: d for d in load_corpus_jsonl(self.files["corpus"])}
        ids = self.render(record["prompt"])
        mask = [0] * len(ids)

        def add(text: str, trained: bool) -> None:
            t = self.encode(text)
            ids.extend(t)
            mask.extend([int(trained)] * len(t))

        end = self.format.turn_end
        for s in record["searches"]:
            add(self.format.search_turn(s["query"]) + end, True)
            add(self.format.information(format_passages([self._docs[i] for i in s["doc_ids"]])), False)
        add(self.format.answer_turn(record["answer"]) + end, True)
        return ids, mask


# --------------------------------------------------------------------------------------- tokenizer


def get_tokenizer(cfg: Any):
    """The run's tokenizer (tasks/tokenizer.run_tokenizer): model.tokenizer, the checkpoint's, or for tiny
    presets a byte-level BPE on the offline KB with the format's markup as single tokens."""
    return run_tokenizer(cfg, tiny_tokenizer)


def tiny_tokenizer(cfg_task: Any, vocab_size: int):
    root, args = _offline(cfg_task)
    fmt = get_format(cfg_get(cfg_task, "format", "search_r1"))
    template = cfg_get(cfg_task, "prompt_template") or fmt.prompt("{question}", None)
    corpus = tokenizer_corpus(generate_kb(args["n_people"], args["seed"]), template)
    corpus += [fmt.invalid()] * 8 + ["Doc 1(Title: ", "Doc 2(Title: ", "Doc 3(Title: "] * 8
    return cached_tiny_tokenizer(corpus, vocab_size, cfg_get(cfg_task, "tokenizer_cache", ".cache/tokenizers"), fmt.markup)
