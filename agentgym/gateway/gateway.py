"""The gateway: train any OpenAI-client agent as a black box.

The trainer (or anyone holding the admin key) opens a *session* per episode; the agent gets a
``base_url`` and an API key for it and talks plain OpenAI to that URL. The gateway renders each
chat itself, samples token-in/token-out from the policy servers (``PolicyClient.generate``),
and records prompt ids, sampled ids, logprobs and weight version per turn. How requests map to
trajectories (extend / fork / fresh branches) is ``agentgym.gateway.sessions``.

The HTTP routes (admin, query, servers, and the OpenAI ones per session) are listed in
``agentgym.gateway.app``.

Choices made:

* ``n > 1``: each sample is recorded on its own branch (its own Trajectory); the first extends
  the matched branch, the others fork at the same point.
* ``stream=true`` (``n`` = 1): tokens go to the agent as the server samples them (``PolicyClient.
  generate_stream``); text that may be the start of a stop string or of a ``<tool_call>`` is held
  back until it is known, and tool calls come as one delta at the end. The turn is recorded from
  the sampled ids, exactly as without streaming. With ``n > 1`` the samples are generated first and
  then sent as chunks.
* ``max_tokens`` left out: ``default_max_tokens``, clipped to what the context has room for.
* ``tool_choice`` ``required``/named, ``response_format`` and ``structured_outputs``, penalties,
  ``logit_bias``, ``min_tokens`` and ``top_logprobs`` go to the policy servers, each in its own
  words (``agentgym.gateway.model_calls``); each turn names what shaped its sampling
  (``Turn.shaped_by``); ``tools`` beside ``response_format`` under ``auto``: a call or the JSON.
* The legacy ``functions``/``function_call`` are read as ``tools``/``tool_choice`` (the history's
  ``function_call`` and ``function`` messages as tool calls and results,
  ``agentgym.server.legacy_functions``): the turn is recorded as a tool call, the agent gets
  ``message.function_call``. A call cut by ``max_tokens`` is a call with partial arguments.
* A turn is recorded only once the agent has its reply: an agent that goes away before it (a
  client timeout) cancels the generation and leaves nothing in the session.
* The ``model`` field is ignored: the session decides what answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request

from agentgym.client import PolicyClient, PolicyServerError
from agentgym.client.policy import TokenDelta
from agentgym.gateway.archive import Archive, ArchivedSession, archive_record, key_hash, open_archive
from agentgym.gateway.model_calls import ModelCalls
from agentgym.gateway.sessions import Plan, Session, SessionError, SessionStore
from agentgym.rollout.chat import ChatTokenizer
from agentgym.server.errors import (
    APIError,
)
from agentgym.server.limits import new_admin_key
from agentgym.server.token_pieces import TokenPieces
from agentgym.types import SamplingParams, TokenSample

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


class Gateway(ModelCalls):
    """The gateway's state: sessions, the policy client, pause control and counters.

    ``policy``: a ``PolicyClient`` over the policy servers. ``tokenizer``: the policy's tokenizer
    (its chat template renders every request). ``max_model_len``: prompt plus completion tokens
    (default: the tokenizer's ``model_max_length``). ``upstream_retry_s``: how long a model call
    keeps retrying while the servers are unreachable (restarts, weight loads) before a 503.
    ``template_check_every``: re-render every k-th finished session to detect a chat template that
    is not prefix-preserving (the ``template_mismatch`` metric, as the rollout runner does); 0: never.
    ``idle_timeout``: an open session unused this long is finished as failed (``expired``).
    ``worker``: this gateway's index among the worker processes of ``agentgym gateway --workers N``
    (its session ids start ``w<index>-``); ``worker_port``: the port only it listens on, which its
    sessions' ``base_url`` names so that the agent talks to it directly. ``store``: where finished
    sessions go (``memory``, ``sqlite:PATH``, or an ``Archive``); ``health_check_interval``: seconds
    between health checks of the servers (0: none). ``await gateway.start()`` before serving,
    ``await gateway.aclose()`` after.
    """

    def __init__(
        self,
        policy: PolicyClient,
        tokenizer: Any,
        *,
        model_name: str = "agentgym",
        admin_key: str | None = None,
        max_model_len: int | None = None,
        default_max_tokens: int = 1024,
        max_body_bytes: int = 16 << 20,
        pause_timeout: float = 600.0,
        upstream_retry_s: float = 60.0,
        public_url: str | None = None,
        keep_finished: int = 10_000,
        template_check_every: int = 1,
        idle_timeout: float = 3600.0,
        worker: int | None = None,
        worker_port: int | None = None,
        store: str | Archive | None = None,
        health_check_interval: float = 10.0,
        max_sessions: int = 8192,
        max_task_bytes: int = 1 << 20,
        allowed_reward_fns: Sequence[str] = (),
    ) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.chat = ChatTokenizer(tokenizer)
        self.archive: Archive = (
            store if not isinstance(store, (str, type(None))) else open_archive(store, keep_finished, worker)
        )
        # finished sessions stay in memory as well, a few, for late calls and quick reads; the archive has them all
        self.store = SessionStore(
            self.chat,
            keep_finished=min(keep_finished, 1024),
            template_check_every=template_check_every,
            idle_timeout=idle_timeout,
            id_prefix="" if worker is None else f"w{worker}-",
            allowed_reward_fns=allowed_reward_fns,
        )
        self.store.on_finish = self._archive
        self.health_check_interval = health_check_interval
        self._health_task: asyncio.Task[None] | None = None
        self.worker, self.worker_port = worker, worker_port
        self.model_name = model_name
        self.admin_key = admin_key or new_admin_key()  # never open: no key would let anyone in
        self.max_sessions = max_sessions
        self.max_task_bytes = max_task_bytes
        limit = max_model_len or getattr(tokenizer, "model_max_length", None)
        self.max_model_len = int(limit) if limit and limit < 10**8 else 32768
        self.default_max_tokens = default_max_tokens
        self.max_body_bytes = max_body_bytes
        self.pause_timeout = pause_timeout
        self.upstream_retry_s = upstream_retry_s
        self.public_url = public_url.rstrip("/") if public_url else None
        self.inflight = 0
        self.weight_version: int | None = None
        self._running = asyncio.Event()
        self._running.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.pieces = TokenPieces(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer: no per-call Python overhead
        if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self._decode_reply = functools.partial(backend.decode, skip_special_tokens=True)
        else:
            self._decode_reply = functools.partial(tokenizer.decode, skip_special_tokens=True)
        self.counts = {
            "completions": 0,
            "errors": 0,
            "upstream_retries": 0,
            "paused_waits": 0,
            "late_completions": 0,
            "archive_errors": 0,
            "undelivered": 0,
        }

    # ---- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the archive and start the servers' health checks (on the loop that will serve)."""
        await self.archive.start()
        if self.health_check_interval > 0 and self._health_task is None:
            self._health_task = asyncio.create_task(self._check_health(), name="gateway-health-checks")

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        pending = [s.archived for s in self.store.finished.values() if s.archived is not None and not s.archived.done()]
        await asyncio.gather(*pending, return_exceptions=True)
        await self.archive.close()

    async def _check_health(self) -> None:
        while True:
            await asyncio.sleep(self.health_check_interval)
            with contextlib.suppress(Exception):
                await self.policy.health()

    # ---- policy servers at run time -------------------------------------------------------
    def servers(self) -> dict[str, Any]:
        return {
            "servers": [
                {"url": s.url, "healthy": s.healthy, "outstanding": s.outstanding, "weight_version": s.version}
                for s in self.policy.servers
            ]
        }

    async def add_server(self, url: str, timeout: float = 10.0) -> dict[str, Any]:
        """Route model calls to ``url`` too, once it answers ``GET /health`` with 200."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise APIError(400, 'post {"url": "http://host:port"} (a policy server\'s base URL, no /v1)', param="url")
        if not await self.policy.check_health(url, timeout):
            raise APIError(
                400,
                f"{url} did not answer GET /health with 200 within {timeout:.0f}s; start the server "
                "first (agentgym serve ...), then add it",
                param="url",
                code="server_unhealthy",
            )
        added = self.policy.add_server(url)
        if added and self.weight_version is not None:
            self.policy.servers[-1].version = self.weight_version
        return {**self.servers(), "added": added}

    async def remove_server(self, url: str, drain_timeout: float = 60.0) -> dict[str, Any]:
        try:
            removed = await self.policy.remove_server(url, drain_timeout)
        except ValueError as exc:
            raise APIError(409, str(exc), "conflict_error", param="url", code="last_server") from None
        if not removed:
            raise APIError(404, f"no policy server {url}; GET /servers lists them", "not_found_error", param="url")
        return {**self.servers(), "removed": url}

    # ---- access ---------------------------------------------------------------------------
    @staticmethod
    def bearer(request: Request) -> str | None:
        header = request.headers.get("authorization") or ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return request.headers.get("x-api-key") or None  # Anthropic's clients send the key so

    def is_admin(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(key.encode(), self.admin_key.encode())

    def require_admin(self, request: Request) -> None:
        if not self.is_admin(self.bearer(request)):
            raise APIError(
                401,
                "this endpoint needs the gateway's admin key (Authorization: Bearer <admin key>)",
                "authentication_error",
                code="invalid_api_key",
            )

    def session_for(self, sid: str, request: Request, admin: bool = False) -> Session:
        """The session ``sid`` if the request may use it: with the session's own key, or for the
        admin endpoints (``admin=True``) with the admin key."""
        session = self.store.get(sid)
        key = self.bearer(request)
        if key == session.key:
            return session
        if admin and self.is_admin(key):
            return session
        owner = self.store.owner(key) if key else None
        if owner is not None:
            raise APIError(
                403,
                f"this API key belongs to another session, not {sid}; use the api_key that "
                "POST /sessions returned with this session's base_url",
                "permission_error",
                code="wrong_session",
            )
        if key is None:
            raise APIError(
                401,
                "no API key: pass the session's api_key (Authorization: Bearer <key>, or x-api-key: <key>)",
                "authentication_error",
                code="invalid_api_key",
            )
        raise APIError(401, f"invalid API key for session {sid}", "authentication_error", code="invalid_api_key")

    async def find(self, sid: str, request: Request, admin: bool = True) -> Session | ArchivedSession:
        """``session_for``, or else the archived session ``sid`` (finished sessions no longer in memory,
        those from before a restart among them), with the same rules for keys."""
        try:
            return self.session_for(sid, request, admin)
        except SessionError as exc:
            if exc.status != 404:
                raise
            record = await self.archive.get(sid)
            if record is None:
                raise
        key = self.bearer(request)
        if key is not None and key_hash(key) == record.key_hash:
            return record
        if admin and self.is_admin(key):
            return record
        if key is not None and self.store.owner(key) is not None:
            raise APIError(
                403, f"this API key belongs to another session, not {sid}", "permission_error", code="wrong_session"
            )
        raise APIError(
            401,
            f"{'no' if key is None else 'invalid'} API key for session {sid}",
            "authentication_error",
            code="invalid_api_key",
        )

    @staticmethod
    def open_session(session: Session) -> Session:
        if session.finished:
            raise APIError(
                409,
                f"session {session.id} is finished; it takes no more model calls",
                "conflict_error",
                code="session_finished",
            )
        return session

    def base_url(self, request: Request, sid: str) -> str:
        if self.public_url:
            root = self.public_url
        elif self.worker_port is not None:
            root = str(request.base_url.replace(port=self.worker_port)).rstrip("/")
        else:
            root = str(request.base_url).rstrip("/")
        return f"{root}/sessions/{sid}/v1"

    # ---- finished sessions ----------------------------------------------------------------
    def _archive(self, session: Session) -> None:
        """``SessionStore.on_finish``: the session goes to the archive (a write, awaited by ``finish``)."""
        self.policy.release_session(session.id)
        session.record = archive_record(session)
        session.archived = asyncio.ensure_future(self.archive.put(session.record))
        session.archived.add_done_callback(self._archived)

    def _archived(self, done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            self.counts["archive_errors"] += 1

    async def finish(
        self, target: Session | ArchivedSession, failure: str | None = None, reward: float | None = None
    ) -> ArchivedSession:
        """Finish a session (once; again: the same trajectories) and return its record once the archive
        holds it (for SQLite: committed)."""
        if isinstance(target, ArchivedSession):
            return target
        if not target.finished:
            self.store.finish(target, failure=failure, reward=reward)
        if target.archived is not None:
            try:
                await asyncio.shield(target.archived)
            except Exception as exc:
                raise APIError(
                    500,
                    f"session {target.id} finished, but storing it failed: {exc}",
                    "server_error",
                    code="store_failed",
                ) from None
        return target.record

    async def delete(self, target: Session | ArchivedSession) -> dict[str, Any]:
        self.store.delete(target.id)
        self.policy.release_session(target.id)
        archived = getattr(target, "archived", None)
        if archived is not None:
            await asyncio.gather(archived, return_exceptions=True)  # so the delete comes after the write
        await self.archive.delete(target.id)
        return {"id": target.id, "deleted": True}

    async def set_metadata(self, target: Session | ArchivedSession, metadata: dict[str, Any]) -> dict[str, Any]:
        target.metadata.update(metadata)
        if isinstance(target, ArchivedSession) or target.finished:
            archived = getattr(target, "archived", None)
            if archived is not None:
                await asyncio.gather(archived, return_exceptions=True)
            await self.archive.set_metadata(target.id, metadata)
        return {"id": target.id, "metadata": target.metadata}

    async def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> dict[str, Any]:
        """Open sessions from memory, finished ones from the archive, by creation time."""
        from agentgym.gateway.archive import matches

        rows = []
        if status in (None, "open"):
            rows = [
                h for h in (s.header() for s in self.store.open.values()) if matches(h, group_id, status, since, until)
            ]
        if status != "open":
            rows += await self.archive.list(group_id, status, since, until, limit=offset + limit, offset=0)
        rows.sort(key=lambda h: h["created"])
        return {"sessions": rows[offset : offset + limit]}

    def record_call(
        self,
        session: Session,
        endpoint: str,
        plan: Plan,
        request: dict[str, Any],
        sampling: SamplingParams,
        samples: list[TokenSample],
        responses: list[Any],
        started: float,
        wall: float,
    ) -> None:
        """One model call as the query API shows it (``GET /sessions/<id>/calls``)."""
        session.calls.append(
            {
                "index": len(session.calls),
                "endpoint": endpoint,
                "time": wall,
                "plan": plan.kind,
                "branch": plan.branch.index,
                "request": request,
                "sampling": dict(vars(sampling)),
                "responses": responses,
                "finish_reasons": [s.finish_reason for s in samples],
                "prompt_tokens": len(plan.context_ids),
                "completion_tokens": [len(s.token_ids) for s in samples],
                "weight_version": min(s.weight_version for s in samples),
                "latency_ms": (asyncio.get_running_loop().time() - started) * 1e3,
            }
        )

    # ---- pause for weight updates ---------------------------------------------------------
    async def pause(self, drain_timeout: float = 60.0) -> dict[str, Any]:
        """Hold new model calls; return once in-flight ones finished (or after ``drain_timeout``)."""
        self._running.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_timeout)
        return {"paused": True, "inflight": self.inflight}

    def resume(self, weight_version: int | None = None) -> dict[str, Any]:
        """Let model calls go; ``weight_version``: the version the servers now hold, recorded on turns
        whose server does not report one itself (vLLM, SGLang; the embedded server does)."""
        if weight_version is not None:
            self.weight_version = int(weight_version)
            for server in getattr(self.policy, "servers", []):
                server.version = self.weight_version
        self._running.set()
        return {"paused": False, "inflight": self.inflight, "weight_version": self.weight_version}

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    @contextlib.asynccontextmanager
    async def weight_update(
        self, weight_version: int | None = None, drain_timeout: float = 60.0
    ) -> AsyncIterator[None]:
        """``async with gateway.weight_update(version): <push weights>`` — calls wait meanwhile (same loop
        only; from elsewhere use ``POST /pause``/``/resume`` or ``GatewayClient.weight_update``)."""
        await self.pause(drain_timeout)
        try:
            yield
        finally:
            self.resume(weight_version)

    # ---- sampling -------------------------------------------------------------------------
    async def _admit(self) -> None:
        """Wait out a pause (up to ``pause_timeout``), then count the call in flight."""
        if not self._running.is_set():
            self.counts["paused_waits"] += 1
            try:
                await asyncio.wait_for(self._running.wait(), self.pause_timeout)
            except asyncio.TimeoutError:
                raise APIError(
                    503,
                    f"the gateway has been paused for a weight update for over {self.pause_timeout:.0f}s; retry later",
                    "server_error",
                    code="paused",
                ) from None
        self.inflight += 1
        self._idle.clear()

    def _done(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    def _upstream_error(self, exc: PolicyServerError, deadline: float) -> APIError | None:
        """What to answer for a failed server call: None means wait a little and retry."""
        if exc.refused is not None:  # the server's own 4xx: retrying cannot help
            return APIError(400, f"the policy server refused the request: {exc}")
        if not getattr(exc, "unreachable", True):  # it answered 5xx (or 429) through PolicyClient's retries
            return APIError(502, f"the policy server failed: {exc}", "server_error", code="upstream_error")
        if asyncio.get_running_loop().time() > deadline:
            return APIError(
                503,
                f"no policy server answered for {self.upstream_retry_s:.0f}s: {exc}",
                "server_error",
                code="upstream_unavailable",
            )
        self.counts["upstream_retries"] += 1
        return None

    async def generate(self, session: Session, prompt_ids: list[int], sampling: SamplingParams) -> TokenSample:
        """One sample from the policy servers, sticky to the session's server; waits out pauses and
        retries unreachable servers for ``upstream_retry_s``. A server's own answer is never retried
        here: a 4xx is the request's fault (400), a 5xx already had ``PolicyClient``'s retries (502)."""
        await self._admit()
        deadline = asyncio.get_running_loop().time() + self.upstream_retry_s
        try:
            while True:
                try:
                    return await self.policy.generate(prompt_ids, sampling, session_id=session.id)
                except PolicyServerError as exc:
                    error = self._upstream_error(exc, deadline)
                    if error is not None:
                        raise error from None
                    await asyncio.sleep(0.25)
        finally:
            self._done()

    async def generate_stream(
        self, session: Session, prompt_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[TokenDelta]:
        """``generate``, streamed: the deltas as the server samples them. Pauses and unreachable servers
        are waited out as ``generate`` does until the first delta; a failure after it is a 502."""
        await self._admit()
        deadline = asyncio.get_running_loop().time() + self.upstream_retry_s
        try:
            while True:
                started = False
                try:
                    async with contextlib.aclosing(
                        self.policy.generate_stream(prompt_ids, sampling, session_id=session.id)
                    ) as deltas:
                        async for delta in deltas:
                            started = True
                            yield delta
                    return
                except PolicyServerError as exc:
                    if started:
                        raise APIError(
                            502, f"the policy server failed mid-answer: {exc}", "server_error", code="upstream_failed"
                        ) from None
                    error = self._upstream_error(exc, deadline)
                    if error is not None:
                        raise error from None
                    await asyncio.sleep(0.25)
        finally:
            self._done()

    def stats(self) -> dict[str, Any]:
        return {
            **self.store.counts,
            **self.counts,
            "open_sessions": len(self.store.open),
            "inflight": self.inflight,
            "paused": self.paused,
        }
