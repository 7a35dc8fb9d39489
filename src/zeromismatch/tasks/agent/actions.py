"""What a model turn asks for, and how an observation is written back: the action format.

    fmt = TagFormat()                          # <bash>cmd</bash> runs cmd; <submit/> ends the episode
    fmt.parse("ls\\n<bash>cat a.txt</bash>")   # Action(kind='bash', command='cat a.txt')
    fmt.observation(result)                    # '<output exit=0>\\n...\\n</output>'

One command per turn (the first ``<bash>`` block; text around it is the model's own notes) keeps the format
learnable by a small model. A turn holding ``<submit/>`` before any command submits. A turn with neither gets
an observation that says what the format is, and the episode goes on. Another format is a subclass with its
own ``parse`` / ``observation`` / ``instructions``, named by ``task.action_format``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .sandbox import CommandResult


@dataclass(frozen=True)
class Action:
    kind: str  # 'bash' | 'submit' | 'none'
    command: str = ""


class TagFormat:
    name = "tags"
    _BASH = re.compile(r"<bash>(.*?)</bash>", re.DOTALL)
    _SUBMIT = "<submit/>"

    def instructions(self) -> str:
        return ("Run one shell command per turn as <bash>COMMAND</bash>; you will see its output. "
                "When the task is done, reply <submit/>.")

    def parse(self, text: str) -> Action:
        m = self._BASH.search(text)
        submit_at = text.find(self._SUBMIT)
        if submit_at >= 0 and (m is None or submit_at < m.start()):
            return Action("submit")
        if m is not None:
            return Action("bash", m.group(1).strip())
        return Action("none")

    def observation(self, r: CommandResult) -> str:
        notes = []
        if r.timed_out:
            notes.append("the command timed out and was stopped")
        if r.output_limit:
            notes.append("the command printed too much and was stopped")
        if r.shell_exited:
            notes.append("the shell exited; the next command runs in a new one")
        if r.restarted:
            notes.append("a new shell ran this command")
        status = f" exit={r.exit_code}" if r.exit_code is not None else ""
        note = "".join(f"[{n}]\n" for n in notes)
        return f"<output{status}>\n{note}{r.output}</output>"

    def no_action(self) -> str:
        return f"<output>\n[no command found. {self.instructions()}]\n</output>"


FORMATS = {TagFormat.name: TagFormat}


def action_format(name: str) -> TagFormat:
    if name not in FORMATS:
        raise ValueError(f"task.action_format={name!r}: expected one of {sorted(FORMATS)}")
    return FORMATS[name]()
