"""How the policy talks to the retriever: the tool-call format, one small class, so another one (a real
checkpoint's chat-template tool calls) can replace the Search-R1 tags.

``SearchR1Tags`` (Search-R1's format): the model writes ``<search> query </search>`` to search, gets
``\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n`` appended, and ends with
``<answer> a </answer>``. A turn that does neither gets Search-R1's correction message appended (the turn is
the policy's mistake, not an infrastructure failure). ``QwenToolCalls``: Qwen's ``<tool_call>{json}</tool_call>``
turns answered by a ``tool`` message rendered as the chat template renders it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# Search-R1's instruction (its data scripts' prefix; the question follows on the same line).
SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


@dataclass(frozen=True)
class Action:
    """What a model turn asks for: ``search`` (with ``query``), ``answer`` (with ``answer``) or ``invalid``."""

    kind: str
    text: str = ""


def format_passages(docs: list[dict]) -> str:
    """Retrieved documents as the model reads them: ``Doc i(Title: t) text`` per line, where a document's
    ``contents`` is ``"Title"\\ntext`` (wiki-18; quotes around the title are dropped) or the server gave
    ``title`` / ``text`` fields. Search-R1's layout."""
    lines = []
    for i, doc in enumerate(docs, start=1):
        doc = doc.get("document", doc)  # return_scores=true wraps each document
        if "contents" in doc:
            title, _, text = str(doc["contents"]).partition("\n")
        else:
            title, text = str(doc.get("title", "")), str(doc.get("text", ""))
        lines.append(f"Doc {i}(Title: {title.strip().strip(chr(34))}) {text}")
    return "\n".join(lines) + "\n" if lines else ""


class ToolFormat:
    """The tool-call protocol between the policy and the retriever (subclass and register in FORMATS)."""

    name = "base"
    markup: tuple[str, ...] = ()  # strings a tiny tokenizer gets as single tokens
    stop_strings: tuple[str, ...] = ()  # a turn ends after one of these (single tokens: stop ids)
    turn_end: str = ""  # what closes a demonstration's turn besides its last tag (the chat end-of-turn)

    def prompt(self, question: str, template: str | None) -> str:
        return (template or SEARCH_R1_TEMPLATE).format(question=question)

    def parse(self, turn_text: str) -> Action:
        raise NotImplementedError

    def information(self, passages: str) -> str:
        raise NotImplementedError

    def invalid(self) -> str:
        raise NotImplementedError

    def search_turn(self, query: str) -> str:
        """A demonstration's search turn (SFT)."""
        raise NotImplementedError

    def answer_turn(self, answer: str) -> str:
        raise NotImplementedError


class SearchR1Tags(ToolFormat):
    name = "search_r1"
    markup = ("<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>")
    stop_strings = ("</search>", "</answer>")
    _ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)

    def parse(self, turn_text: str) -> Action:
        # Search-R1 reads the first complete tag of the turn
        m = self._ACTION.search(turn_text)
        if m is None:
            return Action("invalid")
        return Action(m.group(1), m.group(2).strip())

    def information(self, passages: str) -> str:
        return f"\n\n<information>{passages.strip()}</information>\n\n"

    def invalid(self) -> str:
        return (
            "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
            "</search>. If I want to give the final answer, I should put the answer between <answer> and "
            "</answer>. Let me try again.\n"
        )

    def search_turn(self, query: str) -> str:
        return f"<search> {query} </search>"

    def answer_turn(self, answer: str) -> str:
        return f"<answer> {answer} </answer>"


class QwenToolCalls(ToolFormat):
    """Qwen chat-template tool calls: ``<tool_call>{"name": "search", "arguments": {"query": q}}</tool_call>``
    ends an assistant turn (at <|im_end|>); the result comes back as a ``tool`` message (Qwen renders it as a
    user turn holding ``<tool_response>``) followed by a new assistant header; a turn without a tool call is
    the final answer (``<answer>`` tags inside it are honoured, else the whole text)."""

    name = "qwen_tool_calls"
    turn_end = "<|im_end|>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    _ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

    def parse(self, turn_text: str) -> Action:
        m = self._CALL.search(turn_text)
        if m is None:
            text = turn_text.split("</think>")[-1].replace("<|im_end|>", "")
            a = self._ANSWER.search(text)
            answer = (a.group(1) if a else text).strip()
            return Action("answer", answer) if answer else Action("invalid")
        try:
            call = json.loads(m.group(1))
            query = call["arguments"]["query"]
        except (ValueError, KeyError, TypeError):
            return Action("invalid")
        return Action("search", str(query).strip()) if call.get("name") == "search" else Action("invalid")

    def information(self, passages: str) -> str:
        # the turn ended at <|im_end|> (its stop token, part of the turn)
        return "\n<|im_start|>user\n<tool_response>\n" + passages.strip() + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

    def invalid(self) -> str:
        return self.information("Invalid tool call: call search with {\"query\": ...} or give the final answer.")

    def search_turn(self, query: str) -> str:
        return "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": query}}) + "\n</tool_call>"

    def answer_turn(self, answer: str) -> str:
        return f"<answer> {answer} </answer>"


FORMATS: dict[str, type[ToolFormat]] = {f.name: f for f in (SearchR1Tags, QwenToolCalls)}


def get_format(name: str) -> ToolFormat:
    if name not in FORMATS:
        raise ValueError(f"task.format={name!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[name]()
