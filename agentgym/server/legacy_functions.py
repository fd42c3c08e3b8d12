"""OpenAI's legacy function calling (``functions`` / ``function_call``), as older agent code sends it.

Before ``tools`` (June 2023 to the end of 2023) a chat request listed ``functions`` (each ``{"name",
"description", "parameters"}``) and chose with ``function_call`` (``"none"``, ``"auto"`` or
``{"name": ...}``); the reply carried at most one call as ``message.function_call`` ``{"name",
"arguments"}`` with ``finish_reason`` ``"function_call"``, and the conversation sent it back as an
assistant message with ``function_call`` followed by a ``{"role": "function", "name", "content"}``
message holding the result.

Here a legacy request is read as the same request in today's words (``legacy_request``: ``functions``
-> ``tools``, ``function_call`` -> ``tool_choice``, one call per reply), its history too
(``legacy_messages``: an assistant ``function_call`` -> one ``tool_calls`` entry, a ``function``
message -> a ``tool`` message answering it), so the chat template, the constraint and the gateway's
recording are the ones of a tools request; only the reply is given back in the legacy shape
(``legacy_reply``). Nothing is dropped: a request that mixes the two vocabularies is a 400.
"""

from __future__ import annotations

import re
from typing import Any

from agentgym.client.structured import ConstraintError

FUNCTION_CALL_FINISH = "function_call"


def legacy_request(fields: dict[str, Any]) -> dict[str, Any] | None:
    """``{"tools", "tool_choice", "parallel_tool_calls"}`` for a request that uses ``functions`` /
    ``function_call`` (None when it uses neither), or a ``ConstraintError`` naming the field."""
    functions, choice = fields.get("functions"), fields.get("function_call")
    if functions is None and choice is None:
        return None
    if functions is None:
        raise ConstraintError("function_call is only allowed when functions are given", "function_call")
    if fields.get("tools") is not None or fields.get("tool_choice") is not None:
        raise ConstraintError(
            "give tools/tool_choice or the legacy functions/function_call, not both (functions are tools of "
            'type "function": move each into tools as {"type": "function", "function": {...}})',
            "functions",
        )
    if not isinstance(functions, list) or not functions:
        raise ConstraintError("functions must be a non-empty list of function definitions", "functions")
    for i, f in enumerate(functions):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ConstraintError(f'functions[{i}] must be {{"name": ..., "parameters": {{...}}}}', "functions")
    if choice is None or choice in ("none", "auto"):
        tool_choice: Any = choice
    elif isinstance(choice, dict) and isinstance(choice.get("name"), str) and set(choice) == {"name"}:
        tool_choice = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise ConstraintError('function_call must be "none", "auto" or {"name": <one of functions>}', "function_call")
    return {
        "tools": [{"type": "function", "function": f} for f in functions],
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,  # a legacy reply holds one call
    }


LEGACY_PARAMS = {"tools": "functions", "tool_choice": "function_call"}
_TODAYS_WORDS = re.compile(r"tools\[(\d+)\]\.function\.|\btool_choice\b|\btools\b")


def legacy_error(exc: ConstraintError) -> ConstraintError:
    """A constraint error about ``tools``/``tool_choice`` in the words of the legacy request they came
    from (``functions``/``function_call``), so the 400 names the field the client sent."""
    if exc.param not in LEGACY_PARAMS:
        return exc

    def legacy(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return f"functions[{m.group(1)}]."
        return LEGACY_PARAMS[m.group(0)]

    return ConstraintError(_TODAYS_WORDS.sub(legacy, str(exc)), LEGACY_PARAMS[exc.param])


def legacy_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history with legacy function calls as tool calls: an assistant message's ``function_call``
    becomes its one ``tool_calls`` entry (id ``call_fn_<position>``), a ``function`` message a
    ``tool`` message answering the latest such call. Ids are positional, so the same history always
    converts to the same messages (the gateway matches a session's history message by message)."""
    out, last_id = [], None
    for i, m in enumerate(messages):
        call = m.get("function_call")
        if m.get("role") == "assistant" and call is not None:
            if m.get("tool_calls"):
                raise ConstraintError(f"messages[{i}] has both function_call and tool_calls; send one", "messages")
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ConstraintError(f'messages[{i}].function_call must be {{"name", "arguments"}}', "messages")
            arguments = call.get("arguments")
            if not isinstance(arguments, (str, dict, type(None))):
                raise ConstraintError(f"messages[{i}].function_call.arguments must be a JSON string", "messages")
            last_id = f"call_fn_{i}"
            m = {k: v for k, v in m.items() if k != "function_call"}
            m["tool_calls"] = [
                {"id": last_id, "type": "function", "function": {"name": call["name"], "arguments": arguments or "{}"}}
            ]
        elif m.get("role") == "function":
            m = {**m, "role": "tool", "tool_call_id": last_id or f"call_fn_{i}"}
        out.append(m)
    return out


def legacy_reply(
    content: str | None, calls: list[dict[str, Any]], finish_reason: str
) -> tuple[str | None, dict[str, Any] | None, list[dict[str, Any]], str]:
    """``(content, function_call, tool_calls, finish_reason)`` of a reply to a legacy request: the
    call as ``function_call`` and ``finish_reason`` ``function_call`` (``length`` stays: a call cut
    by ``max_tokens``). A model that wrote more than one call (possible only under ``auto``, where
    nothing holds it to one) has the first as ``function_call`` and all of them in ``tool_calls``
    too: none is dropped."""
    if not calls:
        return content, None, [], finish_reason
    function_call = dict(calls[0]["function"])
    finish = FUNCTION_CALL_FINISH if finish_reason in ("tool_calls", "stop") else finish_reason
    return content, function_call, (calls if len(calls) > 1 else []), finish
