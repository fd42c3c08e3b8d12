"""The embedded server's streaming plumbing: the engine's token events as an async iterator, the SSE
response that stops sampling when its client goes away, and ``IncrementalText`` (token ids to text
deltas that never split a character or leak the start of a stop string)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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


class IncrementalText:
    """Turns a growing list of token ids into text deltas, never emitting half a character
    and holding back text that could be the start of a marker (a stop string, ``<tool_call>``):
    once a marker appears, everything from it on waits for ``finish``."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, markers: list[str]) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.markers = [m for m in markers if m]
        self.ids: list[int] = []
        self.sent = ""
        self.held = False
        self.first = True

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self.held:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):
            return ""
        end = len(text)
        for m in self.markers:
            at = text.find(m, max(0, len(self.sent) - len(m)))
            if at >= 0:
                end = min(end, at)
                self.held = True
            else:
                for k in range(min(len(m) - 1, len(text)), 0, -1):
                    if text.endswith(m[:k]):
                        end = min(end, len(text) - k)
                        break
        if end <= len(self.sent):
            return ""
        delta = text[len(self.sent):end]
        self.sent = text[:end]
        return delta

    def finish(self, final_text: str) -> str:
        if final_text.startswith(self.sent):
            delta = final_text[len(self.sent):]
            self.sent = final_text
            return delta
        return ""
