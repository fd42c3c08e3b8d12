"""Structured output: what an OpenAI request asks the reply to be, and how each backend is told.

A request's ``tools`` + ``tool_choice`` and ``response_format`` become one *constraint*, a plain
JSON-able dict (it travels in ``SamplingParams.structured``, through the gateway and into
trajectories' call records):

* ``{"type": "json", "schema": {...}}``: one JSON value valid against the schema
  (``response_format`` ``json_schema``; ``json_object`` is the schema ``{"type": "object"}``);
* ``{"type": "tool_calls", "tools": [{"name", "parameters"}], "parallel": bool}``: one tool call
  (``parallel``: one or more, separated by a newline) in the Hermes format the chat template
  writes and ``agentgym.envs.tools.parsing`` reads, ``<tool_call>\\n{"name": "<name>",
  "arguments": <JSON valid against the tool's parameters>}\\n</tool_call>``, and nothing else
  (``tool_choice`` ``required``; a named ``tool_choice`` is the same with that one tool); with
  ``"or_json": schema`` (``response_format`` beside tools under ``tool_choice`` ``auto``): those
  calls or one JSON value valid against the schema;
* what a vLLM-style ``structured_outputs`` (or ``guided_*``) field asks, passed on:
  ``{"type": "structural_tag", "tag"}``, ``{"type": "regex", "regex"}``, ``{"type": "choice",
  "choices"}``, ``{"type": "grammar", "grammar"}`` (in the backend's own dialect).

How each backend is told (``backend_fields``):

* the embedded server and vLLM (>= 0.10.2): ``structured_outputs`` ``{"json": schema}`` or
  ``{"structural_tag": "<JSON text>"}``, tool calls in xgrammar's structural-tag format
  (``structural_tag``), which vLLM and SGLang compile with their own grammar backend and the
  embedded server with llguidance (``agentgym.server.grammar``);
* SGLang: ``sampling_params`` ``json_schema`` (a string) or ``structural_tag``.
"""

from __future__ import annotations

import json
import re
from typing import Any

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
TOOL_CALL_BEGIN = '<tool_call>\n{"name": %s, "arguments": '
TOOL_CALL_END = "}\n</tool_call>"
TOOL_CALL_SEPARATOR = "\n"
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class ConstraintError(ValueError):
    """A request whose constraint cannot be built; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# ---- from an OpenAI chat request -------------------------------------------------------------
def tool_function(tool: Any, where: str) -> dict[str, Any]:
    """``{"name", "parameters"}`` of one entry of ``tools`` (OpenAI's ``{"type": "function",
    "function": {...}}``), or a ``ConstraintError``."""
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ConstraintError(
            f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}', "tools"
        )
    parameters = function.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ConstraintError(f"{where}.function.parameters must be a JSON schema object", "tools")
    return {"name": function["name"], "parameters": parameters}


def named_tool(tool_choice: Any) -> str | None:
    """The function a named ``tool_choice`` forces (None for the string choices)."""
    if not isinstance(tool_choice, dict):
        return None
    function = tool_choice.get("function")
    if (
        tool_choice.get("type") != "function"
        or not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
    ):
        raise ConstraintError('a named tool_choice is {"type": "function", "function": {"name": ...}}', "tool_choice")
    return function["name"]


def check_tool_choice(tools: list[dict[str, Any]] | None, tool_choice: Any) -> None:
    """OpenAI's rules: ``tool_choice`` needs ``tools``; a named function must be one of them."""
    if tool_choice is None:
        return
    if not tools:
        raise ConstraintError("tool_choice is only allowed when tools are given", "tool_choice")
    name = named_tool(tool_choice)
    if name is not None:
        names = [tool_function(t, f"tools[{i}]")["name"] for i, t in enumerate(tools)]
        if name not in names:
            raise ConstraintError(
                f"tool_choice names the function {name!r}, which is not in tools ({', '.join(map(repr, names))})",
                "tool_choice",
            )


def response_format_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema ``response_format`` asks for (None for ``text`` or no format)."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise ConstraintError(
            f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}", "response_format"
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(JSON_OBJECT_SCHEMA)
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
        raise ConstraintError(
            'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}', "response_format"
        )
    if schema is None:
        return dict(JSON_OBJECT_SCHEMA)
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("response_format.json_schema.schema must be a JSON schema object", "response_format")
    return schema if isinstance(schema, dict) else ({} if schema else {"not": {}})


def chat_constraint(
    tools: list[dict[str, Any]] | None, tool_choice: Any, parallel_tool_calls: bool | None, response_format: Any
) -> dict[str, Any] | None:
    """The constraint a chat request asks for (None: free text), or a ``ConstraintError``.

    ``tool_choice`` ``required`` or named: the tool calls, whatever ``response_format`` says (the
    tools win, as with OpenAI). ``response_format`` with tools under ``auto`` (or no
    ``tool_choice``): a tool call or the JSON (``or_json``), the union grammar vLLM's issue #39929
    proposes; with ``tool_choice`` ``none``: the JSON alone."""
    check_tool_choice(tools, tool_choice)
    schema = response_format_schema(response_format)
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    either = schema is not None and bool(tools) and tool_choice in (None, "auto")
    if not forced and not either:
        return {"type": "json", "schema": schema} if schema is not None else None
    functions = [tool_function(t, f"tools[{i}]") for i, t in enumerate(tools or [])]
    name = named_tool(tool_choice)
    if name is not None:
        functions = [f for f in functions if f["name"] == name][:1]
    parallel = name is None and parallel_tool_calls is not False
    constraint = {"type": "tool_calls", "tools": functions, "parallel": parallel}
    if either:
        constraint["or_json"] = schema
    return constraint


# ---- for each backend ----------------------------------------------------------------------
def structural_tag(constraint: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_calls`` constraint in xgrammar's structural-tag format (vLLM, SGLang); with ``or_json``
    the calls are one branch of an ``or`` whose other is the JSON schema."""
    tags = [
        {
            "type": "tag",
            "begin": TOOL_CALL_BEGIN % json.dumps(t["name"], ensure_ascii=False),
            "content": {"type": "json_schema", "json_schema": t["parameters"]},
            "end": TOOL_CALL_END,
        }
        for t in constraint["tools"]
    ]
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": TOOL_CALL_SEPARATOR,
        "at_least_one": True,
        "stop_after_first": not constraint["parallel"],
    }
    if constraint.get("or_json") is None:
        return {"type": "structural_tag", "format": calls}
    json_reply = {"type": "json_schema", "json_schema": constraint["or_json"]}
    return {"type": "structural_tag", "format": {"type": "or", "elements": [calls, json_reply]}}


def backend_fields(constraint: dict[str, Any] | None, backend: str) -> dict[str, Any]:
    """What to add to a request for ``backend`` so that it samples within ``constraint``: top-level
    fields of ``/v1/completions`` (embedded, vllm) or ``sampling_params`` fields (sglang)."""
    if constraint is None:
        return {}
    kind = constraint["type"]
    if kind in ("tool_calls", "structural_tag"):
        tag = json.dumps(structural_tag(constraint) if kind == "tool_calls" else constraint["tag"])
        return {"structural_tag": tag} if backend == "sglang" else {"structured_outputs": {"structural_tag": tag}}
    if backend == "sglang":
        if kind == "json":
            return {"json_schema": json.dumps(constraint["schema"])}
        if kind == "choice":
            return {"regex": "|".join(re.escape(c) for c in constraint["choices"])}
        return {"ebnf": constraint["grammar"]} if kind == "grammar" else {"regex": constraint["regex"]}
    if kind == "json":
        return {"structured_outputs": {"json": constraint["schema"]}}
    return {"structured_outputs": {kind: constraint["choices"] if kind == "choice" else constraint[kind]}}


STRUCTURED_KEYS = ("json", "json_object", "structural_tag", "grammar", "regex", "choice")
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
"""vLLM's older names for ``structured_outputs``' keys (before 0.10.2), still sent by some clients."""


def structured_outputs_constraint(structured: Any) -> dict[str, Any] | None:
    """The constraint a vLLM-style ``structured_outputs`` object asks for (exactly one key of
    ``STRUCTURED_KEYS``): ``json`` -> ``json``; ``structural_tag``, ``grammar`` (in the backend's own
    dialect: Lark for llguidance), ``regex`` and ``choice`` are passed on as they are."""
    if structured is None:
        return None
    if not isinstance(structured, dict):
        raise ConstraintError("structured_outputs must be an object", "structured_outputs")
    given = [k for k in STRUCTURED_KEYS if structured.get(k) not in (None, False)]
    if len(given) != 1:
        raise ConstraintError(
            f"structured_outputs takes exactly one of {', '.join(STRUCTURED_KEYS)}", "structured_outputs"
        )
    key, value = given[0], structured[given[0]]
    if key in ("json", "json_object"):
        schema = JSON_OBJECT_SCHEMA if key == "json_object" else value
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ConstraintError(f"structured_outputs.json is not JSON: {exc}", "structured_outputs") from None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError("structured_outputs.json must be a JSON schema", "structured_outputs")
        return {"type": "json", "schema": schema if isinstance(schema, dict) else ({} if schema else {"not": {}})}
    if key == "structural_tag":
        tag = value
        if isinstance(tag, str):
            try:
                tag = json.loads(tag)
            except ValueError as exc:
                raise ConstraintError(
                    f"structured_outputs.structural_tag is not JSON: {exc}", "structured_outputs"
                ) from None
        if not isinstance(tag, dict):
            raise ConstraintError("structured_outputs.structural_tag must be an object", "structured_outputs")
        return {"type": "structural_tag", "tag": tag}
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise ConstraintError("structured_outputs.choice must be a non-empty list of strings", "structured_outputs")
        return {"type": "choice", "choices": list(value)}
    if not isinstance(value, str) or not value:
        raise ConstraintError(f"structured_outputs.{key} must be a non-empty string", "structured_outputs")
    return {"type": key, key: value}


def request_constraint(fields: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """The one constraint an OpenAI request asks for, from whichever fields it uses: ``tools`` +
    ``tool_choice`` and ``response_format`` (chat), ``response_format`` (completions, as vLLM
    takes it), ``structured_outputs`` or vLLM's older ``guided_*`` fields; two at once is an error."""
    structured = fields.get("structured_outputs")
    guided = {key: fields[name] for name, key in GUIDED_FIELDS.items() if fields.get(name) is not None}
    if guided:
        if structured is not None or len(guided) > 1:
            raise ConstraintError("give one of structured_outputs and the guided_* fields", "structured_outputs")
        structured = guided
    explicit = structured_outputs_constraint(structured)
    if chat:
        implied = chat_constraint(
            fields.get("tools"),
            fields.get("tool_choice"),
            fields.get("parallel_tool_calls"),
            fields.get("response_format"),
        )
    else:
        schema = response_format_schema(fields.get("response_format"))
        implied = {"type": "json", "schema": schema} if schema is not None else None
    if explicit is not None and implied is not None:
        raise ConstraintError(
            "structured_outputs and response_format/tool_choice both constrain the reply; ask for one of them",
            "structured_outputs",
        )
    return explicit or implied
