"""Config values are read as the composed config holds them, in trainer/ and stages/.

The composed config has every key of its base file (a missing key is an error at load) with each
value of its default's type, so a ``.get("key", default)`` on it repeats the default somewhere else
(and goes stale when the file changes), and an ``int(cfg...)`` / ``float(...)`` / ``bool(...)`` of a
config value converts what is already converted. This check reads the source (AST) and names each
such call site.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agentgym.config import config_dir, flatten, read_yaml

ROOT = Path(__file__).resolve().parents[1] / "agentgym"
CHECKED = ("trainer", "stages")
CASTS = ("int", "float", "bool")
# where the config is built (``resolve`` casts values it fills in), not read
EXEMPT = ("trainer/config.py",)
BASE_FILES = ("train.yaml", "sft.yaml", "generation.yaml", "evaluation.yaml")


def config_names() -> tuple[set[str], set[str]]:
    """The leaf key names and the section names of the base config files."""
    leaves: set[str] = set()
    sections: set[str] = set()
    for name in BASE_FILES:
        for dotted in flatten(read_yaml(config_dir() / name)):
            *parents, leaf = dotted.split(".")
            leaves.add(leaf)
            sections.update(parents)
    return leaves, sections


LEAVES, SECTIONS = config_names()


def chain(node: ast.expr) -> tuple[str | None, list[str]]:
    """``a.b["c"].d`` -> ("a", ["b", "c", "d"]); the root is None when the chain does not start at a name."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            parts.append(str(node.slice.value))
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id, parts[::-1]
        else:
            return None, parts[::-1]


def is_config_receiver(node: ast.expr) -> bool:
    root, parts = chain(node)
    names = [root or "", *parts]
    return any(n in ("cfg", "config") or n.endswith("_cfg") for n in names) and not any(
        n in ("metrics", "tensors") for n in parts
    )


def offences(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                defaulted = len(node.args) > 1 and key.value in LEAVES | SECTIONS
                if defaulted or is_config_receiver(func.value):
                    found.append(f"{where}: .get({key.value!r}, ...) on the config: read the attribute")
        elif isinstance(func, ast.Name) and func.id in CASTS and len(node.args) == 1 and not node.keywords:
            root, parts = chain(node.args[0])
            through_config = all(p in SECTIONS or p in ("cfg", "config") for p in parts[:-1])
            if root is not None and parts and root != "args" and through_config and parts[-1] in LEAVES:
                found.append(f"{where}: {func.id}() of the config value {'.'.join([root, *parts])}: it has its type")
    return found


def test_the_checker_finds_what_it_looks_for(tmp_path):
    sample = ROOT / "trainer" / "_sample_for_the_check.py"
    sample.write_text(
        "def f(cfg, actor_cfg, rollout, info):\n"
        "    a = cfg.actor_rollout_ref.actor.get('clip_ratio_c', 3.0)\n"
        "    b = int(cfg.data.train_batch_size)\n"
        "    c = float(actor_cfg.optim.lr)\n"
        "    d = bool(rollout.do_sample)\n"
        "    e = cfg.data.get('train_files')\n"
        "    f = info.get('version')\n"  # a plain dict of non-config facts: fine
        "    g = int(info['global_step'])\n"  # not a config key: fine
        "    return a, b, c, d, e, f, g\n"
    )
    try:
        got = offences(sample)
    finally:
        sample.unlink()
    assert [line.split(":")[1] for line in got] == ["2", "3", "4", "5", "6"], got


@pytest.mark.parametrize("part", CHECKED)
def test_no_config_defaults_or_casts_at_call_sites(part):
    paths = [p for p in sorted((ROOT / part).rglob("*.py")) if p.relative_to(ROOT).as_posix() not in EXEMPT]
    found = [o for path in paths for o in offences(path)]
    assert not found, "\n".join(found)
