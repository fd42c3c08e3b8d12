"""The one client everything above the servers uses: rollout, gateway and trainer.

``PolicyClient.generate`` is token-level: token ids in; sampled token ids, their logprobs,
the finish reason and the weight version out. It speaks three dialects behind one call
(``agentgym.client.dialects``: penalties, ``logit_bias``, structured output and top logprobs
included):

* ``embedded`` (agentgym's own server) and ``vllm``: ``POST /v1/completions`` with the prompt
  as token ids, ``logprobs`` and ``return_token_ids=true``; the sampled ids come back in
  ``choices[0].token_ids``. The embedded server also reports ``weight_version``.
* ``sglang``: ``POST /generate`` with ``input_ids`` and ``return_logprob=true``; ids and
  logprobs come back in ``meta_info.output_token_logprobs``.

``PolicyClient.generate_stream`` is the same call streamed: ``TokenDelta``s (ids, logprobs,
finish reason, weight version) as the server samples them (``stream=true`` on ``/v1/completions``;
SGLang's ``/generate`` is not streamed: its one delta comes at the end).

Requests go to the server with the fewest outstanding requests, except that every request
of a session goes to the server that served its first one (so the server's prefix cache is
reused across turns). Connection errors, 5xx and 429 answers are retried ``max_retries`` times
with backoff, then raise ``PolicyServerError`` saying what failed and where (``.status``: the
last HTTP status, None when no server answered; a stream only until its first token: after that
a failure ends it); any other 4xx is the server refusing the request, raised at once
(``.refused``), never retried. Control calls (weight updates) carry ``admin_key``
(``Authorization: Bearer``), which agentgym's embedded server requires. Servers can be added and
removed while requests run (``add_server``, ``remove_server``: a removed server's sessions move to
another server on their next request, its requests in flight finish first).

A vLLM server that a seeded request could kill (vLLM on a CPU with chunked prefill, or one whose
``/server_info`` is off) gets requests without their ``seed`` (``agentgym.client.vllm_cpu``; a warning
says so once per server).

Connections: ``http://`` servers are called through ``agentgym.client.http11`` (keep-alive
connections, responses parsed by httptools: ~0.05 ms of CPU per call where httpx spends ~0.5 ms);
``https://`` ones through httpx, split into small pools (``HTTPPools``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.client.dialects import (
    DialectError,
    completion_choice,
    completions_payload,
    sglang_payload,
    sglang_sample,
)
from agentgym.client.http11 import ConnectionPool, TransportError
from agentgym.client.httpx_pools import HttpxTransport, transport_for
from agentgym.client.versions import known_weight_version, record_weight_version
from agentgym.client.vllm_cpu import SERVER_INFO, seed_hazard, warn_unseeded
from agentgym.types import SamplingParams, TokenSample

BACKENDS = ("embedded", "vllm", "sglang")


class PolicyServerError(RuntimeError):
    """A policy server could not answer after the retries; the message says which and why.
    ``refused``: the server's own 4xx status when it turned the request down (retrying cannot help).
    ``status``: the HTTP status of the last answer (a 5xx or 429 after the retries, or the refusal);
    None when no server answered at all (``unreachable``)."""

    def __init__(self, message: str, refused: int | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.refused = refused
        self.status = refused if status is None else status

    @property
    def unreachable(self) -> bool:
        return self.status is None


class _Server:
    """One server's routing state and connections. A failed server is skipped for ``cooldown``
    seconds, then tried again (it may have restarted), instead of being dropped for good."""

    __slots__ = (
        "url",
        "outstanding",
        "unhealthy_until",
        "transport",
        "removed",
        "model",
        "_model_lookup",
        "seed_hazard",
        "_seed_lookup",
    )

    def __init__(self, url: str, transport: ConnectionPool | HttpxTransport) -> None:
        self.url = url.rstrip("/")
        self.outstanding = 0
        self.unhealthy_until = 0.0
        self.transport = transport
        self.removed = False
        self.model: str | None = None  # the name it serves, once asked (``PolicyClient.served_model``)
        self._model_lookup: asyncio.Task[str | None] | None = None
        # vLLM: why a request with a seed could kill it ("" when it cannot), once asked (``agentgym.client.vllm_cpu``)
        self.seed_hazard: str | None = None
        self._seed_lookup: asyncio.Task[str] | None = None

    @property
    def version(self) -> int:
        """The weights this server was last told to load (``agentgym.client.versions``)."""
        return known_weight_version(self.url)

    @version.setter
    def version(self, value: int) -> None:
        record_weight_version(self.url, value)

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self.unhealthy_until

    def mark(self, healthy: bool, cooldown: float = 5.0) -> None:
        self.unhealthy_until = 0.0 if healthy else time.monotonic() + cooldown


@dataclass
class TokenDelta:
    """What a streamed generation adds: the newly sampled ids and their logprobs (and the
    alternatives asked for); ``finish_reason`` on the last one (None before); the weight version
    of the server that sampled them."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    weight_version: int
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


def _read(parse: Any, *args: Any) -> Any:
    """A dialect's reading of an answer, its complaint as a ``PolicyServerError``."""
    try:
        return parse(*args)
    except DialectError as exc:
        raise PolicyServerError(str(exc)) from None


class PolicyClient:
    """Async client over one or more policy servers of the same backend.

    ``urls``: base URLs such as ``http://127.0.0.1:8000`` (no ``/v1``).
    ``backend``: ``embedded`` | ``vllm`` | ``sglang``.
    ``model``: the model name sent in OpenAI requests (vLLM answers 404 to a name it does not
    serve); default: each server's own, asked once from its ``/v1/models``.
    ``max_connections``: most connections, and requests in flight, per server (more wait their
    turn); ``pool_size``: connections per httpx pool, for ``https://`` servers (see ``HTTPPools``).
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        backend: str = "embedded",
        model: str | None = None,
        max_retries: int = 3,
        timeout: float = 600.0,
        max_connections: int = 1024,
        max_sessions: int = 100_000,
        backoff: float = 0.2,
        cooldown: float = 5.0,
        pool_size: int = 4,
        admin_key: str | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("PolicyClient needs at least one server URL")
        self.backend = backend
        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff  # first retry's delay in seconds; doubles per attempt (jittered, at most 5 s)
        self.cooldown = cooldown  # seconds a failed server is passed over while others are healthy
        self.timeout = timeout
        self.admin_key = admin_key  # sent with control calls (weight updates); the embedded server needs it
        self.max_connections, self.pool_size = max_connections, pool_size
        self.servers = [_Server(u, transport_for(u.rstrip("/"), max_connections, pool_size, timeout)) for u in urls]
        self._sticky: OrderedDict[str, _Server] = OrderedDict()
        self._max_sessions = max_sessions

    # ---- routing -------------------------------------------------------------------------
    def _pick(self, session_id: str | None, exclude: _Server | None = None) -> _Server:
        if session_id is not None:
            server = self._sticky.get(session_id)
            if server is not None and server is not exclude and server.healthy and not server.removed:
                self._sticky.move_to_end(session_id)
                return server
        candidates = (
            [s for s in self.servers if s is not exclude and s.healthy]
            or [s for s in self.servers if s is not exclude]
            or self.servers
        )
        least = min(s.outstanding for s in candidates)
        server = random.choice([s for s in candidates if s.outstanding == least])
        if session_id is not None:
            self._sticky[session_id] = server
            if len(self._sticky) > self._max_sessions:
                self._sticky.popitem(last=False)
        return server

    def release_session(self, session_id: str) -> None:
        """Forget a finished session's server assignment."""
        self._sticky.pop(session_id, None)

    # ---- servers at run time -------------------------------------------------------------
    def add_server(self, url: str) -> bool:
        """Route new requests to ``url`` too (a base URL, as given at construction); False if it is there."""
        url = url.rstrip("/")
        if any(s.url == url for s in self.servers):
            return False
        self.servers = [
            *self.servers,
            _Server(url, transport_for(url, self.max_connections, self.pool_size, self.timeout)),
        ]
        return True

    async def remove_server(self, url: str, drain_timeout: float = 60.0) -> bool:
        """Stop routing to ``url``; returns once its requests in flight finished (or after ``drain_timeout``)
        and its connections are closed. Its sessions move to another server on their next request.
        False if no such server; the last server cannot be removed (add its replacement first)."""
        url = url.rstrip("/")
        server = next((s for s in self.servers if s.url == url), None)
        if server is None:
            return False
        if len(self.servers) == 1:
            raise ValueError(f"{url} is the only policy server; add another before removing it")
        server.removed = True
        self.servers = [s for s in self.servers if s is not server]
        deadline = time.monotonic() + drain_timeout
        while server.outstanding > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await server.transport.aclose()
        return True

    async def _post(
        self,
        path: str,
        payload: dict[str, Any],
        session_id: str | None = None,
        server: _Server | None = None,
        admin: bool = False,
        name_model: bool = False,
    ) -> tuple[_Server, dict[str, Any]]:
        """POST with least-outstanding routing and bounded retries on transport errors, 5xx and 429;
        ``admin``: a control call, sent with the admin key; ``name_model``: set the payload's ``model``
        to the name the chosen server serves."""
        last_error = ""
        last_status: int | None = None
        failed: _Server | None = None
        headers = {"Authorization": f"Bearer {self.admin_key}"} if admin and self.admin_key else None
        bodies: dict[tuple[str | None, bool], bytes] = {}
        for attempt in range(self.max_retries + 1):
            target = server or self._pick(session_id, exclude=failed)
            model = await self.served_model(target) if name_model else None
            unseeded = await self._drops_seed(target, payload)
            body = bodies.get((model, unseeded))
            if body is None:
                body = bodies[(model, unseeded)] = self._body(payload, model, unseeded)
            target.outstanding += 1
            try:
                if headers is None:
                    status, raw = await target.transport.request("POST", path, body, timeout=self.timeout)
                elif isinstance(target.transport, ConnectionPool):
                    answer = await target.transport.fetch("POST", path, body, timeout=self.timeout, headers=headers)
                    status, raw = answer.status, answer.body
                else:
                    status, raw = await target.transport.request(
                        "POST", path, body, timeout=self.timeout, headers=headers
                    )
            except TransportError as exc:
                last_error = str(exc)
                last_status = None
            else:
                if status < 400:
                    target.mark(True)
                    try:
                        return target, json.loads(raw)
                    except ValueError:
                        raise PolicyServerError(
                            f"{target.url}{path} answered {status} with a body that is not JSON: {raw[:200]!r}"
                        ) from None
                text = raw.decode("utf-8", "replace")
                if status < 500 and status != 429:
                    raise PolicyServerError(
                        f"{target.url}{path} refused the request ({status}): {text[:500]}", refused=status
                    )
                last_error = f"HTTP {status}: {text[:200]}"
                last_status = status
            finally:
                target.outstanding -= 1
            if len(self.servers) > 1 and server is None:
                target.mark(False, self.cooldown)
                failed = target
            if attempt < self.max_retries:
                await asyncio.sleep(min(self.backoff * 2**attempt, 5.0) * (0.5 + random.random()))
        where = server.url if server else ", ".join(s.url for s in self.servers)
        hint = (
            "Check that the server is running and reachable (agentgym serve --model ... --port ...)."
            if last_status is None
            else "The server is up but failing: see its log."
        )
        raise PolicyServerError(
            f"policy server request {path} failed after {self.max_retries + 1} attempts ({where}): {last_error}. "
            + hint,
            status=last_status,
        )

    # ---- generation ----------------------------------------------------------------------
    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> TokenSample:
        """Sample one continuation of ``prompt_ids``; never re-tokenizes anything."""
        sampling = sampling or SamplingParams()
        if self.backend == "sglang":
            server, body = await self._post("/generate", sglang_payload(prompt_ids, sampling), session_id)
            return _read(sglang_sample, body, server.url, server.version)
        server, body = await self._post(
            "/v1/completions", completions_payload(prompt_ids, sampling, self.backend), session_id, name_model=True
        )
        return self._parse_completions(body, server, sampling.top_logprobs)

    async def generate_stream(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> AsyncIterator[TokenDelta]:
        """``generate``, streamed: ``TokenDelta``s as the server samples them, the last with the finish
        reason. Retried like ``generate`` until the first delta; a failure after that raises
        ``PolicyServerError``. Closing the iterator early closes the connection (the server stops)."""
        sampling = sampling or SamplingParams()
        if self.backend == "sglang":  # its /generate stream reports cumulative logprobs: not streamed here
            sample = await self.generate(prompt_ids, sampling, session_id)
            yield TokenDelta(
                sample.token_ids, sample.logprobs, sample.finish_reason, sample.weight_version, sample.top_logprobs
            )
            return
        path = "/v1/completions"
        payload = {**completions_payload(prompt_ids, sampling, self.backend), "stream": True}
        last_error = ""
        last_status: int | None = None
        failed: _Server | None = None
        for attempt in range(self.max_retries + 1):
            target = self._pick(session_id, exclude=failed)
            model = await self.served_model(target)
            body = self._body(payload, model, await self._drops_seed(target, payload))
            target.outstanding += 1
            started = False
            try:
                async with target.transport.stream("POST", path, body, timeout=self.timeout) as answer:
                    if answer.status < 400:
                        target.mark(True)
                        async for event in _sse_events(answer):
                            delta = self._parse_delta(event, target, sampling.top_logprobs)
                            if delta is not None:
                                started = True
                                yield delta
                        return
                    text = (await answer.read()).decode("utf-8", "replace")
                if answer.status < 500 and answer.status != 429:
                    raise PolicyServerError(
                        f"{target.url}{path} refused the request ({answer.status}): {text[:500]}", refused=answer.status
                    )
                last_error = f"HTTP {answer.status}: {text[:200]}"
                last_status = answer.status
            except TransportError as exc:
                if started:
                    raise PolicyServerError(f"{target.url}{path} stopped streaming mid-answer: {exc}") from None
                last_error = str(exc)
                last_status = None
            finally:
                target.outstanding -= 1
            if len(self.servers) > 1:
                target.mark(False, self.cooldown)
                failed = target
            if attempt < self.max_retries:
                await asyncio.sleep(min(self.backoff * 2**attempt, 5.0) * (0.5 + random.random()))
        hint = (
            "Check that the server is running and reachable (agentgym serve --model ... --port ...)."
            if last_status is None
            else "The server is up but failing: see its log."
        )
        raise PolicyServerError(
            f"policy server request {path} (stream) failed after {self.max_retries + 1} attempts "
            f"({', '.join(s.url for s in self.servers)}): {last_error}. {hint}",
            status=last_status,
        )

    @staticmethod
    def _parse_delta(event: dict[str, Any], server: _Server, top_logprobs: int = 0) -> TokenDelta | None:
        choices = event.get("choices")
        if not choices:  # a usage chunk
            return None
        choice = choices[0]
        ids, logprobs, tops = _read(completion_choice, choice, f"{server.url} (a streamed chunk)", top_logprobs)
        version = event.get("weight_version", server.version)
        return TokenDelta(
            ids, logprobs, choice.get("finish_reason"), int(version) if version is not None else server.version, tops
        )

    @staticmethod
    def _body(payload: dict[str, Any], model: str | None, unseeded: bool) -> bytes:
        if model or unseeded:
            payload = {k: v for k, v in payload.items() if not (unseeded and k == "seed")}
            if model:
                payload["model"] = model
        return json.dumps(payload).encode()

    async def _drops_seed(self, server: _Server, payload: dict[str, Any]) -> bool:
        """Whether ``payload`` goes to ``server`` without its ``seed``: a vLLM server that a seeded
        request could kill (on a CPU with chunked prefill, or one that does not say;
        ``agentgym.client.vllm_cpu``), asked once per server, a warning the first time."""
        if self.backend != "vllm" or payload.get("seed") is None:
            return False
        if server.seed_hazard is None:
            if server._seed_lookup is None or server._seed_lookup.done():
                server._seed_lookup = asyncio.ensure_future(self._ask_seed_hazard(server))
            hazard = await asyncio.shield(server._seed_lookup)
            if server.seed_hazard is None:
                server.seed_hazard = hazard
                if hazard:
                    warn_unseeded(server.url, hazard)
        return bool(server.seed_hazard)

    async def _ask_seed_hazard(self, server: _Server) -> str:
        try:
            status, raw = await server.transport.request("GET", SERVER_INFO, timeout=60.0)
            info = json.loads(raw) if status == 200 else None
        except (TransportError, ValueError):
            info = None
        return seed_hazard(info if isinstance(info, dict) else None) or ""

    async def served_model(self, server: _Server) -> str | None:
        """The model name to send ``server``: ``self.model`` if given, else the first id in the
        server's ``/v1/models`` (asked once; None while it cannot be asked: the request then
        goes without a name, which vLLM, SGLang and the embedded server take as their model)."""
        if self.model:
            return self.model
        if server.model is None:
            if server._model_lookup is None or server._model_lookup.done():
                server._model_lookup = asyncio.ensure_future(self._ask_model(server))
            server.model = await asyncio.shield(server._model_lookup)
        return server.model

    async def _ask_model(self, server: _Server) -> str | None:
        cards = await self._model_cards(server)
        return str(cards[0]["id"]) if cards and cards[0].get("id") else None

    async def _model_cards(self, server: _Server) -> list[dict[str, Any]]:
        """The model cards in ``server``'s ``GET /v1/models`` (empty if it does not answer)."""
        try:
            status, raw = await server.transport.request("GET", "/v1/models", timeout=10.0)
            cards = (json.loads(raw).get("data") or []) if status == 200 else []
        except (TransportError, ValueError, AttributeError):
            return []
        return [c for c in cards if isinstance(c, dict)]

    def _parse_completions(self, body: dict[str, Any], server: _Server, top_logprobs: int = 0) -> TokenSample:
        choice = body["choices"][0]
        ids, logprobs, tops = _read(completion_choice, choice, server.url, top_logprobs)
        version = body.get("weight_version", server.version)
        return TokenSample(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason") or "stop",
            weight_version=int(version) if version is not None else server.version,
            text=choice.get("text", ""),
            top_logprobs=tops,
        )

    async def chat_completion(self, session_id: str | None = None, **request: Any) -> dict[str, Any]:
        """An OpenAI ``/v1/chat/completions`` call (non-streaming); returns the response body."""
        _, body = await self._post("/v1/chat/completions", request, session_id, name_model="model" not in request)
        return body

    # ---- weights -------------------------------------------------------------------------
    async def update_weights_from_disk(self, model_path: str, version: int) -> None:
        """Every server loads the weights saved at ``model_path`` and reports ``version`` from now on.

        The embedded server and SGLang take SGLang's ``/update_weights_from_disk``; vLLM servers
        (started by ``agentgym.server.launchers``, with its worker extension) are updated through
        ``VLLMWeights``: pause, load in every worker, reset the prefix cache, resume.
        """
        if self.backend == "vllm":
            from agentgym.client.weights import VLLMWeights

            adapter = VLLMWeights()
            try:
                await asyncio.gather(
                    *(asyncio.to_thread(adapter.update_from_disk, s.url, model_path, version) for s in self.servers)
                )
            except Exception as exc:
                raise PolicyServerError(f"vLLM weight update from {model_path} failed: {exc}") from exc
        else:
            payload = {"model_path": model_path, "weight_version": str(version)}
            await asyncio.gather(
                *(self._post("/update_weights_from_disk", payload, server=s, admin=True) for s in self.servers)
            )
        for s in self.servers:
            s.version = version

    async def max_model_len(self) -> int | None:
        """The smallest context (prompt + completion tokens) the servers report in ``GET /v1/models``
        (the embedded server and vLLM report ``max_model_len``); None if none says."""

        async def one(server: _Server) -> int | None:
            lengths = [c.get("max_model_len") for c in await self._model_cards(server)]
            return min((n for n in lengths if isinstance(n, int) and n > 0), default=None)

        known = [n for n in await asyncio.gather(*(one(s) for s in self.servers)) if n is not None]
        return min(known, default=None)

    async def health(self) -> list[bool]:
        """Ask every server's ``/health``; one that fails is passed over for ``cooldown`` seconds."""

        async def one(server: _Server) -> bool:
            ok = await self._healthy(server.transport, 5.0)
            server.mark(ok, self.cooldown)
            return ok

        return list(await asyncio.gather(*(one(s) for s in self.servers)))

    async def check_health(self, url: str, timeout: float = 10.0) -> bool:
        """Whether ``url`` (a server not necessarily routed to) answers ``GET /health`` with 200."""
        transport = transport_for(url.rstrip("/"), 2, 1, timeout)
        try:
            return await self._healthy(transport, timeout)
        finally:
            await transport.aclose()

    @staticmethod
    async def _healthy(transport: Any, timeout: float) -> bool:
        try:
            return (await transport.request("GET", "/health", timeout=timeout))[0] == 200
        except TransportError:
            return False

    async def aclose(self) -> None:
        await asyncio.gather(*(s.transport.aclose() for s in self.servers))

    async def __aenter__(self) -> PolicyClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


async def _sse_events(answer: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON ``data:`` events of a server-sent-events body, until ``[DONE]`` or its end."""
    buffer = b""
    async for piece in answer:
        buffer += piece.replace(b"\r\n", b"\n")
        while True:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            event, buffer = buffer[:end], buffer[end + 2 :]
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    try:
                        yield json.loads(data)
                    except ValueError:
                        raise PolicyServerError(f"a streamed event is not JSON: {data[:200]!r}") from None
