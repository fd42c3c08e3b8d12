"""One episode's env as the runner holds it (``EnvHandle``), and the errors env calls end with."""

from __future__ import annotations

import contextlib
from typing import Any

CALL_EXECUTORS = ("thread", "process", "inline", "openenv")
EPISODE_EXECUTORS = ("workers", "ray")
EXECUTORS = CALL_EXECUTORS + EPISODE_EXECUTORS


class EnvTimeout(TimeoutError):
    """An env call took longer than ``env_timeout``."""


class WorkerCrashed(RuntimeError):
    """The worker process (or actor, or env server) holding an episode's env went away."""


def close_quietly(env: Any) -> None:
    with contextlib.suppress(Exception):
        env.close()


def describe_env(env: Any) -> dict[str, Any]:
    """What the runner needs to know about an env: its tasks, turn budget and (multi-agent) seats."""
    num_tasks = env.num_tasks() if hasattr(env, "num_tasks") else None
    agents = getattr(env, "agents", None)
    return {
        "num_tasks": num_tasks,
        "max_turns": getattr(env, "max_turns", None),
        "agents": list(agents) if agents else None,
    }


class EnvHandle:
    """One episode's env. ``reset``/``step`` follow the TextEnv contract; ``release`` ends it."""

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        raise NotImplementedError

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        raise NotImplementedError

    async def release(self, healthy: bool) -> None:
        raise NotImplementedError
