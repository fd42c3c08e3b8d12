"""Registering ``tool_task`` where the installed metadata predates it (a worktree on PYTHONPATH)."""

from __future__ import annotations


def ensure_tool_task() -> None:
    """Register ``tool_task`` from this checkout's pyproject.toml if the installed agentgym lacks it."""
    from agentgym.registry import ENVS, register, source_tree_entry_points

    if "tool_task" not in ENVS.names():
        register("tool_task", source_tree_entry_points("agentgym.envs")["tool_task"])
