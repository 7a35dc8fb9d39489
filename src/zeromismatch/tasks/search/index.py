"""BM25 over a passage corpus (``bm25s``), built once per corpus and cached on disk.

    index = BM25Index(docs)                                  # docs: [{"id", "contents"}, ...], in memory
    index = cached_index(corpus_path, cache_dir)             # built once per corpus content, then loaded
    index.search("Ada Bell", k=3) -> [{"id", "contents"}, ...]   # best first

The cache entry is ``<cache_dir>/<16 hex of sha256(corpus bytes, bm25s version, INDEX_VERSION)>/``, written whole
(tasks/base.publish_dir) under its lock, so parallel runs build it once and never read half an index.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# bm25s takes its top-k through JAX when JAX is installed, and JAX on a GPU machine claims the GPU and
# preallocates ~75% of its memory at first use: every RL process importing the task registry would then starve
# the trainer and the generator of GPU memory. Retrieval is a CPU job: keep JAX on the CPU (a user's explicit
# JAX_PLATFORMS wins).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bm25s  # noqa: E402
import numpy as np

from ..base import locked, publish_dir
from .data import load_corpus_jsonl

INDEX_VERSION = 1  # bump when the tokenization or the scoring settings change
_INDEX_FILE = "params.index.json"  # bm25s writes it last: an entry with it is complete


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class BM25Index:
    """BM25 (bm25s' defaults: Lucene scoring, k1 1.5, b 0.75) over ``docs``' contents, English stopwords out."""

    def __init__(self, docs: list[dict], bm25: bm25s.BM25 | None = None):
        if not docs:
            raise ValueError("cannot index an empty corpus")
        self.docs = docs
        if bm25 is None:
            bm25 = bm25s.BM25()
            bm25.index(_tokens([d["contents"] for d in docs]), show_progress=False)
        self.bm25 = bm25

    def search_batch(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        """Top-``k`` (document, score) per query, best first; a query with no indexable word (empty, or all
        stopwords) gets none."""
        k = min(int(k), len(self.docs))
        out: list[list[tuple[dict, float]]] = [[] for _ in queries]
        tokens = _tokens(list(queries))
        live = [i for i, t in enumerate(tokens) if t]
        if live and k > 0:
            ids, scores = self.bm25.retrieve([tokens[i] for i in live], k=k, show_progress=False, n_threads=1)
            for row, i in enumerate(live):
                out[i] = [(self.docs[int(j)], float(s)) for j, s in zip(np.asarray(ids[row]), np.asarray(scores[row]))]
        return out

    def search(self, query: str, k: int) -> list[dict]:
        return [doc for doc, _ in self.search_batch([query], k)[0]]


def corpus_key(corpus_path: str | os.PathLike) -> str:
    h = hashlib.sha256(f"index-v{INDEX_VERSION}:bm25s-{bm25s.__version__}:".encode())
    with open(corpus_path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def cached_index(corpus_path: str | os.PathLike, cache_dir: str | os.PathLike) -> BM25Index:
    """The BM25 index of the corpus file (data.load_corpus_jsonl's layout): loaded from
    ``<cache_dir>/<corpus_key>/`` or built and stored there first."""
    docs = load_corpus_jsonl(corpus_path)
    out = Path(cache_dir) / corpus_key(corpus_path)
    if not (out / _INDEX_FILE).is_file():
        with locked(out):
            if not (out / _INDEX_FILE).is_file():
                publish_dir(out, lambda tmp: BM25Index(docs).bm25.save(str(tmp), show_progress=False))
    return BM25Index(docs, bm25s.BM25.load(str(out), show_progress=False))
