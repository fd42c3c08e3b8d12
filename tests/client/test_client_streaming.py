"""Streaming token-level calls (``PolicyClient.generate_stream``, ``http11.ConnectionPool.stream``) and
servers added and removed at run time (``PolicyClient.add_server`` / ``remove_server``).

Against the stand-in (``StandinServer``: a streamed answer sends a token every ``token_delay_ms``),
a hand-written server that breaks off mid-answer, and once the embedded server with the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentgym.client import HTTPPools, PolicyClient, PolicyServerError
from agentgym.client.http11 import ConnectionPool, TransportError
from agentgym.client.httpx_pools import HttpxTransport
from agentgym.types import SamplingParams
from tests.support import standin_server

PROMPT = [60, 61, 62, 63, 64]


@pytest.fixture(scope="module")
def slow():
    mod = standin_server
    server = mod.StandinServer(policy=mod.BuiltinPolicy("echo"), token_delay_ms=40)
    server.start()
    yield server
    server.stop()


async def test_a_stream_gives_the_head_first_then_the_body_as_it_comes(slow):
    host, port = slow.url[7:].split(":")
    pool = ConnectionPool(host, int(port))
    body = json.dumps({"prompt": PROMPT, "max_tokens": 6, "stream": True}).encode()
    start = time.perf_counter()
    async with pool.stream("POST", "/v1/completions", body, timeout=10) as answer:
        head = time.perf_counter() - start
        arrivals = [time.perf_counter() - start async for _ in answer]
    assert answer.status == 200 and answer.header(b"content-type") == b"text/event-stream"
    assert head < arrivals[-1] / 2 and arrivals[-1] > 0.2 and arrivals[0] < arrivals[-1] / 2
    assert (await pool.request("GET", "/health"))[0] == 200 and pool.opened == 1  # read to the end: reused
    async with pool.stream("POST", "/v1/completions", body, timeout=10) as answer:
        async for _ in answer:
            break  # leaving early closes the connection: the server sees the client go
    assert (await pool.request("GET", "/health"))[0] == 200 and pool.opened == 2
    await pool.aclose()


async def test_a_server_that_breaks_off_mid_answer_is_a_transport_error():
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    pool = ConnectionPool("127.0.0.1", server.sockets[0].getsockname()[1])
    pieces = []
    with pytest.raises(TransportError, match="mid-answer"):
        async with pool.stream("GET", "/x", timeout=5) as answer:
            async for piece in answer:
                pieces.append(piece)
    assert pieces == [b"hello"]
    server.close()
    await pool.aclose()


@pytest.mark.parametrize("transport", ["http11", "httpx"])
async def test_generate_stream_adds_up_to_generate(slow, transport):
    client = PolicyClient(slow.url)
    if transport == "httpx":
        client.servers[0].transport = HttpxTransport(slow.url, HTTPPools(4))
    sampling = SamplingParams(max_tokens=8)
    deltas = [d async for d in client.generate_stream(PROMPT, sampling, session_id="s")]
    whole = await client.generate(PROMPT, sampling)
    await client.aclose()
    assert len(deltas) == len(whole.token_ids) == 8  # one token per event from this server
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert [x for d in deltas for x in d.logprobs] == pytest.approx(whole.logprobs)
    assert [d.finish_reason for d in deltas] == [None] * 7 + [whole.finish_reason]
    assert {d.weight_version for d in deltas} == {whole.weight_version}


async def test_a_stream_is_retried_until_its_first_token_and_refusals_are_not():
    mod = standin_server
    answers = [503, 503]
    policy = mod.BuiltinPolicy("echo")
    server = mod.StandinServer(policy=lambda request: answers.pop() if answers else policy(request))
    server.start()
    try:
        client = PolicyClient(server.url, backoff=0.01)
        ids = [t async for d in client.generate_stream(PROMPT, SamplingParams(max_tokens=4)) for t in d.token_ids]
        assert len(ids) == 4 and [r["status"] for r in server.requests] == [503, 503, 200]
        server.policy = lambda request: 400
        with pytest.raises(PolicyServerError) as refused:
            async for _ in client.generate_stream(PROMPT, SamplingParams(max_tokens=4)):
                pass
        assert refused.value.refused == 400 and len(server.requests) == 4  # not retried
        await client.aclose()
    finally:
        server.stop()


async def test_servers_join_and_leave_and_sessions_move_on(slow):
    mod = standin_server
    other = mod.StandinServer(policy=mod.BuiltinPolicy("echo"))
    other.start()
    try:
        client = PolicyClient(slow.url)
        sampling = SamplingParams(max_tokens=2)
        await client.generate(PROMPT, sampling, session_id="a")
        assert client.add_server(other.url) and not client.add_server(other.url + "/")
        assert await client.check_health(other.url) and not await client.check_health("http://127.0.0.1:9", 1.0)
        slow_seen = len(slow.requests)
        assert await client.remove_server(slow.url)
        await client.generate(PROMPT, sampling, session_id="a")  # its server left: it moves, it is not lost
        assert len(slow.requests) == slow_seen and len(other.requests) == 1
        with pytest.raises(ValueError, match="only policy server"):
            await client.remove_server(other.url)
        assert not await client.remove_server("http://127.0.0.1:1")
        await client.aclose()
    finally:
        other.stop()


@pytest.mark.slow
async def test_the_embedded_server_streams_token_ids_a_generate_would_sample(embedded_server):
    handle = embedded_server
    async with PolicyClient(handle.url, model="tiny") as client:
        sampling = SamplingParams(max_tokens=12, temperature=0.8, seed=11)
        deltas = [d async for d in client.generate_stream(PROMPT, sampling)]
        whole = await client.generate(PROMPT, sampling)
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert [x for d in deltas for x in d.logprobs] == pytest.approx(whole.logprobs, abs=1e-4)
    assert deltas[-1].finish_reason == whole.finish_reason
