"""Rows: dataset rows in veRL's RL format as episodes, scored by the row's data source.

    env = agentgym.make("rows", data_files="train.parquet")               # GSM8K / MATH rows: built-in rules
    env = agentgym.make("rows", data_files="train.parquet",
                        custom_reward_function={"path": "my_reward.py", "name": "compute_score"})

What ``agentgym train data.train_files=...`` trains on when no ``--env`` is given (veRL's
``main_ppo`` over a parquet file). Each row is ``{"prompt": [...messages], "data_source": ...,
"reward_model": {"ground_truth": ...}, "extra_info": {...}}``; a row's ``agent_name`` picks its
episode as veRL's agent loops do: ``single_turn_agent`` (default) is one reply, scored;
``tool_agent`` offers the env's ``tools`` (calculator, sandboxed Python) until a reply without a
tool call, which is scored.

The score is veRL's ``compute_score(data_source, solution_str, ground_truth, extra_info)``: the
``custom_reward_function`` when given, else the built-in rule for the row's ``data_source``
(``agentgym.envs.rewards.by_source``). ``score_timeout`` (veRL's ``prime`` reward manager) scores in
a worker process and gives 0 to a call that runs longer.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.envs.base import TextEnv
from agentgym.envs.data import DataError, Task, choose_index, load_tasks, verl_task
from agentgym.envs.gsm8k import DataFiles
from agentgym.envs.rewards.by_source import RewardFunction, UnknownDataSource, has_rule
from agentgym.envs.tools import CallResult, Toolbox, call_metrics, make_tool, split_reply
from agentgym.types import Action, Message

AGENT_LOOPS = ("single_turn_agent", "tool_agent")


def rows_task(row: dict[str, Any], where: str) -> Task:
    """A veRL-format row; ``agent_name`` is kept in ``extra_info['agent_name']``."""
    task = verl_task(row, where)
    agent = row.get("agent_name") or "single_turn_agent"
    if agent not in AGENT_LOOPS:
        raise DataError(
            f"{where}: agent_name={agent!r} is not one of {', '.join(AGENT_LOOPS)} (agentgym's rows env "
            f"runs veRL's single-turn and tool agent loops; other agents: agentgym train --agent)"
        )
    task.extra_info = {**task.extra_info, "agent_name": agent}
    return task


class _ScorePool:
    """One worker process shared by every env of this process, for scoring with a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        atexit.register(self.close)

    def score(self, reward: RewardFunction, timeout: float, *args: Any) -> tuple[float, dict[str, float]] | None:
        """The score, or None when it ran past ``timeout`` (the worker is then replaced)."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=1)
            pool = self._pool
        future = pool.submit(reward, *args)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_POOL = _ScorePool()


class RowsEnv(TextEnv):
    """Dataset rows (veRL format), scored by their data source or a custom reward function (needs data_files=)."""

    def __init__(
        self,
        data_files: DataFiles = None,
        split: str = "train",
        custom_reward_function: Mapping[str, Any] | None = None,
        score_timeout: float | None = None,
        tools: Sequence[str] = ("calculator", "python"),
        max_turns: int = 8,
        render_mode: str | None = None,
    ) -> None:
        """``custom_reward_function``: ``{"path": FILE, "name": FUNCTION}`` (veRL's keys); without one
        every row's data source must have a built-in rule. ``score_timeout``: seconds per score, in a worker process
        (0 after).
        ``tools`` / ``max_turns``: for rows whose ``agent_name`` is ``tool_agent``."""
        super().__init__(render_mode=render_mode)
        crf = dict(custom_reward_function or {})
        self.reward = RewardFunction(crf.get("path"), crf.get("name") or "compute_score")
        self.score_timeout = score_timeout
        self.split = split
        self.max_turns = max_turns
        self.tasks = load_tasks(data_files, split, rows_task)
        if not crf.get("path"):
            missing = sorted({t.data_source for t in self.tasks if not has_rule(t.data_source)})
            if missing:
                raise UnknownDataSource(
                    f"no built-in reward for data_source {', '.join(repr(m) for m in missing)} in {data_files}: pass "
                    f"custom_reward_function={{'path': FILE, 'name': 'compute_score'}} (veRL's signature)"
                )
        else:
            self.reward.function()  # fail now on a bad path or name
        self.tool_names = list(tools)
        self.toolbox: Toolbox | None = None
        self.task: Task | None = None
        self._messages: list[Message] = []
        self._results: list[CallResult] = []
        self._turns = 0
        self._done = True

    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def _tool_loop(self) -> bool:
        return self.task is not None and self.task.extra_info.get("agent_name") == "tool_agent"

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pick a row (``options={"index": i}``, else ``seed % num_tasks()``) and return its prompt;
        ``info["tools"]`` holds the tool schemas for ``tool_agent`` rows."""
        super().reset(seed=seed)
        index = choose_index(len(self.tasks), seed, options, lambda n: int(self.np_random.integers(n)))
        self.task = self.tasks[index]
        self._messages = [dict(m) for m in self.task.prompt]  # type: ignore[misc]
        self._results, self._turns, self._done = [], 0, False
        info = self._info()
        if self._tool_loop:
            if self.toolbox is None:
                self.toolbox = Toolbox([make_tool(name) for name in self.tool_names])
            info["tools"] = self.toolbox.schemas
        return [dict(m) for m in self._messages], info  # type: ignore[misc]

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Score the reply (``terminated=True``), or for a ``tool_agent`` row run its tool calls and
        return the tool messages (``truncated`` after ``max_turns`` turns, then scored)."""
        if self.task is None or self._done:
            raise RuntimeError("call reset() before step(): the episode has ended")
        self._turns += 1
        content, calls, errors = split_reply(action, id_prefix=f"call_{self._turns}_")
        if not self._tool_loop or (not calls and not errors):
            self._messages.append({"role": "assistant", "content": content})
            return [], 0.0, True, False, self._final(content)
        assert self.toolbox is not None
        self._messages.append({"role": "assistant", "content": content, "tool_calls": calls})  # type: ignore[typeddict-item]
        used = sum(r.error not in ("limit", "parse") for r in self._results)
        results = self.toolbox.run_turn(calls, errors, used, id_prefix=f"call_{self._turns}_")
        self._results.extend(results)
        observation = [r.message() for r in results]
        self._messages.extend(observation)
        truncated = self._turns >= self.max_turns
        info = self._final(content) if truncated else self._info()
        return [dict(m) for m in observation], 0.0, False, truncated, info  # type: ignore[misc]

    def _final(self, solution: str) -> dict[str, Any]:
        assert self.task is not None
        self._done = True
        task = self.task
        extra_info = {k: v for k, v in task.extra_info.items() if k != "agent_name"}
        extra_info["num_turns"] = self._turns
        args = (task.data_source, solution, task.ground_truth, extra_info)
        metrics: dict[str, float] = {}
        if self.score_timeout:
            result = _POOL.score(self.reward, float(self.score_timeout), *args)
            metrics["score_timeout"] = float(result is None)
            score, extra = result if result is not None else (0.0, {})
        else:
            score, extra = self.reward(*args)
        metrics.update({"score": score, **extra})
        if self._results:
            metrics.update(call_metrics(self._results))
        return {
            **self._info(),
            "outcome_reward": score,
            "success": score > 0,
            "ground_truth": task.ground_truth,
            "metrics": metrics,
        }

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {
            "index": self.task.index,
            "data_source": self.task.data_source,
            "split": self.split,
            "agent_name": self.task.extra_info.get("agent_name", "single_turn_agent"),
        }

    def close(self) -> None:
        if self.toolbox is not None:
            self.toolbox.close()
        super().close()

    def render(self) -> str | None:
        return "\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in self._messages) or None
