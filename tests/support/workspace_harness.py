"""A test-only runner for ``WorkspaceTask``s without the workspace env: lay the files out in a plain temporary
directory, play tool calls there with ``subprocess`` (no sandbox: only for tasks the tests wrote or generated),
then run the checks the way the task describes them. It lets the suites' tests say "the expert solves it" and "the
checks fail before the fix" independently of the env's own sandbox and verifier."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.envs.workspace.task import Check, WorkspaceTask


@dataclass
class Played:
    root: Path
    outputs: list[str] = field(default_factory=list)  # each call's result text, in order
    answer: str | None = None
    submitted: bool = False


def lay_out(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def play(task: WorkspaceTask, root: Path, calls: Any = None) -> Played:
    """Lay out ``task.files`` under ``root`` and play ``calls`` (default: the expert's)."""
    lay_out(root, task.files)
    played = Played(root)
    for call in task.expert if calls is None else calls:
        name, args = call["name"], call["arguments"]
        if name == "bash":
            proc = subprocess.run(["bash", "-c", args["command"]], cwd=root, capture_output=True, text=True, timeout=30)
            played.outputs.append(proc.stdout + proc.stderr)
        elif name == "read_file":
            played.outputs.append((root / args["path"]).read_text())
        elif name == "write_file":
            path = root / args["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(args["content"])
            played.outputs.append("ok")
        elif name == "str_replace":
            path = root / args["path"]
            text = path.read_text()
            assert text.count(args["old_str"]) == 1, f"old_str must occur once in {args['path']}"
            path.write_text(text.replace(args["old_str"], args["new_str"]))
            played.outputs.append("ok")
        elif name == "submit":
            played.answer = args.get("answer")
            played.submitted = True
            played.outputs.append("submitted")
        else:
            raise ValueError(f"unknown tool {name!r}")
    return played


def check_results(task: WorkspaceTask, played: Played) -> list[bool]:
    """Run every check against the final directory (verifier files added first)."""
    lay_out(played.root, task.verifier_files)
    return [_run(check, played) for check in task.checks]


def _run(check: Check, played: Played) -> bool:
    if check.kind == "command":
        proc = subprocess.run(
            ["bash", "-c", check.command or ""], cwd=played.root, capture_output=True, timeout=check.timeout_s
        )
        return proc.returncode == 0
    if check.kind == "file":
        path = played.root / (check.path or "")
        if check.content is None:
            return not path.exists()
        return path.is_file() and path.read_text() == check.content
    if check.kind == "answer":
        return played.answer is not None and played.answer.strip() == (check.answer or "").strip()
    raise ValueError(f"unknown check kind {check.kind!r}")


def solves(task: WorkspaceTask, root: Path) -> bool:
    return all(check_results(task, play(task, root)))
