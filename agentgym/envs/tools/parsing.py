"""Find tool calls in a model's reply: Hermes-style text or OpenAI ``tool_calls``.

Pure and dependency-free (stdlib only) so the server can use it on generated text too.

Hermes style (Qwen, Hermes, many open models)::

    Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>

Calls inside ``<think>...</think>`` (or after an unclosed ``<think>``) are reasoning, not
calls, and stay in the content untouched.

Model output is unbounded and adversarial, so nothing here backtracks: tags are found with
``str.find`` and every step is linear in the reply's length; JSON nested too deeply to parse is
a malformed call, not a ``RecursionError``.
"""

from __future__ import annotations

import json
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FENCE = "```"
FORMAT_HINT = 'write each call as <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'


def _masked_spans(text: str) -> list[tuple[int, int]]:
    """The ``<think>...</think>`` spans of ``text`` in order (an unclosed one runs to the end)."""
    spans: list[tuple[int, int]] = []
    start = text.find(THINK_OPEN)
    while start != -1:
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end == -1:
            spans.append((start, len(text)))
            break
        spans.append((start, end + len(THINK_CLOSE)))
        start = text.find(THINK_OPEN, end + len(THINK_CLOSE))
    return spans


def load_json(text: str) -> Any:
    """``json.loads`` (raw newlines allowed in strings: models put them in code) that raises only
    ``ValueError`` saying what is wrong: also for nesting too deep for the parser's recursion."""
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at char {exc.pos}") from None
    except ValueError as exc:  # an integer over Python's 4300 digits
        raise ValueError(str(exc).split(";")[0]) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def make_tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call dict; ``arguments`` kept as JSON text (a dict is serialised). Raises
    ``ValueError`` when ``arguments`` cannot be written as JSON."""
    if isinstance(arguments, str):
        text = arguments
    else:
        try:
            text = json.dumps(arguments, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"arguments cannot be written as JSON ({type(exc).__name__})") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _unfence(body: str) -> str:
    """The JSON inside a Markdown code fence (```` ```json ... ``` ````), else ``body`` as it is."""
    if len(body) < 2 * len(FENCE) or not (body.startswith(FENCE) and body.endswith(FENCE)):
        return body
    inner = body[len(FENCE) : -len(FENCE)]
    return (inner[4:] if inner.startswith("json") else inner).strip()


def _parse_body(body: str) -> tuple[str, Any]:
    """``(name, arguments)`` from a call body; ValueError saying what is wrong."""
    try:
        obj = load_json(_unfence(body.strip()))
    except ValueError as exc:
        raise ValueError(f"invalid JSON ({exc})") from None
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
    span = 0  # spans before this one end before the search position
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    block = 0
    while True:
        start = text.find(OPEN, pos)
        while start != -1:
            while span < len(spans) and spans[span][1] <= start:
                span += 1
            if span == len(spans) or start < spans[span][0]:
                break
            start = text.find(OPEN, spans[span][1])  # skip the whole <think> span
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
            name, arguments = _parse_body(text[start + len(OPEN) : end])
            calls.append(make_tool_call(f"{id_prefix}{len(calls)}", name, arguments))
        except ValueError as exc:
            errors.append(f"tool call {block}: {exc}; {FORMAT_HINT}")
        pos = end + len(CLOSE)
    return "".join(kept).strip(), calls, errors


def normalize_tool_calls(raw: Any, id_prefix: str = "call_") -> tuple[list[dict[str, Any]], list[str]]:
    """OpenAI ``tool_calls`` from a message, checked: ``(calls, errors)``. A call whose id is not a
    non-empty string gets ``f"{id_prefix}{i}"``; dict arguments are serialised to JSON text (arguments
    that cannot be are an error). Never raises."""
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    if not isinstance(raw, list):
        return [], [f"tool_calls must be a list, got {type(raw).__name__}"]
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            errors.append(
                f"tool call {i + 1}: expected {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}"
            )
            continue
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"{id_prefix}{i}"
        arguments = function.get("arguments")
        try:
            calls.append(make_tool_call(call_id, name, {} if arguments is None else arguments))
        except ValueError as exc:
            errors.append(f"tool call {i + 1} ({name[:40]!r}): {exc}")
    return calls, errors
