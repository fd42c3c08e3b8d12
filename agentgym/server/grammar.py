"""Constrained decoding in the embedded engine, with llguidance.

What a request constrains its reply to (``agentgym.client.structured``: a chat request's
``tools``/``tool_choice``/``response_format``, vLLM's ``structured_outputs`` with ``json``,
``json_object``, ``structural_tag``, ``grammar`` (llguidance's Lark), ``regex`` or ``choice``)
becomes one llguidance grammar (``grammar_text``), checked once per distinct grammar when the request arrives
(``Grammars.check``:
a 400 if it does not compile) and kept compiled. Every sequence of the request gets its own
matcher, a copy of the compiled one; each decode step the engine asks the matchers of the
constrained rows for the tokens allowed next (``Grammars.mask``: a bit mask, unpacked and applied
to those rows' logits in one operation) and tells each matcher the token it sampled
(``Grammars.advance``). Once the grammar is complete the mask allows only the end-of-sequence
tokens.

Why llguidance (``benchmarks/constrained.py`` measures the three libraries with CPU wheels on
PyPI): per generated token (mask, apply, advance; 32 matchers, the tiny tokenizer, a JSON
schema), llguidance cost 26-76 us over two runs on a shared 2-core machine, xgrammar 7-16 us and
outlines-core 9-23 us; at 32 concurrent requests on the ``mid`` model a token costs 1.0-1.5 ms,
so llguidance's constrained decoding measured 1.04-1.13x the free one there (target: 1.3x), and
xgrammar's lower cost would change that by a few percent. What decided: llguidance is one 3 MB
wheel with no dependencies, while xgrammar requires triton (a 286 MB GPU compiler wheel) and
apache-tvm-ffi, and outlines-core compiles a JSON schema to a regular expression and an index
over the vocabulary (4-6 s for that schema, against 30-60 ms) and cannot express
``json_object``'s any-JSON or recursive schemas. llguidance's
Lark dialect writes a Hermes tool call with the arguments' schema inline (``%json``); vLLM and
SGLang use it as one of their grammar backends.

Tokens the tokenizer treats as special (llguidance: added tokens such as ``<tool_call>``) are
written in the grammar as themselves (``<[id]>``), so a forced tool call uses the one token the
chat template renders, as the model was trained to write it.

JSON is written compactly, with Python's separators (``", "``, ``": "``) as ``json.dumps`` and
the chat template write it: no free whitespace, so a weak model cannot pad a reply with spaces
until it runs out of tokens.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import torch

from agentgym.client.structured import structural_tag

COMPACT_JSON = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
_BITS = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)


class GrammarError(ValueError):
    """A grammar (or schema) that cannot be compiled; the message says why."""


def _compact(schema: Any) -> Any:
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    return {**schema, "x-guidance": {**COMPACT_JSON, **(schema.get("x-guidance") or {})}}


class _Lark:
    """Lark rules for a structural tag (xgrammar's format, the parts agentgym and vLLM's tool
    parsers use: ``const_string``, ``json_schema``, ``sequence``, ``or``, ``tag``,
    ``tags_with_separator``, ``triggered_tags`` is not among them)."""

    def __init__(self, specials: dict[str, int]) -> None:
        self.specials = specials
        self.rules: list[str] = []
        self._split = (
            re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))) if specials else None
        )

    def literal(self, text: str) -> str:
        """``text`` as Lark terms: special tokens as ``<[id]>``, the rest quoted."""
        if not text:
            return '""'
        terms, pos = [], 0
        for m in self._split.finditer(text) if self._split is not None else ():
            if m.start() > pos:
                terms.append(json.dumps(text[pos : m.start()]))
            terms.append(f"<[{self.specials[m.group()]}]>")
            pos = m.end()
        if pos < len(text):
            terms.append(json.dumps(text[pos:]))
        return " ".join(terms)

    def rule(self, body: str) -> str:
        name = f"r{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def format(self, fmt: Any) -> str:
        if not isinstance(fmt, dict):
            raise GrammarError("a structural tag's format must be an object")
        kind = fmt.get("type")
        if kind == "const_string":
            return self.rule(self.literal(str(fmt.get("value", ""))))
        if kind == "json_schema":
            return self.rule(f"%json {json.dumps(_compact(fmt.get('json_schema', {})))}")
        if kind in ("sequence", "or"):
            parts = [self.format(e) for e in fmt.get("elements") or []]
            if not parts:
                raise GrammarError(f"a structural tag's {kind} needs elements")
            return self.rule((" " if kind == "sequence" else " | ").join(parts))
        if kind == "tag":
            end = fmt.get("end", "")
            if not isinstance(fmt.get("begin"), str) or not isinstance(end, str):
                raise GrammarError("a structural tag's tag needs begin and end strings")
            return self.rule(f"{self.literal(fmt['begin'])} {self.format(fmt.get('content'))} {self.literal(end)}")
        if kind == "tags_with_separator":
            tags = self.rule(" | ".join(self.format({**t, "type": "tag"}) for t in fmt.get("tags") or [{}]))
            sep = self.literal(str(fmt.get("separator", "")))
            more = "" if fmt.get("stop_after_first") else f" ({sep} {tags})*"
            return self.rule(f"{tags}{more}" if fmt.get("at_least_one") else f"({tags}{more})?")
        raise GrammarError(
            f"structural tag format {kind!r} is not supported by the embedded server; it takes "
            "const_string, json_schema, sequence, or, tag and tags_with_separator"
        )


def grammar_text(constraint: dict[str, Any], specials: dict[str, int] | None = None) -> str:
    """The llguidance grammar for a constraint (``agentgym.client.structured``)."""
    kind = constraint["type"]
    if kind == "json":
        return f"start: %json {json.dumps(_compact(constraint['schema']))}\n"
    if kind in ("tool_calls", "structural_tag"):
        tag = structural_tag(constraint) if kind == "tool_calls" else constraint["tag"]
        if "format" not in tag:
            raise GrammarError(
                'a structural tag must be {"type": "structural_tag", "format": {...}} (xgrammar\'s format)'
            )
        lark = _Lark(specials or {})
        top = lark.format(tag["format"])
        return "\n".join([f"start: {top}", *lark.rules]) + "\n"
    if kind == "grammar":
        return constraint["grammar"]
    if kind == "regex":
        import llguidance

        return llguidance.LLMatcher.grammar_from_regex(constraint["regex"])
    return "start: " + " | ".join(json.dumps(c) for c in constraint["choices"]) + "\n"


class Grammars:
    """llguidance for one engine: its view of the tokenizer (built on first use: about a second
    for a large vocabulary), compiled grammars (the last ``cache_size``), and the batched mask."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: list[int], cache_size: int = 256) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = list(eos_ids)
        self.cache_size = cache_size
        self._lltok: Any = None
        self._specials: dict[str, int] = {}
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._bitmask = torch.zeros((0, (vocab_size + 31) // 32), dtype=torch.int32)
        self._bits = _BITS

    def _llguidance(self) -> Any:
        if self._lltok is None:
            try:
                import llguidance.hf
            except ImportError:
                raise GrammarError("constrained decoding needs llguidance: pip install llguidance") from None
            try:
                self._lltok = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_ids
                )
            except ValueError as exc:
                raise GrammarError(f"constrained decoding needs a fast (Rust) tokenizer: {exc}") from None
            names = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
            self._specials = {
                t: i for i, t in enumerate(names) if t and self._lltok.is_special_token(i) and i not in self.eos_ids
            }
        return self._lltok

    def text(self, constraint: dict[str, Any]) -> str:
        """``grammar_text`` with this tokenizer's special tokens."""
        with self._lock:
            self._llguidance()
        return grammar_text(constraint, self._specials)

    def check(self, grammar: str) -> None:
        """Compile ``grammar`` (kept for the sequences that use it), or a ``GrammarError`` saying why
        not. Runs in a worker thread: a large schema takes a while."""
        import llguidance

        with self._lock:
            if grammar in self._compiled:
                self._compiled.move_to_end(grammar)
                return
            lltok = self._llguidance()
        matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {matcher.get_error()}")
        with self._lock:
            self._compiled[grammar] = matcher
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)

    def matcher(self, grammar: str) -> Any:
        """A fresh matcher for one sequence (engine thread)."""
        template = self._compiled.get(grammar)
        if template is None:
            self.check(grammar)
            template = self._compiled[grammar]
        return template.deep_copy()

    def mask(self, logits: torch.Tensor, rows: list[int], matchers: list[Any]) -> None:
        """Set the logits of ``rows`` to -inf wherever their matcher allows no token. The packed mask
        (a bit per token) is what crosses to the device, and is unpacked there."""
        if self._bitmask.shape[0] < len(rows):
            self._bitmask = torch.zeros((len(rows), self._bitmask.shape[1]), dtype=torch.int32)
        bitmask = self._bitmask[: len(rows)]
        width = bitmask.shape[1] * 4
        for k, matcher in enumerate(matchers):
            matcher.unsafe_compute_mask_ptr(bitmask[k].data_ptr(), width)
        device = logits.device
        if self._bits.device != device:
            self._bits = self._bits.to(device)
        packed = bitmask.to(device, non_blocking=True)
        allowed = ((packed[:, :, None] & self._bits) != 0).view(len(rows), -1)[:, : logits.shape[1]]
        index = torch.tensor(rows, device=device)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))

    @staticmethod
    def advance(matchers: list[Any], tokens: list[int]) -> None:
        for matcher, token in zip(matchers, tokens):
            if not matcher.is_stopped():
                matcher.consume_token(token)
