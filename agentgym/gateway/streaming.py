"""A finished response as server-sent events: the chunks OpenAI's streaming API sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from agentgym.server.openai_types import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChunk,
    CompletionResponse,
    DeltaMessage,
)


def sse(chunks: list[str]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _data(model: Any) -> str:
    return f"data: {model.model_dump_json(exclude_none=True)}\n\n"


def chat_chunks(response: ChatCompletionResponse, include_usage: bool) -> list[str]:
    def chunk(choice: ChatStreamChoice) -> str:
        return _data(ChatCompletionChunk(id=response.id, created=response.created, model=response.model,
                                         choices=[choice], weight_version=response.weight_version))

    out = []
    for choice in response.choices:
        message = choice.message
        out.append(chunk(ChatStreamChoice(index=choice.index, delta=DeltaMessage(role="assistant", content=""))))
        if message.content:
            out.append(chunk(ChatStreamChoice(index=choice.index, delta=DeltaMessage(content=message.content),
                                              logprobs=choice.logprobs)))
        if message.tool_calls:
            calls = [{"index": k, **c.model_dump()} for k, c in enumerate(message.tool_calls)]
            out.append(chunk(ChatStreamChoice(index=choice.index, delta=DeltaMessage(tool_calls=calls))))
        out.append(chunk(ChatStreamChoice(index=choice.index, delta=DeltaMessage(), finish_reason=choice.finish_reason,
                                          token_ids=choice.token_ids)))
    if include_usage:
        out.append(_data(ChatCompletionChunk(id=response.id, created=response.created, model=response.model,
                                             choices=[], usage=response.usage, weight_version=response.weight_version)))
    out.append("data: [DONE]\n\n")
    return out


def completion_chunks(response: CompletionResponse, include_usage: bool) -> list[str]:
    out = []
    for choice in response.choices:
        out.append(_data(CompletionChunk(id=response.id, created=response.created, model=response.model,
                                         choices=[choice], weight_version=response.weight_version)))
    if include_usage:
        out.append(_data(CompletionChunk(id=response.id, created=response.created, model=response.model, choices=[],
                                         usage=response.usage, weight_version=response.weight_version)))
    out.append("data: [DONE]\n\n")
    return out
