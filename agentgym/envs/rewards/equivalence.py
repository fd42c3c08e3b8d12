"""Decide whether two final answers are the same.

Numbers are compared as exact fractions, so ``72``, ``72.0``, ``72.00``, ``$72``, ``1,000`` and
``1000``, ``3/4``, ``\\frac{3}{4}`` and ``0.75`` all match their partners. Anything that is not a
number is compared as text after light LaTeX/whitespace normalisation.
"""

from __future__ import annotations

import re
from fractions import Fraction

_FRAC_RE = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_TEXT_RE = re.compile(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}")


def _strip_decorations(text: str) -> str:
    text = text.strip().strip("$").strip()
    text = _TEXT_RE.sub(r"\1", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "\\%"):
        text = text.replace(token, "")
    return text.strip()


def parse_number(text: str) -> Fraction | None:
    """``"1,000"`` -> 1000, ``"-3"`` -> -3, ``"0.75"`` / ``"3/4"`` / ``"\\frac{3}{4}"`` -> 3/4,
    ``"$18."`` -> 18, ``"50%"`` -> 50; None when ``text`` is not a plain number."""
    cleaned = _strip_decorations(text).replace(",", "").replace(" ", "").rstrip(".").rstrip("%")
    cleaned = cleaned.lstrip("$")
    frac = _FRAC_RE.match(cleaned)
    if frac:
        cleaned = f"{frac.group(1)}/{frac.group(2)}"
    if not cleaned:
        return None
    try:
        if "/" in cleaned:
            numerator, _, denominator = cleaned.partition("/")
            return Fraction(numerator) / Fraction(denominator)
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _normalise_text(text: str) -> str:
    return re.sub(r"\s+", "", _strip_decorations(text)).rstrip(".").lower()


def answers_match(prediction: str | None, reference: str | None) -> bool:
    """True when ``prediction`` and ``reference`` are the same number (exactly, as fractions),
    or, if either is not a number, the same text after normalisation. None never matches."""
    if prediction is None or reference is None:
        return False
    a, b = parse_number(str(prediction)), parse_number(str(reference))
    if a is not None and b is not None:
        return a == b
    return _normalise_text(str(prediction)) == _normalise_text(str(reference))
