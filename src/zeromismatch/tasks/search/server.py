"""The retriever service: BM25 over a corpus behind Search-R1's HTTP contract, on 127.0.0.1.

    POST /retrieve {"queries": ["..."], "topk": 3, "return_scores": false}
        -> {"result": [[{"id": "7", "contents": "\\"Title\\"\\ntext"}, ...], ...]}        one list per query
        (return_scores: true -> each entry is {"document": {...}, "score": 12.3})
    GET /health -> {"status": "ok", "passages": N, "topk": default}

The documents are the corpus' rows, as Search-R1's retrieval server returns them; the client side renders
them for the model as ``Doc i(Title: t) text`` (format.format_passages), so a user's own e5 / wiki-18 server
with this contract drops in. Run standalone (``python run.py job=retriever``) or as the subprocess
service.RetrieverService starts:

    python -m zeromismatch.tasks.search.server --corpus data/offline_search/corpus.jsonl --port 0 \\
        --port-file /tmp/port --parent-pid 1234
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, Field

from .index import BM25Index, cached_index

HOST = "127.0.0.1"  # never another interface: nothing leaves the machine


class RetrieveRequest(BaseModel):
    queries: list[str] = Field(min_length=1, max_length=4096)
    topk: int | None = Field(default=None, ge=1, le=100)
    return_scores: bool = False


def build_app(index: BM25Index, default_topk: int = 3) -> FastAPI:
    app = FastAPI(title="zeromismatch retriever")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "passages": len(index.docs), "topk": default_topk}

    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> dict:
        hits = index.search_batch(req.queries, req.topk or default_topk)
        if req.return_scores:
            return {"result": [[{"document": d, "score": s} for d, s in q] for q in hits]}
        return {"result": [[d for d, _ in q] for q in hits]}

    return app


def _exit_with_parent(parent_pid: int) -> None:
    """A managed server ends when the process that started it is gone (also after a SIGKILL, where no atexit
    hook of the parent runs)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(0)


def serve(corpus: str, port: int, topk: int = 3, index_cache: str = ".cache/bm25",
          port_file: str | None = None, parent_pid: int | None = None, log_level: str = "warning") -> None:
    """Build (or load) the index, bind 127.0.0.1:``port`` (0 = a free port, written to ``port_file`` once the
    socket listens) and serve until stopped."""
    index = cached_index(corpus, index_cache)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    if port_file:
        tmp = Path(f"{port_file}.tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        os.replace(tmp, port_file)
    if parent_pid:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    print(f"retriever: {len(index.docs)} passages from {corpus} on http://{HOST}:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(build_app(index, topk), log_level=log_level, access_log=False))
    server.run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="BM25 retriever with Search-R1's /retrieve contract, on 127.0.0.1")
    p.add_argument("--corpus", required=True, help="corpus JSONL (one {id, contents} per line)")
    p.add_argument("--port", type=int, default=8000, help="0 = a free port (see --port-file)")
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--index-cache", default=".cache/bm25")
    p.add_argument("--port-file", default=None)
    p.add_argument("--parent-pid", type=int, default=None)
    a = p.parse_args(argv)
    serve(a.corpus, a.port, a.topk, a.index_cache, a.port_file, a.parent_pid)


if __name__ == "__main__":
    main()
