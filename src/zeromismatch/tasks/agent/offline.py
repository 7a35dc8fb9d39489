"""Offline terminal tasks, generated from a seed: file manipulation, text processing (grep / sed / awk / sort /
wc), small scripts that must pass checks, and git operations on a seeded repository.

    splits = offline_agent_splits(n_train=2000, n_heldout=30, seed=0)
    splits["train"][0]        # AgentTaskSpec(instance_id='text-grep-...', instruction=..., solution=(...))

Every task is a template with random words, names and numbers; its ``test.sh`` checks the end state in the work
dir (against expected files in /tests where there are any) and writes 1 or 0 to the reward file. Each task
carries a scripted solution (commands, then submit) for the SFT warm start. The held-out split draws from its own
seed stream and never repeats a train instruction. Deterministic: same arguments, same tasks.
"""

from __future__ import annotations

import random
import shlex

from .spec import REWARD_PATH, WORKDIR, AgentTaskSpec

WORDS = ("apple", "river", "stone", "cloud", "tiger", "maple", "ocean", "piano", "lemon", "robot", "candle",
         "forest", "planet", "silver", "garden", "winter", "rocket", "copper", "violet", "desert", "harbor",
         "falcon", "marble", "meadow", "pepper", "rabbit", "saddle", "tunnel", "velvet", "walnut")
NAMES = ("notes", "data", "report", "list", "log", "items", "words", "draft", "table", "output", "summary",
         "config", "index", "queue", "batch", "record")
EXTS = ("log", "tmp", "bak", "old")
SEED_REPO = ("git init -q -b main && git add -A && git commit -qm 'initial commit'")


def _verifier(check: str) -> str:
    """test.sh: run ``check`` (a shell condition) in the work dir; 1 if it holds, else 0."""
    return (f"#!/bin/bash\ncd {WORKDIR} || exit 1\nmkdir -p $(dirname {REWARD_PATH})\n"
            f"if {check}; then echo 1 > {REWARD_PATH}; else echo 0 > {REWARD_PATH}; fi\n")


def _same_as(path: str, expected: str = "/tests/expected.txt") -> str:
    return f"cmp -s {shlex.quote(path)} {expected}"


def _lines(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4))) for _ in range(n)]


def _two(rng: random.Random, pool) -> tuple[str, str]:
    a, b = rng.sample(pool, 2)
    return a, b


# ------------------------------------------------------------------------------------ files


def file_create(rng):
    name, word = rng.choice(NAMES), rng.choice(WORDS)
    f = f"{name}.txt"
    return dict(instruction=f"Create a file named {f} that contains the word {word}.",
                check=f'[ "$(cat {f})" = "{word}" ]', solution=(f"echo {word} > {f}",))


def file_copy(rng):
    src, dst = _two(rng, NAMES)
    text = "\n".join(_lines(rng, 3)) + "\n"
    return dict(instruction=f"Copy the file {src}.txt to {dst}.txt.", files={f"{src}.txt": text},
                test_files={"expected.txt": text}, check=f"{_same_as(dst + '.txt')} && [ -f {src}.txt ]",
                solution=(f"cp {src}.txt {dst}.txt",))


def file_rename(rng):
    src, dst = _two(rng, NAMES)
    text = "\n".join(_lines(rng, 2)) + "\n"
    return dict(instruction=f"Rename the file {src}.txt to {dst}.txt.", files={f"{src}.txt": text},
                test_files={"expected.txt": text}, check=f"{_same_as(dst + '.txt')} && [ ! -e {src}.txt ]",
                solution=(f"mv {src}.txt {dst}.txt",))


def file_delete_ext(rng):
    folder, ext = rng.choice(NAMES), rng.choice(EXTS)
    doomed = rng.sample(WORDS, 3)
    kept = rng.sample([w for w in WORDS if w not in doomed], 2)
    files = {f"{folder}/{w}.{ext}": "x\n" for w in doomed} | {f"{folder}/{w}.txt": "keep\n" for w in kept}
    check = " && ".join([f"[ ! -e {folder}/{w}.{ext} ]" for w in doomed] + [f"[ -f {folder}/{w}.txt ]" for w in kept])
    return dict(instruction=f"Delete every file ending in .{ext} in the folder {folder}.", files=files,
                check=check, solution=(f"rm {folder}/*.{ext}",))


def file_move_into(rng):
    name, folder = _two(rng, NAMES)
    return dict(instruction=f"Make a folder named {folder} and move {name}.txt into it.",
                files={f"{name}.txt": rng.choice(WORDS) + "\n"},
                check=f"[ -f {folder}/{name}.txt ] && [ ! -e {name}.txt ]",
                solution=(f"mkdir {folder} && mv {name}.txt {folder}/",))


# ------------------------------------------------------------------------------------ text


def text_grep(rng):
    src, out = _two(rng, NAMES)
    word = rng.choice(WORDS)
    lines = _lines(rng, 8)
    lines[rng.randrange(8)] += f" {word}"
    expected = "".join(ln + "\n" for ln in lines if word in ln)
    return dict(instruction=f"Write the lines of {src}.txt that contain the word {word} to {out}.txt.",
                files={f"{src}.txt": "\n".join(lines) + "\n"}, test_files={"expected.txt": expected},
                check=_same_as(f"{out}.txt"), solution=(f"grep {word} {src}.txt > {out}.txt",))


def text_sort(rng):
    src, out = _two(rng, NAMES)
    words = rng.sample(WORDS, rng.randint(4, 7))
    return dict(instruction=f"Sort the lines of {src}.txt alphabetically and write them to {out}.txt.",
                files={f"{src}.txt": "\n".join(words) + "\n"},
                test_files={"expected.txt": "\n".join(sorted(words)) + "\n"},
                check=_same_as(f"{out}.txt"), solution=(f"sort {src}.txt > {out}.txt",))


def text_unique(rng):
    src, out = _two(rng, NAMES)
    words = [rng.choice(WORDS[:8]) for _ in range(10)]
    return dict(instruction=f"Write the distinct lines of {src}.txt, sorted, to {out}.txt.",
                files={f"{src}.txt": "\n".join(words) + "\n"},
                test_files={"expected.txt": "\n".join(sorted(set(words))) + "\n"},
                check=_same_as(f"{out}.txt"), solution=(f"sort -u {src}.txt > {out}.txt",))


def text_count(rng):
    src, out = _two(rng, NAMES)
    n = rng.randint(3, 12)
    return dict(instruction=f"Write the number of lines in {src}.txt to {out}.txt.",
                files={f"{src}.txt": "\n".join(_lines(rng, n)) + "\n"},
                check=f'[ "$(tr -d " \\n" < {out}.txt)" = "{n}" ]', solution=(f"wc -l < {src}.txt > {out}.txt",))


def text_replace(rng):
    src = rng.choice(NAMES)
    a, b = _two(rng, WORDS)
    lines = _lines(rng, 5)
    lines[0] += f" {a}"
    text = "\n".join(lines) + "\n"
    # A space as sed's delimiter: the words keep the spaced tokens of the instruction (the tiny BPE spells the
    # word after 's/' as another token, which a tiny model never learned to copy: 0 of 15 held-out solved).
    return dict(instruction=f"Replace every {a} with {b} in {src}.txt.", files={f"{src}.txt": text},
                test_files={"expected.txt": text.replace(a, b)}, check=_same_as(f"{src}.txt"),
                solution=(f"sed -i 's {a} {b} g' {src}.txt",))


def text_sum_column(rng):
    src, out = _two(rng, NAMES)
    col = rng.randint(1, 3)
    rows = [[rng.randint(1, 50) for _ in range(3)] for _ in range(rng.randint(3, 6))]
    total = sum(r[col - 1] for r in rows)
    return dict(instruction=f"Write the sum of column {col} of {src}.txt to {out}.txt.",
                files={f"{src}.txt": "".join(" ".join(map(str, r)) + "\n" for r in rows)},
                check=f'[ "$(tr -d " \\n" < {out}.txt)" = "{total}" ]',
                solution=(f"awk '{{s += ${col}}} END {{print s}}' {src}.txt > {out}.txt",))


# ------------------------------------------------------------------------------------ scripts


def script_add(rng):
    name = rng.choice(NAMES)
    pairs = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(2)]
    check = " && ".join(f'[ "$(./{name}.sh {a} {b})" = "{a + b}" ]' for a, b in pairs)
    return dict(instruction=f"Write an executable script {name}.sh that prints the sum of its two arguments.",
                check=f"[ -x {name}.sh ] && {check}",
                solution=(f"printf '#!/bin/bash\\necho $(($1 + $2))\\n' > {name}.sh && chmod +x {name}.sh",))


def script_lines(rng):
    name, probe = _two(rng, NAMES)
    n = rng.randint(2, 9)
    return dict(instruction=f"Write an executable script {name}.sh that prints the number of lines of the file "
                            "given as its argument.",
                test_files={f"{probe}.txt": "\n".join(_lines(rng, n)) + "\n"},
                check=f'[ -x {name}.sh ] && [ "$(./{name}.sh /tests/{probe}.txt | tr -d " ")" = "{n}" ]',
                solution=(f"printf '#!/bin/bash\\nwc -l < \"$1\"\\n' > {name}.sh && chmod +x {name}.sh",))


def script_greet(rng):
    name, word = rng.choice(NAMES), rng.choice(WORDS)
    who = rng.choice(WORDS)
    return dict(instruction=f"Write an executable script {name}.sh that prints {word} followed by a space and its "
                            "first argument.",
                check=f'[ -x {name}.sh ] && [ "$(./{name}.sh {who})" = "{word} {who}" ]',
                solution=(f"printf '#!/bin/bash\\necho {word} $1\\n' > {name}.sh && chmod +x {name}.sh",))


# ------------------------------------------------------------------------------------ git


def _repo(rng):
    return {f"{n}.txt": rng.choice(WORDS) + "\n" for n in rng.sample(NAMES, 2)}


def git_commit(rng):
    files = _repo(rng)
    new = rng.choice([n for n in NAMES if f"{n}.txt" not in files])
    msg = f"add {new}"
    return dict(instruction=f"This folder is a git repository. Commit the new file {new}.txt with the message "
                            f"'{msg}'.", files=files, setup=SEED_REPO, post_setup={f"{new}.txt": "fresh\n"},
                check=f'[ "$(git log -1 --format=%s)" = "{msg}" ] && git ls-files --error-unmatch {new}.txt '
                      '>/dev/null 2>&1 && [ -z "$(git status --porcelain)" ]',
                solution=(f"git add {new}.txt && git commit -qm '{msg}'",))


def git_branch(rng):
    branch = f"{rng.choice(WORDS)}-{rng.choice(NAMES)}"
    return dict(instruction=f"This folder is a git repository. Create a branch named {branch}.", files=_repo(rng),
                setup=SEED_REPO, check=f"git rev-parse --verify -q refs/heads/{branch} >/dev/null",
                solution=(f"git branch {branch}",))


def git_head_hash(rng):
    out = rng.choice(NAMES)
    return dict(instruction=f"This folder is a git repository. Write the full hash of the latest commit to "
                            f"{out}.txt.", files=_repo(rng), setup=SEED_REPO,
                check=f'[ "$(tr -d " \\n" < {out}.txt)" = "$(git rev-parse HEAD)" ]',
                solution=(f"git rev-parse HEAD > {out}.txt",))


def git_restore(rng):
    files = _repo(rng)
    target = rng.choice(sorted(files))
    return dict(instruction=f"This folder is a git repository. Discard the uncommitted changes to {target}.",
                files=files, setup=SEED_REPO, post_setup={target: "broken\n"},
                check=f"git diff --quiet -- {target} && [ -f {target} ]", solution=(f"git checkout -- {target}",))


FAMILIES = {
    "file": (file_create, file_copy, file_rename, file_delete_ext, file_move_into),
    "text": (text_grep, text_sort, text_unique, text_count, text_replace, text_sum_column),
    "script": (script_add, script_lines, script_greet),
    "git": (git_commit, git_branch, git_head_hash, git_restore),
}
TEMPLATES = [(family, fn) for family, fns in FAMILIES.items() for fn in fns]


def make_task(rng: random.Random, index: int, split: str, families=None) -> AgentTaskSpec:
    pool = [t for t in TEMPLATES if families is None or t[0] in families]
    family, fn = pool[rng.randrange(len(pool))]
    d = fn(rng)
    setup = d.get("setup")
    for rel, text in d.get("post_setup", {}).items():  # files written after the seed commit
        setup = f"{setup} && printf %s {shlex.quote(text)} > {shlex.quote(rel)}"
    return AgentTaskSpec(instance_id=f"{split}-{index:05d}-{fn.__name__.replace('_', '-')}",
                         instruction=d["instruction"], files=d.get("files", {}), test_files=d.get("test_files", {}),
                         setup=setup, test_sh=_verifier(d["check"]), family=family, solution=d["solution"])


def offline_agent_splits(n_train: int, n_heldout: int, seed: int, families=None) -> dict[str, list[AgentTaskSpec]]:
    """``n_train`` train and ``n_heldout`` held-out tasks (families: a subset of FAMILIES' keys, default all).
    Held-out instructions never occur in train."""
    if families is not None:
        unknown = sorted(set(families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"task.offline.families: unknown {unknown}; expected some of {sorted(FAMILIES)}")
    rng = random.Random(f"agent-train:{seed}")
    train = [make_task(rng, i, "train", families) for i in range(n_train)]
    seen = {t.instruction for t in train}
    rng = random.Random(f"agent-heldout:{seed}")
    heldout: list[AgentTaskSpec] = []
    for _ in range(1000 * max(n_heldout, 1)):
        if len(heldout) == n_heldout:
            break
        t = make_task(rng, len(heldout), "heldout", families)
        if t.instruction not in seen:
            seen.add(t.instruction)
            heldout.append(t)
    if len(heldout) < n_heldout:
        raise ValueError(f"could not draw {n_heldout} held-out tasks distinct from the {n_train} train tasks")
    return {"train": train, "heldout": heldout}
