"""FirstLetter: start the reply with one of the target letters (default: a vowel).

One turn. The outcome reward is 1 when the reply's first non-space character is in
``targets``, else 0. A random tiny model already does this about one time in five (its
first token is near-uniform over the vocabulary), so the signal is dense from step one
and a policy-gradient method visibly raises the rate within a few steps: this is the
trainer's learning check (``tests/trainer/test_trainer.py``), and a quick sanity run for any
new model or algorithm.

    env = agentgym.make("first_letter", targets="xyz")
"""

from __future__ import annotations

from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.types import Action, Message

PROMPTS = (
    "Say one word that starts with {what}.",
    "Reply with a word beginning with {what}.",
    "Name something whose first letter is {what}.",
    "Give me a word starting with {what}.",
)


class FirstLetterEnv(TextEnv):
    """Start the reply with a target letter (default a vowel); reward 1 if it does."""

    max_turns = 1

    def __init__(
        self, targets: str = "aeiouAEIOU", description: str = "a vowel", render_mode: str | None = None
    ) -> None:
        super().__init__(render_mode=render_mode)
        if not targets:
            raise ValueError("targets must name at least one character")
        self.targets = set(targets)
        self.description = description
        self._prompt: str | None = None
        self._reply = ""

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """One user message asking for a word that starts with a target letter (wording from the seed)."""
        super().reset(seed=seed)
        self._prompt = PROMPTS[int(self.np_random.integers(len(PROMPTS)))].format(what=self.description)
        self._reply = ""
        return [{"role": "user", "content": self._prompt}], {}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Score the reply; the episode ends. ``info``: ``outcome_reward``, ``success``, ``first_char``."""
        if self._prompt is None:
            raise RuntimeError("call reset() before step()")
        self._reply = reply_text(action)
        first = self._reply.lstrip()[:1]
        success = bool(first) and first in self.targets
        self._prompt = None
        info = {
            "outcome_reward": float(success),
            "success": success,
            "first_char": first,
            "metrics": {"hit": float(success)},
        }
        return [], 0.0, True, False, info

    def render(self) -> str | None:
        return self._reply
