"""A request to the engine, its sequences, and the events that carry tokens back to the asyncio side."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from agentgym.server.sampling import GenerationParams


@dataclass
class Sequence:
    """One sampled continuation. Written by the engine thread only.

    While it runs, its tokens and logprobs live in the engine's batch tensors (``row``);
    ``output_ids`` / ``logprobs`` read them from there, and become plain lists when it finishes.
    """

    request: Request
    index: int  # choice index within its request
    prompt_ids: list[int]
    params: GenerationParams
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    weight_version: int = 0
    text: str = ""  # final text, set when finished (after stop-string truncation)
    error: str | None = None  # set when the engine failed while sampling this sequence
    row: int = -1  # its slot in the running batch while it runs
    batch: Any = None  # the engine's RunningBatch while it runs
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    matcher: Any = None  # its grammar's matcher, when the request asked for structured output
    _output_ids: list[int] = field(default_factory=list)
    _logprobs: list[float] = field(default_factory=list)

    @property
    def output_ids(self) -> list[int]:
        if self.batch is not None:
            return self.batch.tokens_of(self.row)
        return self._output_ids

    @property
    def logprobs(self) -> list[float]:
        if self.batch is not None:
            return self.batch.logprobs_of(self.row)
        return self._logprobs

    def settle(self) -> None:
        """Copy the tokens out of the batch (it is leaving it)."""
        if self.batch is not None:
            self._output_ids, self._logprobs = self.batch.tokens_of(self.row), self.batch.logprobs_of(self.row)
            self.batch = None


@dataclass
class TokenEvent:
    """One step of one sequence, delivered to the request's event loop."""

    index: int
    token_id: int | None  # None: the sequence ended without a new token (aborted)
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None
    finish_reason: str | None
    text: str | None = None  # the final text, on the last event


class Request:
    """A request's sequences plus the channel back to the asyncio side."""

    _ids = itertools.count()

    def __init__(
        self, prompt_ids: list[int], params: GenerationParams, n: int, stream: bool, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.id = next(self._ids)
        self.prompt_ids = prompt_ids
        self.params = params
        self.n = n
        self.stream = stream
        self.loop = loop
        self.events: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
        self.done: asyncio.Future[list[Sequence]] = loop.create_future()
        self.sequences: list[Sequence] = []
        self.remaining = n

    # called from the engine thread
    def _emit(self, event: TokenEvent) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def _finish_one(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            seqs = self.sequences
            self.loop.call_soon_threadsafe(_resolve, self.done, seqs)
            if self.stream:
                self.loop.call_soon_threadsafe(self.events.put_nowait, None)


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def finish_reason(seq: Sequence, tok: int, eos_ids: set[int], tokenizer: Any) -> tuple[str, str | int | None]:
    """Why a sequence the batch stopped after ``tok`` ends, as ``(finish_reason, stop_reason)``: a stop
    token, eos, a stop string (in that order, once ``min_tokens`` are out), else its length."""
    p = seq.params
    if len(seq.output_ids) >= p.min_tokens:
        if tok in p.stop_token_ids:
            return "stop", tok
        if not p.ignore_eos and tok in eos_ids:
            return "stop", None
        if p.stop:
            hit = stop_string_hit(seq, tokenizer)
            if hit is not None:
                return "stop", hit
    return "length", None


def stop_string_hit(seq: Sequence, tokenizer: Any) -> str | None:
    """The first of the request's stop strings in the text so far (none before ``min_tokens``)."""
    if len(seq.output_ids) < seq.params.min_tokens:
        return None
    text = tokenizer.decode(seq.output_ids, skip_special_tokens=seq.params.skip_special_tokens)
    return next((s for s in seq.params.stop if s in text), None)


def final_text(seq: Sequence, tokenizer: Any) -> str:
    """The response text: decoded, cut before a stop string (or after it, if asked)."""
    p = seq.params
    text = tokenizer.decode(seq.output_ids, skip_special_tokens=p.skip_special_tokens)
    if isinstance(seq.stop_reason, str):
        cut = text.find(seq.stop_reason)
        if cut >= 0:
            text = text[: cut + (len(seq.stop_reason) if p.include_stop_str_in_output else 0)]
    return text


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokenizer's eos plus every eos id in the model's generation config."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    return sorted(ids)
