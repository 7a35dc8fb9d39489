"""HTTP client of the retriever (Search-R1's /retrieve contract, server.py): timeouts, bounded retries, and a
ToolError naming the URL and the request when the retriever stays unreachable, slow or malformed: an
infrastructure failure stops the run instead of scoring rollouts 0.

    client = RetrieverClient("http://127.0.0.1:8000/retrieve", timeout_s=10, retries=3)
    client.retrieve(["Ada Bell"], topk=3) -> [[{"id", "contents"}, ...]]
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import httpx

from ..base import ToolError

logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per retrieval would flood a run's log


def endpoint(url: str, path: str) -> str:
    """``path`` (/retrieve, /health) on the server of ``url`` (given with or without /retrieve)."""
    base = url.rstrip("/").removesuffix("/retrieve")
    return base + path


class RetrieverClient:
    """``recover(err) -> str | None``: called after a failed attempt (e.g. a managed service restarting a dead
    server); a returned URL replaces the current one for the next attempts."""

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.25,
                 recover: Callable[[Exception], str | None] | None = None):  # fmt: skip
        self.url, self.timeout_s, self.retries, self.backoff_s = url, float(timeout_s), int(retries), float(backoff_s)
        self.recover = recover
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s), trust_env=False)  # no proxies: 127.0.0.1

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            url = endpoint(self.url, path)
            try:
                r = self._http.request(method, url, json=payload)
                if r.status_code >= 500 or r.status_code in (408, 429):
                    raise httpx.HTTPStatusError(f"HTTP {r.status_code}: {r.text[:200]}", request=r.request, response=r)
                r.raise_for_status()
                return r.json()
            except (httpx.HTTPError, ValueError) as e:
                last = e
                if isinstance(e, httpx.HTTPStatusError) and e.response.status_code < 500 and e.response.status_code not in (408, 429):
                    break  # the request itself is wrong: retrying will not help
                if attempt < self.retries:
                    if self.recover is not None:
                        self.url = self.recover(e) or self.url
                    time.sleep(self.backoff_s * 2**attempt)
        body = json.dumps(payload)[:300] if payload is not None else ""
        raise ToolError(
            f"retriever {method} {endpoint(self.url, path)} {body} failed after {self.retries + 1} attempt(s) "
            f"(timeout {self.timeout_s:g} s): {type(last).__name__}: {last}"
        )

    def retrieve(self, queries: list[str], topk: int) -> list[list[dict]]:
        payload = {"queries": list(queries), "topk": int(topk), "return_scores": False}
        data = self._request("POST", "/retrieve", payload)
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries) or not all(isinstance(r, list) for r in result):
            raise ToolError(
                f"retriever POST {endpoint(self.url, '/retrieve')} {json.dumps(payload)[:300]}: malformed response "
                f"(expected {{'result': [one list per query]}}), got {str(data)[:200]}"
            )
        return result

    def health(self) -> dict:
        return self._request("GET", "/health")

    def close(self) -> None:
        self._http.close()
