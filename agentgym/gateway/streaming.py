"""Responses as server-sent events, the chunks OpenAI's streaming API sends: a finished response cut
into chunks (``chat_chunks``, ``completion_chunks``, for ``n > 1``), or a generation streamed live,
token by token as the policy server samples it (``live_chat``, ``live_completion``)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi.responses import StreamingResponse

from agentgym.gateway.sessions import Plan, Session, normalize_message
from agentgym.server.errors import APIError
from agentgym.server.legacy_functions import legacy_reply
from agentgym.server.openai_types import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatStreamChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    UsageInfo,
)
from agentgym.server.token_pieces import IncrementalText
from agentgym.server.tool_calls import TOOL_CALL_OPEN, assistant_reply, forced_tool_names
from agentgym.types import SamplingParams, TokenSample

if TYPE_CHECKING:
    from agentgym.client.policy import TokenDelta

Gateway = Any  # agentgym.gateway.gateway.Gateway, which imports this module


def sse(chunks: list[str]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        for chunk in chunks:
            yield chunk

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _data(model: Any) -> str:
    return f"data: {model.model_dump_json(exclude_none=True)}\n\n"


def chat_chunks(response: ChatCompletionResponse, include_usage: bool) -> list[str]:
    def chunk(choice: ChatStreamChoice) -> str:
        return _data(
            ChatCompletionChunk(
                id=response.id,
                created=response.created,
                model=response.model,
                choices=[choice],
                weight_version=response.weight_version,
            )
        )

    out = []
    for choice in response.choices:
        message = choice.message
        out.append(chunk(ChatStreamChoice(index=choice.index, delta=DeltaMessage(role="assistant", content=""))))
        if message.content:
            out.append(
                chunk(
                    ChatStreamChoice(
                        index=choice.index, delta=DeltaMessage(content=message.content), logprobs=choice.logprobs
                    )
                )
            )
        if message.tool_calls or message.function_call:
            calls = [{"index": k, **c.model_dump()} for k, c in enumerate(message.tool_calls)] or None
            function_call = message.function_call.model_dump() if message.function_call else None
            delta = DeltaMessage(tool_calls=calls, function_call=function_call)
            out.append(chunk(ChatStreamChoice(index=choice.index, delta=delta)))
        out.append(
            chunk(
                ChatStreamChoice(
                    index=choice.index,
                    delta=DeltaMessage(),
                    finish_reason=choice.finish_reason,
                    token_ids=choice.token_ids,
                )
            )
        )
    if include_usage:
        out.append(
            _data(
                ChatCompletionChunk(
                    id=response.id,
                    created=response.created,
                    model=response.model,
                    choices=[],
                    usage=response.usage,
                    weight_version=response.weight_version,
                )
            )
        )
    out.append("data: [DONE]\n\n")
    return out


def completion_chunks(response: CompletionResponse, include_usage: bool) -> list[str]:
    out = []
    for choice in response.choices:
        out.append(
            _data(
                CompletionChunk(
                    id=response.id,
                    created=response.created,
                    model=response.model,
                    choices=[choice],
                    weight_version=response.weight_version,
                )
            )
        )
    if include_usage:
        out.append(
            _data(
                CompletionChunk(
                    id=response.id,
                    created=response.created,
                    model=response.model,
                    choices=[],
                    usage=response.usage,
                    weight_version=response.weight_version,
                )
            )
        )
    out.append("data: [DONE]\n\n")
    return out


# ---- live: tokens as the server samples them -------------------------------------------------
async def _first(
    gw: Gateway, session: Session, plan: Plan, sampling: SamplingParams
) -> tuple[TokenDelta | None, AsyncIterator[TokenDelta]]:
    """Start the generation and wait for its first delta, so that a server that cannot answer is still
    an HTTP error (503, 400) and not a stream that breaks off."""
    deltas = gw.generate_stream(session, plan.context_ids, sampling)
    try:
        return await anext(deltas, None), deltas
    except BaseException:
        gw.store.release(plan)
        gw.counts["errors"] += 1
        raise


def _error_event(exc: Exception) -> str:
    if isinstance(exc, APIError):
        error = {"message": exc.message, "type": exc.type, "code": exc.code}
    else:
        error = {"message": f"internal error: {type(exc).__name__}: {exc}", "type": "server_error", "code": None}
    return f"data: {json.dumps({'error': error})}\n\n"


class _Live:
    """One streamed generation: its deltas, what they add up to, the text the agent has been sent."""

    def __init__(
        self,
        gw: Gateway,
        session: Session,
        plan: Plan,
        sampling: SamplingParams,
        markers: list[str],
        first: TokenDelta | None,
        deltas: AsyncIterator[TokenDelta],
    ) -> None:
        self.gw, self.session, self.plan, self.sampling = gw, session, plan, sampling
        self.first, self.deltas = first, deltas
        self.text = IncrementalText(gw.tokenizer, True, markers)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[list[tuple[int, float]]] = []
        self.finish: str | None = None
        self.version = first.weight_version if first is not None else 0
        self.committed = False
        self.failed = False  # the stream ended in an error event (else, uncommitted, the agent went away)
        self.late = False  # the session was finished meanwhile (counted as a late completion)

    async def __aiter__(self) -> AsyncIterator[tuple[TokenDelta, str]]:
        """Each delta with the text it lets the agent see now."""
        delta = self.first
        while delta is not None:
            self.ids += delta.token_ids
            self.logprobs += delta.logprobs
            self.tops += delta.top_logprobs
            self.version = delta.weight_version
            if delta.finish_reason is not None:
                self.finish = delta.finish_reason
            yield delta, "".join(self.text.push(t) for t in delta.token_ids)
            delta = await anext(self.deltas, None)

    def sample(self) -> TokenSample:
        """The whole generation; raises a 409 if the session was finished meanwhile (nothing recorded)."""
        if self.session.finished:
            self.gw.counts["late_completions"] += 1
            raise APIError(
                409,
                f"session {self.session.id} was finished while this call was generating; its result is not recorded",
                "conflict_error",
                code="session_finished",
            )
        return TokenSample(
            token_ids=self.ids,
            logprobs=self.logprobs,
            finish_reason=self.finish or "stop",
            weight_version=self.version,
            top_logprobs=self.tops,
        )

    def record(self, reply: dict[str, Any] | None = None, text: str = "") -> bool:
        """Record the turn, now that the agent has received all of it (not if the session was
        finished meanwhile)."""
        if self.session.finished:
            self.gw.counts["late_completions"] += 1
            self.late = True
            return False
        sample = self.sample()
        self.gw.store.commit(self.session, self.plan, sample, reply, text=text, shaped_by=self.sampling.shaped_by())
        self.committed = True
        self.gw.counts["completions"] += 1
        return True

    async def close(self) -> None:
        if not self.committed:  # failed, or the agent went away: the branch stays as it was
            self.gw.store.release(self.plan)
            if self.failed:
                self.gw.counts["errors"] += 1
            elif not self.late:  # the agent left before the end of the stream
                self.gw.counts["undelivered"] += 1
        await self.deltas.aclose()  # an unfinished generation: the server stops sampling it


def _stream(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def live_chat(
    gw: Gateway,
    session: Session,
    plan: Plan,
    req: ChatCompletionRequest,
    sampling: SamplingParams,
    tools: list[dict[str, Any]] | None,
    request: dict[str, Any],
    started: float,
    wall: float,
) -> StreamingResponse:
    """A chat completion streamed as it is sampled (see ``agentgym.gateway.gateway``: stream=true)."""
    first, deltas = await _first(gw, session, plan, sampling)
    live = _Live(gw, session, plan, sampling, list(sampling.stop) + ([TOOL_CALL_OPEN] if tools else []), first, deltas)
    cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), req.model or gw.model_name

    def chunk(choice: ChatStreamChoice | None, **extra: Any) -> str:
        return _data(
            ChatCompletionChunk(
                id=cid,
                created=created,
                model=model,
                choices=[choice] if choice else [],
                weight_version=live.version,
                **extra,
            )
        )

    async def body() -> AsyncIterator[str]:
        try:
            yield chunk(
                ChatStreamChoice(index=0, delta=DeltaMessage(role="assistant", content="")),
                prompt_token_ids=plan.context_ids if req.return_token_ids else None,
            )
            async for delta, piece in live:
                logprobs = None
                if req.logprobs and delta.token_ids:
                    logprobs = gw.chat_logprobs(
                        TokenSample(delta.token_ids, delta.logprobs, "", top_logprobs=delta.top_logprobs)
                    )
                if piece or logprobs or (req.return_token_ids and delta.token_ids):
                    yield chunk(
                        ChatStreamChoice(
                            index=0,
                            delta=DeltaMessage(content=piece),
                            logprobs=logprobs,
                            token_ids=delta.token_ids if req.return_token_ids else None,
                        )
                    )
            sample = live.sample()
            content, calls, finish = assistant_reply(
                gw.reply_text(sample, sampling.stop),
                sample.finish_reason,
                bool(tools),
                forced_tool_names(sampling.structured),
            )
            reply: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                reply["tool_calls"] = calls  # recorded as a tools reply whatever shape the agent gets
            function_call = None
            if req.legacy_functions:
                content, function_call, calls, finish = legacy_reply(content, calls, finish)
            tail = live.text.finish(content or "")
            if tail or calls or function_call:
                yield chunk(
                    ChatStreamChoice(
                        index=0,
                        delta=DeltaMessage(
                            content=tail or None,
                            tool_calls=[{"index": k, **c} for k, c in enumerate(calls)] or None,
                            function_call=function_call,
                        ),
                    )
                )
            yield chunk(ChatStreamChoice(index=0, delta=DeltaMessage(), finish_reason=finish))
            if req.stream_options and req.stream_options.include_usage:
                yield chunk(None, usage=_usage(plan, sample))
            yield "data: [DONE]\n\n"
            if live.record(normalize_message(reply)):  # the agent has the whole reply: record it
                gw.record_call(session, "chat/completions", plan, request, sampling, [sample], [reply], started, wall)
        except Exception as exc:  # after the first byte an error can only be an event of the stream
            live.failed = True
            yield _error_event(exc)
        finally:
            await live.close()

    return _stream(body())


async def live_completion(
    gw: Gateway,
    session: Session,
    plan: Plan,
    req: CompletionRequest,
    sampling: SamplingParams,
    request: dict[str, Any],
    started: float,
    wall: float,
) -> StreamingResponse:
    """A text completion streamed as it is sampled."""
    first, deltas = await _first(gw, session, plan, sampling)
    live = _Live(gw, session, plan, sampling, list(sampling.stop), first, deltas)
    cid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), req.model or gw.model_name

    def chunk(choice: CompletionChoice | None, **extra: Any) -> str:
        return _data(
            CompletionChunk(
                id=cid,
                created=created,
                model=model,
                choices=[choice] if choice else [],
                weight_version=live.version,
                **extra,
            )
        )

    async def body() -> AsyncIterator[str]:
        offset = 0
        try:
            async for delta, piece in live:
                logprobs = None
                if req.logprobs is not None and delta.token_ids:
                    logprobs = gw.completion_logprobs(
                        TokenSample(delta.token_ids, delta.logprobs, "", top_logprobs=delta.top_logprobs),
                        req.logprobs,
                        offset,
                    )
                    offset += sum(len(t) for t in logprobs.tokens)
                if piece or logprobs or (req.return_token_ids and delta.token_ids):
                    yield chunk(
                        CompletionChoice(
                            index=0,
                            text=piece,
                            logprobs=logprobs,
                            token_ids=delta.token_ids if req.return_token_ids else None,
                        )
                    )
            sample = live.sample()
            text = gw.reply_text(sample, sampling.stop)
            yield chunk(CompletionChoice(index=0, text=live.text.finish(text), finish_reason=sample.finish_reason))
            if req.stream_options and req.stream_options.include_usage:
                yield chunk(None, usage=_usage(plan, sample))
            yield "data: [DONE]\n\n"
            if live.record(text=text):
                gw.record_call(session, "completions", plan, request, sampling, [sample], [text], started, wall)
        except Exception as exc:
            live.failed = True
            yield _error_event(exc)
        finally:
            await live.close()

    return _stream(body())


def _usage(plan: Plan, sample: TokenSample) -> UsageInfo:
    prompt, completion = len(plan.context_ids), len(sample.token_ids)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
