"""``terminal``: procedurally generated shell chores over a generated file tree.

Every seed gives one task (``TerminalSuite(kinds)(seed)``): a small tree of directories and text files, a chore
of one kind, and a scripted expert that does it with one ``bash`` command and then ``submit``. The chores:

* ``find``: submit the path of the file with a given name (``find * -name NAME``);
* ``count_lines``: submit how many lines a file has (``wc -l < PATH``);
* ``count_files``: submit how many ``.EXT`` files a directory holds (``ls DIR/*.EXT | wc -l``);
* ``grep``: submit the path of the one file under a directory that mentions a word (``grep -rl WORD DIR``);
* ``move``: rename or move a file (``mv``), checked by the final files (the new path holds the content, the old
  one is gone);
* ``extract``: a field of a CSV row as the answer (``awk``), or a JSON field written into a file (``python3``);
* ``fix_config``: set one ``key=value`` line of an ini file (``sed -i``), checked by the file's exact content.

Answers are checked by ``answer`` checks, files by ``file`` / ``command`` checks. The expert's command prints
exactly the answer, so the second call copies the tool's output into ``submit``: a pattern a tiny model can learn
from demonstrations. Instructions are one or two short sentences for the same reason.

Seeds are the split, as for Sokoban: training uses seeds from ``env.train_seed_start``, the held-out table those
from ``env.val_seed_start``; the names and numbers are drawn from the seed, so a held-out task is a new
combination of names, values and tree.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentgym.envs.workspace.expert_calls import bash, submit
from agentgym.envs.workspace.task import Check, WorkspaceTask

KINDS = ("find", "count_lines", "count_files", "grep", "move", "extract", "fix_config")

DIRS = ("docs", "data", "logs", "notes", "src", "config", "archive", "reports")
SUBDIRS = ("old", "new", "draft", "misc", "tmp", "v1", "v2")
WORDS = (
    "apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "ocean", "candle",
    "garden", "silver", "rocket", "forest", "button", "window", "planet", "bridge", "violet", "copper",
)  # fmt: skip
RARE_WORDS = ("zebra", "quartz", "walrus", "mango", "falcon", "cobalt", "igloo", "jasmine", "kiwi", "nebula")
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar")
CITIES = ("paris", "lima", "oslo", "rome", "cairo", "tokyo", "dublin", "quito", "sofia", "hanoi")
EXTS = ("txt", "md", "log", "csv")
CONFIG_KEYS = ("workers", "port", "timeout", "retries", "threads", "cache_size", "max_users", "batch")

Files = dict[str, str]


@dataclass(frozen=True)
class Shape:
    """How names look: ``nested``: paths may go two directories deep (``logs/old/x.txt``; else one,
    ``logs/x.txt``); ``name_words``: words in a file's stem (2: ``river_stone.log``; 1: ``river.log``).
    Both only change how many tokens a name is, i.e. how much an agent copies from the instruction or a tool's
    output into its calls: the chores and their checks are the same."""

    nested: bool = True
    name_words: int = 2

    def stem(self, rng: random.Random, first: Sequence[str] = WORDS) -> str:
        return rng.choice(first) if self.name_words == 1 else f"{rng.choice(first)}_{rng.choice(WORDS)}"


class TerminalSuite:
    """Seed -> a shell chore (``WorkspaceTask``). ``kinds``: the chore kinds drawn from (default all of ``KINDS``);
    ``num_files``: how many filler files the tree has beside the chore's own; ``nested``: paths may go two
    directories deep (``logs/old/x.txt``; else one, ``logs/x.txt``: fewer tokens to copy); ``name_words``: words in
    a file's stem (2: ``river_stone.log``, 1: ``river.log``); ``max_turns``: the episode's turn budget (the expert
    needs two)."""

    def __init__(
        self,
        kinds: Sequence[str] | str | None = None,
        num_files: int = 6,
        nested: bool = True,
        max_turns: int = 4,
        name_words: int = 2,
    ) -> None:
        if isinstance(kinds, str):
            kinds = [kinds]
        self.kinds = tuple(kinds) if kinds else KINDS
        unknown = [k for k in self.kinds if k not in GENERATORS]
        if unknown:
            raise ValueError(f"unknown terminal chore kind(s) {unknown}; the kinds are {', '.join(KINDS)}")
        if num_files < 0 or max_turns < 2:
            raise ValueError("num_files must be >= 0 and max_turns >= 2 (the expert uses two turns)")
        if name_words not in (1, 2):
            raise ValueError(f"name_words must be 1 or 2 (words in a file name's stem), got {name_words!r}")
        self.num_files = int(num_files)
        self.shape = Shape(bool(nested), int(name_words))
        self.max_turns = int(max_turns)

    def __call__(self, seed: int) -> WorkspaceTask:
        rng = random.Random(int(seed))
        kind = self.kinds[int(seed) % len(self.kinds)]  # in turn: any run of seeds holds every kind alike
        files = filler_tree(rng, self.num_files, self.shape)
        instruction, checks, expert = GENERATORS[kind](rng, files, self.shape)
        return WorkspaceTask(
            task_id=f"terminal/{kind}/{seed}",
            instruction=instruction,
            files=files,
            checks=tuple(checks),
            expert=tuple(expert),
            max_turns=self.max_turns,
            metadata={"suite": "terminal", "kind": kind, "seed": int(seed)},
        )


# ---- the tree ----------------------------------------------------------------------------------


def text_lines(rng: random.Random, count: int) -> str:
    """``count`` lines of a few common words each, newline-terminated."""
    return "".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) + "\n" for _ in range(count))


def fresh_path(
    rng: random.Random, files: Files, directory: str | None = None, ext: str | None = None, shape: Shape = Shape()
) -> str:
    """A path not in ``files`` (nor a prefix of one): ``DIR[/SUB]/STEM.ext`` (``SUB`` only when ``shape.nested``;
    ``STEM`` is ``word_word`` or ``word``, ``shape.name_words``)."""
    while True:
        d = directory or rng.choice(DIRS)
        if directory is None and shape.nested and rng.random() < 0.4:
            d = f"{d}/{rng.choice(SUBDIRS)}"
        path = f"{d}/{shape.stem(rng)}.{ext or rng.choice(EXTS)}"
        if path not in files and not any(p.startswith(path + "/") for p in files):
            return path


def filler_tree(rng: random.Random, num_files: int, shape: Shape = Shape()) -> Files:
    files: Files = {}
    for _ in range(num_files):
        files[fresh_path(rng, files, shape=shape)] = text_lines(rng, rng.randint(1, 6))
    return files


def _no_rare(files: Files) -> None:
    """Filler text never holds a rare word (``grep``'s target must be the only match)."""
    assert not any(w in text for text in files.values() for w in RARE_WORDS)


# ---- the chores --------------------------------------------------------------------------------

Chore = tuple[str, list[Check], list[dict]]
# A chore: (rng, the tree so far, shape) -> (instruction, checks, expert); it adds its own files to the tree.


def find_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    name = f"{shape.stem(rng, RARE_WORDS)}.{rng.choice(EXTS)}"
    deep = shape.nested and rng.random() < 0.7
    path = f"{rng.choice(DIRS)}/{rng.choice(SUBDIRS)}/{name}" if deep else f"{rng.choice(DIRS)}/{name}"
    files[path] = text_lines(rng, rng.randint(1, 4))
    return (
        f"Find the file named {name}. Submit its path.",
        [Check(kind="answer", answer=path)],
        [bash(f"find * -name {name}"), submit(path)],
    )


def count_lines_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    path = fresh_path(rng, files, shape=shape)
    count = rng.randint(3, 30)
    files[path] = text_lines(rng, count)
    return (
        f"How many lines are in {path}? Submit the number.",
        [Check(kind="answer", answer=str(count))],
        [bash(f"wc -l < {path}"), submit(str(count))],
    )


def count_files_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    directory = f"{rng.choice(DIRS)}/{rng.choice(SUBDIRS)}" if shape.nested else rng.choice(DIRS)
    ext, other = rng.sample(EXTS, 2)
    count = rng.randint(1, 7)
    for _ in range(count):
        files[fresh_path(rng, files, directory, ext, shape)] = text_lines(rng, 1)
    for _ in range(rng.randint(0, 3)):
        files[fresh_path(rng, files, directory, other, shape)] = text_lines(rng, 1)
    count = sum(1 for p in files if p.rpartition("/")[0] == directory and p.endswith("." + ext))
    return (
        f"How many .{ext} files are in {directory}? Submit the number.",
        [Check(kind="answer", answer=str(count))],
        [bash(f"ls {directory}/*.{ext} | wc -l"), submit(str(count))],
    )


def grep_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    _no_rare(files)
    directory = rng.choice(DIRS)
    word = rng.choice(RARE_WORDS)
    for _ in range(rng.randint(1, 3)):  # siblings without the word
        files[fresh_path(rng, files, directory, shape=shape)] = text_lines(rng, rng.randint(1, 4))
    path = fresh_path(rng, files, directory, shape=shape)
    lines = text_lines(rng, rng.randint(2, 5)).splitlines(keepends=True)
    at = rng.randrange(len(lines))
    lines[at] = lines[at].rstrip("\n") + f" {word}\n"
    files[path] = "".join(lines)
    return (
        f"Which file in {directory} mentions {word}? Submit its path.",
        [Check(kind="answer", answer=path)],
        [bash(f"grep -rl {word} {directory}"), submit(path)],
    )


def move_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    source = fresh_path(rng, files, shape=shape)
    content = text_lines(rng, rng.randint(1, 4))
    files[source] = content
    directory, _, name = source.rpartition("/")
    if rng.random() < 0.5:  # rename in place
        stem, _, ext = name.rpartition(".")
        target = f"{directory}/{stem}_{rng.choice(('old', 'final', 'backup', 'v2'))}.{ext}"
        instruction = f"Rename {source} to {target}."
        command = f"mv {source} {target}"
    else:  # move into another (existing) directory
        into = rng.choice([d for d in DIRS if d != directory.split("/")[0] and f"{d}/{name}" not in files])
        files.setdefault(f"{into}/README.md", f"{into}\n")
        target = f"{into}/{name}"
        instruction = f"Move {source} into {into}/."
        command = f"mv {source} {into}/"
    return (
        instruction,
        [Check(kind="file", path=target, content=content), Check(kind="file", path=source, content=None)],
        [bash(command), submit()],
    )


def extract_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    if rng.random() < 0.5:  # a CSV field, submitted
        path = fresh_path(rng, files, rng.choice(("data", "reports")), "csv", shape)
        people = rng.sample(NAMES, rng.randint(3, 6))
        rows = [(i + 1, name, rng.choice(CITIES)) for i, name in enumerate(people)]
        files[path] = "id,name,city\n" + "".join(f"{i},{n},{c}\n" for i, n, c in rows)
        _, name, city = rng.choice(rows)
        return (
            f"In {path}, what is the city of {name}? Submit the city.",
            [Check(kind="answer", answer=city)],
            [bash(f"awk -F, '$2==\"{name}\" {{print $3}}' {path}"), submit(city)],
        )
    # a JSON field, written into a file
    path = fresh_path(rng, files, "config", "json", shape)
    key = rng.choice(("version", "name", "owner"))
    values = {
        "version": f"{rng.randint(0, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 20)}",
        "name": f"{rng.choice(WORDS)}-{rng.choice(WORDS)}",
        "owner": rng.choice(NAMES),
        "port": rng.randint(1024, 9999),
    }
    files[path] = json.dumps(values, indent=2) + "\n"
    out = key.upper() + ".txt"
    value = str(values[key])
    return (
        f"Write the {key} field of {path} into {out}.",
        [Check(kind="command", command=f"test \"$(cat {out})\" = '{value}'")],
        [bash(f"python3 -c \"import json; print(json.load(open('{path}'))['{key}'])\" > {out}"), submit()],
    )


def fix_config_chore(rng: random.Random, files: Files, shape: Shape) -> Chore:
    path = fresh_path(rng, files, "config", "ini", shape)
    keys = rng.sample(CONFIG_KEYS, rng.randint(3, 5))
    values = {k: rng.randint(1, 64) for k in keys}
    key = rng.choice(keys)
    new = rng.choice([v for v in range(1, 100) if v != values[key]])
    files[path] = "".join(f"{k}={v}\n" for k, v in values.items())
    fixed = "".join(f"{k}={new if k == key else v}\n" for k, v in values.items())
    return (
        f"In {path}, set {key} to {new}.",
        [Check(kind="file", path=path, content=fixed)],
        [bash(f"sed -i 's/^{key}=.*/{key}={new}/' {path}"), submit()],
    )


GENERATORS: dict[str, Callable[[random.Random, Files, Shape], Chore]] = {
    "find": find_chore,
    "count_lines": count_lines_chore,
    "count_files": count_files_chore,
    "grep": grep_chore,
    "move": move_chore,
    "extract": extract_chore,
    "fix_config": fix_config_chore,
}
assert tuple(GENERATORS) == KINDS
