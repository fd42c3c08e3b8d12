"""Tool task: any env's tasks, answered with tools (built-in ones and those of MCP servers).

    env = agentgym.make("tool_task", task="arithmetic", task_kwargs={"digits": 3}, tools=[],
                        mcp_servers=[{"name": "calc", "command": "python", "args": ["calc_server.py"]}])

The task env (``task``: a registered name, built with ``task_kwargs``) asks the question and is the
verifier. Each turn the model either calls tools - native OpenAI ``tool_calls`` or Hermes
``<tool_call>{...}</tool_call>`` text - and gets one ``tool`` message per call back, or replies
without a tool call: that reply goes to the task env's ``step`` and is scored there (a one-turn
task ends; a multi-turn one answers with its next observation and the loop goes on).
``info["tools"]`` holds the tool schemas (built-in ``tools`` by registered name with
``tool_kwargs``, then every tool of each ``mcp_servers`` entry: see
``agentgym/envs/tools/mcp/config.py`` and docs/mcp.md).

Rewards: ``tool_reward`` per successful call (default 0) plus the task env's turn rewards; the
task env's ``outcome_reward`` on the step that ends it. ``max_turns`` model turns (tool turns and
answers together) truncate the episode, with an outcome of 0 if the task env never ended it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.envs.base import TextEnv
from agentgym.envs.tools import CallResult, Toolbox, call_metrics, make_tools, split_reply
from agentgym.types import Action, Message

TOOL_PROMPT = (
    "You can call tools: their results come back to you as tool messages. When you know the answer, "
    "reply without a tool call, in the format the task asks for."
)


class ToolTaskEnv(TextEnv):
    """Another env's tasks with tools (built-in and MCP servers'); a reply without a tool call is the answer."""

    def __init__(
        self,
        task: str = "arithmetic",
        task_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[str] = (),
        tool_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        mcp_servers: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        max_turns: int = 4,
        max_calls_per_turn: int = 4,
        max_calls_per_episode: int = 8,
        max_output_chars: int = 2000,
        call_timeout_s: float = 60.0,
        tool_reward: float = 0.0,
        system_prompt: str | None = TOOL_PROMPT,
        render_mode: str | None = None,
    ) -> None:
        """``task``/``task_kwargs``: the env that asks and scores. ``tools``: registered tool names
        (``tool_kwargs``: ``{name: constructor kwargs}``); ``mcp_servers``: MCP servers whose tools are
        offered too. ``system_prompt`` is put first when the task has no system message, else added
        to the end of it (None: never). Raises ``MCPUnavailable`` when a server cannot be reached."""
        super().__init__(render_mode=render_mode)
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        from agentgym.registry import make

        self.task_name = task
        self.task_env = make(task, **dict(task_kwargs or {}))
        self.max_turns = max_turns
        self.tool_reward = tool_reward
        self.system_prompt = system_prompt
        try:
            self.toolbox = Toolbox(
                make_tools(tools, tool_kwargs, mcp_servers),
                max_calls_per_turn=max_calls_per_turn,
                max_calls_per_episode=max_calls_per_episode,
                max_output_chars=max_output_chars,
                call_timeout_s=call_timeout_s,
            )
        except BaseException:
            self.task_env.close()
            raise
        self.tools = self.toolbox.schemas  # type: ignore[misc]  # per instance, per the TextEnv contract
        self._results: list[CallResult] = []
        self._turns = 0
        self._done = True

    def num_tasks(self) -> int | None:
        inner = getattr(self.task_env, "unwrapped", self.task_env)
        return inner.num_tasks() if hasattr(inner, "num_tasks") else None

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The task env's first messages (with the tool prompt) and info, plus ``info["tools"]``."""
        super().reset(seed=seed)
        messages, info = self.task_env.reset(seed=seed, options=options)
        messages = [dict(m) for m in messages]
        if self.system_prompt:
            system = next((m for m in messages if m.get("role") == "system"), None)
            if system is None:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            else:
                system["content"] = f"{system.get('content') or ''}\n\n{self.system_prompt}".strip()
        self._results = []
        self._turns = 0
        self._done = False
        return messages, {**dict(info or {}), "tools": self.tools}  # type: ignore[return-value]

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Tool calls: run them (``tool`` messages back). Else: the task env's step on the reply."""
        if self._done:
            raise RuntimeError("call reset() before step(): the episode has ended")
        self._turns += 1
        truncated = self._turns >= self.max_turns
        content, calls, errors = split_reply(action, id_prefix=f"call_{self._turns}_")
        if not calls and not errors:
            messages, reward, terminated, inner_truncated, info = self.task_env.step(action)
            info = dict(info or {})
            self._done = bool(terminated or inner_truncated or truncated)
            if self._done:
                info["metrics"] = {**dict(info.get("metrics") or {}), **self._metrics()}
                info.setdefault("outcome_reward", 0.0)
            return list(messages), float(reward), bool(terminated), bool(inner_truncated or truncated), info
        used = sum(r.error not in ("limit", "parse") for r in self._results)
        results = self.toolbox.run_turn(calls, errors, used, id_prefix=f"call_{self._turns}_")
        self._results.extend(results)
        reward = self.tool_reward * sum(r.ok for r in results) + sum(r.reward for r in results)
        info: dict[str, Any] = {"turn_metrics": call_metrics(results)}
        if truncated:  # out of turns before an answer: the task env never scored it
            self._done = True
            info.update(outcome_reward=0.0, success=False, metrics=self._metrics())
        return [r.message() for r in results], float(reward), False, truncated, info  # type: ignore[misc]

    def _metrics(self) -> dict[str, float]:
        metrics = {"turns": float(self._turns), **call_metrics(self._results)}
        for r in self._results:
            if r.name:
                metrics[f"tool_calls/{r.name}"] = metrics.get(f"tool_calls/{r.name}", 0.0) + 1.0
        return metrics

    def close(self) -> None:
        self.toolbox.close()
        self.task_env.close()
        super().close()

    def render(self) -> str | None:
        return self.task_env.render() if hasattr(self.task_env, "render") else None
