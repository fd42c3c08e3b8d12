"""Pull a final answer out of a model's text.

Three styles:

* ``strict`` — the answer written after ``####`` (GSM8K's format). As in veRL, only the last
  300 characters are searched and the last match wins; commas and ``$`` are dropped
  (``#### $1,000`` -> ``"1000"``). Slightly more lenient than veRL: ``####18`` and
  ``#### $18`` match too, and a trailing full stop is not part of the number.
* ``flexible`` — the last number in the last 300 characters (veRL's ``flexible``), with
  commas dropped and a trailing ``.`` left out (``"... is 18."`` -> ``"18"``).
* ``boxed`` — the content of the last ``\\boxed{...}`` (nested braces allowed) or ``\\fbox{...}``.

Every extractor returns the answer text, or ``None`` when there is none.
"""

from __future__ import annotations

import re

METHODS = ("strict", "flexible", "boxed")
CLIP_CHARS = 300
"""Only the end of a response is searched by ``strict`` and ``flexible`` (veRL does the same:
the final answer is at the end, and regexes over very long strings are slow)."""

_NUMBER = r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_STRICT_RE = re.compile(r"####\s*\$?\s*(" + _NUMBER + r"(?:\s*/\s*\d+)?)")
_FLEXIBLE_RE = re.compile(_NUMBER)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\b")


def _clip(text: str) -> str:
    return text[-CLIP_CHARS:] if len(text) > CLIP_CHARS else text


def _clean_number(number: str) -> str:
    return number.replace(",", "").replace("$", "").replace(" ", "")


def extract_strict(text: str) -> str | None:
    """The number after the last ``####`` in the last 300 characters, e.g. ``"72"``; else None."""
    matches = _STRICT_RE.findall(_clip(text))
    return _clean_number(matches[-1]) if matches else None


def extract_flexible(text: str) -> str | None:
    """The last number in the last 300 characters, commas dropped; None if there is no number."""
    for candidate in reversed(_FLEXIBLE_RE.findall(_clip(text))):
        cleaned = _clean_number(candidate).rstrip(".")
        if cleaned not in ("", "-"):
            return cleaned
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced), or of
    ``\\boxed 5``; None if there is none or its braces never close."""
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    stripped = rest.lstrip()
    if not stripped.startswith("{"):
        # "\boxed 42": the token after the command
        token = re.match(r"[^\s$]+", stripped)
        return token.group(0) if token else None
    depth = 0
    for i, char in enumerate(stripped):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return stripped[1:i].strip()
    return None


_EXTRACTORS = {"strict": extract_strict, "flexible": extract_flexible, "boxed": extract_boxed}


def extract_answer(text: str, method: str = "strict") -> str | None:
    """The final answer in ``text`` by ``method`` (one of ``METHODS``), or None."""
    try:
        extractor = _EXTRACTORS[method]
    except KeyError:
        raise ValueError(f"unknown answer extraction method {method!r}; use one of {', '.join(METHODS)}") from None
    return extractor(text or "")


def ground_truth_from_gsm8k_answer(answer: str) -> str:
    """The reference answer of a raw GSM8K ``answer`` field: the text after its last ``####``,
    commas dropped (``"...\\n#### 1,000"`` -> ``"1000"``). Raises ValueError if there is no ``####``."""
    head, sep, tail = answer.rpartition("####")
    if not sep or not tail.strip():
        raise ValueError(f"a GSM8K answer must end with '#### <number>'; got ...{answer[-80:]!r}")
    return tail.strip().replace(",", "")
