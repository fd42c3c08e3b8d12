"""GSM8K with tools: the model may call a calculator and a sandboxed Python before answering.

Like veRL's GSM8K tool-agent example. Each turn the model either calls tools (native OpenAI
``tool_calls``, or Hermes ``<tool_call>{...}</tool_call>`` text) and gets one ``tool`` message
per call back (with its ``tool_call_id``), or answers without a tool call, which ends the
episode and is scored by ``compute_score``. ``info["tools"]`` holds the tool schemas.

Rewards: the turn reward is ``tool_reward`` per successful call (default 0) plus anything the
tools themselves return; the answer's score is ``info["outcome_reward"]`` on the last step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.envs.base import TextEnv
from agentgym.envs.data import Task, choose_index, load_tasks
from agentgym.envs.gsm8k import DataFiles, gsm8k_task
from agentgym.envs.rewards import answers_match, compute_score, extract_answer
from agentgym.envs.tools import CallResult, Toolbox, call_metrics, make_tools, split_reply
from agentgym.types import Action, Message

TOOL_SYSTEM_PROMPT = (
    "You are a math expert. Solve the problem step by step. You can call tools to compute: "
    "their results come back to you as tool messages. When you are done, reply without a tool call "
    "and put the final answer after ####, for example `#### 42`."
)


class Gsm8kToolEnv(TextEnv):
    """GSM8K with calculator and Python tools: compute with tools, then answer after '####' (needs data_files=)."""

    def __init__(
        self,
        data_files: DataFiles = None,
        split: str = "train",
        tools: Sequence[str] = ("calculator", "python"),
        tool_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        mcp_servers: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
        max_turns: int = 8,
        max_calls_per_turn: int = 4,
        max_calls_per_episode: int = 16,
        max_output_chars: int = 2000,
        tool_reward: float = 0.0,
        method: str = "strict",
        format_score: float = 0.0,
        score: float = 1.0,
        system_prompt: str | None = TOOL_SYSTEM_PROMPT,
        render_mode: str | None = None,
    ) -> None:
        """``tools``: registered tool names; ``tool_kwargs``: ``{name: constructor kwargs}`` (e.g.
        ``{"python": {"timeout_s": 3}}``); ``mcp_servers``: MCP servers whose tools are offered too
        (docs/mcp.md). ``max_turns``: model turns before truncation; the call
        limits are per turn and per episode. ``tool_reward``: turn reward per successful call.
        ``system_prompt``: prepended when a row's prompt has no system message (None: never)."""
        super().__init__(render_mode=render_mode)
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        extract_answer("", method)  # fail now on an unknown method
        self.split = split
        self.max_turns = max_turns
        self.tool_reward = tool_reward
        self.method, self.format_score, self.score = method, format_score, score
        self.system_prompt = system_prompt
        self.toolbox = Toolbox(
            make_tools(tools, tool_kwargs, mcp_servers),
            max_calls_per_turn=max_calls_per_turn,
            max_calls_per_episode=max_calls_per_episode,
            max_output_chars=max_output_chars,
        )
        self.tools = self.toolbox.schemas  # type: ignore[misc]  # per instance, per the TextEnv contract
        self.tasks = load_tasks(data_files, split, gsm8k_task)
        self.task: Task | None = None
        self._messages: list[Message] = []
        self._results: list[CallResult] = []
        self._turns = 0
        self._done = True

    def num_tasks(self) -> int:
        return len(self.tasks)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pick a row (``options={"index": i}``, else ``seed % num_tasks()``, else at random).
        ``info``: ``tools`` (schemas), ``index``, ``data_source``, ``split``."""
        super().reset(seed=seed)
        index = choose_index(len(self.tasks), seed, options, lambda n: int(self.np_random.integers(n)))
        self.task = self.tasks[index]
        prompt: list[Message] = [dict(m) for m in self.task.prompt]  # type: ignore[misc]
        if self.system_prompt and not any(m.get("role") == "system" for m in prompt):
            prompt.insert(0, {"role": "system", "content": self.system_prompt})
        self._messages = list(prompt)
        self._results = []
        self._turns = 0
        self._done = False
        return [dict(m) for m in prompt], {"tools": self.tools, **self._info()}  # type: ignore[misc]

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the reply's tool calls (tool messages back, ``terminated=False``) or score its answer
        (no messages, ``terminated=True``). ``truncated`` after ``max_turns`` turns."""
        if self.task is None or self._done:
            raise RuntimeError("call reset() before step(): the episode has ended")
        self._turns += 1
        content, calls, errors = split_reply(action, id_prefix=f"call_{self._turns}_")
        assistant: Message = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = calls  # type: ignore[typeddict-item]
        self._messages.append(assistant)
        if not calls and not errors:
            return [], 0.0, True, False, self._final(content)
        used = sum(r.error not in ("limit", "parse") for r in self._results)
        results = self.toolbox.run_turn(calls, errors, used, id_prefix=f"call_{self._turns}_")
        self._results.extend(results)
        observation = [r.message() for r in results]
        self._messages.extend(observation)
        reward = self.tool_reward * sum(r.ok for r in results) + sum(r.reward for r in results)
        truncated = self._turns >= self.max_turns
        info = self._final(content) if truncated else self._info()
        info["turn_metrics"] = call_metrics(results)
        return [dict(m) for m in observation], float(reward), False, truncated, info  # type: ignore[misc]

    def _final(self, answer_text: str) -> dict[str, Any]:
        assert self.task is not None
        self._done = True
        outcome = compute_score(answer_text, self.task.ground_truth or "", self.method, self.format_score, self.score)
        answer = extract_answer(answer_text, self.method)
        metrics = {"score": outcome, "turns": float(self._turns), **call_metrics(self._results)}
        for r in self._results:
            if r.name:
                metrics[f"tool_calls/{r.name}"] = metrics.get(f"tool_calls/{r.name}", 0.0) + 1.0
        return {
            **self._info(),
            "outcome_reward": outcome,
            "success": answers_match(answer, self.task.ground_truth),
            "answer": answer,
            "ground_truth": self.task.ground_truth,
            "metrics": metrics,
        }

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"index": self.task.index, "data_source": self.task.data_source, "split": self.split}

    def close(self) -> None:
        self.toolbox.close()
        super().close()

    def render(self) -> str | None:
        lines = []
        for m in self._messages:
            calls = "".join(
                f"\n  -> {c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", [])
            )
            lines.append(f"[{m['role']}] {m.get('content') or ''}{calls}")
        return "\n".join(lines) or None
