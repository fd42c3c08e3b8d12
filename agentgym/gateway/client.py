"""The gateway's admin client: what the trainer (or any program holding the admin key) calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentgym.client import HTTPPools
from agentgym.types import Trajectory


class GatewayClient:
    """Async admin client of a gateway (local or remote): sessions, rewards, pause/resume."""

    def __init__(self, url: str, admin_key: str | None = None, timeout: float = 120.0,
                 max_connections: int = 64) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = HTTPPools(max_connections, base_url=self.url, headers=headers, timeout=timeout)

    async def _call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(4):
            try:
                response = await self._http.request(method, path, json=payload)
            except httpx.TransportError as exc:
                last = exc
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            if response.status_code >= 400:
                try:
                    message = response.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = response.text[:300]
                raise RuntimeError(f"gateway {method} {path} failed ({response.status_code}): {message}")
            return response.json()
        raise RuntimeError(f"gateway {self.url} unreachable ({type(last).__name__}: {last}); is `agentgym gateway` running?")

    async def create_session(self, task: dict[str, Any] | None = None, group_id: str | None = None,
                             sampling: dict[str, Any] | None = None) -> dict[str, Any]:
        """-> ``{"id", "api_key", "base_url", "group_id"}``."""
        return await self._call("POST", "/sessions", {"task": task or {}, "group_id": group_id, "sampling": sampling or {}})

    async def post_reward(self, sid: str, reward: float, kind: str = "final", turn: int | None = None) -> None:
        await self._call("POST", f"/sessions/{sid}/reward", {"reward": reward, "kind": kind, "turn": turn})

    async def finish_session(self, sid: str, failure: str | None = None, reward: float | None = None) -> list[Trajectory]:
        body = await self._call("POST", f"/sessions/{sid}/finish", {"failure": failure, "reward": reward})
        return [Trajectory.from_dict(t) for t in body["trajectories"]]

    async def get_session(self, sid: str) -> dict[str, Any]:
        return await self._call("GET", f"/sessions/{sid}")

    async def pause(self, drain_timeout: float = 60.0) -> dict[str, Any]:
        return await self._call("POST", "/pause", {"drain_timeout": drain_timeout})

    async def resume(self, weight_version: int | None = None) -> dict[str, Any]:
        return await self._call("POST", "/resume", {"weight_version": weight_version})

    @contextlib.asynccontextmanager
    async def weight_update(self, weight_version: int | None = None, drain_timeout: float = 60.0
                            ) -> AsyncIterator[None]:
        """``async with client.weight_update(version): <push weights to the servers>``: model calls wait
        meanwhile; afterwards turns from servers that report no version record ``version``."""
        await self.pause(drain_timeout)
        try:
            yield
        finally:
            await self.resume(weight_version)

    async def stats(self) -> dict[str, Any]:
        return await self._call("GET", "/stats")

    async def aclose(self) -> None:
        await self._http.aclose()
