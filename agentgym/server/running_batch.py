"""The running sequences as tensors: one row per sequence, rows ``0 .. size-1`` live.

Row ``r`` is also the sequence's KV-cache slot. Everything a decode step needs per row (the
token to feed, how many tokens it has, its sampling parameters, its stop conditions) and
everything it produces (the sampled tokens and their logprobs) is a tensor indexed by row,
so a step is a handful of batched operations whatever the batch size. Python touches a row
only when it joins, leaves or moves, or when it asked for something per token (streaming,
stop strings, top logprobs: ``host_rows``). Counts of what the live rows ask for (greedy,
filtered, seeded, ...) let a step skip the work no row needs without asking the device.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from agentgym.server.logits_processors import PROCESSED, LogitsProcessors, shaping
from agentgym.server.sampling import GenerationParams, counter_uniforms, sample_rows, seed_key


def traits(seq: Any) -> set[str]:
    """What a sequence asks of a step: a subset of sampled, shaped, filtered, seeded, min_tokens,
    stop_ids, host, grammar, penalized, biased."""
    p: GenerationParams = seq.params
    out = set()
    if p.temperature > 0:
        out.add("sampled")
        if p.top_k > 0 or p.top_p < 1.0:
            out.add("filtered")
    out |= shaping(p)  # grammar, penalties, logit_bias, min_tokens (logits_processors.py)
    if p.temperature != 1.0 or "filtered" in out or out & PROCESSED:
        out.add("shaped")  # its sampling distribution is not log_softmax(logits)
    if p.seed is not None:
        out.add("seeded")
    if p.stop_token_ids:
        out.add("stop_ids")
    if p.top_logprobs > 0 or p.stop or seq.request.stream:
        out.add("host")
    return out


class RunningBatch:
    def __init__(
        self,
        rows: int,
        device: torch.device,
        eos_ids: list[int],
        vocab_size: int,
        max_model_len: int,
        generator: torch.Generator,
        out_len: int = 256,
        grammars: Any = None,
    ) -> None:
        self.rows = rows
        self.device = device
        self.max_model_len = max_model_len
        self.generator = generator  # unseeded rows' stream keys and, when no row is seeded, their draws
        self.size = 0
        self.seqs: list[Any] = [None] * rows
        self.step = 0  # decode steps taken; a row's cached length after the next step is base[row] + step
        self.base = [0] * rows
        self._max_base: int | None = None
        self.host_rows: set[int] = set()
        self.counts: Counter[str] = Counter()  # live rows per trait
        self.is_eos = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        self.is_eos[[e for e in eos_ids if 0 <= e < vocab_size]] = True
        self.arange = torch.arange(rows, device=device)
        self.processors = LogitsProcessors(rows, vocab_size, device, grammars)

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.next_token = zeros(rows)
        self.n_out = zeros(rows)
        self.prompt_len = zeros(rows)
        self.limit = zeros(rows)  # max tokens, within max_model_len
        self.min_tokens = zeros(rows)
        self.key = zeros(rows)
        self.top_k = zeros(rows)
        self.temperature = zeros(rows, dtype=torch.float32)
        self.top_p = zeros(rows, dtype=torch.float32)
        self.eos_stops = zeros(rows, dtype=torch.bool)
        self.stop_ids = torch.full((rows, 1), -1, dtype=torch.long, device=device)
        self.tokens = zeros(rows, out_len)
        self.logprobs = zeros(rows, out_len, dtype=torch.float32)
        self._row_tensors = (
            "next_token",
            "n_out",
            "prompt_len",
            "limit",
            "min_tokens",
            "key",
            "top_k",
            "temperature",
            "top_p",
            "eos_stops",
            "stop_ids",
            "tokens",
            "logprobs",
        )

    # ---- per-row reads (a sequence's view of itself) ----------------------------------------
    def tokens_of(self, row: int) -> list[int]:
        return self.tokens[row, : int(self.n_out[row])].tolist()

    def logprobs_of(self, row: int) -> list[float]:
        return self.logprobs[row, : int(self.n_out[row])].tolist()

    def cached_length(self, row: int) -> int:
        """Tokens of ``row`` whose keys and values are in its slot (prompt + all but the last sampled)."""
        return int(self.prompt_len[row]) + int(self.n_out[row]) - 1

    # ---- lengths -----------------------------------------------------------------------------
    def next_length(self) -> int:
        """Columns the next decode step reads: the longest row's cache once its next token is in."""
        if self._max_base is None:
            self._max_base = max(self.base[: self.size], default=0)
        return self._max_base + self.step

    def ensure_out(self, length: int) -> None:
        """Room for ``length`` sampled tokens per row."""
        if length <= self.tokens.shape[1]:
            return
        width = self.tokens.shape[1]
        while width < length:
            width *= 2
        for name in ("tokens", "logprobs"):
            old = getattr(self, name)
            new = torch.zeros((self.rows, width), dtype=old.dtype, device=self.device)
            new[:, : old.shape[1]] = old
            setattr(self, name, new)

    # ---- membership --------------------------------------------------------------------------
    def place(self, row: int, seq: Any) -> None:
        """Write a new sequence into ``row`` (at or past ``size``; ``commit`` makes it live)."""
        p: GenerationParams = seq.params
        seq.row, seq.batch = row, self
        self.seqs[row] = seq
        self.n_out[row] = 0
        self.prompt_len[row] = len(seq.prompt_ids)
        self.limit[row] = min(p.max_tokens, self.max_model_len - len(seq.prompt_ids))
        self.min_tokens[row] = p.min_tokens
        seed = (
            p.seed + seq.index
            if p.seed is not None
            else int(torch.randint(-(2**62), 2**62, (1,), generator=self.generator))
        )
        self.key[row] = seed_key(seed)
        self.temperature[row] = p.temperature
        self.top_k[row] = max(p.top_k, 0)
        self.top_p[row] = p.top_p
        self.eos_stops[row] = not p.ignore_eos
        stops = p.stop_token_ids
        if len(stops) > self.stop_ids.shape[1]:
            grown = torch.full((self.rows, len(stops)), -1, dtype=torch.long, device=self.device)
            grown[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = grown
        self.stop_ids[row] = -1
        if stops:
            self.stop_ids[row, : len(stops)] = torch.tensor(stops, dtype=torch.long)
        self.processors.place(row, seq)
        # after the next decode step its cache holds the prompt and the first sampled token
        self.base[row] = len(seq.prompt_ids) + 1 - self.step

    def commit(self, count: int) -> None:
        """The ``count`` rows placed after ``size`` are live (their first token is sampled)."""
        for row in range(self.size, self.size + count):
            self._count(row, +1)
        self.size += count
        self._max_base = None

    def _count(self, row: int, sign: int) -> None:
        found = traits(self.seqs[row])
        for trait in found:
            self.counts[trait] += sign
        if sign > 0:
            if "host" in found:
                self.host_rows.add(row)
            self.processors.joined(row, found)
        else:
            self.host_rows.discard(row)
            self.processors.left(row)

    def drop(self, row: int) -> int | None:
        """``row``'s sequence leaves; the last live row moves into its place (returns the row it
        came from, or None when ``row`` was the last)."""
        self._count(row, -1)
        self.seqs[row] = None
        last = self.size - 1
        moved = None
        if row != last:
            self._move(last, row)
            moved = last
        self.size -= 1
        self._max_base = None
        return moved

    def _move(self, src: int, dst: int) -> None:
        seq = self.seqs[src]
        if src in self.host_rows:
            self.host_rows.discard(src)
            self.host_rows.add(dst)
        for name in self._row_tensors:
            t = getattr(self, name)
            t[dst] = t[src]
        self.base[dst] = self.base[src]
        self.processors.move(src, dst)
        self.seqs[dst], self.seqs[src] = seq, None
        seq.row = dst

    def clear(self) -> None:
        for row in range(self.size):
            self.seqs[row] = None
        self.size = 0
        self.host_rows.clear()
        self.processors.clear()
        self.counts.clear()
        self._max_base = None

    # ---- a step ------------------------------------------------------------------------------
    def step_traits(self, lo: int, hi: int) -> set[str]:
        """The traits of rows ``lo .. hi-1``: counted for live rows, looked at for rows being admitted."""
        if hi <= self.size:
            return {t for t, n in self.counts.items() if n > 0}
        return set().union(*(traits(self.seqs[r]) for r in range(lo, hi)))

    def sample(
        self, logits: torch.Tensor, log_probs: torch.Tensor, lo: int, hi: int, step: Iterable[str]
    ) -> torch.Tensor:
        """The next token of rows ``lo .. hi-1`` (one row of ``logits`` each; ``step``: their traits)."""
        step = set(step)
        if step & PROCESSED:
            logits = self.processors.apply(logits, self, lo, hi, step)
        if "sampled" not in step:
            return logits.argmax(dim=-1)
        if "seeded" in step:
            u = counter_uniforms(self.key[lo:hi], self.n_out[lo:hi])
        else:
            u = torch.rand((hi - lo,), generator=self.generator).to(self.device)
        plain = "shaped" not in step and self.greedy_rows(lo, hi) == 0
        return sample_rows(
            logits,
            self.temperature[lo:hi],
            self.top_k[lo:hi],
            self.top_p[lo:hi],
            u,
            any_filtered="filtered" in step,
            log_probs=log_probs if plain else None,
        )

    def greedy_rows(self, lo: int, hi: int) -> int:
        """Rows of ``lo .. hi-1`` that decode greedily."""
        if hi <= self.size:
            return self.size - self.counts["sampled"]
        return sum(1 for r in range(lo, hi) if self.seqs[r].params.temperature <= 0)

    def record(
        self, lo: int, hi: int, tokens: torch.Tensor, logprobs: torch.Tensor, step: Iterable[str]
    ) -> torch.Tensor:
        """Store each row's new token and logprob; the rows that must stop now (bool, ``hi - lo``)."""
        step = set(step)
        n_out = self.n_out[lo:hi]
        rows = self.arange[lo:hi]
        self.tokens[rows, n_out] = tokens
        self.logprobs[rows, n_out] = logprobs
        n_out += 1
        self.next_token[lo:hi] = tokens
        if step & PROCESSED:
            self.processors.record(self, lo, hi, tokens, step)
        stop = self.is_eos[tokens] & self.eos_stops[lo:hi]
        if "stop_ids" in step:
            stop |= (self.stop_ids[lo:hi] == tokens[:, None]).any(1)
        if "min_tokens" in step:
            stop &= n_out >= self.min_tokens[lo:hi]
        return stop | (n_out >= self.limit[lo:hi])

    def positions(self) -> torch.Tensor:
        """The column (= position) of each live row's next token."""
        return self.prompt_len[: self.size] + self.n_out[: self.size] - 1
