"""``InteractionEnv``: a dataset row plus a veRL-style interaction, as a multi-turn ``TextEnv``.

A row's ``extra_info.interaction_kwargs.name`` names the interaction (rows without one use
``default_interaction``). Each episode:

1. ``reset`` opens the interaction (``start_interaction(instance_id, **interaction_kwargs)``) and
   returns the row's prompt;
2. each ``step`` appends the model's reply, calls ``generate_response(instance_id, messages,
   **interaction_kwargs)`` and returns its text as a user message, with its turn score as the
   step reward; the episode ends when the interaction says so (``terminated``) or after
   ``max_turns`` replies (``truncated``);
3. on the last step ``calculate_score(instance_id)`` is the outcome reward, then
   ``finalize_interaction(instance_id)`` runs.

Turn scores and the outcome are reported apart (see ``agentgym.envs.base``), so the algorithm decides how to
combine them. The interaction's async methods run on one background event loop shared by
all envs in the process, so ``step`` works from any thread: plain sync code, a worker thread
while the main thread runs its own loop, or inside ``loop.run_in_executor``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import os
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar
from uuid import uuid4

from agentgym.envs.base import TextEnv, reply_text
from agentgym.envs.data import DataError, Task, choose_index, load_tasks
from agentgym.envs.gsm8k import DataFiles, gsm8k_task
from agentgym.registry import INTERACTIONS, EnvSpec
from agentgym.types import Action, Message

T = TypeVar("T")

GSM8K_SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "You should rethink carefully if the user points out that your answer is wrong. "
    "Put your final answer in the format of `#### <answer>`."
)


class _InteractionLoop:
    """One event loop on a daemon thread; coroutines from any thread run there (re-made after fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not self._thread or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="agentgym-interactions", daemon=True)
                thread.start()
                self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` to completion on the background loop and return its result."""
        loop = self._ensure()
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "InteractionEnv.step/reset was called from inside an interaction coroutine; "
                "call it from ordinary code or a worker thread instead"
            )
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"interaction call took longer than timeout_s={timeout_s}") from None


_LOOP = _InteractionLoop()


def _takes_arguments(method: Any) -> bool:
    """veRL's base ``calculate_score(self)`` takes nothing; its gsm8k one takes ``instance_id``."""
    try:
        return bool(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return True


def interaction_kwargs(task: Task, default_interaction: str | None) -> dict[str, Any]:
    """The row's ``extra_info.interaction_kwargs`` (a copy), or kwargs for ``default_interaction``
    built from the task (``name``, ``query``, ``ground_truth``)."""
    kwargs = task.extra_info.get("interaction_kwargs")
    if isinstance(kwargs, Mapping) and kwargs.get("name"):
        return {k: v for k, v in kwargs.items() if v is not None}
    if not default_interaction:
        raise DataError(
            f"{task.where}: missing column 'extra_info.interaction_kwargs.name' "
            "(it names the interaction); add it to the data or pass default_interaction="
        )
    base = {k: v for k, v in (kwargs or {}).items() if v is not None}
    query = next((m["content"] for m in reversed(task.prompt) if m.get("role") == "user"), "")
    return {"query": query, "ground_truth": task.ground_truth, **base, "name": default_interaction}


class InteractionEnv(TextEnv):
    """Dataset rows driven by a veRL-style interaction: feedback turns until it ends (needs data_files=)."""

    def __init__(
        self,
        data_files: DataFiles = None,
        split: str = "train",
        interaction_config: str | Path | Mapping[str, Any] | None = None,
        interactions: Mapping[str, Any] | None = None,
        default_interaction: str | None = None,
        max_turns: int = 5,
        system_prompt: str | None = None,
        success_threshold: float = 1.0,
        timeout_s: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        """``interaction_config``: veRL's interaction YAML (path or loaded mapping);
        ``interactions``: ``{name: instance}`` to use directly; names found in neither are built
        from the ``agentgym.interactions`` registry with ``config={"name": name}``.
        ``max_turns``: model replies before the episode is truncated. ``system_prompt``: prepended
        when a row's prompt has no system message. ``success_threshold``: the outcome score that
        counts as success (unless the interaction's last ``extra`` says ``success``).
        ``timeout_s``: limit on each interaction call (None: wait)."""
        super().__init__(render_mode=render_mode)
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.split = split
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.success_threshold = success_threshold
        self.timeout_s = timeout_s
        self.default_interaction = default_interaction
        self.interactions: dict[str, Any] = {}
        if interaction_config is not None:
            from agentgym.interactions.config import load_interactions

            self.interactions.update(load_interactions(interaction_config))
        self.interactions.update(interactions or {})
        self.tasks = load_tasks(data_files, split, gsm8k_task)
        self._kwargs = [interaction_kwargs(task, default_interaction) for task in self.tasks]
        for name in sorted({kw["name"] for kw in self._kwargs}):
            self._interaction(name)  # fail now on an unknown name
        self.task: Task | None = None
        self._instance_id: str | None = None
        self._messages: list[Message] = []
        self._turn_scores: list[float] = []
        self._last_extra: dict[str, Any] = {}

    # ---- interactions ------------------------------------------------------------------
    def _interaction(self, name: str) -> Any:
        if name not in self.interactions:
            if name not in INTERACTIONS.names():
                known = sorted(set(self.interactions) | set(INTERACTIONS.names()))
                raise DataError(
                    f"unknown interaction {name!r} named by the data; known: {', '.join(known) or 'none'}. "
                    "Pass interaction_config= (veRL YAML) or interactions={name: instance}"
                )
            self.interactions[name] = INTERACTIONS.get(name)(config={"name": name})
        return self.interactions[name]

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return _LOOP.run(coro, self.timeout_s)

    @property
    def _kw(self) -> dict[str, Any]:
        assert self.task is not None
        return self._kwargs[self.task.index]

    def num_tasks(self) -> int:
        return len(self.tasks)

    # ---- episode -----------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pick a row (``options={"index": i}``, else ``seed % num_tasks()``, else at random), open
        its interaction and return the prompt. ``info``: index, data_source, interaction, instance_id."""
        super().reset(seed=seed)
        self._finalize()
        index = choose_index(len(self.tasks), seed, options, lambda n: int(self.np_random.integers(n)))
        self.task = self.tasks[index]
        interaction = self._interaction(self._kw["name"])
        started = self._run(interaction.start_interaction(f"{self.spec_name}-{uuid4().hex}", **self._kw))
        self._instance_id = started if isinstance(started, str) else str(started)
        prompt: list[Message] = [dict(m) for m in self.task.prompt]  # type: ignore[misc]
        if self.system_prompt and not any(m.get("role") == "system" for m in prompt):
            prompt.insert(0, {"role": "system", "content": self.system_prompt})
        self._messages = list(prompt)
        self._turn_scores = []
        self._last_extra = {}
        return [dict(m) for m in prompt], self._info()  # type: ignore[misc]

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Send the reply to the interaction. Returns its feedback as one user message, the turn
        score as reward, and ``terminated`` (the interaction ended it) / ``truncated``
        (``max_turns`` replies). The last step's info has ``outcome_reward`` and ``success``."""
        if self.task is None or self._instance_id is None:
            raise RuntimeError("call reset() before step(): the episode has ended")
        interaction = self._interaction(self._kw["name"])
        self._messages.append({"role": "assistant", "content": reply_text(action)})
        try:
            result = self._run(
                interaction.generate_response(self._instance_id, [dict(m) for m in self._messages], **self._kw)
            )
            should_terminate, text, turn_score, extra = _check_response(result, interaction)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the original error
                self._finalize()
            raise
        feedback: Message = {"role": "user", "content": text}
        self._messages.append(feedback)
        self._turn_scores.append(turn_score)
        self._last_extra = extra
        terminated = should_terminate
        truncated = not terminated and len(self._turn_scores) >= self.max_turns
        info = self._info()
        info["turn_extra"] = extra
        if terminated or truncated:
            info.update(self._outcome(interaction))
        return [dict(feedback)], turn_score, terminated, truncated, info  # type: ignore[list-item]

    def _outcome(self, interaction: Any) -> dict[str, Any]:
        assert self._instance_id is not None
        try:
            method = interaction.calculate_score
            outcome = float(self._run(method(self._instance_id) if _takes_arguments(method) else method()))
        finally:
            self._finalize()
        success = (
            bool(self._last_extra["success"]) if "success" in self._last_extra else outcome >= self.success_threshold
        )
        return {
            "outcome_reward": outcome,
            "success": success,
            "turn_scores": list(self._turn_scores),
            "metrics": {
                "turns": float(len(self._turn_scores)),
                "turn_score_sum": float(sum(self._turn_scores)),
                "outcome": outcome,
            },
        }

    def _finalize(self) -> None:
        """Run ``finalize_interaction`` for the open episode, if any (once)."""
        if self._instance_id is None or self.task is None:
            return
        instance_id, self._instance_id = self._instance_id, None
        interaction = self._interaction(self._kw["name"])
        method = interaction.finalize_interaction
        self._run(method(instance_id) if _takes_arguments(method) else method())

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {
            "index": self.task.index,
            "data_source": self.task.data_source,
            "split": self.split,
            "interaction": self._kw["name"],
            "instance_id": self._instance_id,
            "turn": len(self._turn_scores),
        }

    def close(self) -> None:
        self._finalize()
        super().close()

    def render(self) -> str | None:
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self._messages) or None


def _check_response(result: Any, interaction: Any) -> tuple[bool, str, float, dict[str, Any]]:
    """Validate ``generate_response``'s 4-tuple; say which class returned what otherwise."""
    if not (isinstance(result, (tuple, list)) and len(result) == 4):
        raise TypeError(
            f"{type(interaction).__name__}.generate_response must return "
            f"(should_terminate, text, turn_score, extra); got {result!r}"
        )
    should_terminate, text, score, extra = result
    return bool(should_terminate), "" if text is None else str(text), float(score or 0.0), dict(extra or {})


GSM8K_INTERACTION = EnvSpec(
    name="gsm8k_interaction",
    entry_point=InteractionEnv,
    kwargs={"default_interaction": "gsm8k", "system_prompt": GSM8K_SYSTEM_PROMPT},
    description="GSM8K with feedback: told right or wrong by the gsm8k interaction, it may retry (needs data_files=)",
)
