"""The request bodies each backend takes for a token-level generation, and how its answers read.

* ``embedded`` and ``vllm``: ``POST /v1/completions`` with the prompt as token ids, ``logprobs``
  (0, or ``top_logprobs`` alternatives named ``token_id:<id>`` with ``return_tokens_as_token_ids``)
  and ``return_token_ids``; penalties, ``logit_bias``, ``min_tokens`` and ``structured_outputs``
  (``agentgym.client.structured``) under vLLM's names;
* ``sglang``: ``POST /generate`` with ``input_ids``, ``return_logprob`` (and ``top_logprobs_num``)
  and ``sampling_params`` in SGLang's names (``max_new_tokens``, ``min_new_tokens``,
  ``sampling_seed``, ``json_schema``, ``structural_tag``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym.client.structured import backend_fields
from agentgym.types import SamplingParams, TokenSample


class DialectError(ValueError):
    """A server's answer that does not hold what a token-level generation needs."""


def _shaping(s: SamplingParams) -> dict[str, Any]:
    """Penalties, ``logit_bias`` and ``min_tokens``: only those that differ from the defaults."""
    out: dict[str, Any] = {}
    if s.frequency_penalty:
        out["frequency_penalty"] = s.frequency_penalty
    if s.presence_penalty:
        out["presence_penalty"] = s.presence_penalty
    if s.repetition_penalty != 1.0:
        out["repetition_penalty"] = s.repetition_penalty
    if s.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
    return out


def completions_payload(prompt_ids: Sequence[int], s: SamplingParams, backend: str) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompt": list(prompt_ids),
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "logprobs": s.top_logprobs,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if s.top_logprobs:
        payload["return_tokens_as_token_ids"] = True
    if s.top_k > 0:
        payload["top_k"] = s.top_k
    if s.stop:
        payload["stop"] = s.stop
    if s.stop_token_ids:
        payload["stop_token_ids"] = s.stop_token_ids
    if s.seed is not None:
        payload["seed"] = s.seed
    if s.min_tokens:
        payload["min_tokens"] = s.min_tokens
    if s.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(_shaping(s))
    payload.update(backend_fields(s.structured, backend))
    return payload


def _token_id(name: str) -> int:
    """``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``) -> the id."""
    if not name.startswith("token_id:"):
        raise DialectError(
            f"a top_logprobs entry names {name!r}, not 'token_id:<id>' (the server ignored return_tokens_as_token_ids)"
        )
    return int(name[9:])


def completion_choice(
    choice: dict[str, Any], where: str, k: int = 0
) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
    """``(token ids, logprobs, top logprobs)`` of one ``/v1/completions`` choice (or streamed chunk);
    the ``k`` best alternatives per token (vLLM adds the sampled token to them when it is not one)."""
    ids = choice.get("token_ids")
    if ids is None:
        raise DialectError(
            f"{where} returned no token ids; a vLLM server must support return_token_ids (vLLM >= 0.10.2)"
        )
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs") or []
    if len(values) != len(ids):
        raise DialectError(f"{where} returned {len(values)} logprobs for {len(ids)} tokens")
    tops = (
        [
            sorted(((_token_id(name), float(v)) for name, v in (alts or {}).items()), key=lambda a: -a[1])[:k]
            for alts in (logprobs.get("top_logprobs") or [])
        ]
        if k
        else []
    )
    return list(ids), [float(x) for x in values], tops


def sglang_payload(prompt_ids: Sequence[int], s: SamplingParams) -> dict[str, Any]:
    params: dict[str, Any] = {
        "max_new_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,  # SGLang refuses 0; -1 is its "no top-k"
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if s.stop:
        params["stop"] = s.stop
    if s.stop_token_ids:
        params["stop_token_ids"] = s.stop_token_ids
    if s.seed is not None:
        params["sampling_seed"] = s.seed
    if s.min_tokens:
        params["min_new_tokens"] = s.min_tokens
    if s.ignore_eos:
        params["ignore_eos"] = True
    params.update(_shaping(s))
    params.update(backend_fields(s.structured, "sglang"))
    payload: dict[str, Any] = {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True}
    if s.top_logprobs:
        payload["top_logprobs_num"] = s.top_logprobs
    return payload


def sglang_sample(body: dict[str, Any], where: str, default_version: int) -> TokenSample:
    meta = body.get("meta_info", {})
    pairs = meta.get("output_token_logprobs") or []
    ids = body.get("output_ids") or [int(p[1]) for p in pairs]
    if len(ids) != len(pairs):
        raise DialectError(
            f"{where} returned {len(pairs)} logprobs for {len(ids)} tokens (an SGLang "
            "that trims the stop token despite no_stop_trim?)"
        )
    finish = meta.get("finish_reason") or {}
    reason = finish.get("type", "stop") if isinstance(finish, dict) else str(finish)
    version = meta.get("weight_version")
    tops = [[(int(a[1]), float(a[0])) for a in (alts or [])] for alts in (meta.get("output_top_logprobs") or [])]
    return TokenSample(
        token_ids=list(ids),
        logprobs=[float(p[0]) for p in pairs],
        finish_reason="length" if reason == "length" else ("abort" if reason == "abort" else "stop"),
        weight_version=int(version) if str(version or "").isdigit() else default_version,
        text=body.get("text", ""),
        top_logprobs=tops,
    )
