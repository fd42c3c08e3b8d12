"""Hermes-style tool calls in generated text -> OpenAI ``tool_calls``, for the server's responses.

The model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5 and
Hermes templates); the server returns each as ``{"id", "type": "function", "function":
{"name", "arguments": <JSON text>}}`` and the text outside the blocks as ``content``.

The parsing itself is ``agentgym.envs.tools.parsing.parse_tool_calls`` (one parser for envs
and server: calls inside ``<think>`` are not calls, fenced JSON is accepted). What this
module adds is the server's policy: ids unique per response; when no block parses, the
whole text stays the content (as vLLM's Hermes parser does), so nothing the model wrote
disappears from the answer. A call cut by ``max_tokens`` (a ``<tool_call>`` never closed, finish
``length``) is returned as a call whose ``arguments`` are the JSON text written so far, with
``finish_reason`` ``length``, as vLLM returns a cut forced call; its name must be complete, else
the text stays the content.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from agentgym.client.structured import TOOL_CALL_BEGIN
from agentgym.envs.tools.parsing import CLOSE as TOOL_CALL_CLOSE
from agentgym.envs.tools.parsing import OPEN as TOOL_CALL_OPEN
from agentgym.envs.tools.parsing import THINK_CLOSE, THINK_OPEN
from agentgym.envs.tools.parsing import parse_tool_calls as _parse

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "assistant_reply",
    "cut_tool_call",
    "forced_tool_names",
    "is_cut",
    "parse_tool_calls",
]

CUT_SUFFIX = "_cut"  # the id of a call cut by max_tokens ends so (cut_tool_call)


def is_cut(call: dict[str, Any]) -> bool:
    """Whether a chat tool call is one ``cut_tool_call`` made of a ``<tool_call>`` never closed."""
    return str(call.get("id") or "").endswith(CUT_SUFFIX)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]], list[str]]:
    """``(content, tool_calls, errors)``: the content (``None`` when empty), the well-formed calls
    in OpenAI's shape, one message per malformed block. With no well-formed call, ``content``
    is the whole text."""
    content, calls, errors = _parse(text, id_prefix=f"call_{uuid.uuid4().hex[:16]}_")
    if not calls:
        return (text if text.strip() else None), [], errors
    return (content or None), calls, errors


_CUT_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*(?:,\s*"arguments"\s*:\s*)?')


def forced_tool_names(constraint: dict[str, Any] | None) -> list[str] | None:
    """The tools a request's constraint (``agentgym.client.structured``) holds its calls to (a forced
    call, or the union with JSON once ``<tool_call>`` is written), None when nothing does."""
    if not constraint or constraint.get("type") != "tool_calls":
        return None
    return [t["name"] for t in constraint["tools"]]


def cut_tool_call(text: str, forced: list[str] | None = None) -> tuple[str, dict[str, Any] | None]:
    """``(text before it, call)`` for a ``<tool_call>`` at the end of ``text`` that is never closed
    (the reply ran out of tokens inside it), the call's ``arguments`` being the JSON text written
    so far; ``(text, None)`` when there is no such block or its name is not complete. ``forced``: the
    tools a grammar held the call to (``forced_tool_names``), which wrote it exactly as
    ``TOOL_CALL_BEGIN``: a name cut short is then the one tool it can still become, if only one.
    A block inside an unclosed ``<think>`` is reasoning, not a call."""
    start = text.rfind(TOOL_CALL_OPEN)
    if (
        start == -1
        or text.find(TOOL_CALL_CLOSE, start) != -1
        or text.rfind(THINK_OPEN, 0, start) > text.rfind(THINK_CLOSE, 0, start)
    ):
        return text, None
    body = text[start + len(TOOL_CALL_OPEN) :]
    name, arguments = None, ""
    head = _CUT_HEAD.match(body)
    if head is not None:
        try:
            name = json.loads(head.group(1))
        except ValueError:
            return text, None
        arguments = body[head.end() :] if head.group(0).rstrip().endswith(":") else ""
    elif forced:
        heads = {n: (TOOL_CALL_BEGIN % json.dumps(n, ensure_ascii=False))[len(TOOL_CALL_OPEN) :] for n in forced}
        possible = [n for n, h in heads.items() if h.startswith(body)]
        name = possible[0] if len(possible) == 1 else None
    if name is None:
        return text, None
    call = {
        "id": f"call_{uuid.uuid4().hex[:16]}{CUT_SUFFIX}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return text[:start], call


def assistant_reply(
    text: str, finish_reason: str, parse_tools: bool, forced: list[str] | None = None
) -> tuple[str | None, list[dict[str, Any]], str]:
    """``(content, tool_calls, finish_reason)`` of the assistant message for generated ``text``: with
    tools, Hermes blocks become ``tool_calls`` and a ``stop`` finish becomes ``tool_calls``;
    malformed blocks stay in the content; a call cut by ``max_tokens`` is the last call, with its
    arguments as far as they were written, and the finish stays ``length`` (``forced``: see
    ``cut_tool_call``). Without tools the text is the content, as it is."""
    if not parse_tools:
        return text, [], finish_reason
    cut = None
    if finish_reason == "length":
        text, cut = cut_tool_call(text, forced)
    content, calls, _ = parse_tool_calls(text)
    if cut is not None:
        return content, [*calls, cut], finish_reason
    return content, calls, "tool_calls" if calls and finish_reason == "stop" else finish_reason
