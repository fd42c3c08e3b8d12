"""The embedded server's engine: one thread that batches every running sequence together.

Each iteration of the engine thread

1. runs queued commands (abort, pause, resume) and, once no sequence is running, any
   pending weight update;
2. admits waiting requests (unless paused or an update is waiting): each prompt looks up
   the longest prefix whose keys and values are already cached (``prefix_cache.py``: the
   previous turn of the same episode, or a sibling sample of the same group) and only the
   rest is prefilled; identical prompts (``n > 1``, or a group's samples sent as separate
   requests) are prefilled once and their cache copied;
3. decodes one token for every running sequence in a single forward and samples them in
   one batched call (``running_batch.py``); no Python runs per sequence unless it finishes
   or asked for something per token (streaming, stop strings, top logprobs);
4. finishes sequences that stopped: each leaves its cache behind as a prefix-cache entry and
   the last running sequence moves into its slot, so running sequences stay in slots
   ``0 .. B-1``.

The KV cache is one block of memory within a budget (``kv_cache.py``, ``kv_cache_memory_bytes``,
vLLM's name; default a share of the memory available at start): slots of one width (grown by
doubling up to ``max_model_len`` + 1), at most ``max_batch_size`` for running sequences plus
``prefix_cache_slots`` for finished ones, as many as the budget holds at that width. A request is
admitted only when the running sequences, each as long as its prompt plus ``max_tokens`` could make
it, fit the budget beside it (else it waits; one that could not fit alone fails at once), so a
sequence never runs out of room mid-decode; prefix-cache entries give way first (moved to lower
slots, shortened, or dropped), and the width shrinks back when more rows need the room. On a GPU,
decode steps replay CUDA graphs captured per batch-size and length bucket (``decode_graphs.py``); on
a CPU they run eagerly.

The HTTP side runs in another thread of the same process, so the engine releases the GIL
between steps, and for the first few milliseconds of a burst that reaches an idle engine
it pauses briefly after each admission (``burst_window_s``, ``burst_pause_s``) so the burst
is batched in a few steps rather than over many.

**Logprobs** are ``log_softmax`` of the model's raw logits (temperature 1, before top-k /
top-p, penalties, ``logit_bias`` and grammar masks: ``logits_processors.py``), so they equal a
teacher-forced forward pass of the same weights on the same tokens: exactly what the trainer's
importance ratios need. vLLM reports the same ("raw" logprobs) by default.

**Weight versions**: an update waits until every running sequence has finished (new
requests wait meanwhile), so no response mixes two weight versions; every sequence
carries the version it was sampled with. An update empties the prefix cache.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from agentgym.server.grammar import Grammars
from agentgym.server.kv_cache import AttentionMasks, SlotKVCache, default_kv_cache_bytes
from agentgym.server.lean_forward import LeanForward
from agentgym.server.lean_forward import supports as lean_supports
from agentgym.server.lora_adapters import EngineAdapters
from agentgym.server.lora_adapters import split as split_adapters
from agentgym.server.prefix_cache import PrefixIndex
from agentgym.server.running_batch import RunningBatch, traits
from agentgym.server.sampling import GenerationParams
from agentgym.server.sequences import (
    Request,
    Sequence,
    TokenEvent,
    eos_ids,
    final_text,
    finish_reason,
    stop_string_hit,
)

__all__ = ["Engine", "EngineError", "Request", "Sequence", "TokenEvent"]

log = logging.getLogger("agentgym.server")


class EngineError(RuntimeError):
    pass


class Engine:
    """Owns the model, the tokenizer, the KV cache and the engine thread.

    ``submit`` is called from an asyncio loop and returns a ``Request`` whose ``done`` future
    resolves to its finished sequences (and, when streaming, whose ``events`` queue receives
    one ``TokenEvent`` per sampled token, then ``None``).

    ``prefix_cache_slots``: finished sequences kept for prefix reuse (default
    ``max_batch_size``; 0 turns the prefix cache off). ``cuda_graphs``: replay decode steps
    from CUDA graphs (default: on a CUDA device); ``static_decode`` runs the same bucketed
    decode eagerly (what the graphs capture; tests use it on a CPU). ``lean``: run
    Llama-family models through ``lean_forward.py`` instead of transformers' modules
    (default: wherever it supports the model). ``pack_weights``: the lean forward's linear layers
    run from oneDNN-packed copies of the weights (``packed_linears.py``; default: on a CPU, where
    about a third faster at 8+ rows, for one more copy of the weights in memory).
    ``kv_cache_memory_bytes``: the KV cache's budget (vLLM's ``--kv-cache-memory-bytes``; default
    ``default_kv_cache_bytes``: a quarter of the memory available at start, or what every slot at
    ``max_model_len`` takes, whichever is less).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "tiny",
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        max_prefill_tokens: int = 16384,
        eos_token_ids: list[int] | None = None,
        weight_version: int = 0,
        burst_window_s: float = 0.005,
        burst_pause_s: float = 0.0005,
        prefix_cache_slots: int | None = None,
        cuda_graphs: bool | None = None,
        static_decode: bool | None = None,
        lean: bool | None = None,
        pack_weights: bool | None = None,
        kv_cache_memory_bytes: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        first = next(model.parameters())
        self.device = first.device
        self.max_batch_size = max_batch_size
        self.max_model_len = int(max_model_len or getattr(model.config, "max_position_embeddings", 4096))
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = set(eos_token_ids if eos_token_ids is not None else eos_ids(model, tokenizer))
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
        self._default_generator = torch.Generator(device="cpu")
        self._default_generator.seed()
        self._masks = AttentionMasks(model, self.device, self.max_model_len + 1)
        cache_slots = max_batch_size if prefix_cache_slots is None else max(0, int(prefix_cache_slots))
        self.prefix_caching = cache_slots > 0
        slots = max_batch_size + cache_slots
        if kv_cache_memory_bytes is None:
            kv_cache_memory_bytes = default_kv_cache_bytes(
                model.config, slots, self.max_model_len, first.dtype, self.device
            )
        self.kv = SlotKVCache(
            model.config, slots, self.max_model_len, first.dtype, self.device, budget=kv_cache_memory_bytes
        )
        self.grammars = Grammars(tokenizer, self.vocab_size, sorted(self.eos_token_ids))
        self.batch = RunningBatch(
            max_batch_size,
            self.device,
            sorted(self.eos_token_ids),
            self.vocab_size,
            self.max_model_len,
            self._default_generator,
            grammars=self.grammars,
        )
        self.index = PrefixIndex(self.kv.slots)
        use_lean = lean_supports(model) if lean is None else lean
        self.adapters = EngineAdapters(model, merge=not use_lean)
        self.lean = (
            LeanForward(model, self.kv, self.adapters.by_module, pack=pack_weights, batch_hint=max_batch_size)
            if use_lean
            else None
        )
        self._thread = threading.Thread(target=self._run, name="agentgym-engine", daemon=True)
        self.stats: dict[str, float] = {
            "requests": 0,
            "steps": 0,
            "prefills": 0,
            "generated_tokens": 0,
            "max_batch": 0,
            "forward_s": 0.0,
            "busy_s": 0.0,
            "prompt_tokens": 0,
            "prefill_tokens": 0,
            "prefix_cache_hit_tokens": 0,
            "prefix_cache_hits": 0,
            "shared_prefill_tokens": 0,
            "kv_cache_slots": self.kv.slots,
            "kv_cache_mb": self.kv.nbytes / 2**20,
            "kv_cache_budget_mb": self.kv.budget / 2**20,
        }
        for p in model.parameters():
            p.requires_grad_(False)
        on_cuda = self.device.type == "cuda"
        use_graphs = on_cuda if cuda_graphs is None else bool(cuda_graphs) and on_cuda
        self.graphs = None
        if use_graphs or static_decode:
            from agentgym.server.decode_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(
                self._forward, self.kv, max_batch_size, self.device, self.pad_id, capture=use_graphs
            )

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

    @property
    def _seqs(self) -> list[Sequence]:
        """The running sequences, in slot order."""
        return self.batch.seqs[: self.batch.size]

    # ---- the asyncio side ----------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: GenerationParams, n: int = 1, stream: bool = False) -> Request:
        import asyncio

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
                self._finish_rows({row: ("abort", None, None) for row in range(self.batch.size)})
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
        """Copy ``state_dict`` into the model between responses; the future gives the new version.
        LoRA adapters in it (``<module>.lora_A.weight`` / ``.lora_B.weight``) replace the ones applied
        (``lora_adapters.py``)."""
        from agentgym.model.weights import apply_state_dict

        plain, adapters = split_adapters(state_dict)

        def load() -> None:
            if plain:
                apply_state_dict(self.model, plain)
            if adapters:
                self.adapters.load(adapters)

        return self.run_when_idle(lambda: self._new_version(load, version))

    def share_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> Future:
        """Make the model's weights *be* ``state_dict``'s tensors, between responses; the future gives
        the new version, or False (nothing changed) unless every tensor matches the model's in shape,
        dtype and device. For a trainer in this process that only trains while this engine is idle
        (the synchronous trainer): its in-place updates are then the engine's, and a later push is
        only ``new_version``."""
        from agentgym.model.weights import bind_state_dict

        def bind() -> int | bool:
            if not bind_state_dict(self.model, state_dict):
                return False
            return self._new_version(lambda: None, version, moved=True)

        return self.run_when_idle(bind)

    def new_version(self, version: int | None = None) -> Future:
        """The weights changed in place (shared with a trainer): a new version, caches emptied."""
        return self.run_when_idle(lambda: self._new_version(lambda: None, version))

    def _new_version(self, load: Callable[[], Any], version: int | None, moved: bool = False) -> int:
        """Load weights (engine thread, nothing running) and drop the caches the old ones computed;
        ``moved``: the parameters are new tensors (captured graphs read the old addresses)."""
        load()
        self.index.clear()
        if moved and self.graphs is not None:
            self.graphs.invalidate()
        self.weight_version = self.weight_version + 1 if version is None else int(version)
        return self.weight_version

    def _command(self, fn: Callable[[], None]) -> None:
        self._commands.put(fn)
        self._wake.set()

    # ---- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                try:
                    busy = self._iteration()
                except Exception as exc:  # never leave a caller waiting forever
                    log.exception("engine iteration failed")
                    self._fail_running(exc)
                    busy = False
                if busy:
                    time.sleep(0)  # let the HTTP thread take the GIL between steps (else requests queue up)
                else:
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
            self._fail_running(None)
            while self._waiting or not self._incoming.empty():
                self._drain_incoming()
                while self._waiting:
                    self._fail_request(self._waiting.popleft(), "abort")

    def _fail_running(self, error: Exception | None) -> None:
        for seq in list(self._seqs):
            seq.settle()
            self._finish(seq, "abort", error=error)
        self.batch.clear()
        self.index.clear()

    def _iteration(self) -> bool:
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                break
        self._drain_incoming()
        if self._updates and not self.batch.size:
            while self._updates:
                fn, fut = self._updates.popleft()
                try:
                    fut.set_result(fn())
                except Exception as exc:
                    fut.set_exception(exc)
        if not self.batch.size and self._drain_waiters:
            for fut in self._drain_waiters:
                if not fut.done():
                    fut.set_result(True)
            self._drain_waiters.clear()
        if not self.paused and not self._updates and self._waiting:
            was_idle = not self.batch.size
            if self._admit():
                now = time.monotonic()
                if was_idle:
                    self._burst_until = now + self.burst_window_s
                if now < self._burst_until:
                    # a burst is arriving at an idle engine: hand the HTTP thread the GIL for a moment
                    # so the rest of it joins within a few steps instead of trickling in over many
                    # partial-batch decode steps (never while the engine is busy in steady state)
                    time.sleep(self.burst_pause_s)
        if not self.batch.size:
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
            req.sequences.append(
                Sequence(req, len(req.sequences), req.prompt_ids, req.params, weight_version=self.weight_version)
            )
        for seq in req.sequences:
            seq.batch = None
            self._finish(seq, reason, error)

    def _abort(self, request: Request) -> None:
        if request in self._waiting:
            self._waiting.remove(request)
            self._fail_request(request, "abort")
            return
        self._finish_rows(
            {row: ("abort", None, None) for row in range(self.batch.size) if self.batch.seqs[row].request is request}
        )

    # ---- admission and prefill -----------------------------------------------------------
    def _admit(self) -> int:
        """Prefill as many waiting requests as fit; returns how many."""
        free = self.max_batch_size - self.batch.size
        batch: list[Request] = []
        longest = 0
        rows, widest = self.batch.size, max((self.kv_need(s.request) for s in self._seqs), default=0)
        while self._waiting and free > 0:
            req = self._waiting[0]
            need = self.kv_need(req)
            too_big = self.kv_too_big(req.n, need)
            if too_big:
                self._waiting.popleft()
                self._fail_request(req, "abort", EngineError(too_big))
                continue
            if not self.kv.fits(rows + req.n, max(widest, need) + 1):
                break  # wait until running sequences finish and leave room in the KV cache's budget
            if req.n > self.max_batch_size:
                self._waiting.popleft()
                self._fail_request(
                    req,
                    "abort",
                    EngineError(
                        f"n={req.n} choices exceed this server's max_batch_size ({self.max_batch_size}); ask for fewer "
                        "or start the server with a larger --max-batch-size"
                    ),
                )
                continue
            if req.n > free and (self.batch.size or batch):
                break  # wait for room rather than split a request's choices
            longest2 = max(longest, len(req.prompt_ids))
            if batch and longest2 * (len(batch) + 1) > self.max_prefill_tokens:
                break
            self._waiting.popleft()
            batch.append(req)
            longest = longest2
            free -= req.n
            rows, widest = rows + req.n, max(widest, need)
        if batch:
            try:
                self._prefill(batch)
            except Exception as exc:  # the running batch is untouched; fail only the newcomers
                log.exception("prefill failed")
                for req in batch:
                    self._fail_request(req, "abort", exc)
        return len(batch)

    def kv_need(self, req: Request) -> int:
        """The most tokens a sequence of ``req`` can hold in the KV cache: its prompt and ``max_tokens``."""
        return min(len(req.prompt_ids) + req.params.max_tokens, self.max_model_len)

    def kv_too_big(self, n: int, need: int) -> str | None:
        """Why ``n`` sequences of ``need`` tokens could never run together in the KV cache's budget (None: they can)."""
        if self.kv.fits(n, need + 1):
            return None
        mib = n * (need + 1) * self.kv.column_bytes / 2**20
        budget = self.kv.budget / 2**20
        fewer = "max_tokens or choices (n)" if n > 1 else "max_tokens"
        return (
            f"{n} sequence{'s' if n > 1 else ''} of up to {need} tokens (prompt + max_tokens) need {mib:.1f} MiB "
            f"of KV cache, more than this server's budget of {budget:.1f} MiB ({self.kv.columns} tokens): ask for "
            f"fewer {fewer}, or start the server with a larger --kv-cache-memory-bytes "
            "(config: actor_rollout_ref.rollout.kv_cache_memory_bytes)"
        )

    def _fit(self, rows: int, length: int) -> None:
        """Lay the KV cache out with at least ``rows`` slots of ``length`` tokens (and a scratch column),
        within the budget: the width doubles when it grows (at most ``max_model_len`` + 1, at most what
        ``rows`` slots leave room for) and shrinks to make room for more rows; the slots are as many as
        the budget holds at that width. Prefix-cache entries past the last slot move to free slots or go,
        and entries longer than the width are shortened (``PrefixIndex.fit``)."""
        kv = self.kv
        if rows <= kv.slots and length <= kv.scratch:
            return
        width = kv.width
        if length > kv.scratch:
            # double, else grow by a quarter, if that still leaves a slot for every running sequence and
            # prefix-cache entry; else as much as the running ones leave room for
            in_use = rows + sum(1 for e in self.index.entries.values() if not e.live)
            steps = (min(2 * kv.scratch, kv.max_len) + 1, kv.scratch + max(kv.scratch // 4, 16) + 1)
            width = next((w for w in steps if w > length and kv.columns // w >= in_use), max(steps[1], length + 1))
        width = min(width, kv.columns // max(rows, 1), kv.max_len + 1)
        if width < length + 1:
            raise EngineError(f"{rows} sequences of {length} tokens do not fit the KV cache's budget")
        slots = min(kv.max_slots, kv.columns // width)
        self.index.fit(slots, rows, width - 1, kv.copy)
        kv.relayout(slots, width)
        self.stats["kv_cache_mb"] = kv.nbytes / 2**20
        self.stats["kv_cache_slots"] = kv.slots

    def _prefill(self, requests: list[Request]) -> None:
        # one leader per distinct prompt computes it; its copies (n > 1, identical prompts) follow
        leaders: list[Sequence] = []
        followers: list[tuple[Sequence, int]] = []
        by_prompt: dict[tuple[int, ...], int] = {}
        for req in requests:
            key = tuple(req.prompt_ids)
            for j in range(req.n):
                seq = Sequence(req, j, req.prompt_ids, req.params, weight_version=self.weight_version)
                req.sequences.append(seq)
                if key in by_prompt:
                    followers.append((seq, by_prompt[key]))
                else:
                    by_prompt[key] = len(leaders)
                    leaders.append(seq)
        b0 = self.batch.size
        new = len(leaders) + len(followers)
        lengths = [len(seq.prompt_ids) for seq in leaders]
        self._fit(b0 + new, max(*lengths, self.batch.next_length() if b0 else 0))
        self._vacate(range(b0, b0 + new))
        prefixes = [self._reuse_prefix(seq, b0 + i) for i, seq in enumerate(leaders)]
        self.batch.ensure_out(self.kv.width)
        logits = self._prefill_forward(leaders, prefixes, b0)
        for seq, _ in followers:
            seq.cached_tokens = len(seq.prompt_ids)
        self._copy_followers(followers, b0, len(leaders))
        if followers:
            logits = logits[torch.tensor(list(range(len(leaders))) + [i for _, i in followers], device=self.device)]
        seqs = leaders + [seq for seq, _ in followers]
        for i, seq in enumerate(seqs):
            self.batch.place(b0 + i, seq)
        finished = self._sample_and_record(logits, seqs, b0, b0 + new)
        self.batch.commit(new)
        for i, seq in enumerate(seqs):
            self.index.add(b0 + i, seq.prompt_ids, live=True)
        self.stats["prefills"] += 1
        self.stats["prompt_tokens"] += sum(len(s.prompt_ids) for s in seqs)
        self.stats["prefill_tokens"] += sum(n - p for n, p in zip(lengths, prefixes))
        self.stats["prefix_cache_hit_tokens"] += sum(prefixes)
        self.stats["prefix_cache_hits"] += sum(1 for p in prefixes if p)
        self.stats["shared_prefill_tokens"] += sum(len(s.prompt_ids) for s, _ in followers)
        self._finish_rows(finished)

    def _vacate(self, slots: range) -> None:
        """Move the prefix-cache entries out of ``slots``, so new sequences can take them."""
        for slot in slots:
            if slot in self.index:
                self.index.relocate(slot, slots, self.kv.copy)

    def _reuse_prefix(self, seq: Sequence, slot: int) -> int:
        """Copy the longest cached prefix of ``seq``'s prompt into ``slot``; returns its length."""
        if not self.prefix_caching:
            return 0
        donor, length = self.index.match(seq.prompt_ids, limit=len(seq.prompt_ids) - 1)
        if donor is None:
            return 0
        self.kv.copy(donor, slot, length)
        entry = self.index.entries[donor]
        if not entry.live and length == len(entry.tokens):
            self.index.remove(donor)  # the new sequence's entry holds all of it, and more
        else:
            self.index.touch(donor)
        seq.cached_tokens = length
        return length

    def _prefill_forward(self, leaders: list[Sequence], prefixes: list[int], b0: int) -> torch.Tensor:
        """The uncached part of every leader's prompt in one forward (left-padded, so every row's
        last token is the last column); returns each row's next-token logits."""
        suffixes = [seq.prompt_ids[p:] for seq, p in zip(leaders, prefixes)]
        rows, width = len(leaders), max(len(s) for s in suffixes)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        cols = torch.full((rows, width), self.kv.scratch, dtype=torch.long)  # padding writes to scratch
        for i, (suffix, p) in enumerate(zip(suffixes, prefixes)):
            ids[i, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            cols[i, width - len(suffix) :] = torch.arange(p, p + len(suffix))
        ids, cols = ids.to(self.device), cols.to(self.device)
        length = max(len(seq.prompt_ids) for seq in leaders)
        positions = torch.where(cols == self.kv.scratch, 0, cols)
        self.kv.bind(slice(b0, b0 + rows), self.batch.arange[b0 : b0 + rows, None], cols, length)
        return self._forward(ids, positions, cols, length)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cols: torch.Tensor, length: int) -> torch.Tensor:
        """Logits of each row's last input token; the cache must be bound to the batch."""
        start = time.perf_counter()
        if self.lean is not None:
            logits = self.lean(ids, positions, self._masks(cols, length))
        else:
            logits = self.model(
                input_ids=ids,
                attention_mask=self._masks(cols, length),
                position_ids=positions,
                past_key_values=self.kv,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1, :]
        self.stats["forward_s"] += time.perf_counter() - start
        return logits

    def _copy_followers(self, followers: list[tuple[Sequence, int]], b0: int, leaders: int) -> None:
        by_leader: dict[int, list[int]] = {}
        for k, (_, leader) in enumerate(followers):
            by_leader.setdefault(leader, []).append(b0 + leaders + k)
        for leader, slots in by_leader.items():
            length = next(len(s.prompt_ids) for s, i in followers if i == leader)
            self.kv.copy_many([b0 + leader] * len(slots), slots, length)

    # ---- decoding ------------------------------------------------------------------------
    def _decode(self) -> None:
        batch = self.batch
        b = batch.size
        self.stats["max_batch"] = max(self.stats["max_batch"], b)
        length = batch.next_length()
        if length > self.kv.scratch:
            self._fit(b, length)
            batch.ensure_out(self.kv.width)
        cols = batch.positions()[:, None]
        if self.graphs is not None:
            logits = self.graphs.run(b, length, batch.next_token[:b], cols)
        else:
            self.kv.bind(slice(0, b), batch.arange[:b, None], cols, length)
            logits = self._forward(batch.next_token[:b, None], cols, cols, length)
        self.stats["steps"] += 1
        finished = self._sample_and_record(logits, self._seqs, 0, b)
        batch.step += 1
        self._finish_rows(finished)

    def _sample_and_record(self, logits: torch.Tensor, seqs: list[Sequence], lo: int, hi: int) -> dict[int, Any]:
        """Sample rows ``lo .. hi-1``, record them, and serve the rows that need Python per token;
        returns the rows that must finish: ``{row: (finish_reason, stop_reason, (token, logprob))}``."""
        self._step = self.batch.step_traits(lo, hi)
        self._log_probs = log_probs = torch.log_softmax(logits.float(), dim=-1)
        tokens = self.choose_tokens(logits, seqs)
        chosen = log_probs.gather(1, tokens[:, None])[:, 0]
        done = self.batch.record(lo, hi, tokens, chosen, self._step)
        self.stats["generated_tokens"] += hi - lo
        done_rows = (done.nonzero()[:, 0] + lo).tolist()
        if "host" not in self._step:
            host = []
        elif hi > self.batch.size:  # rows being admitted: not in host_rows before they are committed
            host = [lo + i for i, seq in enumerate(seqs) if "host" in traits(seq)]
        else:
            host = sorted(self.batch.host_rows)
        if not done_rows and not host:
            return {}
        rows = sorted(set(done_rows) | set(host))
        picked = torch.tensor([r - lo for r in rows], device=self.device)
        value = dict(zip(rows, zip(tokens[picked].tolist(), chosen[picked].tolist())))
        finished = {
            row: (*finish_reason(self.batch.seqs[row], value[row][0], self.eos_token_ids, self.tokenizer), value[row])
            for row in done_rows
        }
        for row in host:
            seq = self.batch.seqs[row]
            alts = None
            if seq.params.top_logprobs > 0:
                top_v, top_i = log_probs[row - lo].topk(min(seq.params.top_logprobs, log_probs.shape[-1]))
                alts = list(zip(top_i.tolist(), top_v.tolist()))
                seq.top_logprobs.append(alts)
            if row not in finished and seq.params.stop:
                hit = stop_string_hit(seq, self.tokenizer)
                if hit is not None:
                    finished[row] = ("stop", hit, value[row])
            if seq.request.stream and row not in finished:
                seq.request._emit(TokenEvent(seq.index, *value[row], alts, None))
        return finished

    def choose_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The next token of every row (tests override this to script an output)."""
        lo = seqs[0].row
        return self.batch.sample(logits, self._log_probs, lo, lo + len(seqs), self._step)

    # ---- finishing -----------------------------------------------------------------------
    def _finish_rows(self, finished: dict[int, Any]) -> None:
        """Finish these running rows (highest first, so moves never touch a row still to finish)."""
        for row in sorted(finished, reverse=True):
            seq = self.batch.seqs[row]
            reason, stop_reason, last = finished[row]
            cached = self.batch.cached_length(row)
            seq.settle()
            seq.stop_reason = stop_reason
            self._finish(seq, reason, event=last)
            if self.prefix_caching and cached > 0:
                self.index.add(row, (seq.prompt_ids + seq.output_ids)[:cached], live=False)
            else:
                self.index.remove(row)
            self._release(row)

    def _release(self, row: int) -> None:
        """``row`` has finished: its entry moves out of the running slots (or is dropped) and the
        last running sequence moves into its slot."""
        last = self.batch.size - 1
        if row != last:
            if row in self.index:
                self.index.relocate(row, range(0, self.batch.size), self.kv.copy)
            self.kv.copy(last, row, self.batch.cached_length(last))
            self.index.move(last, row)
        self.batch.drop(row)

    def _finish(
        self, seq: Sequence, reason: str, error: Exception | None = None, event: tuple[int, float] | None = None
    ) -> None:
        if seq.finish_reason is not None:
            return
        seq.finish_reason = reason
        seq.text = self.final_text(seq)
        if error is not None:
            seq.error = f"{type(error).__name__}: {error}"
        if seq.request.stream:
            alts = seq.top_logprobs[-1] if event is not None and seq.top_logprobs else None
            tok, lp = event if event is not None else (None, None)
            seq.request._emit(TokenEvent(seq.index, tok, lp, alts, reason, seq.text))
        seq.request._finish_one()

    def final_text(self, seq: Sequence) -> str:
        return final_text(seq, self.tokenizer)
