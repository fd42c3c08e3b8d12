"""Config values are read as the composed config holds them, in trainer/ and stages/.

The composed config is a structured config of its schema (``agentgym.config_schema``): every key,
each value of its field's type, so a ``.get("key", default)`` on it repeats the default somewhere else
(and goes stale when the file changes), and an ``int(cfg...)`` / ``float(...)`` / ``bool(...)`` of a
config value converts what is already converted. This check reads the source (AST) and names each
such call site.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agentgym.config_schema import SCHEMAS, leaves

ROOT = Path(__file__).resolve().parents[1] / "agentgym"
CHECKED = ("trainer", "stages")
CASTS = ("int", "float", "bool")
# where the config is built (``resolve`` casts values it fills in), not read
EXEMPT = ("trainer/config.py",)


def config_names() -> tuple[set[str], set[str]]:
    """The leaf key names and the section names of every base config's schema (train, sft, generation,
    evaluation)."""
    names: set[str] = set()
    sections: set[str] = set()
    for schema, _ in SCHEMAS.values():
        for dotted in leaves(schema):
            *parents, leaf = dotted.split(".")
            names.add(leaf)
            sections.update(parents)
    return names, sections


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
    """``cfg.data``, ``self.config``, ``actor_cfg``, or a section by its name (``rollout``, ``rollout.val_kwargs``)."""
    root, parts = chain(node)
    names = [root or "", *parts]
    if any(n in ("metrics", "tensors") for n in parts):
        return False
    return any(n in ("cfg", "config") or n.endswith("_cfg") for n in names) or all(n in SECTIONS for n in names)


def offences(source: str, name: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if not isinstance(node, ast.Call):
            continue
        where = f"{name}:{node.lineno}"
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                known = key.value in LEAVES | SECTIONS
                if (known and len(node.args) > 1) or (known and is_config_receiver(func.value)):
                    found.append(f"{where}: .get({key.value!r}, ...) on the config: read the attribute")
        elif isinstance(func, ast.Name) and func.id in CASTS and len(node.args) == 1 and not node.keywords:
            values = config_values(node.args[0])
            if values:
                found.append(f"{where}: {func.id}() of the config value {values[0]}: it has its type")
    return found


def config_value(node: ast.expr) -> str | None:
    """``cfg.data.max_prompt_length`` (a chain through config sections to a config key) as text, else None."""
    root, parts = chain(node)
    through_config = all(p in SECTIONS or p in ("cfg", "config") for p in parts[:-1])
    if root is None or not parts or root == "args" or not through_config or parts[-1] not in LEAVES:
        return None
    return ".".join([root, *parts])


def config_values(node: ast.expr) -> list[str]:
    """The config values ``node`` is made of (``a.x``, ``a.x + a.y``, ``a.x or 0``), or [] when anything
    else takes part in it (``int(ratio * total_steps)`` converts a result, not a config value)."""
    if isinstance(node, ast.BinOp):
        left, right = config_values(node.left), config_values(node.right)
        return [*left, *right] if (left or _constant(node.left)) and (right or _constant(node.right)) else []
    if isinstance(node, ast.BoolOp):
        parts = [config_values(v) for v in node.values]
        ok = all(p or _constant(v) for p, v in zip(parts, node.values))
        return [name for p in parts for name in p] if ok else []
    value = config_value(node)
    return [value] if value else []


def _constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant)


def test_the_checker_finds_what_it_looks_for():
    sample = (
        "def f(cfg, actor_cfg, rollout, info, total_steps):\n"
        "    a = cfg.actor_rollout_ref.actor.get('clip_ratio_c', 3.0)\n"
        "    b = int(cfg.data.train_batch_size)\n"
        "    c = float(actor_cfg.optim.lr)\n"
        "    d = bool(rollout.do_sample)\n"
        "    e = cfg.data.get('train_files')\n"
        "    f = info.get('version')\n"  # a plain dict of non-config facts: fine
        "    g = int(info['global_step'])\n"  # not a config key: fine
        "    h = int(cfg.data.max_prompt_length + cfg.data.max_response_length)\n"
        "    i = int(cfg.model.lora_rank or 0)\n"
        "    j = int(actor_cfg.optim.lr_warmup_steps_ratio * total_steps)\n"  # a result of the run: fine
        "    k = rollout.get('server_admin_key')\n"
        "    m = info.get('path')\n"  # a plain dict's key that happens to be a config key's name: fine
        "    return a, b, c, d, e, f, g, h, i, j, k, m\n"
    )
    got = offences(sample, "sample.py")
    assert [line.split(":")[1] for line in got] == ["2", "3", "4", "5", "6", "9", "10", "12"], got


def checked_paths(part: str) -> list[Path]:
    return [p for p in sorted((ROOT / part).rglob("*.py")) if p.relative_to(ROOT).as_posix() not in EXEMPT]


def test_every_config_reader_is_checked():
    names = {p.relative_to(ROOT).as_posix() for part in CHECKED for p in checked_paths(part)}
    readers = {"stages/offline/generate.py", "stages/offline/scoring.py", "stages/sft.py", "trainer/workers.py"}
    assert readers <= names, readers - names


@pytest.mark.parametrize("part", CHECKED)
def test_no_config_defaults_or_casts_at_call_sites(part):
    paths = checked_paths(part)
    found = [o for path in paths for o in offences(path.read_text(), path.relative_to(ROOT.parent).as_posix())]
    assert not found, "\n".join(found)
