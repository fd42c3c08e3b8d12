"""``WorkspaceEnv``: an agent works in a sandboxed workspace with shell and editor tools; a verifier scores it.

    env = WorkspaceEnv(tasks=my_tasks)             # my_tasks(seed) -> WorkspaceTask
    env = agentgym.make("workspace", tasks="my_pkg.suite:task")   # the same, named as "module:callable"

Each ``reset(seed)`` draws ``task = tasks(seed)``, kills the previous episode's sandbox and takes a
fresh one (``WorkspaceSandbox``, started ahead by a ``SparePool``) with ``task.files`` in
``/workspace``; the first messages are a system prompt and ``task.instruction``; ``info["tools"]``
holds the five tools' schemas (``bash``, ``read_file``, ``write_file``, ``str_replace``, ``submit``),
called natively or as Hermes ``<tool_call>`` text. Each ``step`` runs the reply's calls (one
``tool`` message each). A reply without a call gets a reminder and costs a turn.

The episode ends on ``submit`` (``terminated``) or after ``max_turns`` turns (``truncated``; default
``task.max_turns``). Then the workspace is taken out, the episode's sandbox is killed, and the
verifier (``verifier.py``) runs ``task.checks`` in a fresh sandbox with ``task.verifier_files``
added: ``info["outcome_reward"]`` is 1.0 when all pass, else 0.0; ``info["verifier"]`` holds the
per-check report and ``info["metrics"]`` the counts. Step rewards are 0.

The expert: ``expert_action()`` replays ``task.expert`` (one tool call per turn), then submits, so
``agentgym demos --env <a workspace suite>`` writes demonstrations for any suite with scripted solutions.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from agentgym.envs.base import TextEnv
from agentgym.envs.tools import CallResult, Toolbox, call_metrics, split_reply
from agentgym.envs.workspace.sandbox import (
    SparePool,
    WorkspaceError,
    WorkspaceLimits,
    require_workspace,
)
from agentgym.envs.workspace.task import WorkspaceTask
from agentgym.envs.workspace.tools import WorkspaceHandle, make_workspace_tools
from agentgym.envs.workspace.verifier import VerifierReport, verify
from agentgym.types import Action, Message

SYSTEM_PROMPT = (
    "You are working in a sandboxed Linux workspace at /workspace (bash, coreutils, grep, find, sed, git and "
    "python3 are available; there is no network). Use the tools to inspect and change files and to run "
    "commands, one step at a time. When the task is done, call submit (with the answer if the task asks "
    "for one); your work is then checked."
)
NO_CALL_REMINDER = (
    "No tool call found in your reply. Act with a tool call (bash, read_file, write_file, str_replace), "
    "or call submit when the task is done."
)
TaskSource = Callable[[int], WorkspaceTask]


def load_task_source(tasks: TaskSource | str) -> TaskSource:
    """``tasks`` itself if callable, else the callable named ``"module:attribute"``."""
    if callable(tasks):
        return tasks
    if not isinstance(tasks, str) or ":" not in tasks:
        raise ValueError(
            "WorkspaceEnv needs tasks=: a callable seed -> WorkspaceTask, or its name as 'module:attribute' "
            f"(e.g. 'agentgym.envs.workspace.suites:terminal_task'); got {tasks!r}"
        )
    module, _, attribute = tasks.partition(":")
    source = importlib.import_module(module)
    for part in attribute.split("."):
        source = getattr(source, part)
    if not callable(source):
        raise ValueError(f"tasks={tasks!r} names {type(source).__name__}, not a callable seed -> WorkspaceTask")
    return source  # type: ignore[return-value]


def _limits(value: WorkspaceLimits | Mapping[str, Any] | None) -> WorkspaceLimits:
    if value is None:
        return WorkspaceLimits()
    if isinstance(value, WorkspaceLimits):
        return value
    return WorkspaceLimits(**dict(value))


class WorkspaceEnv(TextEnv):
    """Work in a sandboxed workspace with bash and editor tools; a hidden verifier scores the result (needs tasks=)."""

    def __init__(
        self,
        tasks: TaskSource | str | None = None,
        limits: WorkspaceLimits | Mapping[str, Any] | None = None,
        verifier_limits: WorkspaceLimits | Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        max_calls_per_turn: int = 4,
        max_calls_per_episode: int = 64,
        max_output_chars: int = 8000,
        system_prompt: str | None = SYSTEM_PROMPT,
        spares: int = 1,
        render_mode: str | None = None,
    ) -> None:
        """``tasks``: seed -> ``WorkspaceTask`` (or ``"module:attribute"``). ``limits``: the episode
        sandbox's bounds (``WorkspaceLimits`` or a dict of its fields); ``verifier_limits`` the
        verifier's (default: the same; a command check's ``timeout_s`` raises its timeout).
        ``max_turns``: overrides each task's ``max_turns``. ``spares``: sandboxes kept started ahead
        of the next reset (each still serves one episode; 0: start one at each reset). Raises
        ``SandboxUnavailable`` where the sandbox cannot run."""
        super().__init__(render_mode=render_mode)
        self.task_source = load_task_source(tasks)  # type: ignore[arg-type]  # None: the error says what to pass
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        require_workspace()
        self.limits = _limits(limits)
        self.verifier_limits = _limits(verifier_limits) if verifier_limits is not None else self.limits
        self.turn_budget = max_turns
        self.system_prompt = system_prompt
        self.handle = WorkspaceHandle()
        self.spares = SparePool(self.limits, spares)
        self.toolbox = Toolbox(
            make_workspace_tools(self.handle, max_output_chars),
            max_calls_per_turn=max_calls_per_turn,
            max_calls_per_episode=max_calls_per_episode,
            max_output_chars=max_output_chars,
            call_timeout_s=None,  # the sandbox bounds every call itself (and kills what it started)
        )
        self.tools = self.toolbox.schemas  # type: ignore[misc]  # per instance, per the TextEnv contract
        self.task: WorkspaceTask | None = None
        self.seed: int | None = None
        self.report: VerifierReport | None = None
        self._messages: list[Message] = []
        self._results: list[CallResult] = []
        self._turns = 0
        self._done = True

    # ---- the episode -----------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A fresh workspace for ``tasks(seed)`` (``options={"index": i}`` also picks seed ``i``; no
        seed: a random one). ``info``: ``tools``, ``task_id``, ``seed``, ``max_turns``."""
        super().reset(seed=seed)
        self._end_sandbox()
        if options and "index" in options:
            seed = int(options["index"])
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        task = self.task_source(seed)
        if not isinstance(task, WorkspaceTask):
            raise TypeError(f"the task source returned {type(task).__name__} for seed {seed}, not a WorkspaceTask")
        self.task, self.seed, self.report = task, seed, None
        self.max_turns = self.turn_budget or task.max_turns
        self.handle.submitted, self.handle.answer, self.handle.calls = False, None, {}
        self.handle.sandbox = self.spares.take(task.files)
        prompt: list[Message] = []
        if self.system_prompt:
            prompt.append({"role": "system", "content": self.system_prompt})
        prompt.append({"role": "user", "content": task.instruction})
        self._messages = list(prompt)
        self._results = []
        self._turns = 0
        self._done = False
        return [dict(m) for m in prompt], {"tools": self.tools, **self._info()}  # type: ignore[misc]

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the reply's tool calls; ``terminated`` on submit, ``truncated`` after ``max_turns`` turns.
        The final step's ``info`` has the verifier's verdict."""
        if self.task is None or self._done:
            raise RuntimeError("call reset() before step(): the episode has ended")
        self._turns += 1
        prefix = f"call_{self._turns}_"
        content, calls, errors = split_reply(action, id_prefix=prefix)
        assistant: Message = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = calls  # type: ignore[typeddict-item]
        self._messages.append(assistant)
        if not calls and not errors:
            observation: list[Message] = [{"role": "user", "content": NO_CALL_REMINDER}]
            results: list[CallResult] = []
        else:
            submit_at = next((i for i, c in enumerate(calls) if c["function"]["name"] == "submit"), None)
            run, skipped = (calls, []) if submit_at is None else (calls[: submit_at + 1], calls[submit_at + 1 :])
            used = sum(r.error not in ("limit", "parse") for r in self._results)
            results = self.toolbox.run_turn(run, errors, used, id_prefix=prefix)
            results += [
                CallResult(c["id"], c["function"]["name"], "Error: not run: the task was submitted.", error="limit")
                for c in skipped
            ]
            self._results.extend(results)
            observation = [r.message() for r in results]
        self._messages.extend(observation)
        sandbox = self.handle.sandbox
        died = sandbox is not None and not sandbox.alive
        terminated = self.handle.submitted or died
        truncated = not terminated and self._turns >= (self.max_turns or self.task.max_turns)
        info = self._finish() if terminated or truncated else self._info()
        if results:
            info["turn_metrics"] = call_metrics(results)
        return [dict(m) for m in observation], 0.0, terminated, truncated, info  # type: ignore[misc]

    def _finish(self) -> dict[str, Any]:
        """End the episode: take the workspace out, kill the sandbox, run the verifier."""
        assert self.task is not None
        self._done = True
        archive: bytes | None = None
        sandbox = self.handle.sandbox
        start = time.perf_counter()
        if sandbox is not None:
            try:
                archive = sandbox.archive()
            except (WorkspaceError, ValueError):
                archive = None
        self._end_sandbox()
        self.report = report = verify(self.task, archive, self.handle.answer, self.verifier_limits)
        metrics = {
            "score": report.reward,
            "turns": float(self._turns),
            "submitted": float(self.handle.submitted),
            "workspace_lost": float(archive is None),
            "finish_seconds": time.perf_counter() - start,
            **report.metrics(),
            **call_metrics(self._results),
        }
        for r in self._results:
            if r.name:
                metrics[f"tool_calls/{r.name}"] = metrics.get(f"tool_calls/{r.name}", 0.0) + 1.0
        return {
            **self._info(),
            "outcome_reward": report.reward,
            "success": report.passed,
            "answer": self.handle.answer,
            "verifier": report.as_dict(),
            "metrics": metrics,
        }

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"task_id": self.task.task_id, "seed": self.seed, "max_turns": self.max_turns}

    def _end_sandbox(self) -> None:
        sandbox, self.handle.sandbox = self.handle.sandbox, None
        if sandbox is not None:
            sandbox.close()

    # ---- the expert ------------------------------------------------------------------------------
    def expert_action(self) -> Action | None:
        """The next call of ``task.expert`` as a tool-call message (one per turn), then ``submit``.
        None when the episode is over or the task has no scripted solution."""
        if self.task is None or self._done or not self.task.expert:
            return None
        expert = list(self.task.expert)
        if expert[-1].get("name") != "submit":
            expert.append({"name": "submit", "arguments": {}})
        if self._turns >= len(expert):
            return None
        step = expert[self._turns]
        call = {
            "id": f"call_{self._turns + 1}_0",
            "type": "function",
            "function": {"name": step["name"], "arguments": json.dumps(step.get("arguments", {}))},
        }
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    # ---- the rest --------------------------------------------------------------------------------
    def close(self) -> None:
        self._end_sandbox()
        self.spares.close()
        self._done = True
        super().close()

    def render(self) -> str | None:
        lines = []
        for m in self._messages:
            calls = "".join(
                f"\n  -> {c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", [])
            )
            lines.append(f"[{m['role']}] {m.get('content') or ''}{calls}")
        return "\n".join(lines) or None
