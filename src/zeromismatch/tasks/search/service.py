"""The retriever a search run uses: a server it starts itself (a subprocess on a free 127.0.0.1 port,
health-checked, stopped when the run ends or fails), or an external one (task.retriever.url: a user's own
e5 / wiki-18 server with the /retrieve contract).

    with RetrieverService(corpus="data/offline_search/corpus.jsonl") as svc:   # starts, waits for /health
        client = svc.client(timeout_s=10, retries=3)                          # restarts a dead server on failure
        client.retrieve(["Ada Bell"], 3)
    # stopped here: SIGTERM to its process group, SIGKILL after a grace period

Never left running: ``stop`` runs at ``close`` / ``__exit__``, at interpreter exit (atexit), and the server
itself exits when its parent process is gone (a SIGKILLed run: server.py's parent watch).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ..base import ToolError
from .client import RetrieverClient, endpoint
from .server import HOST


class RetrieverService:
    def __init__(self, corpus: str | os.PathLike, topk: int = 3, index_cache: str = ".cache/bm25",
                 startup_timeout_s: float = 120.0, max_restarts: int = 2):  # fmt: skip
        self.corpus, self.topk, self.index_cache = str(corpus), int(topk), str(index_cache)
        self.startup_timeout_s, self.max_restarts = float(startup_timeout_s), int(max_restarts)
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.restarts = 0
        self._dir = Path(tempfile.mkdtemp(prefix="zm-retriever-"))
        self._log = self._dir / "server.log"
        self._restart_lock = threading.Lock()  # episodes' threads fail together when the server dies: one restarts it

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> str:
        """Start the server and wait until /health answers; returns its /retrieve URL. Raises ToolError (with
        the server's log tail) when it exits or stays unhealthy past startup_timeout_s."""
        port_file = self._dir / "port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "zeromismatch.tasks.search.server", "--corpus", self.corpus, "--port", "0",
               "--topk", str(self.topk), "--index-cache", self.index_cache, "--port-file", str(port_file),
               "--parent-pid", str(os.getpid())]  # fmt: skip
        with open(self._log, "ab") as log:
            # own session = own process group: stop() signals the server and anything it spawned
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if port_file.is_file():
                url = f"http://{HOST}:{port_file.read_text().strip()}/retrieve"
                try:
                    if httpx.get(endpoint(url, "/health"), timeout=2.0, trust_env=False).status_code == 200:
                        self.url = url
                        print(f"retriever: pid {self.proc.pid} serving {self.corpus} at {url}", flush=True)
                        return url
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        code = self.proc.poll()
        self.stop()
        what = f"exited with status {code}" if code is not None else f"not healthy after {self.startup_timeout_s:g} s"
        raise ToolError(f"retriever server {' '.join(cmd)} {what}; its log ({self._log}):\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def recover(self, err: Exception) -> str | None:
        """After a failed request: restart the server if it died (at most max_restarts times in all); the new
        URL (also when another thread restarted it meanwhile), or None when nothing was restarted."""
        with self._restart_lock:
            if self.alive():
                return self.url
            if self.restarts >= self.max_restarts:
                return None
            self.restarts += 1
            print(f"retriever at {self.url} died ({err}); restart {self.restarts}/{self.max_restarts}", flush=True)
            self.stop()
            return self.start()

    def client(self, timeout_s: float = 10.0, retries: int = 3) -> RetrieverClient:
        if self.url is None:
            self.start()
        return RetrieverClient(self.url, timeout_s, retries, recover=self.recover)

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after 5 s; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=5)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        else:
            proc.wait()
        atexit.unregister(self.stop)

    def close(self) -> None:
        self.stop()

    def __enter__(self):
        if self.url is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
