"""httpx, for ``https://`` policy servers (``http://`` ones go through ``agentgym.client.http11``):
``HTTPPools``, keep-alive connections split into small httpx clients, and ``HttpxTransport``,
which gives them ``http11.ConnectionPool``'s shape (``request``, ``stream``, ``aclose``) so
``PolicyClient`` calls either the same way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from agentgym.client.http11 import ConnectionPool, TransportError
from agentgym.client.tls import ssl_context


class HTTPPools:
    """Up to ``limit`` keep-alive connections, in httpx clients (pools) of ``size`` connections each.

    httpcore's pool walks all its connections every time a request starts or ends (a ``poll()``
    per idle connection, and for each idle one another pass over all of them), so its cost per
    request grows faster than its size. Here a request takes the open pool with the fewest
    requests in flight; another pool is opened only when every open one is full, and requests
    beyond ``limit`` wait in a semaphore, never in an httpx queue. ``client_options`` go to
    every ``httpx.AsyncClient`` (``base_url``, ``headers``, ``timeout``...).
    """

    def __init__(self, limit: int, size: int = 4, **client_options: Any) -> None:
        self.size = max(1, min(size, limit))
        self.clients: list[httpx.AsyncClient] = []
        self.busy: list[int] = []  # requests in flight, per client
        self.slots = asyncio.Semaphore(limit)
        if "verify" not in client_options:
            client_options["verify"] = ssl_context()
        self._options = {
            "limits": httpx.Limits(max_connections=self.size, max_keepalive_connections=self.size),
            **client_options,
        }

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[httpx.AsyncClient]:
        """The least busy pool's client (a new pool when every pool is full), counted busy while held."""
        async with self.slots:
            busy = self.busy
            k = min(range(len(busy)), key=busy.__getitem__, default=-1)
            if k < 0 or busy[k] >= self.size:
                self.clients.append(httpx.AsyncClient(**self._options))
                busy.append(0)
                k = len(busy) - 1
            busy[k] += 1
            try:
                yield self.clients[k]
            finally:
                busy[k] -= 1

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """``httpx.AsyncClient.request`` on the least busy pool (the response is read in full)."""
        async with self._client() as client:
            return await client.request(method, url, **kwargs)

    @contextlib.asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """``httpx.AsyncClient.stream`` on the least busy pool: the response before its body is read."""
        async with self._client() as client, client.stream(method, url, **kwargs) as response:
            yield response

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))


class HttpxStreamed:
    """An httpx streamed response in ``http11.Streamed``'s shape: ``status``, ``async for piece``, ``read()``."""

    def __init__(self, response: httpx.Response) -> None:
        self.status, self._response = response.status_code, response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._response.aiter_raw():
                yield piece
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self])


class HttpxTransport:
    """``ConnectionPool``'s ``request``/``aclose`` over ``HTTPPools``, for ``https://`` servers."""

    def __init__(self, base: str, pools: HTTPPools) -> None:
        self.base, self.pools = base, pools

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
        try:
            response = await self.pools.request(
                method, self.base + path, content=body, headers=headers or None, timeout=timeout
            )
        except httpx.TransportError as exc:  # connect, read, write, pool, protocol errors
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return response.status_code, response.content

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, path: str, body: bytes | None = None, timeout: float | None = None
    ) -> AsyncIterator[HttpxStreamed]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            async with self.pools.stream(
                method, self.base + path, content=body, headers=headers or None, timeout=timeout
            ) as response:
                yield HttpxStreamed(response)
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self.pools.aclose()


def transport_for(url: str, max_connections: int, pool_size: int, timeout: float) -> ConnectionPool | HttpxTransport:
    """``http://`` servers: ``http11.ConnectionPool``; anything else (``https://``): httpx."""
    parts = httpx.URL(url)
    if parts.scheme == "http" and parts.host:
        return ConnectionPool(parts.host, parts.port or 80, max_connections, prefix=parts.raw_path.decode().rstrip("/"))
    return HttpxTransport(url, HTTPPools(max_connections, pool_size, timeout=httpx.Timeout(timeout, connect=10.0)))
