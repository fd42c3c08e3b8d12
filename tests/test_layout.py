"""The layout holds: one part per folder, arrows between parts that point one way, no cycles,
tests that mirror the parts; a file that has grown past about 1000 lines is named in a warning (files are
split by idea, not by a line count).

Every import counts, at module level or inside a function (a lazy import hides a cycle from
Python, not from a reader). docs/ARCHITECTURE.md explains the parts and their arrows.
"""

from __future__ import annotations

import ast
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "agentgym"
TESTS = Path(__file__).resolve().parent

# What each part may import (besides itself). Keep in step with docs/ARCHITECTURE.md.
ALLOWED = {
    "types": set(),
    "config": set(),
    "registry": {"types"},
    "model": set(),
    "envs": {"types", "registry"},
    "interactions": {"types", "registry", "envs"},
    "client": {"types", "model"},
    "server": {"types", "registry", "model", "client", "envs"},
    "rollout": {"types", "registry", "config", "model", "envs", "client"},
    "gateway": {"types", "registry", "config", "model", "envs", "client", "rollout", "server"},
    "compat": {"config"},
    "rewards": {"types", "registry", "config", "model", "envs", "rollout"},  # rollout: TrajectorySource
    "trainer": {
        "types",
        "registry",
        "config",
        "model",
        "envs",
        "interactions",
        "client",
        "server",
        "rollout",
        "gateway",
        "compat",
        "rewards",
    },
    "stages": {
        "types",
        "registry",
        "config",
        "model",
        "envs",
        "interactions",
        "client",
        "server",
        "rollout",
        "gateway",
        "compat",
        "rewards",
        "trainer",
    },
    "cli": {
        "types",
        "registry",
        "config",
        "model",
        "envs",
        "interactions",
        "client",
        "server",
        "rollout",
        "gateway",
        "compat",
        "rewards",
        "trainer",
        "stages",
    },
}
ALLOWED["config_schema"] = set()  # agentgym/config_schema/ (the typed configuration): wherever config goes
for _allowed in ALLOWED.values():
    if "config" in _allowed:
        _allowed.add("config_schema")
ALLOWED["config"].add("config_schema")
ALLOWED["progress"] = set()  # agentgym/progress.py (bars for terminals and logs): every part may import it
for _name in ALLOWED:
    if _name != "progress":
        ALLOWED[_name].add("progress")
ALLOWED["plots"] = {"progress"}  # agentgym/plots.py (curves.png, compare.png): drawn by the trainer, stages and cli
# agentgym/tracking.py (the progress line, metrics backends, samples) and agentgym/preflight.py (what a run
# checks before it starts): used by the trainer and the stages around it alike
ALLOWED["tracking"] = {"types", "rollout", "progress"}
ALLOWED["preflight"] = {"config", "registry", "model", "envs", "interactions", "server", "rollout", "progress"}
for _name in ("trainer", "stages", "cli"):
    ALLOWED[_name] |= {"plots", "tracking", "preflight"}
WARN_LINES = 1000


class LongFileWarning(UserWarning):
    """A file over ``WARN_LINES`` lines: worth a look whether it still holds one idea."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level
                    else (node.module or "")
                )
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def part(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_between_modules_or_parts():
    graph = import_graph()
    assert cycles(graph) == [], "modules that import each other"
    parts: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            if part(a) and part(b) and part(a) != part(b):
                parts[part(a)].add(part(b))
    assert cycles(parts) == [], "parts that import each other"


def test_arrows_between_parts_point_the_documented_way():
    wrong = sorted(
        f"{a} -> {b} (part {part(a)} may import only {sorted(ALLOWED.get(part(a), set()))})"
        for a, targets in import_graph().items()
        for b in targets
        if part(a) and part(b) and part(a) != part(b) and part(b) not in ALLOWED.get(part(a), set())
    )
    assert wrong == []


def test_no_sub_package_imports_the_package_root():
    importers = sorted(a for a, targets in import_graph().items() if "agentgym" in targets and a != "agentgym")
    assert importers == []


def warn_about_long_files(package: Path, limit: int = WARN_LINES) -> dict[str, int]:
    """Warn about every ``.py`` file under ``package`` longer than ``limit`` lines; returns them."""
    long = {
        str(p.relative_to(package.parent)): n
        for p in sorted(package.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > limit
    }
    for name, n in long.items():
        warnings.warn(f"{name} has {n} lines (over {limit}): does it still hold one idea?", LongFileWarning, 2)
    return long


def test_a_file_over_the_limit_is_named_in_a_warning(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "long.py").write_text("x = 1\n" * 1001)
    (package / "short.py").write_text("x = 1\n" * 1000)
    with pytest.warns(LongFileWarning, match=r"pkg/sub/long\.py has 1001 lines") as caught:
        assert warn_about_long_files(package) == {"pkg/sub/long.py": 1001}
    assert len(caught) == 1


def test_no_file_has_outgrown_one_idea():
    warn_about_long_files(ROOT)  # size alone never fails the suite: split files along their ideas


def test_the_tests_mirror_the_package():
    """Each folder under tests/ is a part of agentgym (or support/, the helpers and stand-ins), and
    every folder of test modules is a package, so ``tests.<part>.test_x`` names each module uniquely."""
    parts = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - parts - {"support"} == set(), "tests/ folders that name no part of agentgym"
    not_packages = sorted(
        str(d.relative_to(TESTS.parent))
        for d in {p.parent for p in TESTS.rglob("test_*.py")} | {TESTS / "support"}
        if not (d / "__init__.py").is_file()
    )
    assert not_packages == [], "folders of tests without __init__.py"
