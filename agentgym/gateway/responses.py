"""The Responses API in the gateway: ``POST /sessions/<id>/v1/responses``, recorded as a turn exactly as a
chat completion is.

A Responses request becomes the chat completion request it stands for
(``agentgym.server.responses_api.chat_request``) and goes down the gateway's chat path
(``Gateway.chat_completion``): the same rendering, branch matching, pinned sampling, constrained
decoding and recording of the sampled tokens. The chat answer, whole or streamed, is turned back into
the Responses result (``ResponseBuilder``); the turn is recorded once the agent has it, as for chat.
Calls appear in ``GET /sessions/<id>/calls`` with ``"endpoint": "responses"``.

``previous_response_id`` is resolved within the session: each delivered response (unless
``store: false``) keeps the messages it added to its conversation (its input and its reply) and the
response it continued, so a request naming it is served as the whole conversation, re-rendered into
the same tokens and recorded on the same branch. As with OpenAI, ``instructions`` are not carried
over from the previous response: each request's own come first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from agentgym.gateway.model_calls import Delivery
from agentgym.gateway.sessions import Session
from agentgym.server.errors import APIError
from agentgym.server.responses_api import (
    ResponseBuilder,
    chat_request,
    event_stream,
    input_messages,
    response_from_chat,
    stream_events,
)
from agentgym.server.responses_types import ResponsesRequest

ENDPOINT = "responses"


def history(session: Session, response_id: str | None) -> list[dict[str, Any]]:
    """The conversation up to and including the response ``response_id`` of ``session``."""
    if response_id is None:
        return []
    parts: list[list[dict[str, Any]]] = []
    current: str | None = response_id
    while current is not None:
        if current not in session.responses:
            raise APIError(
                400,
                f"previous_response_id {current!r} is not a response of this session (responses are kept per "
                "session, for as long as it is open, and not when sent with store=false)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        current, added = session.responses[current]
        parts.append(added)
    return [m for added in reversed(parts) for m in added]


async def responses_call(gw: Any, session: Session, req: ResponsesRequest) -> Any:
    """One Responses call of ``session`` through ``gw``'s chat path (``Gateway.chat_completion``)."""
    req.model = req.model or gw.model_name
    chat = chat_request(req, history(session, req.previous_response_id))
    builder = ResponseBuilder(req, store=req.store is not False)
    calls_before = len(session.calls)

    def delivered() -> None:
        """The agent has the response: name the call's endpoint, keep the response for later calls."""
        if len(session.calls) > calls_before:
            session.calls[-1]["endpoint"] = ENDPOINT
        if req.store is not False and builder.response.status in ("completed", "incomplete"):
            added = input_messages(req.input) + [builder.reply()]
            session.responses[builder.id] = (req.previous_response_id, added)

    result = await gw.chat_completion(session, chat)
    if isinstance(result, StreamingResponse):

        async def body() -> AsyncIterator[str]:
            async for event in stream_events(result.body_iterator, builder):
                yield event
            delivered()  # the chat stream has ended: its turn is recorded (or, finished meanwhile, not)

        return event_stream(body())
    response = response_from_chat(json.loads(result.body), builder)

    def record() -> None:
        result.record()
        delivered()

    return Delivery(response.model_dump_json(exclude_none=True), "application/json", record, result.release)
