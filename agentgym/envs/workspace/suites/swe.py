"""``swe``: small generated Python packages with one injected bug, SWE-smith style.

Every seed gives a package ``<name>/`` of one or two modules, each a few functions drawn from ``FUNCTIONS``,
with ``unittest`` tests in ``tests/`` (``python3 -m unittest`` runs them: no pytest needed in the sandbox).
One function carries a bug drawn from its mutations: a swapped operator, an off-by-one, a wrong constant or a
missing case. The instruction is a short issue (the module's file, a call and what it should return) and says how
to run the tests. The verifier runs the visible tests, hidden tests (``verifier_files``: more cases for every
function, never shown to the agent) and checks that every visible test file is unchanged.

The expert: ``read_file`` the module, ``str_replace`` the buggy line back, ``submit``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from agentgym.envs.workspace.expert_calls import read_file, str_replace, submit
from agentgym.envs.workspace.task import Check, WorkspaceTask

BUG_KINDS = ("operator", "off_by_one", "constant", "missing_case")
PACKAGES = ("ledger", "gadget", "toolkit", "orbit", "quill", "harbor_utils", "meadow", "pylon", "tally", "vector")
MODULES = ("core", "helpers", "numbers", "text", "calc", "stats")
HIDDEN_TESTS = ".verifier/test_hidden.py"
VISIBLE_TEST_COMMAND = "python3 -m unittest"


@dataclass(frozen=True)
class Function:
    """A function's correct source, its visible and hidden test cases and its bugs.

    ``visible``/``hidden``: ``(call, expected)`` pairs of Python expressions (``call`` uses the function's name);
    ``bugs``: ``(kind, old, new, call)``: replacing ``old`` (whole lines of ``source``) by ``new`` injects the bug,
    and ``call`` (one of the visible cases) shows it: the issue names it."""

    name: str
    source: str
    visible: tuple[tuple[str, str], ...]
    hidden: tuple[tuple[str, str], ...]
    bugs: tuple[tuple[str, str, str, str], ...]


FUNCTIONS = (
    Function(
        "clamp",
        "def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n",
        (("clamp(5, 0, 3)", "3"), ("clamp(-2, 0, 3)", "0"), ("clamp(2, 0, 3)", "2")),
        (("clamp(10, 1, 9)", "9"), ("clamp(0, 1, 9)", "1"), ("clamp(4, 1, 9)", "4"), ("clamp(9, 1, 9)", "9")),
        (
            ("operator", "    if x > hi:\n", "    if x < hi:\n", "clamp(5, 0, 3)"),
            ("missing_case", "    if x < lo:\n        return lo\n", "", "clamp(-2, 0, 3)"),
        ),
    ),
    Function(
        "count_vowels",
        'def count_vowels(text):\n    return sum(1 for c in text.lower() if c in "aeiou")\n',
        (("count_vowels('banana')", "3"), ("count_vowels('Echo')", "2"), ("count_vowels('you')", "2")),
        (("count_vowels('AEIOU')", "5"), ("count_vowels('queue')", "4"), ("count_vowels('')", "0")),
        (
            (
                "missing_case",
                '    return sum(1 for c in text.lower() if c in "aeiou")\n',
                '    return sum(1 for c in text if c in "aeiou")\n',
                "count_vowels('Echo')",
            ),
            (
                "constant",
                '    return sum(1 for c in text.lower() if c in "aeiou")\n',
                '    return sum(1 for c in text.lower() if c in "aeio")\n',
                "count_vowels('you')",
            ),
        ),
    ),
    Function(
        "sum_to",
        "def sum_to(n):\n    total = 0\n    for i in range(1, n + 1):\n        total += i\n    return total\n",
        (("sum_to(3)", "6"), ("sum_to(1)", "1"), ("sum_to(0)", "0")),
        (("sum_to(10)", "55"), ("sum_to(4)", "10"), ("sum_to(2)", "3")),
        (("off_by_one", "    for i in range(1, n + 1):\n", "    for i in range(1, n):\n", "sum_to(3)"),),
    ),
    Function(
        "is_leap",
        "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        (("is_leap(2024)", "True"), ("is_leap(1800)", "False"), ("is_leap(2000)", "True")),
        (("is_leap(2023)", "False"), ("is_leap(2100)", "False"), ("is_leap(1600)", "True"), ("is_leap(2200)", "False")),
        (
            (
                "missing_case",
                "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
                "    return year % 4 == 0 and year % 100 != 0\n",
                "is_leap(2000)",
            ),
            (
                "constant",
                "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
                "    return year % 4 == 0 and (year % 100 != 0 or year % 200 == 0)\n",
                "is_leap(1800)",
            ),
        ),
    ),
    Function(
        "average",
        "def average(values):\n    if not values:\n        return 0.0\n    return sum(values) / len(values)\n",
        (("average([1, 2, 3])", "2.0"), ("average([])", "0.0"), ("average([4])", "4.0")),
        (("average([2, 4, 6, 8])", "5.0"), ("average([-1, 1])", "0.0"), ("average([])", "0.0")),
        (
            ("missing_case", "    if not values:\n        return 0.0\n", "", "average([])"),
            (
                "off_by_one",
                "    return sum(values) / len(values)\n",
                "    return sum(values) / (len(values) + 1)\n",
                "average([1, 2, 3])",
            ),
        ),
    ),
    Function(
        "max_index",
        "def max_index(values):\n    best = 0\n    for i in range(1, len(values)):\n"
        "        if values[i] > values[best]:\n            best = i\n    return best\n",
        (("max_index([3, 9, 2])", "1"), ("max_index([7])", "0"), ("max_index([1, 2, 5])", "2")),
        (("max_index([5, 1, 0])", "0"), ("max_index([0, 0, 4, 1])", "2"), ("max_index([-3, -2, -1])", "2")),
        (
            (
                "operator",
                "        if values[i] > values[best]:\n",
                "        if values[i] < values[best]:\n",
                "max_index([3, 9, 2])",
            ),
            (
                "off_by_one",
                "    for i in range(1, len(values)):\n",
                "    for i in range(1, len(values) - 1):\n",
                "max_index([1, 2, 5])",
            ),
        ),
    ),  # fmt: skip
    Function(
        "to_fahrenheit",
        "def to_fahrenheit(celsius):\n    return celsius * 9 / 5 + 32\n",
        (("to_fahrenheit(100)", "212.0"), ("to_fahrenheit(0)", "32.0")),
        (("to_fahrenheit(-40)", "-40.0"), ("to_fahrenheit(25)", "77.0"), ("to_fahrenheit(10)", "50.0")),
        (
            ("constant", "    return celsius * 9 / 5 + 32\n", "    return celsius * 9 / 5 + 23\n", "to_fahrenheit(0)"),
            (
                "operator",
                "    return celsius * 9 / 5 + 32\n",
                "    return celsius * 5 / 9 + 32\n",
                "to_fahrenheit(100)",
            ),
        ),
    ),  # fmt: skip
    Function(
        "word_count",
        "def word_count(text):\n    return len(text.split())\n",
        (("word_count('a b c')", "3"), ("word_count('one  two')", "2"), ("word_count('')", "0")),
        (("word_count('  padded words  ')", "2"), ("word_count('x')", "1"), ("word_count('a\\tb')", "2")),
        (
            (
                "missing_case",
                "    return len(text.split())\n",
                "    return len(text.split(' '))\n",
                "word_count('one  two')",
            ),
        ),
    ),  # fmt: skip
    Function(
        "last_items",
        "def last_items(items, n):\n    if n <= 0:\n        return []\n    return items[-n:]\n",
        (("last_items([1, 2, 3], 2)", "[2, 3]"), ("last_items([1, 2], 0)", "[]"), ("last_items([4], 1)", "[4]")),
        (("last_items([1, 2, 3, 4], 3)", "[2, 3, 4]"), ("last_items([5, 6], -1)", "[]"), ("last_items([], 2)", "[]")),
        (
            ("missing_case", "    if n <= 0:\n        return []\n", "", "last_items([1, 2], 0)"),
            ("off_by_one", "    return items[-n:]\n", "    return items[-n + 1:]\n", "last_items([1, 2, 3], 2)"),
        ),
    ),  # fmt: skip
    Function(
        "is_palindrome",
        "def is_palindrome(text):\n    cleaned = text.replace(' ', '').lower()\n    return cleaned == cleaned[::-1]\n",
        (("is_palindrome('Level')", "True"), ("is_palindrome('abc')", "False"), ("is_palindrome('a b a')", "True")),
        (
            ("is_palindrome('Never odd or even')", "True"),
            ("is_palindrome('ab')", "False"),
            ("is_palindrome('')", "True"),
        ),
        (
            (
                "missing_case",
                "    cleaned = text.replace(' ', '').lower()\n",
                "    cleaned = text.replace(' ', '')\n",
                "is_palindrome('Level')",
            ),
            (
                "operator",
                "    return cleaned == cleaned[::-1]\n",
                "    return cleaned != cleaned[::-1]\n",
                "is_palindrome('abc')",
            ),
        ),
    ),  # fmt: skip
)


def _test_file(package: str, module: str, functions: Sequence[Function], hidden: bool) -> str:
    names = ", ".join(f.name for f in functions)
    head = (
        "import os\nimport sys\nimport unittest\n\nsys.path.insert(0, os.getcwd())\n\n"
        if hidden
        else ("import unittest\n\n")
    )
    lines = [f"{head}from {package}.{module} import {names}\n\n\nclass Test{module.title()}(unittest.TestCase):\n"]
    for f in functions:
        cases = f.hidden if hidden else f.visible
        lines.append(f"    def test_{f.name}(self):\n")
        lines.extend(f"        self.assertEqual({call}, {expected})\n" for call, expected in cases)
        lines.append("\n")
    text = "".join(lines).rstrip("\n") + "\n"
    return text + ('\n\nif __name__ == "__main__":\n    unittest.main()\n' if hidden else "")


class SweSuite:
    """Seed -> a bug-fix task (``WorkspaceTask``). ``bug_kinds``: the mutations drawn from (default all of
    ``BUG_KINDS``); ``modules``: how many modules the package has (1 or 2); ``functions_per_module``: 1..4."""

    def __init__(
        self,
        bug_kinds: Sequence[str] | str | None = None,
        modules: int = 2,
        functions_per_module: int = 3,
        max_turns: int = 8,
    ) -> None:
        if isinstance(bug_kinds, str):
            bug_kinds = [bug_kinds]
        self.bug_kinds = tuple(bug_kinds) if bug_kinds else BUG_KINDS
        unknown = [k for k in self.bug_kinds if k not in BUG_KINDS]
        if unknown:
            raise ValueError(f"unknown swe bug kind(s) {unknown}; the kinds are {', '.join(BUG_KINDS)}")
        if not 1 <= modules <= 2 or not 1 <= functions_per_module <= 4:
            raise ValueError("modules must be 1 or 2 and functions_per_module 1..4")
        self.modules = modules
        self.functions_per_module = functions_per_module
        self.max_turns = max_turns

    def __call__(self, seed: int) -> WorkspaceTask:
        rng = random.Random(int(seed))
        kind = self.bug_kinds[rng.randrange(len(self.bug_kinds))]
        buggy = rng.choice([f for f in FUNCTIONS if any(b[0] == kind for b in f.bugs)])
        return self.build(seed, rng, buggy, rng.choice([b for b in buggy.bugs if b[0] == kind]))

    def build(self, seed: int, rng: random.Random, buggy: Function, bug: tuple[str, str, str, str]) -> WorkspaceTask:
        """The task with ``bug`` (one of ``buggy.bugs``) injected; ``rng`` draws the rest of the package."""
        kind, old, new, shown = bug
        package = rng.choice(PACKAGES)
        module_names = rng.sample(MODULES, self.modules)
        others = rng.sample([f for f in FUNCTIONS if f is not buggy], self.modules * self.functions_per_module - 1)
        per = self.functions_per_module
        layout = [others[: per - 1]] + [
            others[per - 1 + j * per : per - 1 + (j + 1) * per] for j in range(self.modules - 1)
        ]
        layout[0].insert(rng.randint(0, len(layout[0])), buggy)
        rng.shuffle(layout)

        files: dict[str, str] = {f"{package}/__init__.py": "", "tests/__init__.py": ""}
        hidden_parts: list[str] = []
        module_path = ""
        for module, functions in zip(module_names, layout):
            path = f"{package}/{module}.py"
            source = "\n\n".join(f.source for f in functions)
            if buggy in functions:
                assert source.count(old) == 1, (buggy.name, old)
                at = source.index(old)
                source, module_path = source[:at] + new + source[at + len(old) :], path
                fix_old, fix_new = _fix_edit(source, at, new, old)
            files[path] = source
            files[f"tests/test_{module}.py"] = _test_file(package, module, functions, hidden=False)
            hidden_parts.append(_test_file(package, module, functions, hidden=True))
        expected = dict(buggy.visible + buggy.hidden)[shown]
        # the issue names the module's file, as a traceback would: the expert reads it first, and an agent can
        # only do that when it knows which file it is (with two modules or more it still has to find the line)
        instruction = (
            f"Bug in {module_path}: {shown} should return {expected}. "
            f"Fix it (tests: {VISIBLE_TEST_COMMAND}; do not edit tests/), then submit."
        )
        test_files = {p: t for p, t in files.items() if p.startswith("tests/")}
        checks = [
            Check(kind="command", command=VISIBLE_TEST_COMMAND, timeout_s=60.0),
            *(
                Check(kind="command", command=f"python3 {HIDDEN_TESTS.replace('.py', f'_{i}.py')}", timeout_s=60.0)
                for i in range(len(hidden_parts))
            ),
            *(Check(kind="file", path=p, content=t) for p, t in sorted(test_files.items())),
        ]
        verifier_files = {HIDDEN_TESTS.replace(".py", f"_{i}.py"): text for i, text in enumerate(hidden_parts)}
        return WorkspaceTask(
            task_id=f"swe/{kind}/{seed}",
            instruction=instruction,
            files=files,
            checks=tuple(checks),
            verifier_files=verifier_files,
            expert=(read_file(module_path), str_replace(module_path, fix_old, fix_new), submit()),
            max_turns=self.max_turns,
            metadata={"suite": "swe", "kind": kind, "seed": int(seed), "function": buggy.name, "path": module_path},
        )


def _fix_edit(source: str, at: int, new: str, old: str) -> tuple[str, str]:
    """The ``str_replace`` (old snippet, new snippet) that undoes a bug: ``source`` holds ``new`` at offset ``at``
    where the correct code had ``old``. The snippet is the bug's lines (a deleted case, which has none: the line
    before it), widened a line at a time until it occurs once in ``source``: the shortest edit, the fewest tokens
    for an agent to write."""
    lo = at if new else source.rfind("\n", 0, at - 1) + 1
    hi = at + len(new)
    while source.count(source[lo:hi]) != 1:
        lo = source.rfind("\n", 0, max(lo - 1, 0)) + 1
        nxt = source.find("\n", hi)
        hi = len(source) if nxt < 0 else nxt + 1
    return source[lo:hi], source[lo:at] + old + source[at + len(new) : hi]
