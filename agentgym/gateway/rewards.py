"""Reward functions a gateway session's task may name, applied at finish to each branch's last reply.

A task names one in the registry (``{"reward_fn": "gsm8k", "ground_truth": "72"}``; programs add
theirs with ``agentgym.register(name, fn, kind="reward_fn")`` or an ``agentgym.reward_fns`` entry
point, as envs and tools arrive), or an import path ``package.module:function`` that the gateway's
operator allowed (``agentgym gateway --reward-fn``, see ``agentgym.gateway.validation``). A task with
no ``reward_fn`` but a known ``data_source`` uses that source's reward (as veRL does).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Sequence
from typing import Any

from agentgym.gateway.validation import allowed_import
from agentgym.registry import REWARD_FNS, UnknownNameError, import_object
from agentgym.types import Message

RewardFn = Callable[[list[Message], dict[str, Any]], float]
"""``(messages, task) -> reward``: ``messages`` is the branch's whole conversation, ending with the
model's last reply; ``task`` is the session's task dict."""


def last_assistant_text(messages: Sequence[Message]) -> str:
    """The content of the last assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


def ground_truth(task: dict[str, Any]) -> str:
    """``task["ground_truth"]``, or veRL's ``task["reward_model"]["ground_truth"]``."""
    value = task.get("ground_truth")
    if value is None:
        value = (task.get("reward_model") or {}).get("ground_truth")
    if value is None:
        raise ValueError(
            "the task names a reward function but has no 'ground_truth' (or 'reward_model': {'ground_truth': ...})"
        )
    return str(value)


def gsm8k_reward(messages: list[Message], task: dict[str, Any]) -> float:
    """GSM8K's ``compute_score`` on the last assistant message; ``task["reward_kwargs"]`` (e.g.
    ``{"method": "flexible"}``) is passed through."""
    from agentgym.envs.rewards import compute_score

    return compute_score(last_assistant_text(messages), ground_truth(task), **(task.get("reward_kwargs") or {}))


DATA_SOURCE_REWARDS = {"openai/gsm8k": "gsm8k", "gsm8k": "gsm8k"}
"""A task with no ``reward_fn`` but a known ``data_source`` uses that source's reward (as veRL does)."""


def resolve_reward_fn(name: str, allowed: Collection[str] = ()) -> RewardFn:
    """A registered name (``gsm8k``) or an import path ``package.module:function`` that ``allowed``
    lists (``package.module:*``: any function of that module); see ``agentgym.gateway.validation``."""
    if ":" not in name:
        try:
            return REWARD_FNS.get(name)
        except UnknownNameError:
            pass
    else:
        if not allowed_import(name, allowed):
            raise ValueError(
                f"reward_fn {name!r} is not allowed: a task may name a registered reward function "
                f"({', '.join(REWARD_FNS.names())}) or an import path the gateway's operator allowed "
                "(agentgym gateway --reward-fn package.module:function)"
            )
        try:
            fn = import_object(name)
        except (ValueError, ImportError, AttributeError) as exc:
            raise ValueError(f"reward_fn {name!r} could not be imported: {exc}") from None
        if not callable(fn):
            raise ValueError(f"reward_fn {name!r} is not callable")
        return fn
    close = difflib.get_close_matches(name, REWARD_FNS.names(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"unknown reward_fn {name!r}; registered: {', '.join(REWARD_FNS.names())}, or give "
        f"'package.module:function'.{hint}"
    )


def task_reward_fn(task: dict[str, Any]) -> str | None:
    """The reward function a task names, directly or through its ``data_source``."""
    name = task.get("reward_fn")
    if name is None and task.get("ground_truth") is not None:
        name = DATA_SOURCE_REWARDS.get(str(task.get("data_source") or ""))
    return str(name) if name else None
