"""The stand-in policy server: answers like a policy server in microseconds, so tests and benchmarks
measure only agentgym's side. The one copy for all of them.

It speaks the embedded server's wire format (the JSON ``PolicyClient`` parses):

* ``POST /v1/completions``, token ids in and out: ``choices[0].token_ids``,
  ``logprobs.token_logprobs``, ``finish_reason`` and ``weight_version``. What comes back is a
  *policy*'s answer: a function of the parsed request body that returns
  ``(token_ids, logprobs, finish_reason)``, or an HTTP status to fail with. Built in (``--mode``):

  - ``echo``: deterministic from the prompt, so every session's content is its own: the last
    user block's text comes back as ``echo: <text>``; a block holding ``CALC: <expr>`` gets a
    Hermes calculator tool call; a ``<tool_response>`` block gets ``The tool says <r>. #### <r>``.
    Cut to ``max_tokens`` (``finish_reason`` ``length`` then). Tests recompute what it sampled
    with ``BuiltinPolicy("echo")`` (``reply_ids``; ``logprobs`` is a fixed function of the ids);
  - ``fixed``: ``--text`` (tokenized; default ``The answer is 72.<|im_end|>``) every time, from
    bytes built at start: the request body is not even parsed, so ``max_tokens`` is not applied.

* ``POST /v1/chat/completions``: a canned OpenAI chat answer (``The answer is 72.``): the direct
  path of ``benchmarks/gateway.py``.
* ``POST /vllm/v1/chat/completions`` (``fixed`` mode): the same answer as vLLM gives it with
  ``return_token_ids`` and ``logprobs``: ``prompt_token_ids``, ``choices[0].token_ids`` and
  ``logprobs.content`` (the fixed reply's ids): what a gateway that records vLLM's chat answers
  (``rllm-model-gateway``, measured by ``benchmarks/gateway.py --peer``) needs to find.
* ``GET /health`` (``{"status": "ok", "weight_version": N}``) and ``GET /v1/models``.

It reports weight version ``--weight-version``; ``--delay-ms`` holds back the answers to
generations (``POST /v1/...``) that long, as a real server's generation time would. Plain asyncio
``Protocol``, HTTP/1.1 framed by ``Content-Length``, keep-alive and pipelining, ``Connection:
close`` honoured, everything but the policy's answers prebuilt; no framework: it must never be the
bottleneck.

    python tests/support/standin_server.py --port 0 [--mode echo|fixed] [--text T] [--weight-version N]
                                        [--delay-ms D]   # prints "READY <port>" once listening

* ``start_standin(port, mode, version, ...)`` runs that in a child process and returns its
  ``Popen`` (``.url``) once it listens: ``benchmarks/gateway.py`` and ``benchmarks/rollout.py``
  measure against it; ``tests/gateway/test_gateway*.py`` run it (and kill and restart it mid-run).
* ``StandinServer`` runs it in a background thread of this process (``tests/rollout/test_rollout*.py``):
  its ``policy`` (by default: ``token_ids`` every time) can be swapped at any moment, every
  request and its answer are recorded in ``server.requests``, and it reports weight version 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXED_TEXT = "The answer is 72.<|im_end|>"
CHAT_REPLY = "The answer is 72."

Policy = Callable[[dict[str, Any]], "tuple[list[int], list[float], str] | int"]


# ---- answers -------------------------------------------------------------------------------------
def logprobs(ids: list[int]) -> list[float]:
    """The stand-in's logprobs for a reply: a fixed function of its ids (so tests can recompute them)."""
    return [-0.01 * ((i * 7 + t) % 50 + 1) for i, t in enumerate(ids)]


def http(status: int, body: bytes) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        reason,
        len(body),
        body,
    )


def error(status: int, message: str, kind: str = "invalid_request_error") -> bytes:
    return http(status, json.dumps({"error": {"message": message, "type": kind}}).encode())


def completion(token_ids: list[int], token_logprobs: list[float], finish_reason: str, weight_version: int) -> bytes:
    """A ``/v1/completions`` answer in the embedded server's shape."""
    return http(
        200,
        json.dumps(
            {
                "id": "cmpl-standin",
                "object": "text_completion",
                "model": "standin",
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": token_ids,
                        "finish_reason": finish_reason,
                        "logprobs": {"token_logprobs": token_logprobs},
                    }
                ],
                "weight_version": weight_version,
            },
            separators=(",", ":"),
        ).encode(),
    )


def streamed(token_ids: list[int], token_logprobs: list[float], finish_reason: str, weight_version: int) -> list[bytes]:
    """A streamed ``/v1/completions`` answer in the embedded server's shape, as the pieces written
    one after another: the head, one SSE event per token (the last with ``finish_reason``), the end."""

    def event(data: str) -> bytes:
        raw = f"data: {data}\n\n".encode()
        return b"%x\r\n%s\r\n" % (len(raw), raw)

    pieces = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"]
    last = len(token_ids) - 1
    for i, (t, lp) in enumerate(zip(token_ids, token_logprobs)):
        pieces.append(
            event(
                json.dumps(
                    {
                        "id": "cmpl-standin",
                        "object": "text_completion",
                        "model": "standin",
                        "choices": [
                            {
                                "index": 0,
                                "text": "",
                                "token_ids": [t],
                                "logprobs": {"token_logprobs": [lp]},
                                "finish_reason": finish_reason if i == last else None,
                            }
                        ],
                        "weight_version": weight_version,
                    },
                    separators=(",", ":"),
                )
            )
        )
    if not token_ids:
        pieces.append(
            event(
                json.dumps(
                    {
                        "id": "cmpl-standin",
                        "object": "text_completion",
                        "model": "standin",
                        "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": finish_reason}],
                        "weight_version": weight_version,
                    }
                )
            )
        )
    pieces[-1] += event("[DONE]") + b"0\r\n\r\n"
    return pieces


def prebuilt(weight_version: int, fixed_ids: list[int] | None = None, eos: int | None = None) -> dict[bytes, bytes]:
    """The answers that never change, by ``b"METHOD /path"`` (``fixed_ids``: a ``fixed`` policy's)."""
    answers = {
        b"GET /health": http(200, json.dumps({"status": "ok", "weight_version": weight_version}).encode()),
        b"GET /v1/models": http(200, b'{"object":"list","data":[{"id":"standin","object":"model"}]}'),
        b"POST /v1/chat/completions": http(
            200,
            json.dumps(
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "standin",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": CHAT_REPLY}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26},
                },
                separators=(",", ":"),
            ).encode(),
        ),
    }
    if fixed_ids is not None:
        finish = "stop" if fixed_ids and fixed_ids[-1] == eos else "length"
        answers[b"POST /v1/completions"] = completion(fixed_ids, logprobs(fixed_ids), finish, weight_version)
        answers[b"POST /vllm/v1/chat/completions"] = vllm_chat(fixed_ids)
    return answers


VLLM_PROMPT_TOKENS = 64  # about what the benchmark's chats render to


def vllm_chat(ids: list[int]) -> bytes:
    """A vLLM chat answer with ``return_token_ids`` and ``logprobs`` on (the reply's token strings are
    placeholders: nothing reads them)."""
    content = [
        {"token": f"t{t}", "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in zip(ids, logprobs(ids))
    ]
    return http(
        200,
        json.dumps(
            {
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "created": 0,
                "model": "standin",
                "prompt_token_ids": list(range(100, 100 + VLLM_PROMPT_TOKENS)),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": CHAT_REPLY},
                        "token_ids": ids,
                        "logprobs": {"content": content},
                        "finish_reason": "stop",
                        "stop_reason": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": VLLM_PROMPT_TOKENS,
                    "completion_tokens": len(ids),
                    "total_tokens": VLLM_PROMPT_TOKENS + len(ids),
                },
            },
            separators=(",", ":"),
        ).encode(),
    )


_USER_BLOCK = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


class BuiltinPolicy:
    """The ``echo`` and ``fixed`` policies (see the module docstring), with ``model``'s tokenizer
    (``tokenizers``, not ``transformers``: the stand-in starts in a fraction of a second)."""

    def __init__(self, mode: str = "echo", text: str = FIXED_TEXT, model: str = "tiny") -> None:
        if mode not in ("echo", "fixed"):
            raise ValueError(f"unknown stand-in mode {mode!r} (echo, fixed)")
        from tokenizers import Tokenizer

        from agentgym.model import resolve_model_path

        self.tok = Tokenizer.from_file(str(Path(resolve_model_path(model)) / "tokenizer.json"))
        self.eos = self.tok.token_to_id("<|im_end|>")
        self.mode = mode
        self.fixed = self.tok.encode(text, add_special_tokens=False).ids

    def reply_ids(self, prompt: list[int]) -> list[int]:
        """The whole reply to ``prompt`` (before ``max_tokens`` cuts it)."""
        if self.mode == "fixed":
            return self.fixed
        text = self.tok.decode(prompt, skip_special_tokens=False)
        blocks = _USER_BLOCK.findall(text)
        last = blocks[-1] if blocks else text[-200:]
        tool = _TOOL_RESPONSE.findall(last)
        if tool:
            reply = f"The tool says {tool[-1]}. #### {tool[-1]}"
        elif "CALC:" in last:
            expression = last.split("CALC:", 1)[1].strip().splitlines()[0]
            call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
            reply = f"<tool_call>\n{call}\n</tool_call>"
        else:
            reply = f"echo: {last}"
        return self.tok.encode(reply, add_special_tokens=False).ids + [self.eos]

    logprobs = staticmethod(logprobs)

    def __call__(self, request: dict[str, Any]) -> tuple[list[int], list[float], str] | int:
        prompt = request.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return 400  # the stand-in takes token-id prompts
        ids = self.reply_ids(prompt)[: int(request.get("max_tokens") or 16)]
        return ids, logprobs(ids), "stop" if ids and ids[-1] == self.eos else "length"


# ---- the server ----------------------------------------------------------------------------------
_NOT_FOUND = error(404, "no such route", "not_found_error")


class StandinProtocol(asyncio.Protocol):
    """One connection: parses pipelined HTTP/1.1 requests by ``Content-Length`` and answers each
    from ``answers`` (prebuilt bytes) or, for ``POST /v1/completions`` when there is a ``policy``,
    from the policy (the request and its answer appended to ``record`` when given). Answers to
    ``POST /v1/...`` go out ``delay_s`` late. A policy's answer to a request with ``"stream": true``
    is streamed as the embedded server streams it (SSE over chunked encoding, one chunk per token
    with its id and logprob, then the finish, then ``[DONE]``), a token every ``token_delay_s``."""

    def __init__(
        self,
        answers: dict[bytes, bytes],
        policy: Policy | None = None,
        record: list[dict[str, Any]] | None = None,
        weight_version: int = 0,
        delay_s: float = 0.0,
        token_delay_s: float = 0.0,
    ) -> None:
        self.answers = answers
        self.policy = policy
        self.record = record
        self.weight_version = weight_version
        self.delay_s = delay_s
        self.token_delay_s = token_delay_s
        self.buffer = bytearray()
        self.closing = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        buf = self.buffer
        buf += data
        out = []
        delayed = False
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buf[:end])
            lower = head.lower()
            length = 0
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                line_end = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : line_end if line_end >= 0 else end])
            total = end + 4 + length
            if len(buf) < total:
                break
            key = b" ".join(head.split(b" ", 2)[:2]).split(b"?")[0]
            if self.policy is not None and key == b"POST /v1/completions":
                out.append(self._generate(bytes(buf[end + 4 : total])))
            else:
                out.append(self.answers.get(key, _NOT_FOUND))
            del buf[:total]
            if self.delay_s and key.startswith(b"POST /v1/"):
                delayed = True
            at = lower.find(b"\r\nconnection:")
            if at >= 0 and lower[at + 13 :].split(b"\r\n", 1)[0].strip() == b"close":
                self.closing = True
                break
        if not out:
            return
        if all(isinstance(o, bytes) for o in out):  # the usual case: one write
            if delayed:
                asyncio.get_running_loop().call_later(self.delay_s, self._send, b"".join(out), self.closing)
            else:
                self._send(b"".join(out), self.closing)
            return
        at, group, schedule = (self.delay_s if delayed else 0.0), [], []
        for answer in out:
            if isinstance(answer, bytes):
                group.append(answer)
                continue
            schedule.append((at, b"".join(group) + answer[0]))  # a stream: its head goes with what came before
            group = []
            for piece in answer[1:]:
                at += self.token_delay_s
                schedule.append((at, piece))
        if group:
            schedule.append((at, b"".join(group)))
        loop = asyncio.get_running_loop()
        for k, (when, data) in enumerate(schedule):
            loop.call_later(when, self._send, data, self.closing and k == len(schedule) - 1)

    def _send(self, data: bytes, close: bool) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            if close:
                transport.close()

    def _generate(self, body: bytes) -> bytes | list[bytes]:
        assert self.policy is not None
        try:
            request = json.loads(body)
        except ValueError:
            return error(400, "the body is not JSON")
        result = self.policy(request)
        if isinstance(result, int):
            if self.record is not None:
                self.record.append({"request": request, "status": result})
            return error(result, f"the stand-in's policy answered {result}", "stand_in_error")
        token_ids, token_logprobs, finish_reason = list(result[0]), list(result[1]), result[2]
        if self.record is not None:
            self.record.append(
                {
                    "request": request,
                    "status": 200,
                    "token_ids": token_ids,
                    "logprobs": token_logprobs,
                    "finish_reason": finish_reason,
                }
            )
        if request.get("stream"):
            return streamed(token_ids, token_logprobs, finish_reason, self.weight_version)
        return completion(token_ids, token_logprobs, finish_reason, self.weight_version)


async def listen(host: str, port: int, protocol: Callable[[], asyncio.Protocol]) -> asyncio.Server:
    return await asyncio.get_running_loop().create_server(protocol, host, port, reuse_address=True, backlog=4096)


async def serve(
    host: str,
    port: int,
    mode: str = "echo",
    text: str = FIXED_TEXT,
    weight_version: int = 0,
    delay_ms: float = 0.0,
    model: str = "tiny",
    token_delay_ms: float = 0.0,
) -> None:
    """Serves until cancelled; prints ``READY <port>`` once listening."""
    policy = BuiltinPolicy(mode, text, model)
    answers = prebuilt(weight_version, policy.fixed if mode == "fixed" else None, policy.eos)
    generate = None if mode == "fixed" else policy  # fixed: the prebuilt answer, the body unparsed
    server = await listen(
        host,
        port,
        lambda: StandinProtocol(answers, generate, None, weight_version, delay_ms / 1e3, token_delay_ms / 1e3),
    )
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class StandinProcess(subprocess.Popen):
    """A stand-in in a child process (``start_standin``); ``url``: where it listens."""

    url = ""


def start_standin(
    port: int = 0,
    mode: str = "echo",
    version: int = 0,
    timeout: float = 30.0,
    delay_ms: float = 0.0,
    text: str = FIXED_TEXT,
    token_delay_ms: float = 0.0,
) -> StandinProcess:
    """``python tests/support/standin_server.py`` in a child process, returned once it listens (so it
    answers ``/health``); ``port`` 0: a free one, in ``.url``. ``version``: its weight version."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--port",
        str(port),
        "--mode",
        mode,
        "--text",
        text,
        "--weight-version",
        str(version),
        "--delay-ms",
        str(delay_ms),
        "--token-delay-ms",
        str(token_delay_ms),
    ]
    proc = StandinProcess(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    deadline, line = time.monotonic() + timeout, b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        chunk = (
            os.read(proc.stdout.fileno(), 256) if left > 0 and select.select([proc.stdout], [], [], left)[0] else None
        )
        if not chunk:
            if chunk is None:
                proc.kill()
            proc.wait()
            why = f"did not listen within {timeout:.0f}s" if chunk is None else f"exited with {proc.returncode}"
            raise RuntimeError(f"the stand-in {why}:\n{proc.stderr.read().decode()[-2000:]}")
        line += chunk
    if not line.startswith(b"READY "):
        proc.kill()
        raise RuntimeError(f"the stand-in said {line!r}, not READY <port>")
    proc.url = f"http://127.0.0.1:{int(line.split()[1])}"
    return proc


class StandinServer:
    """The stand-in in a background thread of this process (for tests): ``start()`` returns its URL.
    ``policy`` (default: ``token_ids`` every time) and ``token_ids`` may be changed while it runs."""

    def __init__(
        self,
        policy: Policy | None = None,
        token_ids: list[int] | None = None,
        weight_version: int = 1,
        delay_ms: float = 0.0,
        token_delay_ms: float = 0.0,
    ) -> None:
        self.policy = policy
        self.token_ids = token_ids or []
        self.weight_version = weight_version
        self.delay_ms = delay_ms
        self.token_delay_ms = token_delay_ms
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        ready = threading.Event()
        answers = prebuilt(self.weight_version)

        def protocol() -> StandinProtocol:
            return StandinProtocol(
                answers,
                self._policy,
                self.requests,
                self.weight_version,
                self.delay_ms / 1e3,
                self.token_delay_ms / 1e3,
            )

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            server = loop.run_until_complete(listen("127.0.0.1", 0, protocol))
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
        return list(self.token_ids), logprobs(self.token_ids), "stop"

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed: READY <port>)")
    parser.add_argument("--mode", choices=["echo", "fixed"], default="echo")
    parser.add_argument("--text", default=FIXED_TEXT, help="the fixed mode's answer (tokenized)")
    parser.add_argument("--model", default="tiny", help="whose tokenizer (tokenizer.json) encodes and decodes")
    parser.add_argument("--weight-version", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="answer each generation after this long")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="a streamed answer's time per token")
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # agentgym, when it is not installed
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve(
                args.host,
                args.port,
                args.mode,
                args.text,
                args.weight_version,
                args.delay_ms,
                args.model,
                args.token_delay_ms,
            )
        )


if __name__ == "__main__":
    main()


# ---- a modelled GPU engine (benchmarks/async_train.py) ---------------------------------------------
class EngineStandin:
    """A stand-in that models a GPU inference engine's *timing*, for scheduling benchmarks.

    Every ``step_ms`` one decode step runs: each of the (at most ``cap``) running sequences gets one
    token, whatever their number, so a half-empty batch costs as much as a full one; requests
    beyond ``cap`` wait for a slot. A request for ``max_tokens`` tokens is answered after that many
    steps with ``max_tokens - 1`` filler tokens and ``<|im_end|>`` (``finish_reason`` ``stop``),
    logprob -0.1 each, and the weight version it was sampled with. Weight control like the embedded
    server's: ``POST /pause_generation {"mode": "abort"|"wait"}`` (abort: running sequences answer
    at once with what they have, ``finish_reason`` ``abort``; no new ones start until resumed),
    ``POST /resume_generation``, ``POST /update_weights {"weight_version": N}`` (takes ``load_ms``,
    once nothing runs). Counts steps and sequence-steps in ``stats`` (``GET /stats``) for the
    batch occupancy. Runs in a thread of this process (``start()`` returns the URL): it sleeps
    between steps, so it measures scheduling, not this machine's cores. ``start_engine_standin``
    runs one in a child process (its timing then shares no interpreter with the caller's).
    """

    def __init__(
        self, step_ms: float = 20.0, cap: int = 64, load_ms: float = 200.0, filler: int = 64, eos: int | None = None
    ) -> None:
        self.step_s, self.cap, self.load_s = step_ms / 1e3, cap, load_ms / 1e3
        self.filler = filler
        if eos is None:
            from tokenizers import Tokenizer

            from agentgym.model import resolve_model_path

            eos = Tokenizer.from_file(str(Path(resolve_model_path("tiny")) / "tokenizer.json")).token_to_id(
                "<|im_end|>"
            )
        self.eos = eos
        self.version = 0
        self.paused = False
        self.running: list[dict[str, Any]] = []
        self.waiting: list[dict[str, Any]] = []
        self.stats = {"steps": 0, "sequence_steps": 0, "requests": 0, "aborted": 0}
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- the engine ---------------------------------------------------------------------------
    async def _engine(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            while self.waiting and len(self.running) < self.cap and not self.paused:
                self.running.append(self.waiting.pop(0))
            if not self.running:
                continue
            self.stats["steps"] += 1
            self.stats["sequence_steps"] += len(self.running)
            for seq in self.running:
                seq["done"] += 1
            for seq in [s for s in self.running if s["done"] >= s["want"]]:
                self.running.remove(seq)
                self._answer(seq, "stop")

    def _answer(self, seq: dict[str, Any], finish: str) -> None:
        n = seq["done"]
        ids = [self.filler] * max(0, n - 1) + ([self.eos] if n and finish == "stop" else [self.filler] * min(n, 1))
        if not seq["future"].done():
            seq["future"].set_result((ids, [-0.1] * len(ids), finish, seq["version"]))

    async def _generate(self, body: dict[str, Any]) -> bytes:
        self.stats["requests"] += 1
        future = asyncio.get_running_loop().create_future()
        seq = {"want": max(1, int(body.get("max_tokens") or 16)), "done": 0, "future": future, "version": self.version}
        self.waiting.append(seq)
        ids, logprob_list, finish, version = await future
        return completion(ids, logprob_list, finish, version)

    async def _control(self, path: str, body: dict[str, Any]) -> bytes:
        if path == "/pause_generation":
            self.paused = True
            if body.get("mode") == "abort":
                for seq in self.running:
                    self.stats["aborted"] += 1
                    self._answer(seq, "abort")
                self.running = []
            while self.running:
                await asyncio.sleep(self.step_s)
        elif path == "/resume_generation":
            self.paused = False
        elif path == "/update_weights":
            while self.running:
                await asyncio.sleep(self.step_s)
            await asyncio.sleep(self.load_s)
            self.version = int(body["weight_version"])
        return http(200, json.dumps({"success": True, "weight_version": self.version}).encode())

    # ---- HTTP ---------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = next(
                    (int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")), 0
                )
                body = json.loads(await reader.readexactly(length)) if length else {}
                if method == "POST" and path == "/v1/completions":
                    answer = await self._generate(body)
                elif method == "POST":
                    answer = await self._control(path, body)
                elif path == "/stats":
                    answer = http(200, json.dumps({**self.stats, "weight_version": self.version}).encode())
                else:
                    answer = http(200, json.dumps({"status": "ok", "weight_version": self.version}).encode())
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            server = loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0, backlog=4096))
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            engine = loop.create_task(self._engine())
            ready.set()
            loop.run_forever()
            engine.cancel()
            server.close()
            loop.close()

        self._thread = threading.Thread(target=run, name="engine-standin", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self.url

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def _serve_engine(step_ms: float, cap: int, load_ms: float) -> None:
    """The child process of ``start_engine_standin``: prints ``READY <url>``, serves until killed."""
    engine = EngineStandin(step_ms=step_ms, cap=cap, load_ms=load_ms)
    print(f"READY {engine.start()}", flush=True)
    threading.Event().wait()


def start_engine_standin(
    step_ms: float = 20.0, cap: int = 64, load_ms: float = 200.0, timeout: float = 60.0
) -> StandinProcess:
    """An ``EngineStandin`` in a child process, returned (``.url``) once it listens."""
    code = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}]; "
        f"from tests.support.standin_server import _serve_engine; _serve_engine({step_ms}, {cap}, {load_ms})"
    )
    proc = StandinProcess([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"the engine stand-in did not start: {line!r} {proc.stderr.read().decode()[-2000:]}")
    proc.url = line.split()[1]
    return proc
