"""The gateway's OpenAI model calls: a session's chat or text completion, sampled and recorded.

``Gateway`` (``gateway.py``) has these methods from ``ModelCalls``; it supplies the sessions
(``store``), ``generate`` and the counters.

What a request asks for goes to the policy servers as it is: penalties, ``logit_bias``,
``min_tokens``, ``top_logprobs`` and the structured output (forced tool calls, ``response_format``,
``structured_outputs``: ``agentgym.client.structured``) travel in ``SamplingParams``, and
``PolicyClient`` says them in each backend's words. Each recorded turn names what shaped its
sampling (``Turn.shaped_by``).

A turn is recorded only once its reply has reached the agent: a non-streamed answer is
recorded after it is sent (``Delivery``: ``GatewayApp`` sends it, then calls ``record``, or
``release`` if the agent went away first, in which case its generation was cancelled too);
a streamed one after its last event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import Response, StreamingResponse
from jinja2 import TemplateError

from agentgym.gateway.sessions import Plan, Session, normalize_message
from agentgym.gateway.streaming import chat_chunks, completion_chunks, live_chat, live_completion
from agentgym.server.errors import APIError
from agentgym.server.openai_types import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    TopLogprob,
    UsageInfo,
)
from agentgym.server.token_pieces import top_by_name
from agentgym.server.tool_calls import assistant_reply, forced_tool_names
from agentgym.types import SamplingParams, TokenSample


class Delivery(Response):
    """A model call's JSON answer whose turns are recorded once it has been sent (``record``), or
    given back if the agent went away first (``release``)."""

    def __init__(
        self, content: bytes | str, media_type: str, record: Callable[[], None], release: Callable[[], None]
    ) -> None:
        super().__init__(content, media_type=media_type)
        self.record, self.release = record, release

    async def deliver(self, scope: Any, receive: Any, send: Any, gone: asyncio.Future[None]) -> None:
        """Send the answer unless the agent is ``gone``, then record (or release) its turns. ``gone``
        resolves when the client disconnects; once this answer is complete it would resolve too,
        but not before the code after the last ``send`` has run: nothing here awaits after it."""
        if gone.done():
            self.release()
            return
        await self(scope, receive, send)
        (self.release if gone.done() else self.record)()


class ModelCalls:
    """``Gateway``'s chat and text completions (see the module docstring)."""

    # ---- what to sample --------------------------------------------------------------------
    def sampling(
        self, session: Session, req: ChatCompletionRequest | CompletionRequest, prompt_len: int, param: str
    ) -> SamplingParams:
        """The request's sampling fields, overridden by the session's pinned ones, fitted to the context."""
        top = (req.top_logprobs or 0) if isinstance(req, ChatCompletionRequest) and req.logprobs else 0
        if isinstance(req, CompletionRequest):
            top = req.logprobs or 0
        asked = {
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "seed": req.seed,
            "stop": req.stop,
            "stop_token_ids": req.stop_token_ids,
            "max_tokens": req.requested_max_tokens,
            "min_tokens": req.min_tokens,
            "ignore_eos": req.ignore_eos or None,
            "frequency_penalty": req.frequency_penalty,
            "presence_penalty": req.presence_penalty,
            "repetition_penalty": req.repetition_penalty,
            "logit_bias": req.token_bias(),
            "top_logprobs": top,
            "structured": req.constraint,
        }
        values = {k: v for k, v in asked.items() if v is not None}
        values.update(session.sampling)
        room = self.max_model_len - prompt_len
        if room < 1:
            raise APIError(
                400,
                f"this model's maximum context length is {self.max_model_len} tokens, but the prompt "
                f"has {prompt_len} tokens",
                param=param,
                code="context_length_exceeded",
            )
        vocab = len(self.tokenizer)
        bad = next((t for t in values["logit_bias"] if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"logit_bias: {bad} is not a token id (vocabulary size {vocab})", param="logit_bias")
        values["max_tokens"] = min(int(values.get("max_tokens") or self.default_max_tokens), room)
        if values["min_tokens"] > values["max_tokens"]:
            raise APIError(400, "min_tokens must not exceed max_tokens", param="min_tokens")
        values["stop"] = list(values.get("stop") or [])
        values["stop_token_ids"] = list(values.get("stop_token_ids") or [])
        return SamplingParams(**values)

    def reply_text(self, sample: TokenSample, stop: Sequence[str]) -> str:
        """The sampled text the agent sees: special tokens dropped, cut before the first stop string."""
        text = self._decode_reply(sample.token_ids)
        cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
        return text[: min(cuts)] if cuts else text

    def chat_logprobs(self, sample: TokenSample) -> ChatLogprobs:
        content = []
        for i, (tok, lp) in enumerate(zip(sample.token_ids, sample.logprobs)):
            alts = sample.top_logprobs[i] if i < len(sample.top_logprobs) else []
            content.append(
                ChatTokenLogprob(
                    token=self.pieces.text(tok),
                    logprob=lp,
                    bytes=self.pieces.bytes(tok),
                    top_logprobs=[
                        TopLogprob(token=self.pieces.text(t), logprob=v, bytes=self.pieces.bytes(t)) for t, v in alts
                    ],
                )
            )
        return ChatLogprobs(content=content)

    def completion_logprobs(self, sample: TokenSample, k: int | None, offset: int = 0) -> CompletionLogprobs:
        tokens = [self.pieces.text(t) for t in sample.token_ids]
        top = None
        if k:
            top = [
                top_by_name(sample.top_logprobs[i] if i < len(sample.top_logprobs) else [], self.pieces.text)
                for i in range(len(tokens))
            ]
            for i, token in enumerate(tokens):
                top[i].setdefault(token, sample.logprobs[i])
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=list(sample.logprobs),
            top_logprobs=top,
            text_offset=self.pieces.offsets(tokens, offset),
        )

    async def sample_all(self, session: Session, plans: list[Plan], sampling: SamplingParams) -> list[TokenSample]:
        """Every plan's sample, or none: on any failure (or cancellation: the agent went away) every
        plan is released. A session finished while its samples were generated records nothing
        more: the agent gets a 409."""
        try:
            if len(plans) == 1:  # the usual case: no task to gather
                samples = [await self.generate(session, plans[0].context_ids, sampling)]
            else:
                samples = list(await asyncio.gather(*(self.generate(session, p.context_ids, sampling) for p in plans)))
        except BaseException:
            for p in plans:
                self.store.release(p)
            self.counts["errors"] += 1
            raise
        if session.finished:
            self.late(plans)
            raise APIError(
                409,
                f"session {session.id} was finished while this call was generating; its result is not recorded",
                "conflict_error",
                code="session_finished",
            )
        return samples

    def late(self, plans: list[Plan]) -> None:
        self.counts["late_completions"] += 1
        for p in plans:
            self.store.release(p)

    # ---- chat -----------------------------------------------------------------------------
    @staticmethod
    def chat_prompt(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and tools a chat request is rendered from (a request the gateway cannot
        record is a 400)."""
        if req.continue_final_message or not req.add_generation_prompt:
            raise APIError(
                400,
                "the gateway always starts a new assistant turn; continue_final_message and "
                "add_generation_prompt=false are not supported",
                param="continue_final_message",
            )
        if req.chat_template_kwargs:
            raise APIError(
                400,
                "chat_template_kwargs are not supported by the gateway: every turn must render with the same template",
                param="chat_template_kwargs",
            )
        messages = [normalize_message(m) for m in req.messages]
        return messages, req.tools if req.tools and req.tool_choice != "none" else None

    def chat_prompt_ids(self, session: Session, req: ChatCompletionRequest) -> list[int]:
        """The prompt ``chat_completion`` would sample ``req`` from in ``session`` (on the branch it
        would continue), rendered but not reserved or recorded: ``messages/count_tokens``."""
        messages, tools = self.chat_prompt(req)
        try:
            return self.store.chat_context(session, messages, tools)
        except (ValueError, TypeError, KeyError, TemplateError) as exc:
            raise render_error(exc) from exc

    async def chat_completion(self, session: Session, req: ChatCompletionRequest) -> Any:
        messages, tools = self.chat_prompt(req)
        started, wall = asyncio.get_running_loop().time(), time.time()
        try:
            plan = self.store.plan_chat(session, messages, tools)
        except (ValueError, TypeError, KeyError, TemplateError) as exc:
            raise render_error(exc) from exc
        request = {"messages": messages, "tools": tools}
        if req.stream and req.n == 1:
            return await live_chat(
                self,
                session,
                plan,
                req,
                self.plan_sampling(session, plan, req, "messages"),
                tools,
                request,
                started,
                wall,
            )
        plans, samples, sampling = await self.sample_plan(session, plan, req, "messages")
        choices, replies = [], []
        for i, sample in enumerate(samples):
            content, calls, finish = assistant_reply(
                self.reply_text(sample, sampling.stop),
                sample.finish_reason,
                bool(tools),
                forced_tool_names(sampling.structured),
            )
            reply: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                reply["tool_calls"] = calls
            replies.append(reply)
            message, finish = ChatMessage.reply(content, calls, finish, req.legacy_functions)
            choices.append(
                ChatChoice(
                    index=i,
                    message=message,
                    logprobs=self.chat_logprobs(sample) if req.logprobs else None,
                    finish_reason=finish,
                    token_ids=list(sample.token_ids) if req.return_token_ids else None,
                )
            )

        def record() -> None:
            for p, sample, reply in zip(plans, samples, replies):
                self.store.commit(session, p, sample, normalize_message(reply), shaped_by=sampling.shaped_by())
            self.record_call(session, "chat/completions", plan, request, sampling, samples, replies, started, wall)

        return self.respond(ChatCompletionResponse, chat_chunks, req, plan, plans, samples, choices, session, record)

    # ---- text completions -----------------------------------------------------------------
    async def completion(self, session: Session, req: CompletionRequest) -> Any:
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(
                    400, "the gateway takes one prompt per request (a string or a list of token ids)", param="prompt"
                )
            prompt = prompt[0]
        if isinstance(prompt, list):
            bad = next((t for t in prompt if not 0 <= t < len(self.tokenizer)), None)
            if bad is not None:
                raise APIError(
                    400, f"prompt token id {bad} is outside the vocabulary (size {len(self.tokenizer)})", param="prompt"
                )
        started, wall = asyncio.get_running_loop().time(), time.time()
        plan = self.store.plan_text(session, prompt)
        request = {"prompt": prompt}
        if req.stream and req.n == 1:
            return await live_completion(
                self, session, plan, req, self.plan_sampling(session, plan, req, "prompt"), request, started, wall
            )
        plans, samples, sampling = await self.sample_plan(session, plan, req, "prompt")
        choices, texts = [], []
        for i, sample in enumerate(samples):
            text = self.reply_text(sample, sampling.stop)
            texts.append(text)
            logprobs = self.completion_logprobs(sample, req.logprobs) if req.logprobs is not None else None
            choices.append(
                CompletionChoice(
                    index=i,
                    text=text,
                    logprobs=logprobs,
                    finish_reason=sample.finish_reason,
                    token_ids=list(sample.token_ids) if req.return_token_ids else None,
                )
            )

        def record() -> None:
            for p, sample, text in zip(plans, samples, texts):
                self.store.commit(session, p, sample, text=text, shaped_by=sampling.shaped_by())
            self.record_call(session, "completions", plan, request, sampling, samples, texts, started, wall)

        return self.respond(CompletionResponse, completion_chunks, req, plan, plans, samples, choices, session, record)

    # ---- shared by both -------------------------------------------------------------------
    async def sample_plan(
        self, session: Session, plan: Plan, req: ChatCompletionRequest | CompletionRequest, param: str
    ) -> tuple[list[Plan], list[TokenSample], SamplingParams]:
        """``req.n`` samples from ``plan`` (the first) and its siblings; ``plan`` is released if the
        request cannot be sampled."""
        sampling = self.plan_sampling(session, plan, req, param)
        plans = [plan] + self.store.siblings(session, plan, req.n - 1)
        return plans, await self.sample_all(session, plans, sampling), sampling

    def plan_sampling(
        self, session: Session, plan: Plan, req: ChatCompletionRequest | CompletionRequest, param: str
    ) -> SamplingParams:
        """``sampling`` for ``plan``'s context; the plan is released if the request cannot be sampled."""
        try:
            return self.sampling(session, req, len(plan.context_ids), param)
        except APIError:
            self.store.release(plan)
            raise

    def respond(
        self,
        response_type: type,
        chunks: Any,
        req: ChatCompletionRequest | CompletionRequest,
        plan: Plan,
        plans: list[Plan],
        samples: list[TokenSample],
        choices: list[Any],
        session: Session,
        record: Callable[[], None],
    ) -> Delivery:
        """The OpenAI response (JSON, or SSE ``chunks`` of it when ``req.stream``), recording the
        turns (``record``) once it has been sent."""
        completion = sum(len(s.token_ids) for s in samples)
        response = response_type(
            model=req.model or self.model_name,
            choices=choices,
            prompt_token_ids=plan.context_ids if req.return_token_ids else None,
            usage=UsageInfo(
                prompt_tokens=len(plan.context_ids),
                completion_tokens=completion,
                total_tokens=len(plan.context_ids) + completion,
            ),
            weight_version=min(s.weight_version for s in samples),
        )

        def delivered() -> None:
            if session.finished:
                self.late(plans)
                return
            record()
            self.counts["completions"] += len(samples)

        def lost() -> None:
            for p in plans:
                self.store.release(p)
            self.counts["undelivered"] += 1

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return _StreamDelivery(chunks(response, include_usage), delivered, lost)
        return Delivery(response.model_dump_json(exclude_none=True), "application/json", delivered, lost)


class _StreamDelivery(Delivery):
    """``n > 1`` streamed: the chunks of an answer generated whole, recorded once the last one was
    sent (a client that leaves mid-stream stops the stream: nothing is recorded)."""

    def __init__(self, chunks: list[str], record: Callable[[], None], release: Callable[[], None]) -> None:
        super().__init__(b"", "text/event-stream", record, release)
        self.chunks = chunks

    async def deliver(self, scope: Any, receive: Any, send: Any, gone: asyncio.Future[None]) -> None:
        recorded = False

        async def body() -> AsyncIterator[str]:
            nonlocal recorded
            for chunk in self.chunks:
                yield chunk
            recorded = True
            self.record()

        try:
            await StreamingResponse(
                body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
            )(scope, receive, send)
        finally:
            if not recorded:
                self.release()


def render_error(exc: Exception) -> APIError:
    """A chat request the template could not render: the agent's 400."""
    return APIError(400, f"could not render the messages with the chat template: {exc}", param="messages")
