"""The terminal-agent RL task: a persistent bash per rollout in a sandbox, up to ``max_turns`` turns, scored 0/1
by the task's verifier (episode.py); prompts and observations in the chat format of the run's tokenizer.

    task = AgentTask(cfg.task, tokenizer, seed=cfg.seed)
    item = next(task.train_prompts())            # PromptItem(prompt_id, prompt_ids, gold=instance_id)
    ep = task.start_episode(item, 0)             # AgentEpisode over a sandbox of task.pool
    ids, mask = task.sft_example(record)         # a scripted demonstration (sft.jsonl of demos.py)

Tasks (cfg.task.source): ``offline`` (offline.py's seeded family: task.offline.n_train / n_heldout / seed /
families) or ``rows`` (the published row layout, rows.py: task.rows.train and task.rows.eval files).

A model turn is ``<bash>command</bash>`` or ``<submit/>`` (actions.py), ended by the eos token. The tool's
answer is a user turn appended after it (``observation_ids``): ``\\n<|im_start|>user\\n<output ...>...</output>
<|im_end|>\\n<|im_start|>assistant\\n``, its chat markup as token ids and the command output as plain text (a
chat-markup string in the output is escaped, so a file cannot inject a turn).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

from ...config import cfg_get, to_plain
from ..base import PromptItem, Task, cycle_shuffled
from ..tokenizer import ENDOFTEXT, IM_END, IM_START, cached_tiny_tokenizer, run_tokenizer
from .actions import action_format
from .demos import ensure_agent_demos
from .episode import AgentEpisode
from .offline import offline_agent_splits
from .pool import SandboxPool
from .rows import load_task_rows
from .sandbox import SandboxLimits
from .spec import AgentTaskSpec

ACTION_TOKENS = ("<bash>", "</bash>", "<submit/>", "<output", "</output>")  # single tokens in the tiny BPE


def sandbox_limits(cfg_task: Any) -> SandboxLimits:
    return SandboxLimits(**(to_plain(cfg_get(cfg_task, "sandbox", {})) or {}))


def task_splits(cfg_task: Any) -> dict[str, list[AgentTaskSpec]]:
    """The train and held-out AgentTaskSpecs the config names (module doc)."""
    source = cfg_get(cfg_task, "source", "offline")
    if source == "offline":
        off = cfg_get(cfg_task, "offline")
        families = to_plain(cfg_get(off, "families"))
        return offline_agent_splits(int(cfg_get(off, "n_train", 2000)), int(cfg_get(off, "n_heldout", 30)),
                                    int(cfg_get(off, "seed", 0)), families)
    if source == "rows":
        rows = cfg_get(cfg_task, "rows")
        train, evals = cfg_get(rows, "train"), cfg_get(rows, "eval")
        if not train:
            raise ValueError("task.rows.train: set it to a .jsonl / .parquet file of task rows (task.source=rows)")
        return {"train": load_task_rows(train), "heldout": load_task_rows(evals) if evals else []}
    raise ValueError(f"task.source={source!r}: expected 'offline' or 'rows'")


def user_message(spec: AgentTaskSpec, fmt) -> str:
    return f"{spec.instruction}\n{fmt.instructions()}"


class AgentTask(Task):
    name = "agent"
    max_turns = 64
    max_context_tokens = 65536

    def __init__(self, cfg_task: Any, tokenizer, seed: int = 0, splits: dict | None = None):
        self.cfg, self.tokenizer, self.seed = cfg_task, tokenizer, int(seed)
        splits = splits or task_splits(cfg_task)
        self._train, self._eval = splits["train"], splits["heldout"]
        if not self._train:
            raise ValueError("the agent task has no training tasks")
        self.specs = {s.instance_id: s for s in self._train + self._eval}
        self.configure_episodes(cfg_task)  # max_turns, max_tokens_per_turn, max_context_tokens, env_workers
        self.episode_timeout_s = float(cfg_get(cfg_task, "episode_timeout_s", 3600))
        self.time_scale = float(cfg_get(cfg_task, "time_scale", 1.0))
        if self.max_turns < 1 or self.time_scale <= 0 or self.episode_timeout_s <= 0:
            raise ValueError("task.max_turns must be >= 1, task.time_scale and task.episode_timeout_s > 0")
        self.action_format = action_format(cfg_get(cfg_task, "action_format", "tags"))
        self.pool = SandboxPool(sandbox_limits(cfg_task), cfg_get(cfg_task, "sandbox_concurrency"))
        vocab = tokenizer.get_vocab()
        self._im_start, self._im_end = vocab[IM_START], vocab[IM_END]
        self._stop = tuple(sorted({vocab[t] for t in (IM_END, ENDOFTEXT) if t in vocab}))
        self._ids: dict[str, list[int]] = {}

    # ----- Task protocol

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stop

    def item(self, spec: AgentTaskSpec, index: int) -> PromptItem:
        if spec.instance_id not in self._ids:
            self._ids[spec.instance_id] = self.render(spec)
        return PromptItem(index, list(self._ids[spec.instance_id]), spec.instance_id)

    def train_prompts(self, start: int = 0) -> Iterator[PromptItem]:
        for idx in cycle_shuffled(len(self._train), self.seed, start):
            yield self.item(self._train[idx], idx)

    def eval_prompts(self) -> list[PromptItem]:
        return [self.item(s, i) for i, s in enumerate(self._eval)]

    def start_episode(self, item: PromptItem, sample_index: int) -> AgentEpisode:
        return AgentEpisode(self, item, self.specs[item.gold])

    def reward(self, response_ids: Sequence[int], gold: Any) -> float:
        """A single response scored as a one-turn episode: its command (if any) runs in a fresh sandbox, then
        the verifier. Multi-turn rollouts are scored by their episode instead."""
        try:
            ep = AgentEpisode(self, PromptItem(0, [], gold), self.specs[gold])
        except Exception:  # noqa: BLE001 - a reward never raises; ToolError surfaces through episodes
            return 0.0
        try:
            res = ep.step(response_ids, "stop")
            if not res.done:
                ep.step(self.tokenizer.encode("<submit/>", add_special_tokens=False) + [self._im_end], "stop")
            return ep.reward()
        except Exception:  # noqa: BLE001
            return 0.0
        finally:
            ep.close()

    # ----- rendering

    def render(self, spec: AgentTaskSpec) -> list[int]:
        msgs = [{"role": "user", "content": user_message(spec, self.action_format)}]
        return list(self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False))

    def plain_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: chat markup inside it cannot become a special token."""
        return self.tokenizer.encode(text.replace("<|", "< |"), add_special_tokens=False)

    def observation_ids(self, observation: str) -> list[int]:
        """The tool turn appended after a model turn that ended with eos (module doc)."""
        enc = self.tokenizer.encode
        return (enc("\n", add_special_tokens=False) + [self._im_start] + enc("user\n", add_special_tokens=False)
                + self.plain_ids(observation) + [self._im_end] + enc("\n", add_special_tokens=False)
                + [self._im_start] + enc("assistant\n", add_special_tokens=False))

    def turn_ids(self, text: str) -> list[int]:
        """A model turn: its text, then eos (what the generator emits)."""
        return self.tokenizer.encode(text, add_special_tokens=False) + [self._im_end]

    def decode_response(self, response_ids: Sequence[int]) -> str:
        ids = [int(t) for t in response_ids]
        cut = next((i for i, t in enumerate(ids) if t in set(self._stop)), len(ids))
        return self.tokenizer.decode(ids[:cut], skip_special_tokens=True)

    def sft_example(self, record: dict) -> tuple[list[int], list[int]]:
        """A demonstration of demos.py (its ``turns``: model turn, observation, ..., final model turn) as
        (ids, mask): the prompt as RL renders it, model turns + eos trained on (mask 1), observations not."""
        ids = self.item(self.specs[record["instance_id"]], 0).prompt_ids
        mask = [0] * len(ids)
        for turn in record["turns"]:
            piece = self.turn_ids(turn["text"]) if turn["role"] == "assistant" else self.observation_ids(turn["text"])
            ids += piece
            mask += [int(turn["role"] == "assistant")] * len(piece)
        return ids, mask

    def close(self) -> None:
        """Sandboxes are closed by their episodes; nothing else is held."""


# ------------------------------------------------------------------------------------------ tokenizer


def tokenizer_corpus(cfg_task: Any) -> list[str]:
    """Texts the tiny BPE is trained on: every task's prompt and scripted commands, and the observation markup."""
    fmt = action_format(cfg_get(cfg_task, "action_format", "tags"))
    splits = task_splits(cfg_task)
    texts = []
    for spec in splits["train"] + splits["heldout"]:
        texts.append(user_message(spec, fmt))
        texts += [f"<bash>{c}</bash>" for c in spec.solution]
    texts += ["<submit/>", "<output exit=0>\n</output>", "<output exit=1>\n</output>"] * 32
    random.Random(0).shuffle(texts)  # a fixed order: the cache key is the corpus
    return texts


def ensure_agent_data(cfg_task: Any):
    """The offline source's SFT demonstrations (task.offline.sft), written when missing (demos.py)."""
    return ensure_agent_demos(cfg_task, task_splits(cfg_task)["train"], user_message)


def tiny_tokenizer(cfg_task: Any, vocab_size: int):
    return cached_tiny_tokenizer(tokenizer_corpus(cfg_task), vocab_size,
                                 cfg_get(cfg_task, "tokenizer_cache", ".cache/tokenizers"), ACTION_TOKENS)


def get_agent_tokenizer(cfg: Any):
    """The run's tokenizer: model.tokenizer / the checkpoint's, or for tiny presets the BPE of ``tiny_tokenizer``."""
    return run_tokenizer(cfg, tiny_tokenizer)
