"""The embedded server's engine: one thread that batches every running sequence together.

Each iteration of the engine thread

1. runs queued commands (abort, pause, resume) and, once no sequence is running, any
   pending weight update;
2. admits waiting requests (unless paused or an update is waiting): their prompts are
   prefilled together, left-padded, with an attention mask and per-sequence position ids;
   ``n > 1`` copies of one prompt share that prefill;
3. merges the new sequences' KV cache into the running batch's cache (left-padding the
   shorter one), then decodes one token for every running sequence in a single forward;
4. drops finished sequences from the batch (and cache columns that only padding uses).

This is continuous batching with a transformers ``DynamicCache`` that is re-formed
whenever the set of sequences changes. The HTTP side runs in another thread of the same
process, so the engine releases the GIL between steps, and for the first few milliseconds
of a burst that reaches an idle engine it pauses briefly after each admission
(``burst_window_s``, ``burst_pause_s``) so the burst is batched in a few steps rather than
over many.

**Logprobs** are ``log_softmax`` of the model's raw logits (temperature 1, before top-k /
top-p), so they equal a teacher-forced forward pass of the same weights on the same
tokens: exactly what the trainer's importance ratios need. vLLM reports the same
("raw" logprobs) by default.

**Weight versions**: an update waits until every running sequence has finished (new
requests wait meanwhile), so no response mixes two weight versions; every sequence
carries the version it was sampled with.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym.server.sampling import GenerationParams, sample_tokens

log = logging.getLogger("agentgym.server")


@dataclass
class Sequence:
    """One sampled continuation. Written by the engine thread only."""

    request: Request
    index: int  # choice index within its request
    prompt_ids: list[int]
    params: GenerationParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    weight_version: int = 0
    text: str = ""  # final text, set when finished (after stop-string truncation)
    error: str | None = None  # set when the engine failed while sampling this sequence


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

    def __init__(self, prompt_ids: list[int], params: GenerationParams, n: int, stream: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
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
        self.arrival = time.monotonic()

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


class EngineError(RuntimeError):
    pass


class Engine:
    """Owns the model, the tokenizer and the engine thread.

    ``submit`` is called from an asyncio loop and returns a ``Request`` whose ``done`` future
    resolves to its finished sequences (and, when streaming, whose ``events`` queue receives
    one ``TokenEvent`` per sampled token, then ``None``).
    """

    def __init__(self, model: Any, tokenizer: Any, *, model_name: str = "tiny", max_batch_size: int = 32,
                 max_model_len: int | None = None, max_prefill_tokens: int = 16384,
                 eos_token_ids: list[int] | None = None, weight_version: int = 0,
                 burst_window_s: float = 0.005, burst_pause_s: float = 0.0005) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_model_len = int(max_model_len or getattr(model.config, "max_position_embeddings", 4096))
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = set(eos_token_ids if eos_token_ids is not None else _eos_ids(model, tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.weight_version = weight_version
        self.paused = False
        self.burst_window_s = burst_window_s
        self.burst_pause_s = burst_pause_s
        self._burst_until = 0.0
        self._incoming: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._updates: deque[tuple[Callable[[], Any], Future]] = deque()
        self._drain_waiters: list[Future] = []
        self._waiting: deque[Request] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._default_generator = torch.Generator(device=self.device)
        self._default_generator.seed()
        # the running batch
        self._seqs: list[Sequence] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # (B, C) 1 where a cached column is a real token
        self._next: torch.Tensor | None = None  # (B,) sampled tokens not yet in the cache
        self._pos: torch.Tensor | None = None  # (B,) their positions
        self._thread = threading.Thread(target=self._run, name="agentgym-engine", daemon=True)
        self.stats: dict[str, float] = {"requests": 0, "steps": 0, "prefills": 0, "generated_tokens": 0,
                                        "max_batch": 0, "forward_s": 0.0, "busy_s": 0.0}
        for p in model.parameters():
            p.requires_grad_(False)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- the asyncio side ----------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: GenerationParams, n: int = 1, stream: bool = False) -> Request:
        if not self.alive:
            raise EngineError("the engine thread is not running")
        request = Request(list(prompt_ids), params, n, stream, asyncio.get_running_loop())
        self.stats["requests"] += 1
        self._incoming.put(request)
        self._wake.set()
        return request

    def abort(self, request: Request) -> None:
        self._command(lambda: self._abort(request))

    def pause(self, mode: str = "wait") -> Future:
        """Stop admitting requests; ``wait``: resolve once running sequences finish; ``abort``: end them now."""
        fut: Future = Future()

        def pause() -> None:
            self.paused = True
            if mode == "abort":
                for seq in list(self._seqs):
                    self._finish(seq, "abort")
                self._compact()
            self._drain_waiters.append(fut)

        self._command(pause)
        return fut

    def resume(self) -> None:
        def resume() -> None:
            self.paused = False

        self._command(resume)

    def run_when_idle(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` in the engine thread once no sequence is running (new ones wait meanwhile)."""
        fut: Future = Future()
        self._updates.append((fn, fut))
        self._wake.set()
        return fut

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> Future:
        """Copy ``state_dict`` into the model between responses; the future gives the new version."""
        from agentgym.model.weights import apply_state_dict

        def apply() -> int:
            apply_state_dict(self.model, state_dict)
            self.weight_version = self.weight_version + 1 if version is None else int(version)
            return self.weight_version

        return self.run_when_idle(apply)

    def _command(self, fn: Callable[[], None]) -> None:
        self._commands.put(fn)
        self._wake.set()

    # ---- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        with torch.no_grad():
            while not self._stop.is_set():
                try:
                    busy = self._iteration()
                except Exception as exc:  # never leave a caller waiting forever
                    log.exception("engine iteration failed")
                    for seq in list(self._seqs):
                        self._finish(seq, "abort", error=exc)
                    self._reset_batch()
                    busy = False
                if busy:
                    time.sleep(0)  # let the HTTP thread take the GIL between steps (else requests queue up)
                else:
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
            for seq in list(self._seqs):
                self._finish(seq, "abort")
            while self._waiting or not self._incoming.empty():
                self._drain_incoming()
                while self._waiting:
                    req = self._waiting.popleft()
                    self._fail_request(req, "abort")

    def _iteration(self) -> bool:
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                break
        self._drain_incoming()
        if self._updates and not self._seqs:
            while self._updates:
                fn, fut = self._updates.popleft()
                try:
                    fut.set_result(fn())
                except Exception as exc:
                    fut.set_exception(exc)
        if not self._seqs and self._drain_waiters:
            for fut in self._drain_waiters:
                if not fut.done():
                    fut.set_result(True)
            self._drain_waiters.clear()
        if not self.paused and not self._updates and self._waiting:
            was_idle = not self._seqs
            if self._admit():
                now = time.monotonic()
                if was_idle:
                    self._burst_until = now + self.burst_window_s
                if now < self._burst_until:
                    # a burst is arriving at an idle engine: hand the HTTP thread the GIL for a moment
                    # so the rest of it joins within a few steps instead of trickling in over many
                    # partial-batch decode steps (never while the engine is busy in steady state)
                    time.sleep(self.burst_pause_s)
        if not self._seqs:
            return False
        start = time.perf_counter()
        self._decode()
        self.stats["busy_s"] += time.perf_counter() - start
        return True

    def _drain_incoming(self) -> None:
        while True:
            try:
                self._waiting.append(self._incoming.get_nowait())
            except queue.Empty:
                return

    def _fail_request(self, req: Request, reason: str, error: Exception | None = None) -> None:
        """End every unfinished sequence of ``req`` (creating them if it never started)."""
        while len(req.sequences) < req.n:
            req.sequences.append(Sequence(req, len(req.sequences), req.prompt_ids, req.params,
                                          weight_version=self.weight_version))
        for seq in req.sequences:
            self._finish(seq, reason, error)

    def _abort(self, request: Request) -> None:
        if request in self._waiting:
            self._waiting.remove(request)
            self._fail_request(request, "abort")
            return
        for seq in list(self._seqs):
            if seq.request is request:
                self._finish(seq, "abort")
        self._compact()

    # ---- admission and prefill -----------------------------------------------------------
    def _admit(self) -> int:
        """Prefill as many waiting requests as fit; returns how many."""
        free = self.max_batch_size - len(self._seqs)
        batch: list[Request] = []
        longest = 0
        while self._waiting and free > 0:
            req = self._waiting[0]
            if req.n > free and (self._seqs or batch):
                break  # wait for room rather than split a request's choices
            longest2 = max(longest, len(req.prompt_ids))
            if batch and longest2 * (len(batch) + 1) > self.max_prefill_tokens:
                break
            self._waiting.popleft()
            batch.append(req)
            longest = longest2
            free -= req.n
        if batch:
            try:
                self._prefill(batch)
            except Exception as exc:  # the running batch is untouched; fail only the newcomers
                log.exception("prefill failed")
                for req in batch:
                    self._fail_request(req, "abort", exc)
        return len(batch)

    def _prefill(self, batch: list[Request]) -> None:
        from transformers import DynamicCache

        b = len(batch)
        length = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((b, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, length), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, length - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, length - len(r.prompt_ids):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]
        # expand n > 1 choices of one prompt over the shared prefill
        rows: list[int] = []
        seqs: list[Sequence] = []
        for i, r in enumerate(batch):
            for j in range(r.n):
                gen = None
                if r.params.seed is not None:
                    gen = torch.Generator(device=self.device)
                    gen.manual_seed(r.params.seed + j)
                seq = Sequence(r, j, r.prompt_ids, r.params, generator=gen, weight_version=self.weight_version)
                r.sequences.append(seq)
                seqs.append(seq)
                rows.append(i)
        if rows != list(range(b)):
            index = torch.tensor(rows, device=self.device)
            cache.batch_select_indices(index)
            logits, mask = logits[index], mask[index]
        self.stats["prefills"] += 1
        tokens = self._sample_and_record(logits, seqs)
        new_pos = torch.tensor([len(s.prompt_ids) for s in seqs], dtype=torch.long, device=self.device)
        self._merge(seqs, cache, mask, tokens, new_pos)
        self._compact()

    def _merge(self, seqs: list[Sequence], cache: Any, mask: torch.Tensor, tokens: torch.Tensor,
               pos: torch.Tensor) -> None:
        if not self._seqs:
            self._seqs, self._cache, self._mask, self._next, self._pos = seqs, cache, mask, tokens, pos
            return
        width = max(self._mask.shape[1], mask.shape[1])
        for old_layer, new_layer in zip(self._cache.layers, cache.layers):
            old_layer.keys = torch.cat([_pad_left(old_layer.keys, width, 2), _pad_left(new_layer.keys, width, 2)])
            old_layer.values = torch.cat([_pad_left(old_layer.values, width, 2),
                                          _pad_left(new_layer.values, width, 2)])
        self._mask = torch.cat([_pad_left(self._mask, width, 1), _pad_left(mask, width, 1)])
        self._next = torch.cat([self._next, tokens])
        self._pos = torch.cat([self._pos, pos])
        self._seqs = self._seqs + seqs

    # ---- decoding ------------------------------------------------------------------------
    def _decode(self) -> None:
        assert self._mask is not None and self._next is not None and self._pos is not None
        b = len(self._seqs)
        self.stats["max_batch"] = max(self.stats["max_batch"], b)
        mask = torch.cat([self._mask, torch.ones((b, 1), dtype=self._mask.dtype, device=self.device)], dim=1)
        start = time.perf_counter()
        out = self.model(input_ids=self._next[:, None], attention_mask=mask, position_ids=self._pos[:, None],
                         past_key_values=self._cache, use_cache=True)
        self.stats["forward_s"] += time.perf_counter() - start
        self._mask = mask
        self.stats["steps"] += 1
        self._next = self._sample_and_record(out.logits[:, -1, :], self._seqs)
        self._pos = self._pos + 1
        self._compact()

    def _sample_and_record(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        logits = logits.float()
        tokens = self.choose_tokens(logits, seqs)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
        k = max(s.params.top_logprobs for s in seqs)
        top: list[list[tuple[int, float]]] | None = None
        if k > 0:
            values, indices = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
            top = [list(zip(i_row, v_row)) for i_row, v_row in zip(indices.tolist(), values.tolist())]
        token_list = tokens.tolist()
        self.stats["generated_tokens"] += len(token_list)
        for row, seq in enumerate(seqs):
            tok = token_list[row]
            seq.output_ids.append(tok)
            seq.logprobs.append(chosen[row])
            alts = None
            if seq.params.top_logprobs > 0 and top is not None:
                alts = top[row][: seq.params.top_logprobs]
                seq.top_logprobs.append(alts)
            reason = self._check_stop(seq, tok)
            if reason is not None:
                seq.finish_reason = reason
                seq.text = self.final_text(seq)
            if seq.request.stream:
                seq.request._emit(TokenEvent(seq.index, tok, chosen[row], alts, reason,
                                             seq.text if reason is not None else None))
            if reason is not None:
                seq.request._finish_one()
        return tokens

    def choose_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The next token of every row (tests override this to script an output)."""
        return sample_tokens(logits, [s.params for s in seqs], [s.generator for s in seqs], self._default_generator)

    def _check_stop(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        count = len(seq.output_ids)
        if count >= p.min_tokens:
            if tok in p.stop_token_ids:
                seq.stop_reason = tok
                return "stop"
            if not p.ignore_eos and tok in self.eos_token_ids:
                return "stop"
            if p.stop:
                text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=p.skip_special_tokens)
                for s in p.stop:
                    if s in text:
                        seq.stop_reason = s
                        return "stop"
        if count >= p.max_tokens or len(seq.prompt_ids) + count >= self.max_model_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, error: Exception | None = None) -> None:
        if seq.finish_reason is not None:
            return
        seq.finish_reason = reason
        seq.text = self.final_text(seq)
        if error is not None:
            seq.error = f"{type(error).__name__}: {error}"
        if seq.request.stream:
            seq.request._emit(TokenEvent(seq.index, None, None, None, reason, seq.text))
        seq.request._finish_one()

    def final_text(self, seq: Sequence) -> str:
        p = seq.params
        text = self.tokenizer.decode(seq.output_ids, skip_special_tokens=p.skip_special_tokens)
        if isinstance(seq.stop_reason, str):
            cut = text.find(seq.stop_reason)
            if cut >= 0:
                text = text[: cut + (len(seq.stop_reason) if p.include_stop_str_in_output else 0)]
        return text

    def _compact(self) -> None:
        """Drop finished sequences from the batch, and cache columns only padding uses."""
        if not self._seqs:
            return
        keep = [i for i, s in enumerate(self._seqs) if s.finish_reason is None]
        if len(keep) == len(self._seqs):
            return
        if not keep:
            self._reset_batch()
            return
        index = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(index)
        self._mask, self._next, self._pos = self._mask[index], self._next[index], self._pos[index]
        self._seqs = [self._seqs[i] for i in keep]
        used = self._mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            for layer in self._cache.layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
            self._mask = self._mask[:, first:]

    def _reset_batch(self) -> None:
        self._seqs, self._cache, self._mask, self._next, self._pos = [], None, None, None, None


def _pad_left(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
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
