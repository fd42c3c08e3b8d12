"""What OpenAI's logprobs say about each token: its text, its raw bytes, and text offsets; and
``IncrementalText``, the text deltas of a reply streamed token by token.

Shared by the embedded server and the gateway, which answer with the same logprob and stream shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any


@functools.cache
def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


class TokenPieces:
    """Per-token text and bytes of ``tokenizer``, cached (a response asks for the same ids again and again)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}
        self._added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def bytes(self, token_id: int) -> list[int]:
        """The token's raw bytes (a byte-level BPE token may be part of a UTF-8 character, whose
        decoded text would be a replacement character)."""
        out = self._bytes.get(token_id)
        if out is None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            decoder = _byte_decoder()
            if token_id in self._added or not isinstance(piece, str):
                out = list(self.text(token_id).encode())
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # byte fallback
                out = [int(piece[3:5], 16)]
            elif all(c in decoder for c in piece):
                out = [decoder[c] for c in piece]
            else:
                out = list(self.text(token_id).encode())
            self._bytes[token_id] = out
        return out

    @staticmethod
    def offsets(texts: Iterable[str], start: int = 0) -> list[int]:
        """``text_offset`` of each text: where it starts in their concatenation (after ``start``)."""
        out = []
        for text in texts:
            out.append(start)
            start += len(text)
        return out


class IncrementalText:
    """Turns a growing list of token ids into text deltas, never emitting half a character
    and holding back text that could be the start of a marker (a stop string, ``<tool_call>``):
    once a marker appears, everything from it on waits for ``finish``."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool, markers: list[str]) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.markers = [m for m in markers if m]
        self.ids: list[int] = []
        self.sent = ""
        self.held = False
        self.first = True

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self.held:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd"):
            return ""
        end = len(text)
        for m in self.markers:
            at = text.find(m, max(0, len(self.sent) - len(m)))
            if at >= 0:
                end = min(end, at)
                self.held = True
            else:
                for k in range(min(len(m) - 1, len(text)), 0, -1):
                    if text.endswith(m[:k]):
                        end = min(end, len(text) - k)
                        break
        if end <= len(self.sent):
            return ""
        delta = text[len(self.sent) : end]
        self.sent = text[:end]
        return delta

    def finish(self, final_text: str) -> str:
        if final_text.startswith(self.sent):
            delta = final_text[len(self.sent) :]
            self.sent = final_text
            return delta
        return ""


def top_by_name(alternatives: Iterable[tuple[int, float]], name: Any) -> dict[str, float]:
    """The legacy completions' ``{token text: logprob}`` of best-first alternatives. Two ids can render
    as one text (pieces of a multi-byte character both read "\ufffd"): the text keeps the better
    logprob, so the map can hold fewer entries than asked for, as OpenAI's format allows."""
    out: dict[str, float] = {}
    for token, logprob in alternatives:
        out.setdefault(name(token), logprob)
    return out
