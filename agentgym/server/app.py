"""The embedded policy server's HTTP routes (FastAPI) over an ``Engine``.

OpenAI: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, and
``POST /v1/responses`` (the Responses API over the chat path: ``agentgym.server.responses_api``).
Anthropic: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (``agentgym.server.anthropic_api``,
over the chat path).
Serving: ``GET /health``, ``GET /weight_version``, ``GET /stats``.
Weights (SGLang's names): ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"}``,
``POST /update_weights_from_tensor`` (a safetensors file as the body, ``?weight_version=N``; a part of
a bucketed push with ``&bucket=i&buckets=n``), ``POST /update_weights_from_ipc`` (shared memory or
CUDA IPC handles from a trainer on this host: ``agentgym/server/weight_transfer.py``),
``POST /pause_generation`` ``{"mode": "wait"|"abort"}``, ``POST /resume_generation``
(alias ``/continue_generation``).

A client that disconnects from a request that is not streamed ends its generation, as one that
stops reading a stream does (``streaming.until_disconnect``, vLLM's ``with_cancellation``).

Chat requests may carry ``tools`` beside ``response_format`` (under ``auto``: a tool call or the
JSON, one union grammar), the legacy ``functions``/``function_call`` (``legacy_functions.py``: the
reply as ``message.function_call``); a tool call cut by ``max_tokens`` is returned as a call with
the arguments written so far (``tool_calls.py``). A path not served is a 404 listing the ones that
are (``errors.py``). docs/openai_api.md describes all of it.

The server answers to its model name and to ``"default"`` (and to a request with no
``model``); any other name is a 404 ``model_not_found``. Errors come back in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status, malformed JSON and
invalid fields included (400, not FastAPI's 422).

Hardening (``agentgym.server.limits``): bodies, prompts and client templates are bounded by
``ServerLimits``; JSON parsing (of large bodies), chat templating and tokenization run in worker
threads, so ``/health`` and every other request keep answering while one request renders or
tokenizes a long prompt; the weight and pause routes need the admin key (``app.state.admin_key``:
the one given, or a new random one) and a JSON content type; a pause ends by itself after
``max_pause_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentgym.model.weights import tensors_from_bytes
from agentgym.server.anthropic_api import add_messages_route, error_shape
from agentgym.server.engine import Engine, Sequence
from agentgym.server.engine import Request as EngineRequest
from agentgym.server.errors import APIError, install_error_handlers, json_object, validate
from agentgym.server.legacy_functions import legacy_reply
from agentgym.server.limits import ServerLimits, new_admin_key, read_body, require_admin, text_chars
from agentgym.server.openai_types import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatStreamChoice,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaMessage,
    ModelCard,
    ModelList,
    PauseRequest,
    TopLogprob,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsResponse,
    UsageInfo,
)
from agentgym.server.request_params import compile_constraint, generation_params
from agentgym.server.responses_api import add_route as add_responses_route
from agentgym.server.sampling import GenerationParams
from agentgym.server.streaming import events, sse, until_disconnect
from agentgym.server.token_pieces import IncrementalText, TokenPieces, top_by_name
from agentgym.server.tool_calls import TOOL_CALL_OPEN, assistant_reply, forced_tool_names
from agentgym.server.weight_transfer import BucketStaging, SharedWeights

log = logging.getLogger("agentgym.server")

PARSE_IN_THREAD_BYTES = 256 << 10
"""JSON bodies over this size are parsed in a worker thread, not on the event loop."""

TEMPLATE_CALL_ARGS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""``apply_chat_template``'s own arguments: not template variables, so not a client's to set."""


def build_app(
    engine: Engine,
    served_model_name: str | None = None,
    *,
    admin_key: str | None = None,
    limits: ServerLimits | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` under ``served_model_name`` (default: the engine's name).

    ``admin_key`` guards the control routes (None: a new random key, in ``app.state.admin_key``);
    ``limits``: the request bounds (``ServerLimits()``)."""
    name = served_model_name or engine.model_name
    limits = limits or ServerLimits()
    admin_key = admin_key or new_admin_key()
    server = _Server(engine, name, limits)
    app = FastAPI(title="agentgym policy server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.state.admin_key = admin_key

    install_error_handlers(app, what="agentgym's policy server (OpenAI-compatible)", shape=error_shape)
    staging, shared = BucketStaging(), SharedWeights()

    async def body_json(request: Request, required: bool = True) -> dict[str, Any]:
        raw = await read_body(request, limits.max_body_bytes)
        if len(raw) > PARSE_IN_THREAD_BYTES:
            return await asyncio.to_thread(json_object, raw, required)
        return json_object(raw, required)

    async def parse(request: Request, model: type) -> Any:
        return validate(model, await body_json(request))

    async def control(request: Request, model: type | None = None) -> Any:
        require_admin(request, admin_key)
        data = await body_json(request, required=False)
        return validate(model, data) if model is not None else data

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.alive:
            return JSONResponse({"status": "error", "message": "engine thread stopped"}, status_code=503)
        return JSONResponse({"status": "ok", "weight_version": engine.weight_version})

    @app.get("/v1/models")
    async def models() -> dict:
        return ModelList(data=[ModelCard(id=name, root=name, max_model_len=engine.max_model_len)]).model_dump()

    @app.get("/weight_version")
    async def weight_version() -> dict:
        return {"weight_version": engine.weight_version}

    @app.get("/stats")
    async def stats() -> dict:
        return {**engine.stats, "weight_version": engine.weight_version, "paused": engine.paused}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await until_disconnect(request.receive, server.chat(await parse(request, ChatCompletionRequest)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await until_disconnect(request.receive, server.completions(await parse(request, CompletionRequest)))

    add_messages_route(app, server, body_json)
    add_responses_route(app, parse, server.chat)  # POST /v1/responses

    @app.post("/update_weights_from_disk")
    async def update_from_disk(request: Request) -> JSONResponse:
        from agentgym.model.weights import load_weights

        body = await control(request, UpdateWeightsFromDiskRequest)
        try:
            if body.model_path.endswith(".safetensors"):
                state = load_weights(body.model_path)  # a memory map: nothing is read yet
            else:  # a directory or a torch file: maybe seconds of reading, off the event loop
                state = await asyncio.to_thread(load_weights, body.model_path)
        except (OSError, ValueError, RuntimeError) as exc:
            return _weights_failed(engine, f"could not read weights from {body.model_path!r}: {exc}")
        return await server.apply_weights(
            state, body.weight_version, body.abort_all_requests, f"loaded weights from {body.model_path}"
        )

    @app.post("/update_weights_from_tensor")
    async def update_from_tensor(request: Request) -> JSONResponse:
        from safetensors.torch import load as load_safetensors

        require_admin(request, admin_key, content_type="application/octet-stream")
        raw = await read_body(request, limits.max_weights_bytes)
        query = request.query_params
        try:
            version_int = int(query["weight_version"]) if "weight_version" in query else None
            state = (
                await asyncio.to_thread(load_safetensors, raw) if "buckets" not in query else tensors_from_bytes(raw)
            )
            if "buckets" in query:
                state = staging.add(version_int, int(query.get("bucket", 0)), int(query["buckets"]), state)
        except Exception as exc:
            return _weights_failed(
                engine, f"the body must be a safetensors file and weight_version, bucket and buckets integers: {exc}"
            )
        if state is None:
            return JSONResponse(
                {
                    "success": True,
                    "message": f"bucket {query.get('bucket')} of {query['buckets']} held",
                    "weight_version": engine.weight_version,
                }
            )
        return await server.apply_weights(state, version_int, False, f"loaded {len(state)} tensors")

    @app.post("/update_weights_from_ipc")
    async def update_from_ipc(request: Request) -> JSONResponse:
        body = await control(request)
        try:
            state, version = shared.open(body)
        except Exception as exc:
            return _weights_failed(engine, f"could not open the shared tensors: {exc}")
        return await server.apply_weights(state, version, False, f"loaded {len(state)} shared tensors")

    @app.post("/pause_generation")
    async def pause(request: Request) -> dict:
        body = await control(request, PauseRequest)
        server.pause_started()
        await asyncio.wrap_future(engine.pause(body.mode))
        return {
            "success": True,
            "message": f"paused ({body.mode}); resumes by itself after {limits.max_pause_s:g} s",
            "weight_version": engine.weight_version,
        }

    @app.post("/resume_generation")
    @app.post("/continue_generation")
    async def resume(request: Request) -> dict:
        await control(request)
        server.resume()
        return {"success": True, "message": "resumed", "weight_version": engine.weight_version}

    return app


def _weights_failed(engine: Engine, message: str) -> JSONResponse:
    return JSONResponse(
        UpdateWeightsResponse(success=False, message=message, weight_version=engine.weight_version).model_dump(),
        status_code=400,
    )


def chat_message(
    text: str, finish_reason: str, parse_tools: bool, legacy: bool = False, forced: list[str] | None = None
) -> tuple[ChatMessage, str]:
    """The assistant message for generated ``text``: with tools, Hermes ``<tool_call>`` blocks
    become ``tool_calls`` and a ``stop`` finish becomes ``tool_calls``; malformed blocks stay
    in the content; a call cut by ``max_tokens`` is a call with the arguments written so far
    (finish ``length``; ``forced``: ``tool_calls.cut_tool_call``). ``legacy``: the reply to a
    ``functions`` request (``function_call``)."""
    content, calls, finish_reason = assistant_reply(text, finish_reason, parse_tools, forced)
    return ChatMessage.reply(content, calls, finish_reason, legacy)


class _Server:
    """Request handling: render, validate against the model, submit, build OpenAI responses."""

    def __init__(self, engine: Engine, name: str, limits: ServerLimits) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.name = name
        self.limits = limits
        self.max_prompt_chars = limits.prompt_chars(engine.max_model_len)
        self.pieces = TokenPieces(self.tokenizer)
        self._auto_resume: asyncio.TimerHandle | None = None

    # ---- pause ---------------------------------------------------------------------------
    def pause_started(self) -> None:
        """Arm the bound on a pause: nobody resuming within ``max_pause_s`` resumes it anyway."""
        if self._auto_resume is not None:
            self._auto_resume.cancel()
        self._auto_resume = asyncio.get_running_loop().call_later(self.limits.max_pause_s, self._resume_by_itself)

    def _resume_by_itself(self) -> None:
        self._auto_resume = None
        log.warning(
            "generation was paused for %.0f s and nobody resumed it: resuming (max_pause_s)", self.limits.max_pause_s
        )
        self.engine.resume()

    def resume(self) -> None:
        if self._auto_resume is not None:
            self._auto_resume.cancel()
            self._auto_resume = None
        self.engine.resume()

    # ---- weights -------------------------------------------------------------------------
    async def apply_weights(self, state: dict, version: int | None, abort: bool, what: str) -> JSONResponse:
        engine = self.engine
        if abort:
            await asyncio.wrap_future(engine.pause("abort"))
        try:
            new_version = await asyncio.wrap_future(engine.update_weights(state, version))
        except ValueError as exc:
            return _weights_failed(engine, str(exc))
        finally:
            if abort:
                engine.resume()
        return JSONResponse(
            UpdateWeightsResponse(
                success=True, message=f"{what}; weight version {new_version}", weight_version=new_version
            ).model_dump()
        )

    # ---- shared --------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model not in (None, "", self.name, "default"):
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.name!r} (or use 'default')",
                type="NotFoundError",
                param="model",
                code="model_not_found",
            )

    async def params(
        self, req: ChatCompletionRequest | CompletionRequest, prompt_len: int, top_logprobs: int, param: str
    ) -> GenerationParams:
        grammar = await compile_constraint(self.engine, req.constraint)
        return generation_params(self.engine, req, prompt_len, top_logprobs, param, grammar)

    async def wait(self, request: EngineRequest) -> list[Sequence]:
        try:
            seqs = await request.done
        except asyncio.CancelledError:
            self.engine.abort(request)
            raise
        failed = next((s.error for s in seqs if s.error), None)
        if failed:
            raise APIError(500, f"the engine failed while generating: {failed}", type="internal_error")
        return seqs

    # ---- chat ----------------------------------------------------------------------------
    def template_kwargs(self, req: ChatCompletionRequest) -> dict[str, Any]:
        kwargs = dict(req.chat_template_kwargs or {})
        if "chat_template" in kwargs and not self.limits.allow_client_chat_template:
            raise APIError(
                400,
                "this server renders with the model's own chat template; a template sent in "
                "chat_template_kwargs.chat_template is refused (start the server with "
                "--allow-client-chat-template to accept one)",
                param="chat_template_kwargs",
            )
        reserved = sorted(set(kwargs) & (TEMPLATE_CALL_ARGS - {"chat_template"}))
        if reserved:
            raise APIError(
                400,
                f"chat_template_kwargs may not set {reserved}: those are the request's own fields or the server's",
                param="chat_template_kwargs",
            )
        return kwargs

    def check_prompt_chars(self, chars: int, param: str) -> None:
        if chars > self.max_prompt_chars:
            raise APIError(
                400,
                f"the prompt is {chars} characters; this server takes at most {self.max_prompt_chars} "
                f"(its context is {self.engine.max_model_len} tokens; agentgym serve --max-prompt-chars)",
                param=param,
                code="context_length_exceeded",
            )

    def render_chat(self, req: ChatCompletionRequest, kwargs: dict[str, Any]) -> list[int]:
        """The prompt's token ids (runs in a worker thread: templates and tokenizers may take long)."""
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        try:
            messages = [_flatten_content(m) for m in req.messages]
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                tokenize=False,
                **kwargs,
            )
            if not isinstance(text, str):
                raise TypeError(f"the template produced {type(text).__name__}, not text")
        except Exception as exc:
            raise APIError(
                400,
                f"could not render the messages with the chat template: {type(exc).__name__}: {exc}",
                param="messages",
            ) from exc
        self.check_prompt_chars(len(text), "messages")
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def chat_prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        """The token ids the chat path renders ``req``'s prompt to (its model, template arguments
        and size checked): what ``chat`` samples from, and what ``count_tokens`` counts."""
        self.check_model(req.model)
        kwargs = self.template_kwargs(req)
        self.check_prompt_chars(text_chars([req.messages, req.tools, kwargs]), "messages")
        return await asyncio.to_thread(self.render_chat, req, kwargs)

    async def chat(self, req: ChatCompletionRequest) -> Any:
        prompt_ids = await self.chat_prompt_ids(req)
        top = (req.top_logprobs or 0) if req.logprobs else 0
        params = await self.params(req, len(prompt_ids), top, "messages")
        parse_tools = bool(req.tools) and req.tool_choice != "none"
        if req.stream:
            request = self.engine.submit(prompt_ids, params, n=req.n, stream=True)
            return sse(self.chat_stream(req, request, parse_tools), self.engine, request)
        request = self.engine.submit(prompt_ids, params, n=req.n)
        seqs = await self.wait(request)
        choices = []
        forced, legacy = forced_tool_names(req.constraint), req.legacy_functions
        for seq in seqs:
            message, finish = chat_message(seq.text, seq.finish_reason or "stop", parse_tools, legacy, forced)
            choices.append(
                ChatChoice(
                    index=seq.index,
                    message=message,
                    logprobs=self.chat_logprobs(seq.output_ids, seq.logprobs, seq.top_logprobs)
                    if req.logprobs
                    else None,
                    finish_reason=finish,
                    stop_reason=seq.stop_reason,
                    token_ids=seq.output_ids,
                )
            )
        completion = sum(len(s.output_ids) for s in seqs)
        return ChatCompletionResponse(
            model=self.name,
            choices=choices,
            prompt_token_ids=prompt_ids,
            usage=UsageInfo(
                prompt_tokens=len(prompt_ids), completion_tokens=completion, total_tokens=len(prompt_ids) + completion
            ),
            weight_version=seqs[0].weight_version if seqs else self.engine.weight_version,
        ).model_dump()

    def chat_logprobs(self, ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]]) -> ChatLogprobs:
        content = []
        for i, (tok, lp) in enumerate(zip(ids, logprobs)):
            alts = [
                TopLogprob(token=self.pieces.text(t), logprob=v, bytes=self.pieces.bytes(t))
                for t, v in (tops[i] if i < len(tops) else [])
            ]
            content.append(
                ChatTokenLogprob(
                    token=self.pieces.text(tok), logprob=lp, bytes=self.pieces.bytes(tok), top_logprobs=alts
                )
            )
        return ChatLogprobs(content=content)

    async def chat_stream(
        self, req: ChatCompletionRequest, request: EngineRequest, parse_tools: bool
    ) -> AsyncIterator[str]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        markers = list(req.stop or []) + ([TOOL_CALL_OPEN] if parse_tools else [])
        streams = [IncrementalText(self.tokenizer, req.skip_special_tokens, markers) for _ in range(req.n)]
        version = None

        def chunk(choice: ChatStreamChoice, **extra: Any) -> str:
            body = ChatCompletionChunk(
                id=cid,
                created=created,
                model=self.name,
                choices=[choice],
                weight_version=version if version is not None else self.engine.weight_version,
                **extra,
            )
            return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

        first = True
        async for event in events(request):
            if version is None:
                version = request.sequences[0].weight_version if request.sequences else self.engine.weight_version
            if first:
                for i in range(req.n):
                    yield chunk(
                        ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content="")),
                        prompt_token_ids=request.prompt_ids if i == 0 else None,
                    )
                first = False
            stream = streams[event.index]
            delta = stream.push(event.token_id) if event.token_id is not None else ""
            logprobs = None
            if req.logprobs and event.token_id is not None:
                logprobs = self.chat_logprobs([event.token_id], [event.logprob], [event.top_logprobs or []])
            calls = function_call = None
            finish = event.finish_reason
            if finish is not None:
                final = event.text or ""
                if parse_tools:
                    content, parsed, finish = assistant_reply(final, finish, True, forced_tool_names(req.constraint))
                    final = content or ""
                    if req.legacy_functions:
                        _, function_call, parsed, finish = legacy_reply(content, parsed, finish)
                    if parsed:
                        calls = [{"index": k, **c} for k, c in enumerate(parsed)]
                delta += stream.finish(final)
            if delta or calls or function_call or logprobs or finish or event.token_id is not None:
                yield chunk(
                    ChatStreamChoice(
                        index=event.index,
                        delta=DeltaMessage(
                            content=delta if delta or not (calls or function_call) else None,
                            tool_calls=calls,
                            function_call=function_call,
                        ),
                        logprobs=logprobs,
                        finish_reason=finish,
                        token_ids=[event.token_id] if event.token_id is not None else [],
                    )
                )
        if include_usage:
            seqs = request.sequences
            completion = sum(len(s.output_ids) for s in seqs)
            usage = UsageInfo(
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=completion,
                total_tokens=len(request.prompt_ids) + completion,
            )
            body = ChatCompletionChunk(
                id=cid,
                created=created,
                model=self.name,
                choices=[],
                usage=usage,
                weight_version=version if version is not None else self.engine.weight_version,
            )
            yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
        yield "data: [DONE]\n\n"

    # ---- completions ---------------------------------------------------------------------
    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        """The prompts' token ids (text is tokenized in a worker thread: see ``completions``)."""
        if isinstance(prompt, str):
            prompts = [self.tokenizer.encode(prompt, add_special_tokens=False)]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompt]
        else:
            prompts = [list(p) for p in prompt]
        limit = self.engine.max_model_len
        for ids in prompts:
            if len(ids) > limit:
                raise APIError(
                    400,
                    f"this model's maximum context length is {limit} tokens, but the prompt has {len(ids)} tokens",
                    param="prompt",
                    code="context_length_exceeded",
                )
        vocab = self.engine.vocab_size
        for ids in prompts:
            if not ids:
                raise APIError(400, "the prompt encodes to no tokens", param="prompt")
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(400, f"prompt token id {bad} is outside the vocabulary (size {vocab})", param="prompt")
        return prompts

    async def completions(self, req: CompletionRequest) -> Any:
        self.check_model(req.model)
        texts = [req.prompt] if isinstance(req.prompt, str) else [p for p in req.prompt if isinstance(p, str)]
        for text in texts:
            self.check_prompt_chars(len(text), "prompt")
        if texts:
            prompts = await asyncio.to_thread(self.completion_prompts, req.prompt)
        else:
            prompts = self.completion_prompts(req.prompt)
        top = req.logprobs or 0
        params = [await self.params(req, len(p), top, "prompt") for p in prompts]
        if req.stream:
            if len(prompts) != 1:
                raise APIError(400, "streaming takes one prompt", param="prompt")
            request = self.engine.submit(prompts[0], params[0], n=req.n, stream=True)
            return sse(self.completion_stream(req, request), self.engine, request)
        requests = [self.engine.submit(p, ps, n=req.n) for p, ps in zip(prompts, params)]
        try:
            results = await asyncio.gather(*(self.wait(r) for r in requests))
        except asyncio.CancelledError:
            for r in requests:
                self.engine.abort(r)
            raise
        choices = []
        completion = 0
        for i, (prompt_ids, seqs) in enumerate(zip(prompts, results)):
            for seq in seqs:
                completion += len(seq.output_ids)
                choices.append(
                    CompletionChoice(
                        index=i * req.n + seq.index,
                        text=seq.text,
                        logprobs=self.completion_logprobs(
                            seq.output_ids,
                            seq.logprobs,
                            seq.top_logprobs,
                            req.logprobs,
                            as_ids=req.return_tokens_as_token_ids,
                        )
                        if req.logprobs is not None
                        else None,
                        finish_reason=seq.finish_reason,
                        stop_reason=seq.stop_reason,
                        token_ids=seq.output_ids,
                        prompt_token_ids=prompt_ids,
                    )
                )
        prompt_tokens = sum(len(p) for p in prompts)
        versions = {s.weight_version for seqs in results for s in seqs}
        return CompletionResponse(
            model=self.name,
            choices=choices,
            prompt_token_ids=prompts[0] if len(prompts) == 1 else None,
            usage=UsageInfo(
                prompt_tokens=prompt_tokens, completion_tokens=completion, total_tokens=prompt_tokens + completion
            ),
            weight_version=min(versions) if versions else self.engine.weight_version,
        ).model_dump()

    def completion_logprobs(
        self,
        ids: list[int],
        logprobs: list[float],
        tops: list[list[tuple[int, float]]],
        k: int | None,
        offset: int = 0,
        as_ids: bool = False,
    ) -> CompletionLogprobs:
        """``as_ids``: vLLM's ``return_tokens_as_token_ids``, tokens named ``token_id:<id>``."""
        texts = [self.pieces.text(t) for t in ids]
        offsets = self.pieces.offsets(texts, offset)
        name = (lambda t: f"token_id:{t}") if as_ids else self.pieces.text
        tokens = [name(t) for t in ids] if as_ids else texts
        top = None
        if k:
            top = [top_by_name(tops[i] if i < len(tops) else [], name) for i in range(len(ids))]
            for i in range(len(ids)):
                top[i].setdefault(tokens[i], logprobs[i])
        return CompletionLogprobs(tokens=tokens, token_logprobs=logprobs, top_logprobs=top, text_offset=offsets)

    async def completion_stream(self, req: CompletionRequest, request: EngineRequest) -> AsyncIterator[str]:
        cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [IncrementalText(self.tokenizer, req.skip_special_tokens, list(req.stop or [])) for _ in range(req.n)]
        offsets = [0] * req.n
        version = None
        async for event in events(request):
            if version is None:
                version = request.sequences[0].weight_version if request.sequences else self.engine.weight_version
            stream = streams[event.index]
            delta = stream.push(event.token_id) if event.token_id is not None else ""
            if event.finish_reason is not None:
                delta += stream.finish(event.text or "")
            logprobs = None
            if req.logprobs is not None and event.token_id is not None:
                logprobs = self.completion_logprobs(
                    [event.token_id],
                    [event.logprob],
                    [event.top_logprobs or []],
                    req.logprobs,
                    offsets[event.index],
                    as_ids=req.return_tokens_as_token_ids,
                )
                offsets[event.index] += len(self.pieces.text(event.token_id))
            choice = CompletionChoice(
                index=event.index,
                text=delta,
                logprobs=logprobs,
                finish_reason=event.finish_reason,
                token_ids=[event.token_id] if event.token_id is not None else [],
                prompt_token_ids=request.prompt_ids if stream.first else None,
            )
            stream.first = False
            body = CompletionChunk(id=cid, created=created, model=self.name, choices=[choice], weight_version=version)
            yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
        if req.stream_options and req.stream_options.include_usage:
            completion = sum(len(s.output_ids) for s in request.sequences)
            usage = UsageInfo(
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=completion,
                total_tokens=len(request.prompt_ids) + completion,
            )
            body = CompletionChunk(
                id=cid,
                created=created,
                model=self.name,
                choices=[],
                usage=usage,
                weight_version=version if version is not None else self.engine.weight_version,
            )
            yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
        yield "data: [DONE]\n\n"


def _flatten_content(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI content parts (``[{"type": "text", "text": ...}]``) -> one string, as templates expect."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") in ("text", None)]
        message = {**message, "content": "".join(texts)}
    if message.get("role") == "developer":
        message = {**message, "role": "system"}
    return message
