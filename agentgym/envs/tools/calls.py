"""``Toolbox``: run a turn's tool calls against a set of tools, within limits, never raising.

Every failure — a malformed call, an unknown tool, arguments that are not a JSON object, a
tool that raises, times out or is over the per-turn / per-episode budget — becomes a ``tool``
message telling the model what went wrong, and is counted in the metrics.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.envs.base import reply_text
from agentgym.envs.tools.base import Tool, ToolError
from agentgym.envs.tools.parsing import load_json, normalize_tool_calls, parse_tool_calls
from agentgym.types import Action, Message


@dataclass
class CallResult:
    """The outcome of one tool call, as sent back to the model and logged."""

    call_id: str
    name: str
    text: str
    reward: float = 0.0
    error: str | None = None  # kind: "unknown_tool", "bad_arguments", "tool_error", "timeout", "limit", "parse", ...
    seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def message(self) -> Message:
        """The ``tool`` role message carrying this result."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.text}


def split_reply(action: Action, id_prefix: str = "call_") -> tuple[str, list[dict[str, Any]], list[str]]:
    """``(content, tool_calls, errors)`` of an assistant reply: its native OpenAI ``tool_calls`` if
    it is a message dict that has them, else Hermes-style calls parsed from its text."""
    if isinstance(action, dict) and action.get("tool_calls"):
        calls, errors = normalize_tool_calls(action["tool_calls"], id_prefix)
        return reply_text(action), calls, errors
    return parse_tool_calls(reply_text(action), id_prefix)


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, saying how much was left out."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... [truncated: {len(text) - max_chars} more characters]"


def _call_parts(call: Any) -> tuple[str, str, Any]:
    """``(id, name, raw arguments)`` of an OpenAI tool call, whatever shape it came in (an id or a
    name that is not a string counts as missing)."""
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    call_id = call.get("id") if isinstance(call, dict) else None
    name = function.get("name")
    return (
        call_id if isinstance(call_id, str) and call_id else "call",
        name if isinstance(name, str) else "",
        function.get("arguments"),
    )


def _run_with_timeout(
    tool: Tool, arguments: dict[str, Any], timeout_s: float | None
) -> tuple[str, float, dict[str, float]]:
    """``tool.execute(arguments)``, on a daemon thread when ``timeout_s`` is set (a stuck tool is
    abandoned, not killed: tools that run code must enforce their own limits, as PythonTool does)."""
    if timeout_s is None:
        return tool.execute(arguments)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = tool.execute(arguments)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{tool.name} did not finish within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


class Toolbox:
    """Named tools plus the limits a conversation runs them under."""

    def __init__(
        self,
        tools: Sequence[Tool] | Mapping[str, Tool],
        max_calls_per_turn: int = 4,
        max_calls_per_episode: int = 16,
        max_output_chars: int = 4000,
        call_timeout_s: float | None = 60.0,
    ) -> None:
        self.tools: dict[str, Tool] = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
        self.max_calls_per_turn = max_calls_per_turn
        self.max_calls_per_episode = max_calls_per_episode
        self.max_output_chars = max_output_chars
        self.call_timeout_s = call_timeout_s

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas of every tool (for ``info["tools"]`` and the chat template)."""
        return [tool.schema for tool in self.tools.values()]

    def execute(self, call: dict[str, Any]) -> CallResult:
        """Run one OpenAI-format tool call. Never raises: failures come back as error results."""
        call_id, name, raw = _call_parts(call)
        tool = self.tools.get(name)
        if tool is None:
            return CallResult(
                call_id,
                name,
                f"Error: unknown tool {name[:80]!r}. Available tools: {', '.join(self.tools) or 'none'}.",
                error="unknown_tool",
            )
        try:
            arguments = load_json(raw) if isinstance(raw, str) else raw
            if arguments is None:
                arguments = {}
        except ValueError as exc:
            return CallResult(
                call_id,
                name,
                f"Error: the arguments of {name} are not valid JSON ({exc}); pass a JSON object.",
                error="bad_arguments",
            )
        if not isinstance(arguments, dict):
            return CallResult(
                call_id,
                name,
                f"Error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}.",
                error="bad_arguments",
            )
        start = time.perf_counter()
        try:
            text, reward, metrics = _run_with_timeout(tool, arguments, self.call_timeout_s)
            result = CallResult(call_id, name, str(text), float(reward), None, metrics=dict(metrics or {}))
        except ToolError as exc:
            result = CallResult(call_id, name, f"Error: {exc}", error=exc.kind, metrics=exc.metrics)
        except TimeoutError as exc:
            result = CallResult(call_id, name, f"Error: {exc}", error="timeout")
        except Exception as exc:  # a crash inside the tool: the model hears about it, the episode goes on
            result = CallResult(call_id, name, f"Error: {name} failed: {type(exc).__name__}: {exc}", error="tool_error")
        result.seconds = time.perf_counter() - start
        result.text = truncate(result.text, self.max_output_chars)
        return result

    def run_turn(
        self, calls: list[dict[str, Any]], errors: list[str], used: int, id_prefix: str = "call_"
    ) -> list[CallResult]:
        """Results for one assistant turn, in order: each parse error, then each call (calls past
        ``max_calls_per_turn`` or the episode budget — ``used`` calls so far — are refused)."""
        results = [
            CallResult(f"{id_prefix}error{i}", "", f"Error: {err}", error="parse") for i, err in enumerate(errors)
        ]
        for i, call in enumerate(calls):
            if i >= self.max_calls_per_turn:
                results.append(self._refused(call, f"at most {self.max_calls_per_turn} tool calls per turn"))
            elif used >= self.max_calls_per_episode:
                results.append(
                    self._refused(call, f"the budget of {self.max_calls_per_episode} tool calls is used up; answer now")
                )
            else:
                results.append(self.execute(call))
                used += 1
        return results

    @staticmethod
    def _refused(call: dict[str, Any], why: str) -> CallResult:
        call_id, name, _ = _call_parts(call)
        return CallResult(call_id, name, f"Error: not run: {why}.", error="limit")

    def close(self) -> None:
        for tool in self.tools.values():
            tool.close()


def call_metrics(results: list[CallResult]) -> dict[str, float]:
    """Counts for logging: ``tool_calls``, ``tool_errors`` and ``tool_errors/<kind>``."""
    metrics: dict[str, float] = {
        "tool_calls": float(len(results)),
        "tool_errors": float(sum(not r.ok for r in results)),
    }
    for r in results:
        if r.error:
            metrics[f"tool_errors/{r.error}"] = metrics.get(f"tool_errors/{r.error}", 0.0) + 1.0
    return metrics
