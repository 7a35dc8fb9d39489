"""One terminal task: an instruction, the files the sandbox starts with, the verifier, and (for generated tasks)
a scripted solution.

    spec = AgentTaskSpec(instance_id="text-grep-0007", instruction="Write the lines of ...",
                         files={"log.txt": "..."}, test_sh="#!/bin/bash\\n...", test_files={"expected.txt": "..."})

The verifier (``test_sh``, with ``test_files`` beside it in /tests) is put into the sandbox only after the agent
submits, runs in the work dir, and writes 1 or 0 to ``reward_path``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sandbox import SandboxSpec

REWARD_PATH = "/logs/verifier/reward.txt"
WORKDIR = "/work"


@dataclass(frozen=True)
class AgentTaskSpec:
    instance_id: str
    instruction: str
    test_sh: str
    files: dict[str, str] = field(default_factory=dict)  # relpath under workdir -> text, before the episode
    test_files: dict[str, str] = field(default_factory=dict)  # relpath under /tests -> text, after submit
    setup: str | None = None  # shell run in the work dir before the agent's shell starts
    workdir: str = WORKDIR
    reward_path: str = REWARD_PATH
    family: str = ""
    solution: tuple[str, ...] = ()  # scripted commands that solve it (generated tasks), then submit
    image: str | None = None  # the container image a published row names (not pulled: see rows.py)

    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec(files=dict(self.files), workdir=self.workdir, setup=self.setup,
                           reward_path=self.reward_path)

    def to_json(self) -> dict:
        return {"instance_id": self.instance_id, "instruction": self.instruction, "test_sh": self.test_sh,
                "files": self.files, "test_files": self.test_files, "setup": self.setup, "workdir": self.workdir,
                "reward_path": self.reward_path, "family": self.family, "solution": list(self.solution),
                "image": self.image}

    @classmethod
    def from_json(cls, d: dict) -> "AgentTaskSpec":
        return cls(**{**d, "solution": tuple(d.get("solution") or ())})
