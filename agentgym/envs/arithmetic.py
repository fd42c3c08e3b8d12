"""Arithmetic: GSM8K's answer format on problems a tiny model can learn in minutes.

One turn. The seed draws ``operands`` numbers of up to ``digits`` digits and a sum or
difference of them ("What is 47 + 38 - 12?"); the reply is scored like GSM8K: the last
number after ``####`` must equal the result (the outcome reward is 1, else 0; with
``format_score``, as veRL's GSM8K score, a wrong number after ``####`` earns that much, and
``success`` stays the right answer only). Reasoning before the ``####`` is allowed. The expert answers ``#### 73``
(``agentgym demos``); a
random policy answers a uniform number in the result's range.

    env = agentgym.make("arithmetic", digits=2, operands=3)

``agentgym train --env arithmetic`` (configs/env/arithmetic.yaml, 2-digit sums) runs demos -> SFT ->
GRPO on it with the tiny model; measured from clean directories it does not show RL learning (the
figures are in the preset and docs/results.md). SmolLM2 learns its one-digit variant
(configs/env/arithmetic/smollm2-135m.yaml).
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentgym.envs.base import TextEnv, reply_text
from agentgym.types import Action, Message

_ANSWER_RE = re.compile(r"####\s*(-?\d+)")


class ArithmeticEnv(TextEnv):
    """Add and subtract a few numbers; answer after '####' (GSM8K's format), reward 1 if right."""

    max_turns = 1

    def __init__(
        self,
        digits: int = 2,
        operands: int = 2,
        subtract: bool = True,
        system_prompt: str | None = None,
        format_score: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if digits < 1 or operands < 2:
            raise ValueError("digits must be at least 1 and operands at least 2")
        self.digits, self.operands, self.subtract = int(digits), int(operands), bool(subtract)
        self.system_prompt = system_prompt
        self.format_score = float(format_score)
        self._answer: int | None = None
        self._reply = ""

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The problem drawn from ``seed``: one user message (after the system prompt, if any)."""
        super().reset(seed=seed)
        rng = random.Random(seed)
        top = 10**self.digits - 1
        numbers = [rng.randint(0, top) for _ in range(self.operands)]
        signs = ["+"] + [rng.choice("+-") if self.subtract else "+" for _ in numbers[1:]]
        self._answer = sum(n if s == "+" else -n for s, n in zip(signs, numbers, strict=True))
        question = str(numbers[0]) + "".join(f" {s} {n}" for s, n in zip(signs[1:], numbers[1:], strict=True))
        self._reply = ""
        messages: list[Message] = [{"role": "user", "content": f"What is {question}?"}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {"answer": self._answer}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Score the reply; the episode ends. ``info``: ``outcome_reward``, ``success``, ``answer``."""
        if self._answer is None:
            raise RuntimeError("call reset() before step()")
        self._reply = reply_text(action)
        found = _ANSWER_RE.findall(self._reply[-1024:])
        success = bool(found) and int(found[-1]) == self._answer
        outcome = 1.0 if success else self.format_score if found else 0.0
        info = {
            "outcome_reward": outcome,
            "success": success,
            "answer": self._answer,
            "metrics": {"formatted": float(bool(found))},
        }
        self._answer = None
        return [], 0.0, True, False, info

    def expert_action(self) -> str | None:
        return None if self._answer is None else f"#### {self._answer}"

    def random_action(self, rng: random.Random) -> str:
        reach = self.operands * (10**self.digits - 1)
        return f"#### {rng.randint(-reach if self.subtract else 0, reach)}"

    def render(self) -> str | None:
        return self._reply
