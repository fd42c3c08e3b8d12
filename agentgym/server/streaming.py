"""The embedded server's streaming plumbing: the engine's token events as an async iterator, and the
SSE response that stops sampling when its client goes away, and ``until_disconnect``, which does the
same for a request that is not streamed (``IncrementalText``, which turns the
tokens into text deltas, is in ``token_pieces``, shared with the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi.responses import Response, StreamingResponse

from agentgym.server.engine import Engine, TokenEvent
from agentgym.server.engine import Request as EngineRequest


async def events(request: EngineRequest) -> AsyncIterator[TokenEvent]:
    while True:
        event = await request.events.get()
        if event is None:
            return
        yield event


def sse(body: AsyncIterator[str], engine: Engine, request: EngineRequest) -> StreamingResponse:
    async def guarded() -> AsyncIterator[str]:
        finished = False
        try:
            async for part in body:
                yield part
            finished = True
        finally:
            if not finished:  # the client went away: stop sampling for it
                engine.abort(request)

    return StreamingResponse(
        guarded(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


T = TypeVar("T")


async def wait_for_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
    """Return once the client has gone (the request body must have been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T]) -> T | Response:
    """``await work``, cancelled if the client disconnects first (as vLLM's ``with_cancellation``):
    a generation nobody waits for is aborted (``CancelledError`` reaches the code awaiting the
    engine) instead of running to ``max_tokens``. What is returned then is never sent."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    return Response(status_code=499)
