"""Decide whether two final answers are the same.

Numbers are compared as exact fractions, so ``72``, ``72.0``, ``72.00``, ``$72``, ``1,000`` and
``1000``, ``3/4``, ``\\frac{3}{4}`` and ``0.75`` all match their partners. Anything that is not a
number is compared as text after light LaTeX/whitespace normalisation.

A model writes whatever it likes inside ``\\boxed{}``: numbers are read with a linear parser and
bounded before they are built (``1e9999999`` as a fraction has ten million digits), so comparing
any two answers takes milliseconds.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_DIGITS = 1000
"""A number with more digits than this, or scaled by a power of ten beyond ``10**±MAX_DIGITS``
(``1e5000``), is compared as text, not as a fraction."""

_FRAC_RE = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_DIGITS = r"\d+(?:_\d+)*"
# sign, integer digits, fraction digits, exponent: each part is unambiguous, so matching is linear
_DECIMAL_RE = re.compile(rf"([-+]?)({_DIGITS})?(?:\.({_DIGITS})?)?(?:[eE]([-+]?{_DIGITS}))?")
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
    if "/" in cleaned:
        numerator, _, denominator = cleaned.partition("/")
        top, bottom = _decimal(numerator), _decimal(denominator)
        return top / bottom if top is not None and bottom else None
    return _decimal(cleaned)


def _decimal(text: str) -> Fraction | None:
    """``"-1.5e3"`` -> -1500 (what ``Fraction(text)`` accepts), or None when ``text`` is not such a
    number or is over ``MAX_DIGITS`` digits."""
    match = _DECIMAL_RE.fullmatch(text.strip())
    if match is None or not (match.group(2) or match.group(3)):
        return None
    sign, whole, fraction, exponent = (group or "" for group in match.groups())
    digits, fraction, exponent = (
        (whole + fraction).replace("_", ""),
        fraction.replace("_", ""),
        exponent.replace("_", ""),
    )
    if len(digits) > MAX_DIGITS or len(exponent) > 8:
        return None
    power = int(exponent or 0) - len(fraction)
    if abs(power) > MAX_DIGITS:
        return None
    value = Fraction(int(digits), 10**-power) if power < 0 else Fraction(int(digits) * 10**power)
    return -value if sign == "-" else value


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
