"""The gateway's Anthropic model call: ``POST /sessions/<id>/v1/messages``.

A Messages request is translated to a chat request (``agentgym.server.anthropic_api.chat_body``)
and answered by ``Gateway.chat_completion``: it is rendered, sampled and recorded exactly as a chat
completion (the same branches, token-exact turns, rewards; ``GET /sessions/<id>/calls`` shows it
as a ``chat/completions`` call with the translated messages), and its answer is translated back
(``anthropic_message``, or the Messages event stream). The turn is recorded once the agent has
the whole answer, as for any chat call.

An Anthropic client's base URL is the session's ``base_url`` without its ``/v1`` (the client adds
``/v1/messages`` itself): ``POST /sessions`` returns it as ``anthropic_base_url``. The client sends
its key as ``x-api-key``, which the gateway takes as it takes ``Authorization: Bearer``.

``POST /sessions/<id>/v1/messages/count_tokens`` (``count_tokens``) answers how many prompt tokens
a Messages request would be sampled from, without sampling or recording anything.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from agentgym.gateway.model_calls import Delivery
from agentgym.gateway.sessions import Session
from agentgym.server.anthropic_api import anthropic_message, chat_body, prompt_body, stream_response
from agentgym.server.anthropic_types import CountTokensRequest, CountTokensResponse, MessagesRequest
from agentgym.server.errors import validate
from agentgym.server.openai_types import ChatCompletionRequest


async def messages(gw: Any, session: Session, req: MessagesRequest) -> Any:
    """The Messages answer to ``req`` from ``gw``'s (a ``Gateway``) chat completions path."""
    chat = validate(ChatCompletionRequest, chat_body(req))
    result = await gw.chat_completion(session, chat)
    decode = gw._decode_reply
    if isinstance(result, Delivery):
        message = anthropic_message(json.loads(result.body), req.stop_sequences, decode)
        return Delivery(message.model_dump_json(), "application/json", result.record, result.release)
    if isinstance(result, StreamingResponse):
        return stream_response(result, req.stop_sequences, decode)
    raise TypeError(f"the chat path answered {type(result).__name__}, not a Delivery or a stream")


async def count_tokens(gw: Any, session: Session, req: CountTokensRequest) -> JSONResponse:
    """``POST /sessions/<id>/v1/messages/count_tokens``: ``{"input_tokens": N}``, the prompt tokens
    the same Messages request would be sampled from in this session (the ``usage.input_tokens`` it
    would report: on the branch it would continue, token-exactly). Rendered only: no model call,
    no turn, nothing recorded or counted as a request of the session."""
    chat = validate(ChatCompletionRequest, prompt_body(req))
    ids = gw.chat_prompt_ids(session, chat)
    return JSONResponse(CountTokensResponse(input_tokens=len(ids)).model_dump())
