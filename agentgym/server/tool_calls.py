"""Hermes-style tool calls in generated text -> OpenAI ``tool_calls``.

The model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5 and
Hermes templates); the server returns each as ``{"id", "type": "function", "function":
{"name", "arguments": <JSON text>}}`` and the text outside the blocks as ``content``.

TODO(dedup): ``agentgym/envs/tools/parsing.py`` (envs) parses the same format for envs;
once both settle, one should call the other.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]], list[str]]:
    """``(content, tool_calls, errors)``: the text outside tool-call blocks (``None`` when only
    whitespace), the well-formed calls in OpenAI's shape, and one message per malformed block.

    An unclosed last block (generation stopped mid-call) is parsed if its JSON is complete.
    Malformed blocks stay in ``content`` so nothing the model wrote is lost.
    """
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        kept.append(text[pos:match.start()])
        pos = match.end()
        body = match.group(1)
        try:
            obj = json.loads(body)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ValueError('expected {"name": ..., "arguments": {...}}')
            args = obj.get("arguments", obj.get("parameters", {}))
            arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            errors.append(f"malformed tool call {body[:80]!r}: {exc}")
            kept.append(match.group(0))
            continue
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"], "arguments": arguments}})
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return (content or None), calls, errors
