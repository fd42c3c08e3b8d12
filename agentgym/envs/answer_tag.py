"""The inside of a reply's last ``<answer>...</answer>``, read in linear time (the text envs' answer format)."""

from __future__ import annotations

import re

_OPEN_RE = re.compile(re.escape("<answer>"), re.IGNORECASE)
_CLOSE_RE = re.compile(re.escape("</answer>"), re.IGNORECASE)


def last_answer(text: str) -> str | None:
    """The inside of the last ``<answer>...</answer>`` (tags matched left to right, case-insensitive,
    as the lazy regex ``<answer>(.*?)</answer>`` would pair them), found in one pass: a reply full of
    unclosed tags costs no more than any other (the regex's ``findall`` is quadratic there)."""
    answer, pos = None, 0
    while (opened := _OPEN_RE.search(text, pos)) and (closed := _CLOSE_RE.search(text, opened.end())):
        answer, pos = text[opened.end() : closed.start()], closed.end()
    return answer
