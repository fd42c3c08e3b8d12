"""OpenAI's Responses API over the chat path: the one place that turns a Responses request into a chat
completion request (``chat_request``) and a chat completion, whole or streamed, into a Responses
result (``ResponseBuilder``, ``response_from_chat``, ``stream_events``). The policy server
(``add_route``: ``POST /v1/responses``) and the gateway (``agentgym.gateway.responses``) both use it, so
a Responses call samples, constrains and (in the gateway) records exactly as a chat completion does.

Input items become chat messages: ``message`` items keep their role (text parts joined), a
``function_call`` joins the assistant message before it as a ``tool_calls`` entry whose id is the
``call_id``, a ``function_call_output`` is a ``tool`` message. The reply comes back as output items:
a ``message`` with one ``output_text`` part (the reply's content) and one ``function_call`` item per
tool call (``call_id`` = the chat tool call's id). A reply cut by ``max_output_tokens`` is
``status: "incomplete"`` with ``incomplete_details.reason: "max_output_tokens"``.

Streamed, the events are OpenAI's, each with its ``sequence_number``: ``response.created``,
``response.in_progress``; for text ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``..., ``response.output_text.done``, ``response.content_part.done``,
``response.output_item.done``; for each call ``response.output_item.added``,
``response.function_call_arguments.delta``, ``response.function_call_arguments.done``,
``response.output_item.done``; then ``response.completed`` (or ``response.incomplete``) with the
whole response. An error after the first event is an ``error`` event.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from agentgym.server.errors import APIError, validate
from agentgym.server.openai_types import MEDIA_PARTS, ChatCompletionRequest
from agentgym.server.responses_types import (
    FunctionCallItem,
    IncompleteDetails,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from agentgym.server.streaming import until_disconnect
from agentgym.server.tool_calls import is_cut

TEXT_PARTS = ("input_text", "output_text", "text")
CHAT_TO_RESPONSES = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}
"""The Responses field a chat request's field came from, for the ``param`` of an error."""


# ---- request: Responses -> chat ------------------------------------------------------------------
def _text(content: Any, where: str) -> str:
    """A message's or a tool output's content (a string or text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in MEDIA_PARTS:
            raise APIError(
                400, f"{where}[{k}] is an {kind} part, but this model reads text only; send text parts", param=where
            )
        else:
            raise APIError(
                400, f"{where}[{k}] must be an input_text or output_text part with a string text", param=where
            )
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a Responses ``input`` (without ``instructions``)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"{where} must be an item object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{where}.role must be user, system, developer or assistant", param=where)
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise APIError(400, f"{where}: a function_call needs call_id, name and arguments strings", param=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if messages and messages[-1]["role"] == "assistant":  # the reply this call came with
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, f"{where}: a function_call_output needs its call_id", param=where)
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(output, f"{where}.output")}
            )
        elif kind == "item_reference":
            raise APIError(
                400, f"{where}: item_reference needs stored items, which this API keeps none of; send the item itself"
            )
        else:
            raise APIError(
                400,
                f"{where} is a {kind!r} item; the items served here are message, function_call and "
                "function_call_output (no reasoning or hosted-tool items)",
                param=where,
            )
    return messages


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise APIError(
                400,
                f"tools[{i}] is a {kind!r} tool; only function tools (type function, with a name) are served: "
                "hosted tools do not run here, declare a function and run it in your agent",
                param=f"tools[{i}]",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(
        400,
        f"tool_choice {choice!r} is not served: use none, auto, required or "
        '{"type": "function", "name": "<one of your function tools>"}',
        param="tool_choice",
    )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as the chat path's ``response_format``."""
    fmt = (text or {}).get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise APIError(400, "text.format must be of type text, json_object or json_schema", param="text.format")


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The chat completion request a Responses request is served as: ``instructions`` as the system
    message, then ``history`` (a previous response's conversation), then the input's messages. Under a
    forced tool call (``tool_choice`` required or named) ``text.format`` is not passed on: the reply is
    the call, no text, as with OpenAI (the Agents SDK sends both when an agent with an ``output_type``
    must call a tool)."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + list(history or [])
    messages += input_messages(req.input)
    if not messages:
        raise APIError(400, "input holds no message", param="input")
    forced = req.tool_choice == "required" or isinstance(req.tool_choice, dict)
    data = {
        "model": req.model,
        "messages": messages,
        "tools": _tools(req.tools),
        "tool_choice": _tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        # a forced tool call writes no text: text.format has nothing to shape (the chat path refuses both)
        "response_format": None if forced and req.tools else _response_format(req.text),
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "seed": req.seed,
        "logprobs": req.logprobs,
        "top_logprobs": req.top_logprobs if req.logprobs else None,
        "stream": req.stream,
        "stream_options": {"include_usage": True} if req.stream else None,
        "user": req.user,
    }
    try:
        return validate(ChatCompletionRequest, {k: v for k, v in data.items() if v is not None})
    except APIError as exc:  # name the Responses field the agent sent
        head = (exc.param or "").split(".")[0].split("[")[0]
        exc.param = CHAT_TO_RESPONSES.get(head, exc.param)
        raise


# ---- result: chat -> Responses ------------------------------------------------------------------
class ResponseBuilder:
    """A Responses result built up from a chat completion, whole or chunk by chunk; every step returns
    the stream events it makes (a whole response ignores them)."""

    def __init__(self, req: ResponsesRequest, store: bool = False) -> None:
        self.response = ResponseObject(
            model=req.model or "default",
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            reasoning=req.reasoning,
            store=store,
            temperature=req.temperature,
            text=req.text or {"format": {"type": "text"}},
            tool_choice=req.tool_choice or "auto",
            tools=list(req.tools or []),
            top_p=req.top_p,
            truncation=req.truncation or "disabled",
            user=req.user,
            metadata=req.metadata or {},
        )
        self.sequence = 0
        self.message: OutputMessage | None = None  # the message item being written
        self.pending_logprobs: list[dict[str, Any]] = []
        self.started = False

    @property
    def id(self) -> str:
        return self.response.id

    def event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def _snapshot(self) -> dict[str, Any]:
        return self.response.model_dump(exclude_none=True)

    def start(self, model: str | None = None) -> list[str]:
        if self.started:
            return []
        self.started = True
        if model:
            self.response.model = model
        return [
            self.event("response.created", response=self._snapshot()),
            self.event("response.in_progress", response=self._snapshot()),
        ]

    def text(self, delta: str, logprobs: list[dict[str, Any]] | None = None) -> list[str]:
        """Reply text (and its tokens' logprobs). Logprobs of tokens that wrote no text yet wait for the
        text; a reply that is only tool calls has no message item (nor logprobs: OpenAI gives none for
        function calls)."""
        if self.message is None and not delta:
            self.pending_logprobs += logprobs or []
            return []
        if logprobs is not None and self.pending_logprobs:
            logprobs, self.pending_logprobs = self.pending_logprobs + logprobs, []
        if not delta and not logprobs:
            return []
        out = []
        if self.message is None:
            self.message = OutputMessage()
            self.response.output.append(self.message)
            index = len(self.response.output) - 1
            out.append(self.event("response.output_item.added", output_index=index, item=self.message.model_dump()))
            self.message.content.append(OutputText(logprobs=[] if logprobs is not None else None))
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=self.message.id,
                    output_index=index,
                    content_index=0,
                    part=self.message.content[0].model_dump(exclude_none=True),
                )
            )
        part = self.message.content[0]
        part.text += delta
        if logprobs is not None:
            part.logprobs = (part.logprobs or []) + logprobs
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=self.message.id,
                output_index=self.response.output.index(self.message),
                content_index=0,
                delta=delta,
                logprobs=_delta_logprobs(logprobs or []),
            )
        )
        return out

    def _close_message(self, status: str) -> list[str]:
        message, self.message = self.message, None
        if message is None:
            return []
        index, part = self.response.output.index(message), message.content[0]
        message.status = status  # type: ignore[assignment]
        ids = {"item_id": message.id, "output_index": index, "content_index": 0}
        return [
            self.event("response.output_text.done", **ids, text=part.text, logprobs=_delta_logprobs(part.logprobs)),
            self.event("response.content_part.done", **ids, part=part.model_dump(exclude_none=True)),
            self.event("response.output_item.done", output_index=index, item=message.model_dump(exclude_none=True)),
        ]

    def calls(self, calls: list[dict[str, Any]]) -> list[str]:
        """Chat ``tool_calls`` (whole: the chat path parses them once the reply ends) as function_call items."""
        if not calls:
            return []
        out = self._close_message("completed")
        for call in calls:
            function = call.get("function") or {}
            item = FunctionCallItem(call_id=call.get("id") or "", name=function.get("name") or "")
            self.response.output.append(item)
            index = len(self.response.output) - 1
            out.append(self.event("response.output_item.added", output_index=index, item=item.model_dump()))
            item.arguments = function.get("arguments") or ""
            item.status = "incomplete" if is_cut(call) else "completed"  # cut by max_output_tokens
            ids = {"item_id": item.id, "output_index": index}
            out += [
                self.event("response.function_call_arguments.delta", **ids, delta=item.arguments),
                self.event("response.function_call_arguments.done", **ids, name=item.name, arguments=item.arguments),
                self.event("response.output_item.done", output_index=index, item=item.model_dump()),
            ]
        return out

    def finish(self, finish_reason: str | None, usage: dict[str, Any] | None, weight_version: int | None) -> list[str]:
        """The response's end: ``response.completed``, or ``response.incomplete`` for a reply cut at
        ``max_output_tokens``."""
        cut = finish_reason == "length"
        out = self._close_message("incomplete" if cut else "completed")
        r = self.response
        r.status = "incomplete" if cut else "completed"
        r.incomplete_details = IncompleteDetails(reason="max_output_tokens") if cut else None
        r.weight_version = weight_version
        if usage is not None:
            r.usage = ResponseUsage(
                input_tokens=usage.get("prompt_tokens", 0),
                output_tokens=usage.get("completion_tokens", 0),
                total_tokens=usage.get("total_tokens", 0),
            )
        out.append(self.event("response.incomplete" if cut else "response.completed", response=self._snapshot()))
        return out

    def error(self, error: dict[str, Any]) -> str:
        return self.event(
            "error", code=error.get("code"), message=error.get("message") or "error", param=error.get("param")
        )

    def reply(self) -> dict[str, Any]:
        """The response's output as the assistant chat message it was sampled as (for a later
        ``previous_response_id``)."""
        text = "".join(p.text for m in self.response.output if isinstance(m, OutputMessage) for p in m.content)
        calls = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in self.response.output
            if isinstance(c, FunctionCallItem)
        ]
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            reply["tool_calls"] = calls
        return reply


def _delta_logprobs(logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        {
            "token": lp["token"],
            "logprob": lp["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in lp.get("top_logprobs") or []],
        }
        for lp in logprobs or []
    ]


def response_from_chat(chat: dict[str, Any], builder: ResponseBuilder) -> ResponseObject:
    """A whole chat completion (``n`` = 1) as the Responses result."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    builder.start(chat.get("model"))
    logprobs = (choice.get("logprobs") or {}).get("content")
    builder.text(message.get("content") or "", logprobs)
    builder.calls(message.get("tool_calls") or [])
    builder.finish(choice.get("finish_reason"), chat.get("usage"), chat.get("weight_version"))
    return builder.response


def _sse_data(raw: str | bytes) -> list[str]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


async def stream_events(chunks: AsyncIterator[Any], builder: ResponseBuilder) -> AsyncIterator[str]:
    """A chat completion's SSE chunks (``stream_options.include_usage``) as Responses events. The
    chunks are read to their end (the gateway records a turn after its last chunk), and closed if the
    client leaves first (the server stops sampling)."""
    finish, usage, version = None, None, None
    try:
        async for raw in chunks:
            for data in _sse_data(raw):
                if data.strip() == "[DONE]":
                    for event in builder.finish(finish, usage, version):
                        yield event
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    yield builder.error(chunk["error"] or {})
                    continue
                for event in builder.start(chunk.get("model")):
                    yield event
                version = chunk.get("weight_version", version)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    logprobs = (choice.get("logprobs") or {}).get("content") if choice.get("logprobs") else None
                    for event in builder.text(delta.get("content") or "", logprobs):
                        yield event
                    for event in builder.calls(delta.get("tool_calls") or []):
                        yield event
                    finish = choice.get("finish_reason") or finish
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


def event_stream(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def respond(result: Any, builder: ResponseBuilder) -> Any:
    """``result`` (the chat path's answer: its JSON, or a streamed answer) as the Responses answer."""
    if isinstance(result, StreamingResponse):
        return event_stream(stream_events(result.body_iterator, builder))
    return response_from_chat(result, builder).model_dump(exclude_none=True)


# ---- the policy server's route --------------------------------------------------------------------
def add_route(
    app: FastAPI, parse: Callable[[Request, type], Awaitable[Any]], chat: Callable[[ChatCompletionRequest], Any]
) -> None:
    """``POST /v1/responses`` on the policy server, served by its chat path ``chat``."""

    async def serve(req: ResponsesRequest) -> Any:
        if req.previous_response_id is not None:
            raise APIError(
                400,
                "the policy server keeps no responses, so previous_response_id cannot be resolved here: send "
                "the whole conversation as input (the OpenAI Agents SDK does by default), or talk through the "
                "gateway, which resolves previous_response_id within a session",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        builder = ResponseBuilder(req)
        return respond(await chat(chat_request(req)), builder)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        return await until_disconnect(request.receive, serve(await parse(request, ResponsesRequest)))
