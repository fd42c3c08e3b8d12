"""The gateway's HTTP face: the admin routes (FastAPI) and the model calls (a thin ASGI app in front).

Admin endpoints (``Authorization: Bearer <admin key>``; every gateway has a key: given, or a new one
that ``agentgym gateway`` prints and ``GatewayHandle.admin_key`` holds):

* ``POST /sessions`` ``{"task": {...}, "group_id": str, "sampling": {...}}`` ->
  ``{"id", "api_key", "base_url", "anthropic_base_url", "group_id"}``. ``sampling`` (``SamplingParams`` names:
  ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``stop``, ``seed``...) is pinned: it
  overrides what the agent asks for, and is checked here (``agentgym.gateway.validation``). The task
  may name a reward function (``"reward_fn": "gsm8k"``, or a ``"module:function"`` the operator
  allowed) with its ``ground_truth``.
  ``"metadata": {...}`` is the caller's own notes (see the query API below).
* ``GET /sessions/<id>``, ``POST /sessions/<id>/reward`` ``{"reward", "kind": "final"|"turn",
  "turn", "branch"}``, ``POST /sessions/<id>/finish`` ``{"failure", "reward"}`` -> ``{"trajectories"}``:
  also open to the session's own key. Finishing twice returns the same trajectories.
* The query API (same keys): ``GET /sessions?group_id=&status=open|finished|failed&since=&until=
  &limit=&offset=`` -> ``{"sessions": [...]}`` (``since``/``until``: creation time, Unix seconds);
  ``POST /sessions/<id>/metadata`` ``{"metadata": {...}}`` merges keys into the session's metadata;
  ``GET /sessions/<id>/calls`` -> one record per model call (request, response, latency, token
  counts, branch, weight version); ``DELETE /sessions/<id>``.
* Finished sessions go to the archive (``agentgym.gateway.archive``): in memory (the latest
  ``keep_finished``), or with ``store="sqlite:PATH"`` (``agentgym gateway --store``) in SQLite, written
  when the session finishes and committed before the finish is answered, so finished sessions and
  their trajectories survive a crash or restart of the gateway.
* Policy servers at run time: ``GET /servers``, ``POST /servers`` ``{"url"}`` (added once it answers
  ``/health``), ``DELETE /servers?url=<url>`` (its requests in flight finish; its sessions move to
  another server on their next call). Every ``health_check_interval`` seconds each server's
  ``/health`` is asked; one that fails is passed over until it answers again.
* ``POST /pause`` (waits, bounded, for in-flight generations) and ``POST /resume``
  ``{"weight_version": N}``: while paused, new model calls wait (up to ``pause_timeout``) instead of
  failing; every turn records the weight version its server reported (or the one given at resume,
  for servers that report none). ``GET /health``, ``GET /stats``.

OpenAI endpoints, under ``base_url`` = ``http://host:port/sessions/<id>/v1``, with the
session's key: ``POST /chat/completions`` (tools -> Hermes ``tool_calls``, ``n``, ``stop``,
``logprobs``, ``stream``, forced tool calls, ``response_format``, penalties: docs/openai_api.md),
``POST /completions``, ``POST /responses`` (OpenAI's Responses API over the chat path, recorded the same
way: ``agentgym.gateway.responses``), ``GET /models``. Anthropic's Messages API: ``POST /sessions/<id>/v1/messages``
(``agentgym.gateway.messages``; the ``anthropic`` client's ``base_url`` is ``anthropic_base_url``,
the session's URL without ``/v1``), recorded as a chat completion, errors in Anthropic's shape; the
key may come as ``x-api-key``. ``POST /sessions/<id>/v1/messages/count_tokens`` -> ``{"input_tokens": N}``:
the prompt tokens that Messages request would be sampled from in the session (not a model call: nothing
is recorded). A path not served is a 404 that lists the ones that are (``/v1/...`` at the
root: how to get a session). Another session's key is a 403, a missing or unknown key a
401; every other error has OpenAI's shape. An agent that disconnects before its answer cancels the
generation and nothing is recorded (``GET /stats``: ``undelivered``).

Limits (``Gateway`` options; ``agentgym gateway`` flags of the same names): ``max_sessions`` open at
once (429 beyond), ``max_body_bytes`` per request (413), ``max_task_bytes`` per session task,
``idle_timeout`` for a session nobody uses; connections that send a request slower than
``read_timeout`` or stop reading for ``write_timeout`` seconds are closed
(``agentgym.server.http_timeouts``). What a client stores is checked when it arrives
(``agentgym.gateway.validation``). A policy server's 4xx is answered at once as a 400, a 5xx after
``PolicyClient``'s bounded retries as a 502; only unreachable servers are waited for
(``upstream_retry_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agentgym.gateway.archive import STATUSES, ArchivedSession, archived_summary, finish_body
from agentgym.gateway.gateway import SAMPLING_FIELDS, Gateway
from agentgym.gateway.messages import count_tokens, messages
from agentgym.gateway.model_calls import Delivery
from agentgym.gateway.responses import responses_call
from agentgym.gateway.validation import check_index, check_number, check_sampling, check_task
from agentgym.server import anthropic_api
from agentgym.server.anthropic_types import CountTokensRequest, MessagesRequest
from agentgym.server.errors import (
    APIError,
    error_response,
    install_error_handlers,
    json_object,
    path_methods,
    served_routes,
    unserved_message,
    validate,
)
from agentgym.server.openai_types import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from agentgym.server.responses_types import ResponsesRequest
from agentgym.server.streaming import wait_for_disconnect


def build_app(gateway: Gateway) -> GatewayApp:
    """The gateway's ASGI app over ``gateway``."""
    app = FastAPI(title="agentgym gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    gw = gateway

    def count_error(_: Exception) -> None:
        gw.counts["errors"] += 1

    def unserved(request: Request) -> tuple[int, str, str]:
        path = request.url.path
        if path == "/v1" or path.startswith("/v1/"):
            return 404, no_session_message(path, request), "no_session"
        return unserved_message(
            "the agentgym gateway",
            request.method,
            path,
            gateway_routes(app),
            path_methods(app, request.scope),
            hint="An agent talks to its own session: base_url http://host:port/sessions/<id>/v1 (POST /sessions).",
        )

    install_error_handlers(
        app,
        internal_type="server_error",
        on_internal=count_error,
        unserved=unserved,
        shape=anthropic_api.error_shape,  # an unserved /sessions/<id>/v1/messages/...: Anthropic's shape
    )

    async def body(request: Request, model: type | None = None, required: bool = True) -> Any:
        return await read_body(gw, request, model, required)

    # ---- admin --------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "paused": gw.paused, "open_sessions": len(gw.store.open)}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return gw.stats()

    # POST /sessions and POST /sessions/<id>/finish: GatewayApp's (create_session, finish_session)

    @app.get("/sessions")
    async def listing(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        q = request.query_params
        status = q.get("status")
        if status is not None and status not in STATUSES:
            raise APIError(400, f"status must be one of {', '.join(STATUSES)}", param="status")
        try:
            since, until = (float(q[k]) if q.get(k) else None for k in ("since", "until"))
            limit, offset = int(q.get("limit") or 100), int(q.get("offset") or 0)
        except ValueError:
            raise APIError(400, "since/until are Unix times in seconds; limit/offset are integers") from None
        return await gw.list_sessions(
            q.get("group_id"), status, since, until, max(0, min(limit, 10_000)), max(0, offset)
        )

    @app.get("/sessions/{sid}")
    async def get(sid: str, request: Request) -> dict[str, Any]:
        target = await gw.find(sid, request)
        tokens = request.query_params.get("tokens", "1") != "0"
        return archived_summary(target, tokens) if isinstance(target, ArchivedSession) else target.summary(tokens)

    @app.delete("/sessions/{sid}")
    async def delete(sid: str, request: Request) -> dict[str, Any]:
        return await gw.delete(await gw.find(sid, request))

    @app.get("/sessions/{sid}/calls")
    async def calls(sid: str, request: Request) -> dict[str, Any]:
        target = await gw.find(sid, request)
        return {"id": sid, "calls": target.calls}

    @app.post("/sessions/{sid}/metadata")
    async def metadata(sid: str, request: Request) -> dict[str, Any]:
        target = await gw.find(sid, request)
        data = (await body(request)).get("metadata")
        if not isinstance(data, dict):
            raise APIError(400, 'post {"metadata": {...}}: its keys are merged into the session\'s', param="metadata")
        return await gw.set_metadata(target, data)

    @app.post("/sessions/{sid}/reward")
    async def reward(sid: str, request: Request) -> dict[str, Any]:
        session = gw.session_for(sid, request, admin=True)
        data = await body(request)
        value, kind = data.get("reward"), data.get("kind", "final")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or kind not in ("final", "turn"):
            raise APIError(
                400, 'post {"reward": <number>, "kind": "final" | "turn"} (optional "turn", "branch")', param="reward"
            )
        value = check_number(value)
        turn, branch = check_index(data.get("turn"), "turn"), check_index(data.get("branch"), "branch")
        try:
            posted = session.post_reward(value, kind, turn, branch)
        except ValueError as exc:
            raise APIError(409 if session.finished else 400, str(exc), param="reward") from None
        return {"id": sid, "reward": vars(posted)}

    # ---- policy servers at run time -----------------------------------------------------
    @app.get("/servers")
    async def servers(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        return gw.servers()

    @app.post("/servers")
    async def add_server(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        return await gw.add_server((await body(request)).get("url"))

    @app.delete("/servers")
    async def remove_server(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        url = request.query_params.get("url")
        if not url:
            raise APIError(400, "DELETE /servers?url=<the server's base URL>", param="url")
        try:
            drain = float(request.query_params.get("drain_timeout") or 60.0)
        except ValueError:
            raise APIError(400, "drain_timeout is a number of seconds", param="drain_timeout") from None
        return await gw.remove_server(url, check_number(drain, "drain_timeout"))

    @app.post("/pause")
    async def pause(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        data = await body(request, required=False)
        drain = check_number(data.get("drain_timeout", 60.0), "drain_timeout")
        return await gw.pause(min(max(drain, 0.0), gw.pause_timeout))

    @app.post("/resume")
    async def resume(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        version = (await body(request, required=False)).get("weight_version")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise APIError(400, "'weight_version' must be an integer", param="weight_version")
        return gw.resume(version)

    # ---- OpenAI, per session (the model calls themselves are GatewayApp's) ----------------
    @app.get("/sessions/{sid}/v1/models")
    async def models(sid: str, request: Request) -> dict[str, Any]:
        gw.session_for(sid, request)
        return ModelList(
            data=[ModelCard(id=gw.model_name, root=gw.model_name, max_model_len=gw.max_model_len)]
        ).model_dump()

    @app.post("/sessions/{sid}/v1/v1/messages")
    async def doubled_v1(sid: str, request: Request) -> Response:
        """An ``anthropic`` client given the OpenAI ``base_url``: it adds ``/v1`` itself."""
        gw.session_for(sid, request)
        return anthropic_api.error_response(
            404,
            "the anthropic client adds /v1/messages to its base_url itself: give it the session's "
            "anthropic_base_url (its base_url without /v1)",
        )

    return GatewayApp(gw, app)


def no_session_message(path: str, request: Request) -> str:
    """An OpenAI client pointed at the gateway's root: say how to get a session's base_url."""
    return (
        f"the gateway has no {path} of its own: every agent talks to its own session. "
        f"Create one first: POST {str(request.base_url).rstrip('/')}/sessions (body "
        f'{{"task": {{...}}}}), then use the base_url and api_key it returns with the OpenAI '
        f"client: OpenAI(base_url=session['base_url'], api_key=session['api_key'])"
    )


def gateway_routes(app: FastAPI) -> list[tuple[str, str]]:
    """What the gateway serves: the model calls and admin calls ``GatewayApp`` answers itself, then
    the FastAPI app's routes (read now: routes added later are listed)."""
    own = [("POST", f"/sessions/{{sid}}/v1/{rest}") for rest in _MODEL_CALLS]
    own += [("POST", "/sessions"), ("POST", "/sessions/{sid}/finish")]
    return own + served_routes(app)


async def create_session(gw: Gateway, request: Request) -> dict[str, Any]:
    """``POST /sessions``."""
    gw.require_admin(request)
    data = await read_body(gw, request, required=False)
    task, sampling, metadata = data.get("task") or {}, data.get("sampling") or {}, data.get("metadata") or {}
    if not isinstance(task, dict) or not isinstance(sampling, dict) or not isinstance(metadata, dict):
        raise APIError(400, "'task', 'sampling' and 'metadata' must be JSON objects")
    check_task({"task": task, "metadata": metadata}, gw.max_task_bytes)
    unknown = sorted(set(sampling) - SAMPLING_FIELDS)
    if unknown:
        raise APIError(
            400, f"unknown sampling fields {unknown}; pin any of {sorted(SAMPLING_FIELDS)}", param="sampling"
        )
    sampling = check_sampling(sampling, len(gw.tokenizer), gw.max_model_len)
    if len(gw.store.open) >= gw.max_sessions:
        raise APIError(
            429,
            f"{len(gw.store.open)} sessions are open, this gateway's limit "
            "(agentgym gateway --max-sessions); finish some first",
            code="too_many_sessions",
        )
    if data.get("group_id") is not None and not isinstance(data["group_id"], (str, int)):
        raise APIError(400, "'group_id' must be a string", param="group_id")
    try:
        session = gw.store.create(task, data.get("group_id"), sampling, metadata)
    except ValueError as exc:
        raise APIError(400, str(exc), param="task") from None
    return {
        "id": session.id,
        "api_key": session.key,
        "base_url": gw.base_url(request, session.id),
        "anthropic_base_url": gw.base_url(request, session.id).removesuffix("/v1"),
        "group_id": session.group_id,
    }


async def finish_session(gw: Gateway, sid: str, request: Request) -> bytes:
    """``POST /sessions/<id>/finish``: ``{"id", "group_id", "trajectories"}``."""
    target = await gw.find(sid, request)
    data = await read_body(gw, request, required=False)
    value = check_number(data.get("reward"), required=False)
    failure = data.get("failure")
    if failure is not None and not isinstance(failure, str):
        raise APIError(400, "'failure' must be a string (what went wrong) or null", param="failure")
    return finish_body(await gw.finish(target, failure=failure, reward=value))


async def read_body(gw: Gateway, request: Request, model: type | None = None, required: bool = True) -> Any:
    """The request's JSON object (validated as ``model`` if given), within the gateway's size limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > gw.max_body_bytes:
        raise APIError(
            413,
            f"the request body is {declared} bytes; the gateway takes at most {gw.max_body_bytes}",
            code="request_too_large",
        )
    chunks, size = [], 0  # the ASGI messages read directly: Request.body()'s async generator costs more
    while True:
        message = await request.receive()
        if message["type"] != "http.request":
            raise APIError(400, "the client went away before sending the whole body")
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > gw.max_body_bytes:  # a chunked body without a length: stop reading at the limit
            raise APIError(413, f"the request body is over {gw.max_body_bytes} bytes", code="request_too_large")
        if not message.get("more_body"):
            break
    raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    data = json_object(raw, required)
    return data if model is None else validate(model, data)


_MODEL_CALLS = {
    "chat/completions": (ChatCompletionRequest, Gateway.chat_completion),
    "completions": (CompletionRequest, Gateway.completion),
    "messages": (MessagesRequest, messages),
    "messages/count_tokens": (CountTokensRequest, count_tokens),  # rendered and counted, not recorded
    "responses": (ResponsesRequest, responses_call),  # the Responses API: agentgym/gateway/responses.py
}
_ERROR_SHAPES = {"messages": anthropic_api.error_response, "messages/count_tokens": anthropic_api.error_response}
"""The model calls whose errors are not in OpenAI's shape."""


class GatewayApp:
    """The gateway's ASGI app. The calls made for every session are answered here, before the
    FastAPI app (``api``) that serves every other route: ``POST /sessions/<id>/v1/chat/completions``,
    ``.../completions`` and ``.../responses``, and ``POST /sessions`` and ``POST /sessions/<id>/finish``.

    Why: they are the gateway's hot path, and FastAPI's middleware stack (error, exception,
    body-limit, telemetry and exit-stack middlewares, the router, dependency solving, anyio's
    per-request task group) cost more CPU per call than rendering the chat does (measured: taking
    create and finish out of it cut the gateway's CPU per model call by about a tenth). Errors
    keep OpenAI's shape.
    """

    def __init__(self, gateway: Gateway, api: FastAPI) -> None:
        self.gateway, self.api = gateway, api
        self.state = api.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith("/sessions"):
            if path.startswith("/sessions/"):
                sid, sep, rest = path[10:].partition("/v1/")
                call = _MODEL_CALLS.get(rest) if sep and sid and "/" not in sid else None
                if call is not None:
                    await self.model_call(sid, *call, scope, receive, send, _ERROR_SHAPES.get(rest, error_response))
                    return
                sid, sep, rest = path[10:].partition("/")
                if rest == "finish" and sid and scope["method"] == "POST":
                    await self.admin_call(finish_session, (sid,), scope, receive, send)
                    return
            elif path == "/sessions" and scope["method"] == "POST":
                await self.admin_call(create_session, (), scope, receive, send)
                return
        await self.api(scope, receive, send)

    async def model_call(
        self,
        sid: str,
        model: type,
        method: Any,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        error_response: Callable[..., Response] = error_response,
    ) -> None:
        """One model call. Once its body is read, the call runs while the agent's connection is
        watched: an agent that goes away cancels it (its generation is aborted, nothing is recorded);
        a ``Delivery`` records its turns once sent."""
        gw, request = self.gateway, Request(scope, receive)
        gone: asyncio.Future[None] | None = None
        try:
            if scope["method"] != "POST":
                raise APIError(405, f"{request.url.path} takes POST", code="method_not_allowed")
            session = gw.open_session(gw.session_for(sid, request))
            body = await read_body(gw, request, model)
            gone = asyncio.ensure_future(wait_for_disconnect(receive))
            work = asyncio.ensure_future(method(gw, session, body))
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
                gw.counts["undelivered"] += 1
                return
            response = work.result()
        except APIError as exc:  # SessionError too
            response = error_response(exc.status, exc.message, exc.type, exc.param, exc.code)
        except Exception as exc:  # the gateway stays up; the agent gets a 500 in OpenAI's shape
            gw.counts["errors"] += 1
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        try:
            if isinstance(response, Delivery) and gone is not None:
                await response.deliver(scope, receive, send, gone)
            else:
                await response(scope, receive, send)
        finally:
            if gone is not None:
                gone.cancel()

    async def admin_call(
        self, handler: Any, args: tuple[Any, ...], scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        gw = self.gateway
        try:
            result = await handler(gw, *args, Request(scope, receive))
            body = result if isinstance(result, bytes) else json.dumps(result).encode()
            response: Response = Response(body, media_type="application/json")
        except APIError as exc:
            response = error_response(exc.status, exc.message, exc.type, exc.param, exc.code)
        except Exception as exc:
            gw.counts["errors"] += 1
            response = error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        await response(scope, receive, send)
