"""``agentgym env-serve``: any registered env behind OpenEnv's HTTP/WebSocket API.

    agentgym env-serve --env sokoban --port 8010
    agentgym env-serve --env rg/chain_sum --env-arg size=500
    agentgym env-serve --env sokoban --mcp      # as MCP tools instead (mcp_server.py)

The routes are OpenEnv's (``openenv-core``'s ``HTTPEnvServer``), so OpenEnv's own clients
(``GenericEnvClient(base_url=...)``) and agentgym's ``openenv`` env / ``env.executor=openenv``
step it:

* ``WS /ws``: a session per connection, holding its own env instance. Messages
  ``{"type": "reset", "data": {"seed": 3, "options": {...}}}``, ``{"type": "step", "data":
  {"message": <the assistant's reply: text or a message dict>}}``, ``{"type": "state"}``,
  ``{"type": "close"}``; answers ``{"type": "observation", "data": {"observation": {...},
  "reward": r, "done": d}}``, ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data":
  {"message": ..., "code": ...}}``.
* ``POST /reset`` and ``POST /step``: as in OpenEnv, each request gets a fresh env unless it
  names an ``episode_id`` (a ``/reset`` with one keeps that env for the ``/step`` calls that
  name it, until ``done`` or ``max_sessions`` pushes it out).
* ``GET /state`` (``?episode_id=``), ``GET /health``, ``GET /schema``, ``GET /metadata``.

An observation is ``{"messages": [...new chat messages...], "info": {...}, "truncated": bool}``
(``info`` as the env returned it, made JSON-safe); ``reward`` is the turn reward and ``done``
is ``terminated or truncated``. Env calls run on threads, so one slow env never stalls the
others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# Module level, not inside create_app: FastAPI reads the endpoints' (string) annotations from
# this module's globals, and a WebSocket parameter it cannot resolve turns into a 403.
from fastapi import Body, FastAPI, HTTPException, WebSocket, WebSocketDisconnect

from agentgym.envs.adapters.wire import jsonable

ACTION_SCHEMA = {
    "title": "AgentgymAction",
    "type": "object",
    "required": ["message"],
    "properties": {
        "message": {
            "description": "the assistant's reply: text, or an OpenAI message dict (content and/or tool_calls)",
            "anyOf": [{"type": "string"}, {"type": "object"}],
        }
    },
}
OBSERVATION_SCHEMA = {
    "title": "AgentgymObservation",
    "type": "object",
    "properties": {
        "messages": {
            "type": "array",
            "items": {"type": "object"},
            "description": "the new chat messages since the last step",
        },
        "info": {"type": "object"},
        "truncated": {"type": "boolean"},
        "episode_id": {"type": "string"},
    },
}
STATE_SCHEMA = {
    "title": "AgentgymState",
    "type": "object",
    "properties": {"episode_id": {"type": "string"}, "step_count": {"type": "integer"}},
}


class _Session:
    """One env instance and its episode counters."""

    def __init__(self, env: Any, episode_id: str | None = None) -> None:
        self.env = env
        self.episode_id = episode_id or uuid.uuid4().hex
        self.step_count = 0
        self.done = False
        self.lock = asyncio.Lock()

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        async with self.lock:
            messages, info = await asyncio.to_thread(self.env.reset, seed=seed, options=options)
        self.step_count = 0
        self.done = False
        return {
            "observation": {
                "messages": jsonable(list(messages)),
                "info": jsonable(dict(info or {})),
                "truncated": False,
                "episode_id": self.episode_id,
            },
            "reward": None,
            "done": False,
        }

    async def step(self, action: Any) -> dict[str, Any]:
        async with self.lock:
            messages, reward, terminated, truncated, info = await asyncio.to_thread(self.env.step, action)
        self.step_count += 1
        self.done = bool(terminated or truncated)
        return {
            "observation": {
                "messages": jsonable(list(messages)),
                "info": jsonable(dict(info or {})),
                "truncated": bool(truncated),
                "episode_id": self.episode_id,
            },
            "reward": float(reward),
            "done": self.done,
        }

    def state(self, describe: dict[str, Any]) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count, "done": self.done, **describe}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.env.close()


def _action(data: dict[str, Any]) -> Any:
    if "message" not in data:
        raise ValueError(f"a step's action is {{'message': <text or assistant message dict>}}; got keys {sorted(data)}")
    return data["message"]


def create_app(
    env_name: str,
    env_kwargs: dict[str, Any] | None = None,
    max_sessions: int = 1024,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """The FastAPI app serving ``env_name`` (or ``factory``'s envs) with OpenEnv's API."""
    from agentgym.registry import env_spec, make

    kwargs = dict(env_kwargs or {})
    build = factory or (lambda: make(env_name, **kwargs))
    description = ""
    with contextlib.suppress(Exception):
        description = env_spec(env_name).description
    probe = build()
    num_tasks = probe.num_tasks() if hasattr(probe, "num_tasks") else None
    agents = getattr(probe, "agents", None)
    describe = {
        "env": env_name,
        "num_tasks": num_tasks,
        "max_turns": getattr(probe, "max_turns", None),
        "agents": list(agents) if agents else None,
    }
    idle: list[Any] = [probe]
    episodes: OrderedDict[str, _Session] = OrderedDict()
    active = itertools.count()
    app = FastAPI(
        title=f"agentgym env-serve: {env_name}", description="An agentgym env behind OpenEnv's HTTP/WebSocket API"
    )
    app.state.sessions = 0
    app.state.describe = describe

    def new_env() -> Any:
        return idle.pop() if idle else build()

    def give_back(session: _Session, healthy: bool) -> None:
        if healthy and len(idle) < 64:
            idle.append(session.env)
        else:
            session.close()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        import importlib.metadata

        version = importlib.metadata.version("agentgym")
        return {"name": env_name, "description": description, "version": version, "author": "agentgym", **describe}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {"action": ACTION_SCHEMA, "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA}

    @app.get("/state")
    async def state(episode_id: str | None = None) -> dict[str, Any]:
        if episode_id is not None:
            session = episodes.get(episode_id)
            if session is None:
                raise HTTPException(404, f"no episode {episode_id!r}: POST /reset with it first")
            return session.state(describe)
        return {"episode_id": None, "step_count": 0, **describe}

    @app.post("/reset")
    async def reset(request: dict[str, Any] = Body(default_factory=dict)) -> dict[str, Any]:
        episode_id = request.get("episode_id")
        session = _Session(new_env(), episode_id)
        try:
            result = await session.reset(request.get("seed"), request.get("options"))
        except Exception as exc:
            session.close()
            raise HTTPException(500, f"env reset raised {type(exc).__name__}: {exc}") from exc
        if episode_id is None:  # OpenEnv's stateless reset
            give_back(session, True)
            return result
        old = episodes.pop(episode_id, None)
        if old is not None:
            give_back(old, True)
        episodes[episode_id] = session
        while len(episodes) > max_sessions:
            give_back(episodes.popitem(last=False)[1], True)
        return result

    @app.post("/step")
    async def step(request: dict[str, Any] = Body(...)) -> dict[str, Any]:
        try:
            action = _action(request.get("action") or {})
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        episode_id = request.get("episode_id")
        session = episodes.get(episode_id) if episode_id is not None else None
        if episode_id is not None and session is None:
            raise HTTPException(404, f"no episode {episode_id!r}: POST /reset with it first")
        fresh = session is None
        if fresh:  # OpenEnv's stateless step: a fresh env, reset, one step
            session = _Session(new_env())
            await session.reset(request.get("seed"), request.get("options"))
        try:
            result = await session.step(action)
        except Exception as exc:
            episodes.pop(session.episode_id, None)
            session.close()
            raise HTTPException(500, f"env step raised {type(exc).__name__}: {exc}") from exc
        if fresh or session.done:
            episodes.pop(session.episode_id, None)
            give_back(session, True)
        return result

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        if app.state.sessions >= max_sessions:
            await websocket.send_text(
                json.dumps(
                    {
                        "type": "error",
                        "data": {
                            "message": f"env server full: {max_sessions} sessions (agentgym env-serve --max-sessions)",
                            "code": "CAPACITY_REACHED",
                        },
                    }
                )
            )
            await websocket.close()
            return
        app.state.sessions += 1
        next(active)
        session = _Session(new_env())
        healthy = True
        try:
            while True:
                raw = await websocket.receive_text()
                try:
                    message = json.loads(raw)
                    kind = message.get("type")
                    data = message.get("data") or {}
                    if kind == "reset":
                        reply = {
                            "type": "observation",
                            "data": await session.reset(data.get("seed"), data.get("options")),
                        }
                    elif kind == "step":
                        reply = {"type": "observation", "data": await session.step(_action(data))}
                    elif kind == "state":
                        reply = {"type": "state", "data": session.state(describe)}
                    elif kind == "close":
                        break
                    else:
                        reply = {
                            "type": "error",
                            "data": {"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"},
                        }
                except Exception as exc:  # noqa: BLE001 - the client hears about it; the session goes on
                    healthy = False
                    reply = {
                        "type": "error",
                        "data": {"message": f"{type(exc).__name__}: {exc}", "code": "EXECUTION_ERROR"},
                    }
                await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        finally:
            app.state.sessions -= 1
            give_back(session, healthy and not session.lock.locked())
            with contextlib.suppress(Exception):
                await websocket.close()

    return app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.envs import env_args

    parser.add_argument("--env", required=True, help="registered env name (see `agentgym envs`)")
    parser.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=env_args.HELP)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--max-sessions", type=int, default=1024, help="most env instances alive at once")
    from agentgym.envs.adapters import mcp_server

    mcp_server.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``agentgym env-serve --env NAME [--env-arg K=V] [--host] [--port] [--max-sessions] [--mcp]``."""
    import uvicorn

    from agentgym.envs.env_args import parse_env_args
    from agentgym.registry import UnknownNameError

    try:
        env_kwargs: dict[str, Any] = parse_env_args(args.env_arg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.mcp:
        from agentgym.envs.adapters import mcp_server

        return mcp_server.run(args, env_kwargs)
    try:
        app = create_app(args.env, env_kwargs, max_sessions=args.max_sessions)
    except UnknownNameError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bad --env-arg, a missing package: say so
        print(
            f"error: could not build env {args.env!r} with {env_kwargs}: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 2
    print(
        f"serving {args.env} with OpenEnv's API at http://{args.host}:{args.port} "
        f"(WebSocket /ws, POST /reset /step, GET /state /health /schema)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", ws_max_size=1 << 26)
    return 0
