"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) over the chat
completions path.

One translation, used by the embedded server (``add_messages_route``) and the gateway
(``agentgym.gateway.messages``) alike: a Messages request becomes a chat request
(``chat_body``), the chat path renders, samples and (in the gateway) records it as any chat
completion, and its result becomes a Messages result (``anthropic_message``, or the event stream
``message_events`` turns a chat stream into). ``count_tokens`` renders the same chat request's
prompt (``prompt_body``: ``chat_body`` without the sampling fields) and answers ``{"input_tokens": N}``,
the ``usage.input_tokens`` the Messages call would report.

    system (text or text blocks)       -> a system message
    user text blocks                   -> a user message
    user tool_result blocks            -> tool messages (tool_call_id = tool_use_id; is_error: the
                                          content is prefixed "Error: ")
    assistant text / tool_use blocks   -> an assistant message with content / tool_calls
    a final assistant message          -> a prefill: the reply continues it (continue_final_message)
    tools[].input_schema               -> tools[].function.parameters
    tool_choice auto | any | tool | none -> auto | required | the named function | none
    disable_parallel_tool_use          -> parallel_tool_calls=false
    stop_sequences, max_tokens, temperature, top_p, top_k, metadata.user_id -> stop, max_tokens, ...
    output_config.format (or the beta's output_format) json_schema -> response_format json_schema

    finish stop / tool_calls / length  -> stop_reason end_turn (stop_sequence when one of the
                                          stop_sequences ended it, named in stop_sequence) /
                                          tool_use / max_tokens

Errors have Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, with the same
status codes as the chat path (400 invalid_request_error, 401 authentication_error, 403
permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error).
A streamed reply is the event sequence Anthropic sends: ``message_start``, ``ping``, per content
block ``content_block_start``, ``content_block_delta`` (``text_delta`` or ``input_json_delta``),
``content_block_stop``, then ``message_delta`` (``stop_reason``, ``stop_sequence``, ``usage``) and
``message_stop``; an error after the first event is an ``error`` event.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentgym.server.anthropic_types import (
    CountTokensRequest,
    CountTokensResponse,
    ErrorObject,
    ErrorResponse,
    MessagesRequest,
    MessagesResponse,
    TextBlock,
    ToolResultBlockParam,
    ToolUseBlock,
    ToolUseBlockParam,
    Usage,
)
from agentgym.server.errors import APIError, validate
from agentgym.server.openai_types import ChatCompletionRequest
from agentgym.server.streaming import until_disconnect

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
"""Anthropic's error type for a status; any other 4xx is an invalid_request_error, a 5xx an api_error."""

log = logging.getLogger("agentgym.server")

Decode = Callable[[list[int]], str]


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    return ErrorResponse(error=ErrorObject(type=error_type(status), message=message)).model_dump()


def error_response(status: int, message: str, *_: Any, **__: Any) -> JSONResponse:
    """An error in Anthropic's shape (the arguments after ``message``, OpenAI's type, param and code,
    positional or named, are not part of it), so that it can stand in for
    ``agentgym.server.errors.error_response``."""
    return JSONResponse(error_body(status, message), status_code=status)


ANTHROPIC_PATH = re.compile(r"^(/sessions/[^/]+)?/v1/messages(/|$)")
"""Paths under Anthropic's API: the server's ``/v1/messages...``, a session's ``/sessions/<id>/v1/messages...``."""


def error_shape(path: str) -> Callable[..., JSONResponse] | None:
    """``error_response`` for a path under Anthropic's API (an unserved one, say
    ``/v1/messages/batches``, is answered in the shape its client reads), else None."""
    return error_response if ANTHROPIC_PATH.match(path) else None


# ---- request: Messages -> chat ---------------------------------------------------------------------
def chat_body(req: MessagesRequest) -> dict[str, Any]:
    """The chat completions request body that asks for what ``req`` asks for (``return_token_ids``
    and streamed usage on, which the answer's ``stop_sequence`` and ``usage`` are read from)."""
    body = prompt_body(req)
    body |= {
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences or None,
        "user": req.metadata.user_id if req.metadata else None,
        "stream": req.stream,
        "return_token_ids": True,
    }
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    return {k: v for k, v in body.items() if v is not None}


def prompt_body(req: CountTokensRequest) -> dict[str, Any]:
    """The part of ``chat_body`` a request's prompt is rendered from (model, messages, tools,
    tool_choice, response format, prefill): alone, the chat request ``count_tokens`` renders."""
    body: dict[str, Any] = {"model": req.model, "messages": chat_messages(req)}
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description is not None else {}),
                    "parameters": t.input_schema,
                },
            }
            for t in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool" and not choice.name:
            raise APIError(400, 'tool_choice {"type": "tool"} needs the tool\'s name', param="tool_choice.name")
        if choice.type != "tool" and choice.name:
            raise APIError(400, f"tool_choice {choice.type!r} takes no name", param="tool_choice.name")
        if choice.type != "none" and not req.tools:
            raise APIError(400, f"tool_choice {choice.type!r} needs tools", param="tool_choice")
        if choice.type == "tool":
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif req.tools:
            body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use is not None:
            body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    fmt = (req.output_config.format if req.output_config else None) or req.output_format
    if fmt is not None:  # structured outputs: constrained decoding, as for chat
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.json_schema}}
    if req.messages[-1].role == "assistant":  # a prefill: the reply continues it
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return {k: v for k, v in body.items() if v is not None}


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """``req``'s system prompt and messages as OpenAI chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    system = req.system_text
    if system is not None:
        out.append({"role": "system", "content": system})
    for i, message in enumerate(req.messages):
        blocks = message.blocks()
        if message.role == "assistant":
            wrong = next((b for b in blocks if isinstance(b, ToolResultBlockParam)), None)
            if wrong is not None:
                raise APIError(400, f"messages[{i}]: tool_result blocks belong in user messages", param="messages")
            text = "".join(b.text for b in blocks if b.type == "text")
            calls = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
                }
                for b in blocks
                if isinstance(b, ToolUseBlockParam)
            ]
            reply: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
            if calls:
                reply["tool_calls"] = calls
            out.append(reply)
            continue
        out += _user_messages(i, blocks)
    return out


def _user_messages(i: int, blocks: list[Any]) -> list[dict[str, Any]]:
    """A user message's blocks as chat messages, in order: its text as user messages, each
    ``tool_result`` as a tool message."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in blocks:
        if isinstance(block, ToolUseBlockParam):
            raise APIError(400, f"messages[{i}]: tool_use blocks belong in assistant messages", param="messages")
        if isinstance(block, ToolResultBlockParam):
            if texts:
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            content = f"Error: {block.text}" if block.is_error else block.text
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        else:
            texts.append(block.text)
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


# ---- response: chat -> Messages ---------------------------------------------------------------------
def tool_use_block(call: dict[str, Any]) -> ToolUseBlock | TextBlock:
    """A chat tool call as a ``tool_use`` block; one whose arguments are not a JSON object (which
    ``input`` must be) comes back as the text the model wrote it as, a Hermes block."""
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"] or "{}")
    except ValueError:
        arguments = function["arguments"]
    if isinstance(arguments, dict):
        return ToolUseBlock(id=call["id"], name=function["name"], input=arguments)
    body = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
    return TextBlock(text=f"<tool_call>\n{body}\n</tool_call>")


def stop_of(
    finish: str | None,
    tool_use: bool,
    token_ids: Sequence[int] | None,
    stop_sequences: Sequence[str] | None,
    decode: Decode,
    matched: str | int | None = None,
) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat ``finish`` reason: which of ``stop_sequences``
    ended the reply is ``matched`` (the server's ``stop_reason``) or else the first of them in the
    decoded sampled ``token_ids`` (which keep the stop string the reply text is cut before)."""
    if finish == "length":
        return "max_tokens", None
    if tool_use:
        return "tool_use", None
    if stop_sequences and finish == "stop":
        if isinstance(matched, str) and matched in stop_sequences:
            return "stop_sequence", matched
        if token_ids:
            text = decode(list(token_ids))
            found = [(text.find(s), s) for s in stop_sequences if s in text]
            if found:
                return "stop_sequence", min(found)[1]
    return "end_turn", None


def anthropic_message(chat: dict[str, Any], stop_sequences: Sequence[str] | None, decode: Decode) -> MessagesResponse:
    """A chat completion (one choice, as a JSON object) as a Messages response."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[TextBlock | ToolUseBlock] = []
    if message.get("content"):
        content.append(TextBlock(text=message["content"]))
    content += [tool_use_block(c) for c in message.get("tool_calls") or []]
    stop_reason, stop_sequence = stop_of(
        choice.get("finish_reason"),
        any(isinstance(b, ToolUseBlock) for b in content),
        choice.get("token_ids"),
        stop_sequences,
        decode,
        choice.get("stop_reason"),
    )
    usage = chat.get("usage") or {}
    return MessagesResponse(
        id=f"msg_{chat['id'].removeprefix('chatcmpl-')}",
        model=chat["model"],
        content=content,
        stop_reason=stop_reason,
        stop_sequence=stop_sequence,
        usage=Usage(input_tokens=usage.get("prompt_tokens", 0), output_tokens=usage.get("completion_tokens", 0)),
        weight_version=chat.get("weight_version"),
    )


# ---- streams: chat chunks -> Messages events --------------------------------------------------------
def event(data: dict[str, Any]) -> str:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_event(status: int, message: str) -> str:
    return event(error_body(status, message))


async def _data_lines(chunks: AsyncIterator[str | bytes]) -> AsyncIterator[str]:
    """The ``data:`` payloads of a server-sent event stream, however its bytes were cut."""
    buffer = ""
    async for part in chunks:
        buffer += part.decode() if isinstance(part, bytes) else part
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            for line in block.splitlines():
                if line.startswith("data:"):
                    yield line[5:].strip()


class _EventWriter:
    """The Messages events for one streamed chat completion, fed its chunks one by one."""

    def __init__(self, stop_sequences: Sequence[str] | None, decode: Decode) -> None:
        self.stop_sequences, self.decode = stop_sequences, decode
        self.started = False
        self.index = -1  # the content block open (or last closed)
        self.text_open = False
        self.token_ids: list[int] = []
        self.finish: str | None = None
        self.tool_use = False
        self.output_tokens: int | None = None

    def start(self, chunk: dict[str, Any]) -> list[str]:
        self.started = True
        message = MessagesResponse(
            id=f"msg_{str(chunk.get('id', '')).removeprefix('chatcmpl-')}",
            model=chunk.get("model", ""),
            content=[],
            usage=Usage(input_tokens=len(chunk.get("prompt_token_ids") or []), output_tokens=0),
            weight_version=chunk.get("weight_version"),
        ).model_dump()
        return [event({"type": "message_start", "message": message}), event({"type": "ping"})]

    def close_text(self) -> list[str]:
        if not self.text_open:
            return []
        self.text_open = False
        return [event({"type": "content_block_stop", "index": self.index})]

    def chunk(self, chunk: dict[str, Any]) -> list[str]:
        out = [] if self.started else self.start(chunk)
        if chunk.get("usage"):
            self.output_tokens = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            self.token_ids += choice.get("token_ids") or []
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if not self.text_open:
                    self.index += 1
                    self.text_open = True
                    block = {"type": "text", "text": ""}
                    out.append(event({"type": "content_block_start", "index": self.index, "content_block": block}))
                out.append(
                    event(
                        {
                            "type": "content_block_delta",
                            "index": self.index,
                            "delta": {"type": "text_delta", "text": delta["content"]},
                        }
                    )
                )
            for call in delta.get("tool_calls") or []:
                out += self.close_text()
                out += self.call(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def call(self, call: dict[str, Any]) -> list[str]:
        block = tool_use_block(call)
        self.index += 1
        if isinstance(block, TextBlock):
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block.text}
        else:
            self.tool_use = True
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.input, ensure_ascii=False)}
        return [
            event({"type": "content_block_start", "index": self.index, "content_block": start}),
            event({"type": "content_block_delta", "index": self.index, "delta": delta}),
            event({"type": "content_block_stop", "index": self.index}),
        ]

    def end(self) -> list[str]:
        out = self.close_text()
        reason, sequence = stop_of(self.finish, self.tool_use, self.token_ids, self.stop_sequences, self.decode)
        tokens = self.output_tokens if self.output_tokens is not None else len(self.token_ids)
        out.append(
            event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"output_tokens": tokens},
                }
            )
        )
        out.append(event({"type": "message_stop"}))
        return out


async def message_events(
    chunks: AsyncIterator[str | bytes], stop_sequences: Sequence[str] | None, decode: Decode
) -> AsyncIterator[str]:
    """A chat completion's SSE stream (``data: {chunk}`` ... ``data: [DONE]``) as Messages events.
    The chat stream is read to its end (the gateway records its turn after ``[DONE]``), and closed
    if this stream is (a client that goes away stops the generation)."""
    writer = _EventWriter(stop_sequences, decode)
    done = False
    try:
        async for data in _data_lines(chunks):
            if done:
                continue
            if data == "[DONE]":
                done = True
                for part in writer.end():
                    yield part
                continue
            chunk = json.loads(data)
            if "error" in chunk:  # an error after the stream began: the chat path's error event
                error = chunk["error"] or {}
                done = True
                status = 500 if error.get("type") in ("server_error", "internal_error") else 400
                yield error_event(status, error.get("message", "error"))
                continue
            for part in writer.chunk(chunk):
                yield part
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


def stream_response(chat: StreamingResponse, stop_sequences: Sequence[str] | None, decode: Decode) -> StreamingResponse:
    """The chat path's streamed response as a Messages event stream."""
    return StreamingResponse(
        message_events(chat.body_iterator, stop_sequences, decode),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# ---- the embedded server's route ----------------------------------------------------------------------
def add_messages_route(app: FastAPI, server: Any, body_json: Callable[[Request], Any]) -> None:
    """``POST /v1/messages`` on the embedded server's ``app``, answered by ``server.chat`` (the
    chat completions path), and ``POST /v1/messages/count_tokens``, by ``server.chat_prompt_ids``;
    ``body_json`` reads a request's JSON body within the server's limits.
    The ``x-api-key`` and ``anthropic-version`` headers Anthropic's clients send are accepted (the
    server has no key for model calls)."""

    def decode(ids: list[int]) -> str:
        return server.tokenizer.decode(ids, skip_special_tokens=True)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Any:
        try:
            req = validate(MessagesRequest, await body_json(request))
            chat = validate(ChatCompletionRequest, chat_body(req))
            result = await until_disconnect(request.receive, server.chat(chat))
        except APIError as exc:
            return error_response(exc.status, exc.message)
        except Exception as exc:  # the server stays up; the client gets a 500 in Anthropic's shape
            log.exception("POST /v1/messages failed")
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        if isinstance(result, StreamingResponse):
            return stream_response(result, req.stop_sequences, decode)
        if isinstance(result, Response):  # the client went away: nothing is sent
            return result
        return anthropic_message(result, req.stop_sequences, decode).model_dump()

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        """The number of prompt tokens ``POST /v1/messages`` would render the same request to
        (its ``usage.input_tokens``): rendered by the chat path, nothing sampled."""
        try:
            req = validate(CountTokensRequest, await body_json(request))
            chat = validate(ChatCompletionRequest, prompt_body(req))
            ids = await server.chat_prompt_ids(chat)
        except APIError as exc:
            return error_response(exc.status, exc.message)
        except Exception as exc:  # the server stays up; the client gets a 500 in Anthropic's shape
            log.exception("POST /v1/messages/count_tokens failed")
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        return CountTokensResponse(input_tokens=len(ids)).model_dump()
