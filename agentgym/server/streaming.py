"""The embedded server's streaming plumbing: the engine's token events as an async iterator, and the
SSE response that stops sampling when its client goes away (``IncrementalText``, which turns the
tokens into text deltas, is in ``token_pieces``, shared with the gateway)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

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

    return StreamingResponse(guarded(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
