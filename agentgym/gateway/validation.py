"""What the gateway checks before it stores anything a client sent: sampling pinned on a session,
the session's task, posted rewards and the turn/branch they name, and reward functions.

Each check answers a 400 (``APIError``) that names the field, at the moment the value arrives:
a value stored unchecked failed later, for everyone (``sampling.max_tokens: "abc"`` made every
model call of the session a 500; ``turn: 0.5`` made ``finish`` raise and lost the session's
trajectories; a ``NaN`` reward trained).

Reward functions: a task may name one in the registry (``gsm8k``; programs add theirs with
``agentgym.register(name, fn, kind="reward_fn")``), or an import path ``package.module:function``
that the gateway's operator allowed
(``Gateway(allowed_reward_fns=[...])``, ``agentgym gateway --reward-fn``; ``package.module:*``
allows a whole module). Any other import path is refused: a request must not choose what code
the gateway imports.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentgym.server.errors import APIError, validation_message


class PinnedSampling(BaseModel):
    """``POST /sessions`` ``sampling``: ``SamplingParams`` names, each checked."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_tokens: int | None = Field(None, ge=1, le=1 << 30)
    temperature: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=1 << 30)
    stop: list[str] | None = Field(None, max_length=64)
    stop_token_ids: list[int] | None = Field(None, max_length=1024)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    min_tokens: int | None = Field(None, ge=0, le=1 << 30)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0, allow_inf_nan=False)

    @field_validator(
        "temperature", "top_p", "frequency_penalty", "presence_penalty", "repetition_penalty", mode="before"
    )
    @classmethod
    def _int_is_a_number(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _non_empty(cls, v: list[str] | None) -> list[str] | None:
        if v and any(not s for s in v):
            raise ValueError("stop strings must not be empty")
        return v


def check_sampling(sampling: Any, vocab_size: int | None = None, max_model_len: int | None = None) -> dict[str, Any]:
    """The pinned sampling fields that were given, checked (a 400 names the first bad one)."""
    if not isinstance(sampling, dict):
        raise APIError(400, "'sampling' must be a JSON object", param="sampling")
    try:
        checked = PinnedSampling.model_validate(sampling)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, f"sampling.{message}", param=f"sampling.{param}" if param else "sampling") from None
    out = checked.model_dump(exclude_unset=True)
    if vocab_size is not None:
        bad = next((t for t in out.get("stop_token_ids") or [] if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(
                400,
                f"sampling.stop_token_ids: {bad} is not a token id (vocabulary size {vocab_size})",
                param="sampling.stop_token_ids",
            )
    if max_model_len is not None and out.get("max_tokens") is not None and out["max_tokens"] >= max_model_len:
        raise APIError(
            400,
            f"sampling.max_tokens={out['max_tokens']} leaves no room for a prompt in this "
            f"gateway's context of {max_model_len} tokens",
            param="sampling.max_tokens",
        )
    return out


def check_task(task: Any, max_bytes: int) -> dict[str, Any]:
    if not isinstance(task, dict):
        raise APIError(400, "'task' must be a JSON object", param="task")
    size = len(json.dumps(task, ensure_ascii=False).encode("utf-8", "replace"))
    if size > max_bytes:
        raise APIError(
            413,
            f"the task is {size} bytes; this gateway keeps at most {max_bytes} per session "
            "(agentgym gateway --max-task-bytes)",
            param="task",
            code="request_too_large",
        )
    return task


def check_number(value: Any, param: str = "reward", required: bool = True) -> float | None:
    """A finite number (not a bool), or a 400."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, f"'{param}' must be a number", param=param)
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise APIError(400, f"'{param}' must be a finite number, got {value!r}", param=param)
    return number


def check_index(value: Any, param: str) -> int | None:
    """A non-negative integer (not a bool or a float), or None; else a 400."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise APIError(400, f"'{param}' must be a non-negative integer, got {value!r}", param=param)
    return value


def allowed_import(name: str, allowed: Collection[str]) -> bool:
    """Whether the operator allowed the reward function ``package.module:function``."""
    module = name.partition(":")[0]
    return name in allowed or f"{module}:*" in allowed
