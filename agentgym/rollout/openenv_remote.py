"""Env instances in OpenEnv servers (``env_executor="openenv"``): one WebSocket session per episode."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from agentgym.rollout.env_handles import EnvHandle, EnvTimeout, WorkerCrashed


class OpenEnvSession:
    """One ``/ws`` session with an OpenEnv server: one env instance there, reused across episodes."""

    def __init__(self, url: str, ws: Any) -> None:
        self.url = url
        self.ws = ws

    @classmethod
    async def connect(cls, url: str) -> OpenEnvSession:
        from websockets.asyncio.client import connect

        ws_url = "ws" + url[len("http") :] if url.startswith("http") else url
        try:
            ws = await connect(f"{ws_url}/ws", max_size=None, open_timeout=30, ping_interval=None)
        except Exception as exc:  # noqa: BLE001
            raise WorkerCrashed(
                f"could not open an OpenEnv session at {url}/ws: {type(exc).__name__}: {exc}. "
                "Is the env server running (agentgym env-serve --env NAME)?"
            ) from exc
        return cls(url, ws)

    async def request(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        try:
            await self.ws.send(json.dumps(message))
            raw = await asyncio.wait_for(self.ws.recv(), timeout) if timeout is not None else await self.ws.recv()
        except asyncio.TimeoutError:
            raise EnvTimeout(
                f"OpenEnv {message['type']} at {self.url} took longer than env_timeout={timeout}s"
            ) from None
        except Exception as exc:  # noqa: BLE001 - the connection closed: the server or its env is gone
            raise WorkerCrashed(f"OpenEnv session at {self.url} closed: {type(exc).__name__}: {exc}") from exc
        reply = json.loads(raw)
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            raise RuntimeError(f"OpenEnv server {self.url}: {data.get('message', data)}")
        return reply.get("data") or {}

    async def describe(self, timeout: float | None) -> dict[str, Any]:
        state = await self.request({"type": "state"}, timeout)
        return {"num_tasks": state.get("num_tasks"), "max_turns": state.get("max_turns"), "agents": state.get("agents")}

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.transport.abort()


class OpenEnvHandle(EnvHandle):
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.session: OpenEnvSession | None = None

    async def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[list, dict]:
        if self.session is None:
            self.session = await self.backend._session()
        data = await self.session.request(
            {"type": "reset", "data": {"seed": seed, "options": options}}, self.backend.timeout
        )
        observation = data.get("observation") or {}
        return observation.get("messages") or [], observation.get("info") or {}

    async def step(self, action: Any) -> tuple[list, float, bool, bool, dict]:
        assert self.session is not None, "reset() first"
        data = await self.session.request({"type": "step", "data": {"message": action}}, self.backend.timeout)
        observation = data.get("observation") or {}
        truncated = bool(observation.get("truncated"))
        terminated = bool(data.get("done")) and not truncated
        return (
            observation.get("messages") or [],
            float(data.get("reward") or 0.0),
            terminated,
            truncated,
            observation.get("info") or {},
        )

    async def release(self, healthy: bool) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        if healthy:
            self.backend._sessions.append(session)
        else:  # a timed-out or failed call: drop the session, so the server drops that env
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.ws.close(), 1.0)
            session.abort()
