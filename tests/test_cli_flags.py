"""Every flag a command reads is one its own parser declares: a flag renamed in one place and not the other
fails here, not in a run.

For each command of ``agentgym.cli.COMMANDS`` the test parses a minimal command line (which gives every dest
the command's parser declares), then follows ``args`` statically from the module's ``run(args)`` into every
function it is handed to (``f(args, ...)``, across modules) and collects each ``args.<name>`` read there.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from agentgym import cli

ROOT = Path(cli.__file__).resolve().parent

# the least each command needs on its command line
MINIMAL = {
    "envs": [],
    "play": ["--env", "sokoban"],
    "demos": ["--env", "sokoban", "--n", "1", "-o", "demos.jsonl"],
    "serve": [],
    "rollout": ["--env", "sokoban"],
    "eval": ["--env", "sokoban"],
    "generate": [],
    "train": [],
    "config": ["--from", "verl", "ppo.yaml"],
    "gateway": [],
    "sft": [],
    "plot": ["run"],
    "compare": ["run_a", "run_b"],
    "view": ["trajectories.jsonl"],
    "env-serve": ["--env", "sokoban"],
}


@cache
def module_ast(module: str) -> ast.Module | None:
    path = ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
    return ast.parse(path.read_text(), str(path)) if path.is_file() else None


@cache
def names_of(module: str) -> dict[str, tuple[str, str | None]]:
    """name -> (module, function name or None for a module) for the module's own functions and everything it
    imports from agentgym, at module level or inside a function."""
    tree = module_ast(module)
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node in tree.body:
            out[node.name] = (module, node.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentgym"):
            for alias in node.names:
                name = alias.asname or alias.name
                if module_ast(f"{node.module}.{alias.name}") is not None:
                    out[name] = (f"{node.module}.{alias.name}", None)
                else:
                    out[name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("agentgym") and alias.asname:
                    out[alias.asname] = (alias.name, None)
    return out


def function(module: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    tree = module_ast(module)
    for node in tree.body if tree else ():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    target = names_of(module).get(name) if tree else None  # re-exported from another module
    if target and target[1] and target != (module, name):
        return function(*target)
    return None


def callee(module: str, call: ast.Call) -> tuple[str, ast.FunctionDef | ast.AsyncFunctionDef] | None:
    func = call.func
    if isinstance(func, ast.Name) and func.id in names_of(module):
        where, name = names_of(module)[func.id]
        found = function(where, name) if name else None
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in names_of(module):
        where, name = names_of(module)[func.value.id]
        found = function(where, func.attr) if name is None else None
    else:
        return None
    return (where, found) if found is not None else None


def args_use(module: str, run: str) -> tuple[dict[str, str], set[str], list[str]]:
    """Following ``args`` from ``module.run``: {attribute read: where}, the attributes assigned, and the
    ``getattr(args, "name", ...)`` probes."""
    reads: dict[str, str] = {}
    stores: set[str] = set()
    probes: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    todo = [(module, function(module, run), "args")]
    while todo:
        where, fn, param = todo.pop()
        if (where, fn.name, param) in seen:
            continue
        seen.add((where, fn.name, param))
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == param:
                if isinstance(node.ctx, ast.Store):
                    stores.add(node.attr)
                else:
                    reads.setdefault(node.attr, f"{where}.{fn.name}:{node.lineno}")
            elif isinstance(node, ast.Call):
                positional = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id == param]
                keywords = [k.arg for k in node.keywords if isinstance(k.value, ast.Name) and k.value.id == param]
                if not positional and not keywords:
                    continue
                if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr", "setattr"):
                    name = node.args[1] if len(node.args) > 1 else None
                    if node.func.id == "setattr" and isinstance(name, ast.Constant):
                        stores.add(name.value)
                    elif isinstance(name, ast.Constant):
                        probes.append(f"{node.func.id}(args, {name.value!r}) at {where}.{fn.name}:{node.lineno}")
                    continue
                found = callee(where, node)
                if found is None:
                    continue
                target_module, target = found
                params = [a.arg for a in target.args.posonlyargs + target.args.args]
                for i in positional:
                    if i < len(params):
                        todo.append((target_module, target, params[i]))
                for keyword in keywords:
                    todo.append((target_module, target, keyword))
    return reads, stores, probes


def test_every_command_is_checked():
    assert set(MINIMAL) == set(cli.COMMANDS)


def test_cli_declares_no_arguments():
    assert ".add_argument(" not in Path(cli.__file__).read_text()


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_flag_a_command_reads_is_declared_by_its_parser(name):
    module = cli.COMMANDS[name][0]
    args = cli.build_parser(name).parse_args([name, *MINIMAL[name]])
    assert args.func is importlib.import_module(module).run
    declared = set(vars(args))
    reads, stores, probes = args_use(module, "run")
    assert reads, f"{module}.run reads no args: the walk lost it"
    undeclared = {attr: where for attr, where in reads.items() if attr not in declared | stores}
    assert not undeclared, f"agentgym {name} reads flags its parser does not declare: {undeclared}"
    assert not probes, f"agentgym {name}: read args.<name> directly, not {probes}"


def test_the_walk_follows_args_into_other_modules():
    # eval's flags are read in agentgym.rollout.commands (the episodes) and agentgym.stages.from_run (--run)
    reads, stores, _ = args_use("agentgym.stages.eval_command", "run")
    assert {"temperature", "env_workers", "sampling_seed"} <= set(reads)
    assert reads["env_workers"].startswith("agentgym.rollout.commands")
    assert {"env_kwargs", "max_model_len", "chat_template_kwargs"} <= stores


@pytest.mark.parametrize("mode", ["rollout", "eval"])
def test_the_settings_a_run_supplies_are_flags_of_the_command(mode):
    """``--run`` fills ``args.<dest>`` for every key of ``from_run.run_settings`` (by name, at run time)."""
    tree = function("agentgym.stages.from_run", "run_settings")
    keys = {
        k.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        for k in node.keys
        if isinstance(k, ast.Constant)
    }
    keys |= {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "out"
    }
    assert {"model", "temperature", "seed"} <= keys
    args = cli.build_parser(mode).parse_args([mode, *MINIMAL[mode]])
    assert keys <= set(vars(args)), keys - set(vars(args))


def test_a_renamed_flag_is_caught(tmp_path, monkeypatch):
    """The check itself: a read of a flag that was renamed in the parser is reported."""
    package = tmp_path / "agentgym_renamed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cmd.py").write_text(
        "import argparse\n\n"
        "def add_arguments(parser):\n    parser.add_argument('--max-new-tokens', type=int, default=8)\n\n"
        "def run(args: argparse.Namespace) -> int:\n    return helper(args)\n\n"
        "def helper(ns):\n    return ns.max_tokens\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", package)
    module_ast.cache_clear()
    names_of.cache_clear()
    try:
        reads, _, _ = args_use("agentgym_renamed.cmd", "run")
    finally:
        module_ast.cache_clear()
        names_of.cache_clear()
    assert set(reads) == {"max_tokens"}


def test_listing_envs_never_imports_torch():
    code = "import sys; from agentgym.cli import main; main(['envs']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
