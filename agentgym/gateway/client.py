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
    """Async admin client of a gateway (local or remote): sessions, rewards, queries, servers, pause/resume."""

    def __init__(
        self, url: str, admin_key: str | None = None, timeout: float = 120.0, max_connections: int = 64
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = HTTPPools(max_connections, base_url=self.url, headers=headers, timeout=timeout)

    async def _call(
        self, method: str, path: str, payload: dict[str, Any] | None = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(4):
            try:
                response = await self._http.request(method, path, json=payload, params=params)
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
        raise RuntimeError(
            f"gateway {self.url} unreachable ({type(last).__name__}: {last}); is `agentgym gateway` running?"
        )

    async def create_session(
        self,
        task: dict[str, Any] | None = None,
        group_id: str | None = None,
        sampling: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """-> ``{"id", "api_key", "base_url", "anthropic_base_url", "group_id"}``."""
        body = {"task": task or {}, "group_id": group_id, "sampling": sampling or {}}
        if metadata:
            body["metadata"] = metadata
        return await self._call("POST", "/sessions", body)

    async def post_reward(self, sid: str, reward: float, kind: str = "final", turn: int | None = None) -> None:
        await self._call("POST", f"/sessions/{sid}/reward", {"reward": reward, "kind": kind, "turn": turn})

    async def finish_session(
        self, sid: str, failure: str | None = None, reward: float | None = None
    ) -> list[Trajectory]:
        body = await self._call("POST", f"/sessions/{sid}/finish", {"failure": failure, "reward": reward})
        return [Trajectory.from_dict(t) for t in body["trajectories"]]

    async def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Sessions by creation time: ``status`` ``open``/``finished``/``failed``, ``since``/``until`` Unix times."""
        params = {
            k: v
            for k, v in {
                "group_id": group_id,
                "status": status,
                "since": since,
                "until": until,
                "limit": limit,
                "offset": offset,
            }.items()
            if v is not None
        }
        return (await self._call("GET", "/sessions", params=params))["sessions"]

    async def set_metadata(self, sid: str, metadata: dict[str, Any]) -> dict[str, Any]:
        """Merge ``metadata`` into the session's; returns all of it."""
        return (await self._call("POST", f"/sessions/{sid}/metadata", {"metadata": metadata}))["metadata"]

    async def calls(self, sid: str) -> list[dict[str, Any]]:
        """One record per model call of the session: request, responses, latency, token counts."""
        return (await self._call("GET", f"/sessions/{sid}/calls"))["calls"]

    async def delete_session(self, sid: str) -> None:
        await self._call("DELETE", f"/sessions/{sid}")

    async def servers(self) -> list[dict[str, Any]]:
        return (await self._call("GET", "/servers"))["servers"]

    async def add_server(self, url: str) -> list[dict[str, Any]]:
        """Route model calls to ``url`` too (it must answer ``/health`` first)."""
        return (await self._call("POST", "/servers", {"url": url}))["servers"]

    async def remove_server(self, url: str, drain_timeout: float = 60.0) -> list[dict[str, Any]]:
        """Stop routing to ``url`` once its calls in flight are done; its sessions move to the others."""
        return (await self._call("DELETE", "/servers", params={"url": url, "drain_timeout": drain_timeout}))["servers"]

    async def pause(self, drain_timeout: float = 60.0) -> dict[str, Any]:
        return await self._call("POST", "/pause", {"drain_timeout": drain_timeout})

    async def resume(self, weight_version: int | None = None) -> dict[str, Any]:
        return await self._call("POST", "/resume", {"weight_version": weight_version})

    @contextlib.asynccontextmanager
    async def weight_update(
        self, weight_version: int | None = None, drain_timeout: float = 60.0
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
