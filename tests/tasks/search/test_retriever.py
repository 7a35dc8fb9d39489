"""The retriever service: Search-R1's /retrieve contract over a real HTTP server on 127.0.0.1, the index cache,
and the lifecycle of the managed server (started, health-checked, killed mid-run -> recovery or a ToolError
naming URL and request, never left running)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from zeromismatch.tasks.base import ToolError
from zeromismatch.tasks.search.client import RetrieverClient, endpoint
from zeromismatch.tasks.search.format import format_passages
from zeromismatch.tasks.search.index import cached_index, corpus_key
from zeromismatch.tasks.search.offline import generate_kb, write_offline_search
from zeromismatch.tasks.search.service import RetrieverService


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """No such process (a zombie counts as gone: it runs nothing and holds no port)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def kb_files(tmp_path_factory):
    return write_offline_search(tmp_path_factory.mktemp("kb"), n_people=30, n_heldout=6, seed=0)


@pytest.fixture(scope="module")
def service(kb_files, tmp_path_factory):
    svc = RetrieverService(kb_files["corpus"], topk=3, index_cache=str(tmp_path_factory.mktemp("bm25")), max_restarts=1)
    svc.start()
    yield svc
    svc.stop()


def test_contract(service):
    assert service.url.startswith("http://127.0.0.1:") and service.url.endswith("/retrieve")
    health = httpx.get(endpoint(service.url, "/health"), trust_env=False).json()
    assert health["status"] == "ok" and health["passages"] > 30
    r = httpx.post(service.url, json={"queries": ["Which country is Brisk in?", "Brisk"], "topk": 2}, trust_env=False)
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and all(len(docs) == 2 for docs in result)
    assert all(set(d) == {"id", "contents"} and d["contents"].startswith('"') for docs in result for d in docs)
    assert result[1][0]["contents"].startswith('"Brisk"\nBrisk is a city in ')
    scored = httpx.post(service.url, json={"queries": ["Brisk"], "topk": 3, "return_scores": True}, trust_env=False).json()
    (hits,) = scored["result"]
    assert len(hits) == 3 and hits[0]["document"] == result[1][0]
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"] and hits[0]["score"] > 0
    default = httpx.post(service.url, json={"queries": ["Brisk"]}, trust_env=False).json()["result"]
    assert len(default[0]) == 3  # the server's default topk
    for bad in ({"queries": []}, {"queries": ["x"], "topk": 0}, {"topk": 3}, {"queries": "x"}):
        assert httpx.post(service.url, json=bad, trust_env=False).status_code == 422, bad


def test_two_hop_question_is_answered_after_two_searches(service):
    """Which country was X born in? The first search finds X's city, the second that city's country."""
    kb = generate_kb(30, 0)
    q = next(q for q in kb.questions if q.hops == 2)
    client = service.client()
    (first,) = client.retrieve([q.subject], 3)
    person = first[0]["contents"]
    assert person.startswith(f'"{q.subject}"') and q.answer not in format_passages(first[:1])
    city = person.split(" was born in ")[1].split(" and ")[0]
    (second,) = client.retrieve([city], 3)
    assert second[0]["contents"] == f'"{city}"\n{city} is a city in {q.answer}.'


def test_index_built_once_per_corpus(kb_files, tmp_path):
    a = cached_index(kb_files["corpus"], tmp_path)
    entry = tmp_path / corpus_key(kb_files["corpus"])
    stamp = entry.stat().st_mtime_ns
    b = cached_index(kb_files["corpus"], tmp_path)
    assert entry.stat().st_mtime_ns == stamp and len(list(tmp_path.glob(".*tmp*"))) == 0
    assert a.search("Brisk", 3) == b.search("Brisk", 3)
    assert a.search("the of and", 3) == []  # nothing indexable: no passages, not an error


def test_killed_server_is_restarted_then_fails_clearly(kb_files, tmp_path):
    svc = RetrieverService(kb_files["corpus"], index_cache=str(tmp_path), max_restarts=1)
    client = svc.client(timeout_s=2.0, retries=2)
    try:
        first_pid = svc.pid
        assert client.retrieve(["Brisk"], 1)
        os.kill(first_pid, signal.SIGKILL)  # killed mid-run
        svc.proc.wait(timeout=5)
        assert client.retrieve(["Brisk"], 1)  # recovered: a new server on a new port
        assert svc.restarts == 1 and svc.pid != first_pid
        os.killpg(svc.pid, signal.SIGKILL)  # again: no restarts left
        url = svc.url
        with pytest.raises(ToolError) as e:
            client.retrieve(["Brisk"], 1)
        msg = str(e.value)
        assert url in msg and '"queries": ["Brisk"]' in msg and "failed after 3 attempt(s)" in msg
    finally:
        pid = svc.pid
        svc.stop()
    assert pid is None or _gone(pid)


def test_stopped_at_close_and_when_the_parent_dies(kb_files, tmp_path):
    with RetrieverService(kb_files["corpus"], index_cache=str(tmp_path)) as svc:
        pid = svc.pid
        assert svc.client().health()["status"] == "ok"
    assert _gone(pid)
    # a parent killed without any cleanup: the server notices and exits
    code = (
        "import os, sys; from zeromismatch.tasks.search.service import RetrieverService; "
        f"s = RetrieverService({str(kb_files['corpus'])!r}, index_cache={str(tmp_path)!r}); s.start(); "
        "print(s.pid, flush=True); os.kill(os.getpid(), 9)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert _gone(int(out.stdout.strip().splitlines()[-1]), within_s=10)


def test_unreachable_or_slow_retriever_is_a_tool_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    url = f"http://127.0.0.1:{port}/retrieve"
    with pytest.raises(ToolError, match=rf"retriever POST {url} .*\"queries\": \[\"q\"\].*failed after 2 attempt"):
        RetrieverClient(url, timeout_s=0.5, retries=1, backoff_s=0.01).retrieve(["q"], 3)
    with socket.socket() as slow:  # accepts, never answers
        slow.bind(("127.0.0.1", 0))
        slow.listen(4)
        url = f"http://127.0.0.1:{slow.getsockname()[1]}/retrieve"
        with pytest.raises(ToolError, match=r"timeout 0.3 s\): ReadTimeout"):
            RetrieverClient(url, timeout_s=0.3, retries=1, backoff_s=0.01).retrieve(["q"], 3)
