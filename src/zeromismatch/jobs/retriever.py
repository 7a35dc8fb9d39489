"""`python run.py job=retriever task=search`: the BM25 retriever served standalone on 127.0.0.1:job.port until
stopped (Ctrl-C), over job.corpus or the search task's corpus (the offline KB, written first if missing)."""

from __future__ import annotations

from ..tasks.registry import prepare_task_data
from ..tasks.search.server import serve


def main(cfg) -> dict:
    corpus = cfg.job.get("corpus")
    if corpus is None:
        if cfg.task.name != "search":
            raise ValueError("job=retriever needs job.corpus=<corpus JSONL> or task=search (its corpus)")
        prepare_task_data(cfg)
        corpus = cfg.task.offline.corpus if cfg.task.source == "offline" else cfg.task.files.corpus
        if corpus is None:
            raise ValueError("job=retriever: task.files.corpus is null; set job.corpus=<corpus JSONL>")
    serve(str(corpus), int(cfg.job.port), int(cfg.job.topk), str(cfg.job.index_cache), log_level="info")
    return {"corpus": str(corpus), "port": int(cfg.job.port)}
