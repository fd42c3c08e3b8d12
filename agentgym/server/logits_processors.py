"""What shapes the next-token distribution besides temperature, top-k and top-p, batched over rows.

Applied to the rows that ask for it, in vLLM's order, before temperature and the filters:

1. a grammar (``structured_outputs``, forced tool calls, ``response_format``): tokens the
   matcher does not allow get -inf (``grammar.py``);
2. ``logit_bias``: added to the logits of the tokens it names (OpenAI: -100 .. 100);
3. ``min_tokens`` (vLLM): the stop tokens (eos unless ``ignore_eos``, ``stop_token_ids``) get
   -inf until that many tokens are out;
4. penalties over the tokens this sequence generated, as OpenAI and vLLM define them:
   ``logit -= frequency_penalty * count + presence_penalty * (count > 0)``; and vLLM's
   ``repetition_penalty`` over the prompt and the generated tokens: a seen token's positive
   logit is divided by it, a negative one multiplied.

The logprobs a response reports are not affected: they stay ``log_softmax`` of the model's own
logits (see ``engine.py``), which is what a teacher-forced pass recomputes.

State per row lives in tensors indexed by row, allocated on first use (a count per vocabulary
entry for penalties, a dense bias row for ``logit_bias``), so a step applies each processor to all
its rows at once; only the grammar's matchers are advanced one row at a time.
"""

from __future__ import annotations

from typing import Any

import torch

PROCESSED = frozenset({"grammar", "penalized", "biased", "min_tokens"})
"""Traits (``running_batch.traits``) of rows whose logits are processed here."""


def shaping(params: Any) -> set[str]:
    """The processors a request's ``GenerationParams`` turn on."""
    out = set()
    if params.grammar:
        out.add("grammar")
    if params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0:
        out.add("penalized")
    if params.logit_bias:
        out.add("biased")
    if params.min_tokens > 0:
        out.add("min_tokens")
    return out


class LogitsProcessors:
    """The processors' per-row state for a ``RunningBatch`` of ``rows`` rows."""

    def __init__(self, rows: int, vocab_size: int, device: torch.device, grammars: Any = None) -> None:
        self.rows, self.vocab, self.device = rows, vocab_size, device
        self.grammars = grammars
        self.grammar_rows: set[int] = set()  # live rows with a matcher
        self.counts: torch.Tensor | None = None  # (rows, vocab) generated-token counts
        self.seen: torch.Tensor | None = None  # (rows, vocab) in the prompt (repetition_penalty)
        self.bias: torch.Tensor | None = None  # (rows, vocab)
        self.frequency = torch.zeros(rows, device=device)
        self.presence = torch.zeros(rows, device=device)
        self.repetition = torch.ones(rows, device=device)

    def _table(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        table = getattr(self, name)
        if table is None:
            table = torch.zeros((self.rows, self.vocab), dtype=dtype, device=self.device)
            setattr(self, name, table)
        return table

    # ---- rows join, move, leave ------------------------------------------------------------
    def place(self, row: int, seq: Any) -> None:
        """A new sequence on ``row``: its own state, nothing left of the row's last sequence."""
        p = seq.params
        seq.matcher = self.grammars.matcher(p.grammar) if p.grammar else None
        self.frequency[row], self.presence[row], self.repetition[row] = (
            p.frequency_penalty,
            p.presence_penalty,
            p.repetition_penalty,
        )
        for name, needed in (
            ("counts", p.frequency_penalty or p.presence_penalty or p.repetition_penalty != 1.0),
            ("seen", p.repetition_penalty != 1.0),
            ("bias", bool(p.logit_bias)),
        ):
            table = getattr(self, name)
            if table is None and needed:
                table = self._table(name, torch.bool if name == "seen" else torch.float32)
            if table is not None:
                table[row] = 0
        if p.repetition_penalty != 1.0:
            prompt = [t for t in seq.prompt_ids if 0 <= t < self.vocab]
            self.seen[row, torch.tensor(prompt, dtype=torch.long, device=self.device)] = True
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=self.device)
            self.bias[row, ids] = torch.tensor(list(p.logit_bias.values()), dtype=torch.float32, device=self.device)

    def joined(self, row: int, found: set[str]) -> None:
        if "grammar" in found:
            self.grammar_rows.add(row)

    def left(self, row: int) -> None:
        self.grammar_rows.discard(row)

    def move(self, src: int, dst: int) -> None:
        if src in self.grammar_rows:
            self.grammar_rows.discard(src)
            self.grammar_rows.add(dst)
        for name in ("frequency", "presence", "repetition", "counts", "seen", "bias"):
            table = getattr(self, name)
            if table is not None:
                table[dst] = table[src]

    def clear(self) -> None:
        self.grammar_rows.clear()

    # ---- a step ------------------------------------------------------------------------------
    def _grammar_rows(self, batch: Any, lo: int, hi: int) -> list[int]:
        if hi <= batch.size:
            return sorted(r for r in self.grammar_rows if lo <= r < hi)
        return [r for r in range(lo, hi) if batch.seqs[r].params.grammar]

    def apply(self, logits: torch.Tensor, batch: Any, lo: int, hi: int, step: set[str]) -> torch.Tensor:
        """Rows ``lo .. hi-1``'s logits after the processors their rows ask for (a new tensor)."""
        logits = logits.float().clone()
        if "grammar" in step:
            rows = self._grammar_rows(batch, lo, hi)
            if rows:
                self.grammars.mask(logits, [r - lo for r in rows], [batch.seqs[r].matcher for r in rows])
        if "biased" in step and self.bias is not None:
            logits += self.bias[lo:hi]
        if "min_tokens" in step:
            early = batch.n_out[lo:hi] < batch.min_tokens[lo:hi]
            stops = batch.is_eos[None, :] & batch.eos_stops[lo:hi, None]
            ids = batch.stop_ids[lo:hi]
            listed = torch.zeros(stops.shape, dtype=torch.int32, device=stops.device)
            stops = stops | (listed.scatter_add_(1, ids.clamp(min=0), (ids >= 0).int()) > 0)  # -1: padding
            logits = logits.masked_fill(stops & early[:, None], float("-inf"))
        if "penalized" in step and self.counts is not None:
            counts = self.counts[lo:hi]
            if self.seen is not None:
                seen = self.seen[lo:hi] | (counts > 0)
                rep = self.repetition[lo:hi, None]
                logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
            logits -= self.frequency[lo:hi, None] * counts + self.presence[lo:hi, None] * (counts > 0)
        if "grammar" in step or "min_tokens" in step:
            # a row left with no token at all (a grammar that is complete while min_tokens holds the
            # end back, or a matcher in error): let it end rather than sample from nothing
            dead = ~torch.isfinite(logits).any(dim=-1)
            if bool(dead.any()):
                logits[dead] = torch.where(batch.is_eos, 0.0, float("-inf"))
        return logits

    def record(self, batch: Any, lo: int, hi: int, tokens: torch.Tensor, step: set[str]) -> None:
        """Each row sampled ``tokens``: count it, advance the grammars."""
        if "penalized" in step and self.counts is not None:
            self.counts[batch.arange[lo:hi], tokens] += 1
        if "grammar" in step:
            rows = self._grammar_rows(batch, lo, hi)
            if rows:
                picked = tokens[torch.tensor([r - lo for r in rows], device=tokens.device)].tolist()
                self.grammars.advance([batch.seqs[r].matcher for r in rows], picked)
