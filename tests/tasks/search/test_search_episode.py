"""A search episode over fixed model turns: search -> the passages appended as <information> tokens -> answer ->
exact-match reward; the SFT demonstrations' loss mask leaves the information tokens out; a dead retriever is a
ToolError, never a 0 reward."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from zeromismatch.tasks.base import ToolError
from zeromismatch.tasks.search.offline import generate_kb
from zeromismatch.tasks.search.task import SearchTask


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _two_hop(task):
    return next(it for it in task.eval_prompts() if task._eval[it.prompt_id].extra["hops"] == 2)


def test_markup_tags_are_single_tokens_and_stop_turns(search_tokenizer, search_task):
    tok = search_tokenizer
    for tag in ("<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"):
        assert len(_ids(tok, tag)) == 1, tag
        assert tok.decode(_ids(tok, f"a {tag} b"), skip_special_tokens=True) == f"a {tag} b"
    stops = {tok.convert_ids_to_tokens(i) for i in search_task.stop_token_ids}
    assert stops == {"</search>", "</answer>", "<|im_end|>", "<|endoftext|>"}


def test_two_hop_episode(search_tokenizer, search_task):
    tok, task = search_tokenizer, search_task
    item = _two_hop(task)
    question = task._eval[item.prompt_id].question
    person = question.removeprefix("Which country was ").removesuffix(" born in?")
    kb = generate_kb(30, 0)
    city = next(p.text.split(" was born in ")[1].split(" and ")[0] for p in kb.passages if p.title == person)
    ep = task.start_episode(item, 0)
    r1 = ep.step(_ids(tok, f"<search> {person} </search>"), "stop")
    info = tok.decode(r1.append_ids)
    assert not r1.done and info.startswith("\n\n<information>Doc 1(Title: ") and info.endswith("</information>\n\n")
    assert f"Doc 1(Title: {person}) {person} was born in {city}" in info and info.count("Doc ") == 3
    r2 = ep.step(_ids(tok, f"<search> {city} </search>"), "stop")
    assert f"Doc 1(Title: {city}) {city} is a city in {item.gold[0]}." in tok.decode(r2.append_ids)
    r3 = ep.step(_ids(tok, f"<answer> the {item.gold[0].lower()} </answer>"), "stop")
    assert r3.done and r3.append_ids == [] and ep.reward() == 1.0
    ep.close()


def test_wrong_missing_and_malformed_answers_score_zero(search_tokenizer, search_task):
    tok, task = search_tokenizer, search_task
    item = task.eval_prompts()[0]
    ep = task.start_episode(item, 0)
    assert ep.step(_ids(tok, "<answer> Nowhere </answer>"), "stop").done and ep.reward() == 0.0
    ep = task.start_episode(item, 1)
    bad = ep.step(_ids(tok, "I think it is"), "stop")  # neither tag: the correction message, masked, then go on
    assert not bad.done and "My previous action is invalid" in tok.decode(bad.append_ids)
    assert ep.reward() == 0.0
    cut = ep.step(_ids(tok, "<search> Ada"), "length")  # cut at the per-turn cap: corrected, as in Search-R1
    assert not cut.done and "My previous action is invalid" in tok.decode(cut.append_ids) and ep.reward() == 0.0
    ep = task.start_episode(item, 2)
    assert ep.step(_ids(tok, "<answer> </answer>"), "stop").done and ep.reward() == 0.0


def test_tool_output_is_capped(search_cfg, search_tokenizer):
    cfg = OmegaConf.merge(search_cfg.task, {"max_tool_tokens": 5})
    task = SearchTask(cfg, search_tokenizer)
    try:
        ep = task.start_episode(task.eval_prompts()[0], 0)
        assert len(ep.step(_ids(search_tokenizer, "<search> Brisk </search>"), "stop").append_ids) == 5
    finally:
        task.close()


def test_dead_retriever_is_a_tool_error(search_cfg, search_tokenizer):
    cfg = OmegaConf.merge(search_cfg.task, {"retriever": {"url": "http://127.0.0.1:9/retrieve", "retries": 1}})
    task = SearchTask(cfg, search_tokenizer)
    try:
        ep = task.start_episode(task.eval_prompts()[0], 0)
        with pytest.raises(ToolError, match=r"retriever POST http://127.0.0.1:9/retrieve \{\"queries\": \[\"Brisk\"\]"):
            ep.step(_ids(search_tokenizer, "<search> Brisk </search>"), "stop")
    finally:
        task.close()


def test_sft_demonstration_masks_the_information(search_cfg, search_tokenizer, search_task):
    tok, task = search_tokenizer, search_task
    with open(task.files["sft"]) as f:
        record = next(r for r in map(json.loads, f) if r["level"] == 2)
    ids, mask = task.sft_example(record)
    prompt = task.render(record["prompt"])
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    q1, q2 = (s["query"] for s in record["searches"])
    assert trained == f"<search> {q1} </search><search> {q2} </search><answer> {record['answer']} </answer>"
    masked = tok.decode([t for t, m in zip(ids[len(prompt):], mask[len(prompt):]) if not m])
    assert masked.count("<information>") == 2 and masked.count("Doc 1(Title: ") == 2 and "<search>" not in masked
    # the demonstration's information is what the live retriever answers for the same query
    ep = task.start_episode(task.eval_prompts()[0], 0)
    live = ep.step(_ids(tok, f"<search> {q1} </search>"), "stop").append_ids
    start = len(prompt) + len(_ids(tok, f"<search> {q1} </search>"))
    assert ids[start : start + len(live)] == live
