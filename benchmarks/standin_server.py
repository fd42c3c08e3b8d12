"""A stand-in policy server that answers instantly, so a benchmark measures only the client side.

It speaks the embedded server's wire format for ``POST /v1/completions`` (the same JSON the
``PolicyClient`` parses: ``choices[0].token_ids``, ``logprobs.token_logprobs``,
``finish_reason``, ``weight_version``) and answers every request with the same tokens: by
default ``<answer>Up</answer><|im_end|>`` tokenized with the tiny tokenizer (a valid Sokoban
move). ``GET /health`` and ``GET /v1/models`` answer too. The request body is read but not
parsed, so the server costs microseconds per request.

Plain asyncio HTTP/1.1 with keep-alive, no framework: it must never be the bottleneck.

    python benchmarks/standin_server.py --port 0        # prints "READY <port>" when listening

Tests use ``StandinServer`` in a background thread with a ``policy``: a function of the parsed
request body that returns ``(token_ids, logprobs, finish_reason)`` or an HTTP status to fail
with; every request and its answer are recorded in ``server.requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

Policy = Callable[[dict[str, Any]], "tuple[list[int], list[float], str] | int"]


def response_body(token_ids: list[int], text: str, weight_version: int = 0) -> bytes:
    return json.dumps({
        "id": "cmpl-standin", "object": "text_completion", "model": "standin",
        "choices": [{"index": 0, "text": text, "token_ids": token_ids, "finish_reason": "stop",
                     "logprobs": {"token_logprobs": [-0.5] * len(token_ids)}}],
        "weight_version": weight_version,
    }, separators=(",", ":")).encode()


def _http(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n").encode() + body


class StandinProtocol(asyncio.Protocol):
    """Parses pipelined HTTP/1.1 requests by Content-Length and answers from prebuilt bytes
    (or, for ``/v1/completions`` with a ``policy``, from the policy's answer)."""

    def __init__(self, answers: dict[bytes, bytes], counter: list[int], policy: Policy | None = None,
                 record: list[dict[str, Any]] | None = None, weight_version: int = 0) -> None:
        self.answers = answers
        self.counter = counter
        self.policy = policy
        self.record = record
        self.weight_version = weight_version
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buf[:end])
            length = 0
            lower = head.lower()
            at = lower.find(b"content-length:")
            if at >= 0:
                line_end = lower.find(b"\r\n", at)
                length = int(lower[at + 15: line_end if line_end >= 0 else len(lower)])
            total = end + 4 + length
            if len(buf) < total:
                break
            body = bytes(buf[end + 4:total]) if self.policy is not None else b""
            del buf[:total]
            key = b" ".join(head.split(b" ", 2)[:2]).split(b"?")[0]
            if self.policy is not None and key == b"POST /v1/completions":
                out.append(self._answer(json.loads(body)))
            else:
                out.append(self.answers.get(key) or _http("404 Not Found", b'{"error":"not found"}'))
            self.counter[0] += 1
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _answer(self, request: dict[str, Any]) -> bytes:
        assert self.policy is not None
        result = self.policy(request)
        if isinstance(result, int):
            if self.record is not None:
                self.record.append({"request": request, "status": result})
            return _http(f"{result} Error", b'{"error":"stand-in failure"}')
        token_ids, logprobs, finish_reason = result
        body = {"choices": [{"index": 0, "text": "", "token_ids": list(token_ids), "finish_reason": finish_reason,
                             "logprobs": {"token_logprobs": list(logprobs)}}],
                "weight_version": self.weight_version}
        if self.record is not None:
            self.record.append({"request": request, "status": 200, "token_ids": list(token_ids),
                                "logprobs": list(logprobs), "finish_reason": finish_reason})
        return _http("200 OK", json.dumps(body).encode())


def _answers(token_ids: list[int], text: str, weight_version: int) -> dict[bytes, bytes]:
    return {
        b"POST /v1/completions": _http("200 OK", response_body(token_ids, text, weight_version)),
        b"GET /health": _http("200 OK", b"{}"),
        b"GET /v1/models": _http("200 OK", b'{"object":"list","data":[{"id":"standin","object":"model"}]}'),
    }


async def serve(host: str, port: int, token_ids: list[int], text: str, weight_version: int) -> None:
    answers = _answers(token_ids, text, weight_version)
    counter = [0]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: StandinProtocol(answers, counter), host, port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"READY {bound}", flush=True)
    async with server:
        await server.serve_forever()


class StandinServer:
    """The stand-in in a background thread of this process (for tests): ``start()`` returns its URL."""

    def __init__(self, policy: Policy | None = None, token_ids: list[int] | None = None,
                 weight_version: int = 1) -> None:
        self.policy = policy
        self.token_ids = token_ids or []
        self.weight_version = weight_version
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        ready = threading.Event()
        answers = _answers(self.token_ids, "", self.weight_version)

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            def protocol() -> StandinProtocol:
                return StandinProtocol(answers, [0], policy=self._policy, record=self.requests,
                                       weight_version=self.weight_version)

            server = loop.run_until_complete(loop.create_server(protocol, "127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            ready.set()
            loop.run_forever()
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="standin-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self.url

    def _policy(self, request: dict[str, Any]) -> tuple[list[int], list[float], str] | int:
        if self.policy is not None:
            return self.policy(request)
        return list(self.token_ids), [-0.5] * len(self.token_ids), "stop"

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="tiny", help="tokenizer used to encode --text")
    parser.add_argument("--text", default="<answer>Up</answer><|im_end|>")
    parser.add_argument("--weight-version", type=int, default=1)
    args = parser.parse_args()
    from agentgym.model import load_tokenizer

    token_ids = load_tokenizer(args.model).encode(args.text, add_special_tokens=False)
    try:
        asyncio.run(serve(args.host, args.port, token_ids, args.text, args.weight_version))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
