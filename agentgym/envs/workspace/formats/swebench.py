"""SWE-bench-style instances as ``WorkspaceTask``s, read from a local JSON / JSONL file (nothing downloads).

An instance has SWE-bench's fields: ``instance_id``, ``problem_statement``, ``test_patch`` (the tests the fix must
pass, hidden from the agent), ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (test ids; lists or, as in the Hugging Face
dataset, JSON-encoded lists), ``patch`` (the gold fix: the expert), ``repo``, ``base_commit``. SWE-bench checks the
repository out at ``base_commit`` in a Docker image; agentgym reads a local snapshot instead, named by one of:

* ``repo_dir``: a directory holding the repository at ``base_commit`` (relative to the instances file);
* ``files``: ``{path: text}``.

The task: the snapshot's files; the problem statement as the instruction; ``test_patch`` applied to the snapshot
gives the verifier files (the test files it touches, written over the agent's copies when the checks run, as the
SWE-bench harness resets them); two ``command`` checks run ``FAIL_TO_PASS`` and ``PASS_TO_PASS``; the gold
``patch`` becomes the expert (``write_file`` for each file it changes, then ``submit``).

Tests run with ``test_cmd`` (an agentgym field; the ids follow it). Without one: ``python3 -m pytest -q`` when the ids
look like pytest's (``path::name``), else ``python3 -m unittest`` (Django's ``name (module.Class)`` ids are turned
into ``module.Class.name``). SWE-bench's per-repository install and test specs are not reproduced: an instance whose
tests need packages the sandbox's ``python3`` lacks fails its checks, and binary files in a snapshot are refused
(``UnsupportedTask``). Patches are applied with ``git apply`` when the instances are read.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from agentgym.envs.workspace.expert_calls import bash, submit, write_file
from agentgym.envs.workspace.formats import UnsupportedTask
from agentgym.envs.workspace.task import Check, WorkspaceTask

REQUIRED = ("instance_id", "problem_statement", "test_patch", "FAIL_TO_PASS")
SKIPPED_PARTS = (".git", "__pycache__", ".pytest_cache")
_DJANGO_ID = re.compile(r"^(\w+) \(([\w.]+)\)$")


def load_instances(path: str | Path) -> list[dict[str, Any]]:
    """The instances of a ``.json`` (one object or a list) or ``.jsonl`` file."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        data = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected SWE-bench instances (JSON objects), one per line or as a list")
    return rows


def swebench_task(instance: dict[str, Any], base_dir: str | Path = ".", max_turns: int = 30) -> WorkspaceTask:
    """One instance -> a ``WorkspaceTask``; ``base_dir``: where a relative ``repo_dir`` is found."""
    missing = [k for k in REQUIRED if not instance.get(k)]
    if missing:
        raise ValueError(f"instance {instance.get('instance_id', '?')}: missing {', '.join(missing)}")
    iid = str(instance["instance_id"])
    files = _snapshot(instance, Path(base_dir), iid)
    tests = _apply(files, instance["test_patch"], f"{iid}: test_patch")
    if any(text is None for text in tests.values()):
        raise UnsupportedTask(f"{iid}: test_patch deletes files; only added or changed test files are supported")
    fail_to_pass, pass_to_pass = _ids(instance["FAIL_TO_PASS"]), _ids(instance.get("PASS_TO_PASS") or [])
    command = instance.get("test_cmd") or _default_command(fail_to_pass + pass_to_pass)
    checks = [Check(kind="command", command=_run(command, fail_to_pass), timeout_s=300.0)]
    if pass_to_pass:
        checks.append(Check(kind="command", command=_run(command, pass_to_pass), timeout_s=300.0))
    expert: tuple[dict[str, Any], ...] = ()
    if instance.get("patch"):
        fix = _apply(files, instance["patch"], f"{iid}: patch")
        expert = (
            *(write_file(p, t) if t is not None else bash(f"rm -f {shlex.quote(p)}") for p, t in fix.items()),
            submit(),
        )
    repo = instance.get("repo") or "the repository"
    instruction = (
        f"{str(instance['problem_statement']).strip()}\n\n"
        f"Fix this issue in {repo} (checked out in /workspace) without changing its tests, then submit."
    )
    return WorkspaceTask(
        task_id=f"swebench/{iid}",
        instruction=instruction,
        files=files,
        checks=tuple(checks),
        verifier_files={p: t for p, t in tests.items() if t is not None},
        expert=expert,
        max_turns=max_turns,
        metadata={
            "suite": "swebench",
            "instance_id": iid,
            "repo": instance.get("repo"),
            "base_commit": instance.get("base_commit"),
            "FAIL_TO_PASS": fail_to_pass,
            "PASS_TO_PASS": pass_to_pass,
        },
    )


def _snapshot(instance: dict[str, Any], base_dir: Path, iid: str) -> dict[str, str]:
    if isinstance(instance.get("files"), dict):
        return {str(k): str(v) for k, v in instance["files"].items()}
    if not instance.get("repo_dir"):
        raise UnsupportedTask(
            f"{iid}: no repository snapshot (repo_dir or files): agentgym reads the repository at base_commit "
            "from local files, it does not clone"
        )
    root = base_dir / instance["repo_dir"]
    if not root.is_dir():
        raise FileNotFoundError(f"{iid}: repo_dir {root} is not a directory")
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(part in SKIPPED_PARTS for part in rel.parts):
            continue
        try:
            files[rel.as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UnsupportedTask(f"{iid}: {rel} is not UTF-8 text (workspace files are text)") from None
    return files


def _apply(files: dict[str, str], patch: str, what: str) -> dict[str, str | None]:
    """The files ``patch`` changes, after it is applied to ``files``: path -> new text (None: deleted)."""
    git = shutil.which("git")
    if git is None:
        raise UnsupportedTask(f"{what}: applying a patch needs git, which is not on PATH")
    with tempfile.TemporaryDirectory(prefix="agentgym-swebench-") as tmp:
        root = Path(tmp)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        proc = subprocess.run(
            [git, "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise UnsupportedTask(f"{what} does not apply to the snapshot: {proc.stderr.strip()[:500]}")
        after = {
            p.relative_to(root).as_posix(): p.read_text()
            for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part in SKIPPED_PARTS for part in p.relative_to(root).parts)
        }
    changed: dict[str, str | None] = {p: t for p, t in after.items() if files.get(p) != t}
    changed.update({p: None for p in files if p not in after})
    return changed


def _ids(value: Any) -> list[str]:
    ids = json.loads(value) if isinstance(value, str) else value
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"test ids must be a list of strings (or its JSON), got {value!r}")
    return [f"{m.group(2)}.{m.group(1)}" if (m := _DJANGO_ID.match(i)) else i for i in ids]


def _default_command(ids: list[str]) -> str:
    return "python3 -m pytest -q -p no:cacheprovider" if any("::" in i for i in ids) else "python3 -m unittest"


def _run(command: str, ids: list[str]) -> str:
    return f"{command} {' '.join(shlex.quote(i) for i in ids)}"


class SweBenchTasks:
    """A task source over a file of SWE-bench-style instances; seed ``s`` is instance ``s % len``. Every instance is
    read when the source is made: one that cannot run raises (``UnsupportedTask`` naming each one and why) unless
    ``skip_unsupported``, which warns and leaves it out."""

    def __init__(self, path: str | Path, skip_unsupported: bool = False, max_turns: int = 30) -> None:
        path = Path(path)
        self.tasks: list[WorkspaceTask] = []
        self.refused: dict[str, str] = {}
        rows = load_instances(path)
        for row in rows:
            try:
                self.tasks.append(swebench_task(row, path.parent, max_turns))
            except UnsupportedTask as exc:
                self.refused[str(row.get("instance_id", "?"))] = str(exc)
        if self.refused and (not skip_unsupported or not self.tasks):
            raise UnsupportedTask(
                f"{len(self.refused)} of {len(rows)} instance(s) cannot run here:\n"
                + "\n".join(f"  {name}: {why}" for name, why in self.refused.items())
            )
        if self.refused:
            warnings.warn(f"left out {len(self.refused)} instance(s): {', '.join(self.refused)}", stacklevel=2)

    def __len__(self) -> int:
        return len(self.tasks)

    def __call__(self, seed: int) -> WorkspaceTask:
        return self.tasks[int(seed) % len(self.tasks)]
