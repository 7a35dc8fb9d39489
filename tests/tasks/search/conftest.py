"""A small offline knowledge base, its tiny tokenizer and a search task, built once per test session in a
temporary directory (nothing under the repo)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from zeromismatch.tasks.search.task import SearchTask, get_tokenizer

SHORT_TEMPLATE = "Answer the question with <search> q </search> and <answer> a </answer>. Question: {question}\n"


@pytest.fixture(scope="session")
def search_cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    task = OmegaConf.load("conf/task/search.yaml")
    task.offline.dir = str(root / "kb")
    task.offline.n_people = 30
    task.offline.n_heldout = 6
    task.tokenizer_cache = str(root / "tok")
    task.retriever.index_cache = str(root / "bm25")
    task.retriever.timeout_s = 2.0
    task.retriever.retries = 1
    task.prompt_template = SHORT_TEMPLATE
    return OmegaConf.create({"task": task, "model": {"preset": "tiny", "overrides": {}, "checkpoint": None, "tokenizer": None}})


@pytest.fixture(scope="session")
def search_tokenizer(search_cfg):
    return get_tokenizer(search_cfg)


@pytest.fixture
def search_task(search_cfg, search_tokenizer):
    task = SearchTask(search_cfg.task, search_tokenizer, seed=0)
    yield task
    task.close()
