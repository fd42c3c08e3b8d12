"""The tool calls a scripted expert makes (``WorkspaceTask.expert``), in one place: the names and argument
names of the workspace tools (``bash``, ``read_file``, ``write_file``, ``str_replace``, ``submit``)."""

from __future__ import annotations

from typing import Any


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command}}


def read_file(path: str) -> dict[str, Any]:
    return {"name": "read_file", "arguments": {"path": path}}


def write_file(path: str, content: str) -> dict[str, Any]:
    return {"name": "write_file", "arguments": {"path": path, "content": content}}


def str_replace(path: str, old: str, new: str) -> dict[str, Any]:
    return {"name": "str_replace", "arguments": {"path": path, "old_str": old, "new_str": new}}


def submit(answer: str | None = None) -> dict[str, Any]:
    """``submit`` ends the episode; ``answer`` is what an ``answer`` check compares (None: nothing to answer)."""
    return {"name": "submit", "arguments": {} if answer is None else {"answer": answer}}
