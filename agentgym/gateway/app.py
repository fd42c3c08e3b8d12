"""The gateway's HTTP face: the admin routes (FastAPI) and the model calls (a thin ASGI app in front).

Routes and their bodies are described in ``agentgym.gateway.gateway``'s docstring.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from agentgym.gateway.gateway import SAMPLING_FIELDS, Gateway
from agentgym.server.errors import APIError, error_response, install_error_handlers, json_object, validate
from agentgym.server.openai_types import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from agentgym.types import Trajectory, Turn


def trajectory_json(traj: Trajectory) -> dict[str, Any]:
    """``traj.to_dict()`` without its deep copy of every token id (5 ms for a few hundred tokens)."""
    out = {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}
    out["turns"] = [{f.name: getattr(t, f.name) for f in _TURN_FIELDS} for t in traj.turns]
    return out


_TURN_FIELDS = dataclasses.fields(Turn)


def build_app(gateway: Gateway) -> GatewayApp:
    """The gateway's ASGI app over ``gateway``."""
    app = FastAPI(title="agentgym gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    gw = gateway

    def count_error(_: Exception) -> None:
        gw.counts["errors"] += 1

    install_error_handlers(app, internal_type="server_error", on_internal=count_error)

    async def body(request: Request, model: type | None = None, required: bool = True) -> Any:
        return await read_body(gw, request, model, required)

    # ---- admin --------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "paused": gw.paused, "open_sessions": len(gw.store.open)}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return gw.stats()

    @app.post("/sessions")
    async def create(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        data = await body(request, required=False)
        task, sampling = data.get("task") or {}, data.get("sampling") or {}
        if not isinstance(task, dict) or not isinstance(sampling, dict):
            raise APIError(400, "'task' and 'sampling' must be JSON objects")
        unknown = sorted(set(sampling) - SAMPLING_FIELDS)
        if unknown:
            raise APIError(400, f"unknown sampling fields {unknown}; pin any of {sorted(SAMPLING_FIELDS)}",
                           param="sampling")
        try:
            session = gw.store.create(task, data.get("group_id"), sampling)
        except ValueError as exc:
            raise APIError(400, str(exc), param="task") from None
        return {"id": session.id, "api_key": session.key, "base_url": gw.base_url(request, session.id),
                "group_id": session.group_id}

    @app.get("/sessions/{sid}")
    async def get(sid: str, request: Request) -> dict[str, Any]:
        return gw.session_for(sid, request, admin=True).summary(request.query_params.get("tokens", "1") != "0")

    @app.post("/sessions/{sid}/reward")
    async def reward(sid: str, request: Request) -> dict[str, Any]:
        session = gw.session_for(sid, request, admin=True)
        data = await body(request)
        value, kind = data.get("reward"), data.get("kind", "final")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or kind not in ("final", "turn"):
            raise APIError(400, "post {\"reward\": <number>, \"kind\": \"final\" | \"turn\"} (optional \"turn\", \"branch\")",
                           param="reward")
        try:
            posted = session.post_reward(value, kind, data.get("turn"), data.get("branch"))
        except ValueError as exc:
            raise APIError(409 if session.finished else 400, str(exc), param="reward") from None
        return {"id": sid, "reward": vars(posted)}

    @app.post("/sessions/{sid}/finish")
    async def finish(sid: str, request: Request) -> dict[str, Any]:
        session = gw.session_for(sid, request, admin=True)
        data = await body(request, required=False)
        value = data.get("reward")
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise APIError(400, "'reward' must be a number", param="reward")
        was_open = not session.finished
        trajectories = gw.store.finish(session, failure=data.get("failure"),
                                       reward=value if was_open else None)
        if was_open:
            gw.policy.release_session(session.id)
        return {"id": sid, "group_id": session.group_id, "trajectories": [trajectory_json(t) for t in trajectories]}

    @app.post("/pause")
    async def pause(request: Request) -> dict[str, Any]:
        gw.require_admin(request)
        data = await body(request, required=False)
        return await gw.pause(float(data.get("drain_timeout", 60.0)))

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
        return ModelList(data=[ModelCard(id=gw.model_name, root=gw.model_name, max_model_len=gw.max_model_len)]).model_dump()

    @app.api_route("/v1/{rest:path}", methods=["GET", "POST"])
    async def root_v1(rest: str, request: Request) -> dict[str, Any]:
        """An OpenAI client pointed at the gateway's root: say how to get a session's base_url."""
        raise APIError(404, f"the gateway has no /v1/{rest} of its own: every agent talks to its own session. "
                       f"Create one first: POST {str(request.base_url).rstrip('/')}/sessions (body "
                       f'{{"task": {{...}}}}), then use the base_url and api_key it returns with the OpenAI '
                       f"client: OpenAI(base_url=session['base_url'], api_key=session['api_key'])",
                       code="no_session")

    return GatewayApp(gw, app)


async def read_body(gw: Gateway, request: Request, model: type | None = None, required: bool = True) -> Any:
    """The request's JSON object (validated as ``model`` if given), within the gateway's size limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > gw.max_body_bytes:
        raise APIError(413, f"the request body is {declared} bytes; the gateway takes at most {gw.max_body_bytes}",
                       code="request_too_large")
    raw = await request.body()
    if len(raw) > gw.max_body_bytes:
        raise APIError(413, f"the request body is over {gw.max_body_bytes} bytes", code="request_too_large")
    data = json_object(raw, required)
    return data if model is None else validate(model, data)


_MODEL_CALLS = {"chat/completions": (ChatCompletionRequest, Gateway.chat_completion),
                "completions": (CompletionRequest, Gateway.completion)}


class GatewayApp:
    """The gateway's ASGI app. ``POST /sessions/<id>/v1/chat/completions`` and ``.../completions``
    are answered here, before the FastAPI app (``api``) that serves every other route.

    Why: the model calls are the gateway's hot path, and FastAPI's middleware stack (error,
    exception, body-limit, telemetry and exit-stack middlewares, the router, anyio's per-request
    task group) cost more CPU per call than rendering the chat does. Errors keep OpenAI's shape.
    """

    def __init__(self, gateway: Gateway, api: FastAPI) -> None:
        self.gateway, self.api = gateway, api
        self.state = api.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if path.startswith("/sessions/"):
            sid, sep, rest = path[10:].partition("/v1/")
            call = _MODEL_CALLS.get(rest) if sep and sid and "/" not in sid else None
            if call is not None:
                response = await self.model_call(sid, *call, Request(scope, receive), scope["method"])
                await response(scope, receive, send)
                return
        await self.api(scope, receive, send)

    async def model_call(self, sid: str, model: type, method: Any, request: Request, verb: str) -> Response:
        gw = self.gateway
        try:
            if verb != "POST":
                raise APIError(405, f"{request.url.path} takes POST", code="method_not_allowed")
            session = gw.open_session(gw.session_for(sid, request))
            return await method(gw, session, await read_body(gw, request, model))
        except APIError as exc:  # SessionError too
            return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)
        except Exception as exc:  # the gateway stays up; the agent gets a 500 in OpenAI's shape
            gw.counts["errors"] += 1
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
