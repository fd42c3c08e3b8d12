"""``WorkspaceTask``: what a workspace episode is about, independent of where its tasks come from.

A suite (generated terminal chores, generated SWE bugs, a Harbor task directory, a SWE-bench-style instance)
turns into these; the workspace env lays ``files`` out at reset, shows ``instruction``, lets the agent act with
its tools, and after the episode runs ``checks`` against the final workspace with ``verifier_files`` added
(files the agent never saw). ``expert`` is a scripted solution (a list of tool calls) for demos / warm start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Check:
    """One verifier check.

    * ``command``: ``command`` runs in the final workspace (verifier files present); passes on exit status 0.
    * ``file``: the file at ``path`` exists with exactly ``content`` (``content=None``: must not exist).
    * ``answer``: the agent's ``submit`` answer equals ``answer`` after stripping whitespace.
    """

    kind: Literal["command", "file", "answer"]
    command: str | None = None
    path: str | None = None
    content: str | None = None
    answer: str | None = None
    timeout_s: float = 20.0


@dataclass(frozen=True)
class WorkspaceTask:
    """A task for one episode in a fresh workspace."""

    task_id: str
    instruction: str
    files: dict[str, str]  # workspace-relative path -> text, laid out at reset
    checks: tuple[Check, ...]
    verifier_files: dict[str, str] = field(default_factory=dict)  # added only when the checks run
    # a scripted solution: tool calls in order, each {"name": "bash"|"read_file"|..., "arguments": {...}}
    expert: tuple[dict[str, Any], ...] = ()
    max_turns: int = 8
    metadata: dict[str, Any] = field(default_factory=dict)
