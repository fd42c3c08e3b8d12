"""A lean HTTP/1.1 keep-alive client for the token path (``PolicyClient`` -> policy servers).

Why not httpx here: every model call of the rollout runner and the gateway is one small POST to
a policy server on a private network, and httpx + httpcore spend about 0.5 ms of CPU on each
(request and header models, the connection pool's bookkeeping, anyio's cancel scopes). In the
gateway that was 40% of its CPU per call. This client writes the request bytes itself and
parses responses with ``httptools`` (the C parser uvicorn uses, installed with it), for about a
tenth of that. It does plain ``http://`` only; ``PolicyClient`` uses httpx for ``https://``.

``ConnectionPool(host, port, limit, prefix=...)``: request paths go under ``prefix``; up to
``limit`` connections, reused most-recent first; requests beyond that wait for one to come back.
``request()`` returns ``(status, body)``, ``fetch()`` the whole ``Answer``. A connection that
fails, times out or is cancelled mid-request is closed, never reused, and ``TransportError``
says what happened. Only a request that the server closed its reused idle connection on
without answering a byte is sent again, once, on a fresh connection (a timeout never is).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import NamedTuple

import httptools


class TransportError(ConnectionError):
    """The request got no complete answer: connecting, sending or reading failed, or timed out."""


class Answer(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]  # as sent, names not lowered
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Answer] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.received = False  # any byte of the current response
        self.headers_done = False
        self.lost_unanswered = False  # the server closed it before answering the current request
        self.closed = False
        self.keep_alive = True
        self.framed = False  # the response says where its body ends (length or chunked)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(TransportError(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            if self.headers_done and not self.framed and exc is None:  # body delimited by the close
                waiter.set_result(self._answer())
            else:
                self.lost_unanswered = not self.received
                reason = f": {exc}" if exc else ""
                waiter.set_exception(TransportError(f"the server closed the connection{reason}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(self._answer())

    def _answer(self) -> Answer:
        return Answer(self.parser.get_status_code(), self.headers, b"".join(self.body))

    # use
    def send(self, data: bytes) -> asyncio.Future[Answer]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.headers, self.body, self.received, self.framed, self.headers_done = [], [], False, False, False
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self.keep_alive


class ConnectionPool:
    """Keep-alive connections to one ``host:port``; see the module docstring."""

    def __init__(self, host: str, port: int, limit: int = 1024, connect_timeout: float = 10.0,
                 headers: Mapping[str, str] | None = None, prefix: str = "") -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self.connect_timeout = connect_timeout
        self.limit = limit
        self.idle: list[_Connection] = []
        self.slots = asyncio.Semaphore(limit)
        self._loop: asyncio.AbstractEventLoop | None = None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._host = f"Host: {host}:{port}\r\n".encode("latin-1")
        self._head = extra.encode("latin-1")
        self.opened = 0  # connections opened so far (a test and stats figure)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(_Connection, self.host, self.port),
                                             self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise TransportError(f"could not connect to {self.host}:{self.port}: {exc or 'timed out'}") from None
        self.opened += 1
        return conn

    async def request(self, method: str, path: str, body: bytes | None = None, timeout: float | None = None,
                      content_type: str = "application/json") -> tuple[int, bytes]:
        """Send one request; ``(status, body)`` of the answer. Raises ``TransportError``."""
        answer = await self.fetch(method, path, body, timeout, content_type)
        return answer.status, answer.body

    async def fetch(self, method: str, path: str, body: bytes | None = None, timeout: float | None = None,
                    content_type: str = "application/json", headers: Mapping[str, str] | None = None) -> Answer:
        """``request``, with extra request ``headers`` (a ``Host`` among them replaces the pool's); the
        whole ``Answer``, its headers included."""
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1")
        if headers:
            lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            head += (b"" if any(k.lower() == "host" for k in headers) else self._host) + self._head + lines.encode("latin-1")
        else:
            head += self._host + self._head
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n".encode("latin-1")
        data = head + b"\r\n" + (body or b"")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self.idle, self.slots, self._loop = [], asyncio.Semaphore(self.limit), loop
        async with self.slots:
            conn = self._idle_connection()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                try:
                    answer = await self._exchange(conn, data, timeout)
                except TransportError:
                    if not (reused and conn.lost_unanswered):  # a timeout, or a server that took the request
                        raise
                    conn.close()  # the server closed it while it sat idle: nothing was processed
                    conn = await self._connect()
                    answer = await self._exchange(conn, data, timeout)
            except BaseException:
                conn.close()
                raise
            if conn.reusable:
                self.idle.append(conn)
            else:
                conn.close()
            return answer

    def _idle_connection(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    @staticmethod
    async def _exchange(conn: _Connection, data: bytes, timeout: float | None) -> Answer:
        if conn.closed:
            raise TransportError("the connection is closed")
        try:
            if timeout is None:
                return await conn.send(data)
            return await asyncio.wait_for(conn.send(data), timeout)
        except asyncio.TimeoutError:
            raise TransportError(f"no complete answer within {timeout:.0f} s") from None

    async def aclose(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        await asyncio.sleep(0)  # let the transports close
