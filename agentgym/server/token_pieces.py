"""What OpenAI's logprobs say about each token: its text, its raw bytes, and text offsets.

Shared by the embedded server and the gateway, which answer with the same logprob shapes.
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
