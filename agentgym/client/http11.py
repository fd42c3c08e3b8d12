"""A lean HTTP/1.1 keep-alive client for the token path (``PolicyClient`` -> policy servers).

Why not httpx here: every model call of the rollout runner and the gateway is one small POST to
a policy server on a private network, and httpx + httpcore spend about 0.5 ms of CPU on each
(request and header models, the connection pool's bookkeeping, anyio's cancel scopes). In the
gateway that was 40% of its CPU per call. This client writes the request bytes itself and
parses responses with ``httptools`` (the C parser uvicorn uses, installed with it), for about a
tenth of that. It does plain ``http://`` only; ``PolicyClient`` uses httpx for ``https://``.

``ConnectionPool(host, port, limit, prefix=...)``: request paths go under ``prefix``; up to
``limit`` connections, reused most-recent first; requests beyond that wait for one to come back.
``request()`` returns ``(status, body)``, ``fetch()`` the whole ``Answer``; ``stream()`` gives the
status and headers as soon as they arrive and the body piece by piece (server-sent events). A connection that
fails, times out or is cancelled mid-request is closed, never reused, and ``TransportError``
says what happened. Only a request that the server closed its reused idle connection on
without answering a byte is sent again, once, on a fresh connection (a timeout never is).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
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
        self.pieces: asyncio.Queue[bytes | Exception | None] | None = None  # streaming: the body as it comes
        self.complete = False  # the current response has ended

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
        if self.pieces is not None and waiter is not None and waiter.done() and not self.complete:
            if self.framed or exc is not None:
                self.pieces.put_nowait(
                    TransportError(f"the server closed the connection mid-answer{f': {exc}' if exc else ''}")
                )
            else:  # body delimited by the close
                self.complete = True
                self.pieces.put_nowait(None)
            return
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
        if self.pieces is not None and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(Answer(self.parser.get_status_code(), self.headers, b""))

    def on_body(self, body: bytes) -> None:
        if self.pieces is not None:
            self.pieces.put_nowait(body)
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        if self.pieces is not None:
            self.pieces.put_nowait(None)
            return
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(self._answer())

    def _answer(self) -> Answer:
        return Answer(self.parser.get_status_code(), self.headers, b"".join(self.body))

    # use
    def send(self, data: bytes, streaming: bool = False) -> asyncio.Future[Answer]:
        """Write a request; the future resolves to the whole answer, or (``streaming``) to its status and
        headers, the body then coming through ``pieces`` (``None`` at its end)."""
        self.waiter = asyncio.get_running_loop().create_future()
        self.headers, self.body, self.received, self.framed, self.headers_done = [], [], False, False, False
        self.pieces = asyncio.Queue() if streaming else None
        self.complete = False
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        elif self.pieces is not None and not self.complete:
            self.pieces.put_nowait(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self.keep_alive and (self.pieces is None or self.complete)


class Streamed:
    """A streamed answer: ``status``, ``headers``, and the body as it arrives (``async for piece in
    answer``); each piece must come within the pool's ``timeout``, else ``TransportError``."""

    def __init__(self, answer: Answer, conn: _Connection, timeout: float | None) -> None:
        self.status, self.headers = answer.status, answer.headers
        self.header = answer.header
        self._conn, self._timeout = conn, timeout

    def __aiter__(self) -> Streamed:
        return self

    async def __anext__(self) -> bytes:
        pieces = self._conn.pieces
        assert pieces is not None
        if self._conn.complete and pieces.empty():
            raise StopAsyncIteration
        try:
            piece = await (pieces.get() if self._timeout is None else asyncio.wait_for(pieces.get(), self._timeout))
        except asyncio.TimeoutError:
            raise TransportError(f"no more of the answer within {self._timeout:.0f} s") from None
        if piece is None:
            raise StopAsyncIteration
        if isinstance(piece, Exception):
            raise piece
        return piece

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self])


class ConnectionPool:
    """Keep-alive connections to one ``host:port``; see the module docstring."""

    def __init__(
        self,
        host: str,
        port: int,
        limit: int = 1024,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
    ) -> None:
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
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), self.connect_timeout
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise TransportError(f"could not connect to {self.host}:{self.port}: {exc or 'timed out'}") from None
        self.opened += 1
        return conn

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        """Send one request; ``(status, body)`` of the answer. Raises ``TransportError``."""
        answer = await self.fetch(method, path, body, timeout, content_type)
        return answer.status, answer.body

    async def fetch(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float | None = None,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """``request``, with extra request ``headers`` (a ``Host`` among them replaces the pool's); the
        whole ``Answer``, its headers included."""
        data = self._request_bytes(method, path, body, content_type, headers)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self.idle, self.slots, self._loop = [], asyncio.Semaphore(self.limit), loop
        async with self.slots:
            conn, answer = await self._send(data, timeout, streaming=False)
            if conn.reusable:
                self.idle.append(conn)
            else:
                conn.close()
            return answer

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        timeout: float | None = None,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Streamed]:
        """``async with pool.stream(...) as answer``: the status and headers as soon as they come, the body
        by ``async for piece in answer``. Leaving the block early closes the connection (the server
        sees the client go); a fully read answer leaves it for reuse."""
        data = self._request_bytes(method, path, body, content_type, headers)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self.idle, self.slots, self._loop = [], asyncio.Semaphore(self.limit), loop
        async with self.slots:
            conn, answer = await self._send(data, timeout, streaming=True)
            try:
                yield Streamed(answer, conn, timeout)
            except BaseException:
                conn.close()
                raise
            if conn.reusable:
                self.idle.append(conn)
            else:
                conn.close()

    def _request_bytes(
        self, method: str, path: str, body: bytes | None, content_type: str, headers: Mapping[str, str] | None
    ) -> bytes:
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1")
        if headers:
            lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            head += (
                (b"" if any(k.lower() == "host" for k in headers) else self._host)
                + self._head
                + lines.encode("latin-1")
            )
        else:
            head += self._host + self._head
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n".encode("latin-1")
        return head + b"\r\n" + (body or b"")

    async def _send(self, data: bytes, timeout: float | None, streaming: bool) -> tuple[_Connection, Answer]:
        """Send on an idle connection (or a new one) and wait for the answer (streaming: its head)."""
        conn = self._idle_connection()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        try:
            try:
                return conn, await self._exchange(conn, data, timeout, streaming)
            except TransportError:
                if not (reused and conn.lost_unanswered):  # a timeout, or a server that took the request
                    raise
                conn.close()  # the server closed it while it sat idle: nothing was processed
                conn = await self._connect()
                return conn, await self._exchange(conn, data, timeout, streaming)
        except BaseException:
            conn.close()
            raise

    def _idle_connection(self) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    @staticmethod
    async def _exchange(conn: _Connection, data: bytes, timeout: float | None, streaming: bool = False) -> Answer:
        if conn.closed:
            raise TransportError("the connection is closed")
        try:
            if timeout is None:
                return await conn.send(data, streaming)
            return await asyncio.wait_for(conn.send(data, streaming), timeout)
        except asyncio.TimeoutError:
            raise TransportError(f"no complete answer within {timeout:.0f} s") from None

    async def aclose(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        await asyncio.sleep(0)  # let the transports close
