"""An OpenAI request's sampling fields as the engine's ``GenerationParams``, checked against the model.

Everything here answers a 400 in OpenAI's shape naming the field: a prompt or ``max_tokens`` past
the context, ``n`` sequences of prompt + ``max_tokens`` past what the engine's KV cache budget holds,
``min_tokens`` over ``max_tokens``, token ids (``stop_token_ids``, ``logit_bias``) outside the
vocabulary, a constraint whose grammar does not compile (the compiled grammar is kept for the
request's sequences: ``grammar.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentgym.server.errors import APIError
from agentgym.server.grammar import GrammarError
from agentgym.server.openai_types import ChatCompletionRequest, CompletionRequest
from agentgym.server.sampling import GenerationParams


def generation_params(
    engine: Any,
    req: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    top_logprobs: int,
    param: str,
    grammar: str | None = None,
) -> GenerationParams:
    limit = engine.max_model_len
    if prompt_len > limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens",
            param=param,
            code="context_length_exceeded",
        )
    max_tokens = req.requested_max_tokens
    if max_tokens is None:
        max_tokens = limit - prompt_len
    elif prompt_len + max_tokens > limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens; the prompt has "
            f"{prompt_len} and max_tokens asks for {max_tokens} more",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if max_tokens < 1:
        raise APIError(
            400,
            f"the prompt ({prompt_len} tokens) leaves no room to generate",
            param=param,
            code="context_length_exceeded",
        )
    too_big = engine.kv_too_big(req.n, prompt_len + max_tokens)
    if too_big:
        raise APIError(400, too_big, param="max_tokens", code="kv_cache_budget_exceeded")
    if req.min_tokens > max_tokens:
        raise APIError(400, "min_tokens must not exceed max_tokens", param="min_tokens")
    vocab = engine.vocab_size
    for t in req.stop_token_ids or []:
        if not 0 <= t < vocab:
            raise APIError(
                400, f"stop_token_ids: {t} is not a token id (vocabulary size {vocab})", param="stop_token_ids"
            )
    bias = req.token_bias()
    bad = next((t for t in bias if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"logit_bias: {bad} is not a token id (vocabulary size {vocab})", param="logit_bias")
    temperature = 1.0 if req.temperature is None else req.temperature
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=0.0 if temperature < 1e-5 else temperature,  # as vLLM: below that, greedy
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=min(req.top_k, vocab) if req.top_k and req.top_k > 0 else -1,
        min_tokens=req.min_tokens,
        seed=req.seed,
        stop=list(req.stop or []),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        top_logprobs=top_logprobs,
        skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        frequency_penalty=req.frequency_penalty or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=bias,
        grammar=grammar,
    )


async def compile_constraint(engine: Any, constraint: dict[str, Any] | None) -> str | None:
    """The llguidance grammar of a request's constraint, compiled (in a worker thread), or a 400."""
    if constraint is None:
        return None

    def build() -> str:
        text = engine.grammars.text(constraint)
        engine.grammars.check(text)
        return text

    try:
        return await asyncio.to_thread(build)
    except GrammarError as exc:
        param = {"tool_calls": "tools", "json": "response_format"}.get(constraint["type"], "structured_outputs")
        raise APIError(400, f"cannot constrain the reply: {exc}", param=param) from None
