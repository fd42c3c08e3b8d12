"""``agentgym.client.http11``: the keep-alive client against tiny raw asyncio servers.

Each server here writes its HTTP responses by hand, so every misbehaviour (chunked bodies, a body
ended by the close, a close mid-response, an idle close, a request never answered) is staged exactly.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from agentgym.client.http11 import ConnectionPool, TransportError


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    conn: int  # which accepted connection it came on (0, 1, ...)
    seq: int  # its index among the requests on that connection


# a handler writes its answer (or not); returning False closes the connection right after
Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[bool | None]]


def reply(body: bytes = b"", status: int = 200, reason: str = "OK", headers: str = "") -> bytes:
    """A complete response framed by Content-Length; ``headers`` are extra raw header lines."""
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n{headers}\r\n").encode() + body


class RawServer:
    """``asyncio.start_server`` on 127.0.0.1 port 0 that parses requests and hands them to ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[Request] = []
        self.active = 0
        self.max_active = 0
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    def pool(self, limit: int = 16, **kwargs: object) -> ConnectionPool:
        return ConnectionPool("127.0.0.1", self.port, limit, **kwargs)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        conn, seq = self.connections, 0
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    method, path, _version = lines[0].split(" ")
                    headers = {}
                    for line in lines[1:]:
                        if line:
                            name, value = line.split(":", 1)
                            headers[name.strip().lower()] = value.strip()
                    body = await reader.readexactly(int(headers.get("content-length", "0")))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request = Request(method, path, headers, body, conn, seq)
                self.requests.append(request)
                self.active += 1
                self.max_active = max(self.max_active, self.active)
                try:
                    keep = await self.handler(request, writer)
                except ConnectionError:
                    return
                finally:
                    self.active -= 1
                if keep is False:
                    return
                seq += 1
        finally:
            writer.close()
            self._tasks.discard(task)


async def answer(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


# ---- 1. basic request / response ------------------------------------------------------------


async def test_post_sends_method_prefixed_path_headers_and_exact_body():
    async def handler(req, writer):
        if req.path == "/v1/missing":
            await answer(writer, reply(b'{"error": "no such route"}', 404, "Not Found"))
        else:
            await answer(writer, reply(b"ok:" + req.body, 201, "Created"))

    async with RawServer(handler) as server:
        pool = server.pool(prefix="/v1")
        body = b'{"prompt": [1, 2, 3], "text": "caf\xc3\xa9\\r\\n"}'
        assert await pool.request("POST", "/generate", body) == (201, b"ok:" + body)
        assert await pool.request("POST", "/missing", b"{}") == (404, b'{"error": "no such route"}')
        assert await pool.request("GET", "/health") == (201, b"ok:")
        await pool.aclose()

    post, missing, get = server.requests
    assert (post.method, post.path) == ("POST", "/v1/generate")
    assert post.headers["host"] == f"127.0.0.1:{server.port}"
    assert post.headers["content-type"] == "application/json"
    assert post.headers["content-length"] == str(len(body))
    assert post.body == body
    assert (missing.method, missing.path, missing.body) == ("POST", "/v1/missing", b"{}")
    assert (get.method, get.path, get.body) == ("GET", "/v1/health", b"")
    assert "content-length" not in get.headers and "content-type" not in get.headers


async def test_content_type_and_extra_headers_are_sent():
    async def handler(req, writer):
        await answer(writer, reply(b"x"))

    async with RawServer(handler) as server:
        pool = server.pool(headers={"Authorization": "Bearer abc"})
        assert await pool.request("PUT", "/w", b"\x00\x01", content_type="application/octet-stream") == (200, b"x")
        await pool.aclose()
    (req,) = server.requests
    assert req.method == "PUT" and req.body == b"\x00\x01"
    assert req.headers["content-type"] == "application/octet-stream"
    assert req.headers["authorization"] == "Bearer abc"


# ---- 2. keep-alive reuse --------------------------------------------------------------------


async def test_sequential_requests_reuse_one_connection():
    async def handler(req, writer):
        await answer(writer, reply(req.body))

    async with RawServer(handler) as server:
        pool = server.pool()
        for i in range(20):
            assert await pool.request("POST", "/echo", f"{i}".encode()) == (200, f"{i}".encode())
        await pool.aclose()
    assert pool.opened == 1
    assert server.connections == 1
    assert [r.seq for r in server.requests] == list(range(20))


# ---- 3. body framings -----------------------------------------------------------------------


async def test_chunked_response_is_decoded_and_the_connection_reused():
    async def handler(req, writer):
        await answer(writer, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
        await asyncio.sleep(0.01)  # the body arrives in pieces, split inside a chunk
        await answer(writer, b"lo\r\n")
        await asyncio.sleep(0.01)
        await answer(writer, b"7\r\n, world\r\n0\r\n\r\n")

    async with RawServer(handler) as server:
        pool = server.pool()
        assert await pool.request("POST", "/c", b"{}") == (200, b"hello, world")
        assert await pool.request("POST", "/c", b"{}") == (200, b"hello, world")
        await pool.aclose()
    assert pool.opened == 1 and server.connections == 1


async def test_body_delimited_by_connection_close_is_returned_whole():
    async def handler(req, writer):
        await answer(writer, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst part, ")
        await asyncio.sleep(0.02)
        await answer(writer, b"second part")
        return False  # the close ends the body

    async with RawServer(handler) as server:
        pool = server.pool()
        assert await pool.request("POST", "/eof", b"{}") == (200, b"first part, second part")
        assert await pool.request("POST", "/eof", b"{}") == (200, b"first part, second part")
        await pool.aclose()
    assert pool.opened == 2 and server.connections == 2


# ---- 4. Connection: close -------------------------------------------------------------------


async def test_connection_close_response_is_not_reused():
    async def handler(req, writer):
        # says close but keeps the socket open: the client must not reuse it anyway
        await answer(writer, reply(b"bye", headers="Connection: close\r\n"))

    async with RawServer(handler) as server:
        pool = server.pool()
        assert await pool.request("POST", "/a", b"1") == (200, b"bye")
        assert await pool.request("POST", "/a", b"2") == (200, b"bye")
        assert await pool.request("POST", "/a", b"3") == (200, b"bye")
        await pool.aclose()
    assert pool.opened == 3 and server.connections == 3
    assert [r.seq for r in server.requests] == [0, 0, 0]


# ---- 5. the server closes an idle keep-alive connection ----------------------------------


async def test_server_closing_an_idle_connection_is_survived():
    async def handler(req, writer):
        await answer(writer, reply(b"answer " + req.body))
        return False  # closes after answering, without a Connection: close header

    async with RawServer(handler) as server:
        pool = server.pool()
        assert await pool.request("POST", "/x", b"1") == (200, b"answer 1")
        await asyncio.sleep(0.05)  # the close reaches the client while the connection sits idle
        assert await pool.request("POST", "/x", b"2") == (200, b"answer 2")
        await pool.aclose()
    assert pool.opened == 2 and server.connections == 2
    assert [r.body for r in server.requests] == [b"1", b"2"]


async def test_server_closing_on_the_next_request_unanswered_is_resent_on_a_fresh_connection():
    async def handler(req, writer):
        if req.seq > 0:
            return False  # read the request, then close without a byte of answer
        await answer(writer, reply(b"answer " + req.body))

    async with RawServer(handler) as server:
        pool = server.pool()
        for i in range(8):
            assert await pool.request("POST", "/x", f"{i}".encode()) == (200, f"answer {i}".encode())
        await pool.aclose()
    assert pool.opened == 8 and server.connections == 8
    answered = [r.body for r in server.requests if r.seq == 0]
    assert answered == [f"{i}".encode() for i in range(8)]
    assert len(server.requests) == 15  # requests 1..7 each went first to the connection that closed


# ---- 6. the server closes mid-response --------------------------------------------------------


PARTIAL_RESPONSES = {
    "status-line": b"HTTP/1.1 20",
    "mid-header-name": b"HTTP/1.1 200 OK\r\nContent-Ty",
    "headers-not-ended": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n",
    "body-short-of-length": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
    "chunked-not-ended": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
}


@pytest.mark.parametrize("name", list(PARTIAL_RESPONSES))
async def test_server_closing_mid_response_raises_and_the_connection_is_dropped(name):
    async def handler(req, writer):
        if req.body == b"cut":
            await answer(writer, PARTIAL_RESPONSES[name])
            await asyncio.sleep(0.02)
            return False
        await answer(writer, reply(b"whole"))

    async with RawServer(handler) as server:
        pool = server.pool()
        assert await pool.request("POST", "/p", b"warm") == (200, b"whole")
        with pytest.raises(TransportError):
            await pool.request("POST", "/p", b"cut")
        assert await pool.request("POST", "/p", b"after") == (200, b"whole")
        await pool.aclose()
    assert pool.opened == 2 and server.connections == 2
    # the cut request was sent once (something came back, so it is not resent) and the next
    # request went to a new connection
    assert [(r.body, r.conn) for r in server.requests] == [(b"warm", 0), (b"cut", 0), (b"after", 1)]


# ---- 7. timeout -------------------------------------------------------------------------------


def late_handler(delay: float) -> Handler:
    """``/hang`` answers "stale" after ``delay`` s (past the client's timeout); anything else at once."""

    async def handler(req, writer):
        if req.path == "/hang":
            await asyncio.sleep(delay)
            await answer(writer, reply(b"stale"))
        else:
            await answer(writer, reply(b"fast " + req.body))

    return handler


async def test_timeout_raises_and_the_next_request_gets_its_own_answer():
    async with RawServer(late_handler(0.4)) as server:
        pool = server.pool()
        start = time.monotonic()
        with pytest.raises(TransportError):
            await asyncio.wait_for(pool.request("POST", "/hang", b"{}", timeout=0.2), 2)  # a hang fails, not hangs
        assert time.monotonic() - start < 1.0
        assert await pool.request("POST", "/fast", b"1") == (200, b"fast 1")
        await asyncio.sleep(0.3)  # the late answer to /hang has been written by now
        assert await pool.request("POST", "/fast", b"2") == (200, b"fast 2")
        await pool.aclose()
    assert pool.opened == 2


async def test_timeout_on_a_never_answering_server():
    async def handler(req, writer):
        await asyncio.sleep(3600)

    async with RawServer(handler) as server:
        pool = server.pool()
        start = time.monotonic()
        with pytest.raises(TransportError):
            await asyncio.wait_for(pool.request("POST", "/hang", b"{}", timeout=0.2), 2)  # a hang fails, not hangs
        assert time.monotonic() - start < 1.0
        await pool.aclose()


async def test_timeout_on_a_reused_connection_is_not_resent():
    async with RawServer(late_handler(0.4)) as server:
        pool = server.pool()
        assert await pool.request("POST", "/fast", b"warm") == (200, b"fast warm")
        start = time.monotonic()
        with pytest.raises(TransportError):
            await asyncio.wait_for(pool.request("POST", "/hang", b"{}", timeout=0.2), 2)  # a hang fails, not hangs
        elapsed = time.monotonic() - start
        await pool.aclose()
    assert [r.path for r in server.requests].count("/hang") == 1
    assert elapsed < 0.35


# ---- 8. cancellation ---------------------------------------------------------------------------


async def test_cancelled_request_never_leaves_its_pending_answer_to_the_next():
    async def handler(req, writer):
        if req.path == "/slow":
            await asyncio.sleep(0.3)
            await answer(writer, reply(b"slow"))
        else:
            await answer(writer, reply(b"fast"))

    async with RawServer(handler) as server:
        pool = server.pool(limit=1)
        assert await pool.request("POST", "/fast", b"{}") == (200, b"fast")  # one idle connection
        task = asyncio.create_task(pool.request("POST", "/slow", b"{}"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await pool.request("POST", "/fast", b"{}") == (200, b"fast")
        await asyncio.sleep(0.35)  # the slow answer has been written by now
        assert await pool.request("POST", "/fast", b"{}") == (200, b"fast")
        await pool.aclose()
    assert pool.opened == 2


# ---- 9. the concurrency cap ------------------------------------------------------------------


async def test_at_most_limit_requests_in_flight():
    async def handler(req, writer):
        await asyncio.sleep(0.05)
        await answer(writer, reply(req.body))

    async with RawServer(handler) as server:
        pool = server.pool(limit=3)
        bodies = [f"r{i}".encode() for i in range(12)]
        results = await asyncio.gather(*(pool.request("POST", "/s", b) for b in bodies))
        await pool.aclose()
    assert results == [(200, b) for b in bodies]
    assert server.max_active == 3
    assert pool.opened == 3 and server.connections == 3


# ---- 10. connect failure ---------------------------------------------------------------------


async def test_connect_failure_names_host_and_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the request: nothing listens there
    pool = ConnectionPool("127.0.0.1", port, 4)
    with pytest.raises(TransportError, match=f"127.0.0.1:{port}"):
        await pool.request("POST", "/x", b"{}")
    assert pool.opened == 0


# ---- 11. many concurrent requests never mix answers ------------------------------------------


async def test_concurrent_requests_each_get_their_own_answer():
    async def handler(req, writer):
        await asyncio.sleep(0.001 * (hash(req.body) % 5))  # answers finish out of order
        await answer(writer, reply(req.body))

    async with RawServer(handler) as server:
        pool = server.pool(limit=50)
        bodies = [f'{{"id": {i}, "pad": "{"x" * (i % 7)}"}}'.encode() for i in range(200)]
        results = await asyncio.gather(*(pool.request("POST", "/echo", b) for b in bodies))
        await pool.aclose()
    assert results == [(200, b) for b in bodies]
    assert server.max_active <= 50 and pool.opened <= 50
    assert sorted(r.body for r in server.requests) == sorted(bodies)  # each sent exactly once


# ---- 12. one pool across successive event loops --------------------------------------------


class ThreadedServer:
    """A ``RawServer`` on its own event loop in a thread, so it outlives the client's loops."""

    def __init__(self, handler: Handler) -> None:
        self.raw = RawServer(handler)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> RawServer:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.raw.__aenter__(), self.loop).result(5)

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self.raw.__aexit__(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_pool_works_from_two_successive_event_loops():
    async def handler(req, writer):
        await answer(writer, reply(b"echo " + req.body))

    with ThreadedServer(handler) as server:
        pool = server.pool(limit=2)  # made outside any running loop

        async def use(tag: str, close: bool) -> list[tuple[int, bytes]]:
            results = await asyncio.gather(*(pool.request("POST", "/e", f"{tag}{i}".encode()) for i in range(4)))
            if close:
                await pool.aclose()
            return list(results)

        first = asyncio.run(use("a", close=False))  # its connections stay idle in the pool when this loop ends
        second = asyncio.run(use("b", close=True))
    assert first == [(200, f"echo a{i}".encode()) for i in range(4)]
    assert second == [(200, f"echo b{i}".encode()) for i in range(4)]
    assert pool.opened == 4  # 2 per loop: the first loop's connections are not reused by the second
