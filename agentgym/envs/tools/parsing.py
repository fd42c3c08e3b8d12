"""Find tool calls in a model's reply: Hermes-style text or OpenAI ``tool_calls``.

Pure and dependency-free (stdlib only) so the server can use it on generated text too.

Hermes style (Qwen, Hermes, many open models)::

    Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>

Calls inside ``<think>...</think>`` (or after an unclosed ``<think>``) are reasoning, not
calls, and stay in the content untouched.
"""

from __future__ import annotations

import json
import re
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_THINK_RE = re.compile(r"<think>.*?(?:</think>|\Z)", re.S)
_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
FORMAT_HINT = 'write each call as <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'


def _masked_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _THINK_RE.finditer(text)]


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(start <= pos < end for start, end in spans)


def make_tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call dict; ``arguments`` kept as JSON text (a dict is serialised)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _parse_body(body: str) -> tuple[str, Any]:
    """``(name, arguments)`` from a call body; ValueError saying what is wrong."""
    body = body.strip()
    fenced = _FENCE_RE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        obj = json.loads(body, strict=False)  # models often put raw newlines inside strings (code)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError('no "name"')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    return name, {} if arguments is None else arguments


def parse_tool_calls(text: str, id_prefix: str = "call_") -> tuple[str, list[dict[str, Any]], list[str]]:
    """Split Hermes-style tool calls out of ``text``.

    Returns ``(content, calls, errors)``: the text with every ``<tool_call>...</tool_call>`` block
    removed (stripped); the well-formed calls as OpenAI tool-call dicts with ids
    ``f"{id_prefix}{i}"``; and one message per malformed block (bad JSON, no name, unclosed tag).
    Never raises.
    """
    text = text or ""
    if OPEN not in text:
        return text.strip(), [], []
    spans = _masked_spans(text)
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    block = 0
    while True:
        start = text.find(OPEN, pos)
        while start != -1 and _inside(start, spans):
            start = text.find(OPEN, start + len(OPEN))
        if start == -1:
            kept.append(text[pos:])
            break
        kept.append(text[pos:start])
        block += 1
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1:
            errors.append(f"tool call {block}: {OPEN} is never closed with {CLOSE}; {FORMAT_HINT}")
            break
        try:
            name, arguments = _parse_body(text[start + len(OPEN):end])
            calls.append(make_tool_call(f"{id_prefix}{len(calls)}", name, arguments))
        except ValueError as exc:
            errors.append(f"tool call {block}: {exc}; {FORMAT_HINT}")
        pos = end + len(CLOSE)
    return "".join(kept).strip(), calls, errors


def normalize_tool_calls(raw: Any, id_prefix: str = "call_") -> tuple[list[dict[str, Any]], list[str]]:
    """OpenAI ``tool_calls`` from a message, checked: ``(calls, errors)``. A call missing its id gets
    ``f"{id_prefix}{i}"``; dict arguments are serialised to JSON text. Never raises."""
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    if not isinstance(raw, list):
        return [], [f"tool_calls must be a list, got {type(raw).__name__}"]
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            errors.append(f"tool call {i + 1}: expected {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}")
            continue
        call_id = item.get("id") or f"{id_prefix}{i}"
        arguments = function.get("arguments")
        calls.append(make_tool_call(str(call_id), name, {} if arguments is None else arguments))
    return calls, errors
