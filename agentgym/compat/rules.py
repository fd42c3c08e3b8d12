"""A key rule: what happens to another system's config key that agentgym's ``train.yaml`` lacks."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Verdict = tuple[str, str]
"""``("ignore", reason)`` | ``("refuse", reason)`` | ``("alias", agentgym_key)``."""

ANY = object()


@dataclass(frozen=True)
class Rule:
    """``pattern``: an ``fnmatch`` pattern on the dotted key. ``action``:

    * ``ignore``: accepted with no effect (``reason`` says why); when ``unless`` is given, only
      those values are harmless and any other value is refused, naming ``reason``;
    * ``refuse``: rejected; ``reason`` says what to use instead;
    * ``alias``: another name for the agentgym key ``reason``.
    """

    pattern: str
    action: str
    reason: str
    unless: Sequence[Any] | object = ANY

    def verdict(self, key: str, value: Any) -> Verdict:
        if self.action == "ignore" and self.unless is not ANY and not _harmless(value, self.unless):
            return ("refuse", f"agentgym cannot honour {key}={value!r}: {self.reason}")
        return (self.action, self.reason)


def _harmless(value: Any, allowed: Any) -> bool:
    values = allowed if isinstance(allowed, (list, tuple)) else [allowed]
    return any(value == v or (v == {} and value in ({}, None)) for v in values)


def apply_rules(rules: Sequence[Rule], key: str, value: Any) -> Verdict | None:
    """The first rule whose pattern matches ``key``, applied to ``value``; None when none does."""
    for rule in rules:
        if fnmatch.fnmatchcase(key, rule.pattern):
            return rule.verdict(key, value)
    return None
