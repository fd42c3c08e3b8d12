"""Hermes-style tool calls in generated text -> OpenAI ``tool_calls``, for the server's responses.

The model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5 and
Hermes templates); the server returns each as ``{"id", "type": "function", "function":
{"name", "arguments": <JSON text>}}`` and the text outside the blocks as ``content``.

The parsing itself is ``agentgym.envs.tools.parsing.parse_tool_calls`` (one parser for envs
and server: calls inside ``<think>`` are not calls, fenced JSON is accepted). What this
module adds is the server's policy: ids unique per response; when no block parses, the
whole text stays the content (as vLLM's Hermes parser does), so nothing the model wrote
disappears from the answer.
"""

from __future__ import annotations

import uuid
from typing import Any

from agentgym.envs.tools.parsing import CLOSE as TOOL_CALL_CLOSE
from agentgym.envs.tools.parsing import OPEN as TOOL_CALL_OPEN
from agentgym.envs.tools.parsing import parse_tool_calls as _parse

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "assistant_reply", "parse_tool_calls"]


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]], list[str]]:
    """``(content, tool_calls, errors)``: the content (``None`` when empty), the well-formed calls
    in OpenAI's shape, one message per malformed block. With no well-formed call, ``content``
    is the whole text."""
    content, calls, errors = _parse(text, id_prefix=f"call_{uuid.uuid4().hex[:16]}_")
    if not calls:
        return (text if text.strip() else None), [], errors
    return (content or None), calls, errors


def assistant_reply(text: str, finish_reason: str, parse_tools: bool) -> tuple[str | None, list[dict[str, Any]], str]:
    """``(content, tool_calls, finish_reason)`` of the assistant message for generated ``text``: with
    tools, Hermes blocks become ``tool_calls`` and a ``stop`` finish becomes ``tool_calls``;
    malformed blocks stay in the content. Without tools the text is the content, as it is."""
    if not parse_tools:
        return text, [], finish_reason
    content, calls, _ = parse_tool_calls(text)
    return content, calls, "tool_calls" if calls and finish_reason == "stop" else finish_reason
