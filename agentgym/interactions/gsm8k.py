"""``Gsm8kInteraction``: tell the model whether its GSM8K answer is right; if not, let it retry.

Config (the ``config:`` mapping of its YAML entry), all optional:

* ``max_turns`` (3): answers allowed before the interaction ends the episode;
* ``method`` ("flexible"): how the answer is extracted (see ``agentgym.envs.rewards``);
* ``score`` (1.0) / ``format_score`` (0.0): as in ``compute_score``;
* ``correct_message``, ``incorrect_message``, ``final_message``: the feedback texts.

Expects ``ground_truth`` among the row's ``interaction_kwargs`` (veRL's
``gsm8k_multiturn_w_interaction.py`` puts it there).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from agentgym.envs.rewards import compute_score
from agentgym.interactions.base import BaseInteraction

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."
FINAL = "Your response is incorrect, and no attempts are left."


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The content of the last assistant message ("" if there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


class Gsm8kInteraction(BaseInteraction):
    """Right/wrong feedback on a GSM8K answer, with retries up to ``max_turns``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.max_turns = int(self.config.get("max_turns", 3))
        self.method = str(self.config.get("method", "flexible"))
        self.score = float(self.config.get("score", 1.0))
        self.format_score = float(self.config.get("format_score", 0.0))
        self.correct_message = str(self.config.get("correct_message", CORRECT))
        self.incorrect_message = str(self.config.get("incorrect_message", INCORRECT))
        self.final_message = str(self.config.get("final_message", FINAL))
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> str:
        if instance_id is None:
            instance_id = str(uuid4())
        self._instances[instance_id] = {"ground_truth": ground_truth, "response": "", "reward": 0.0, "turns": 0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            state["ground_truth"] = kwargs.get("ground_truth")
        state["response"] = last_assistant_text(messages)
        state["turns"] += 1
        reward = await self.calculate_score(instance_id)
        state["reward"] = reward
        correct = reward >= self.score
        extra = {"correct": correct, "attempt": state["turns"]}
        if correct:
            return True, self.correct_message, reward, extra
        if state["turns"] >= self.max_turns:
            return True, self.final_message, reward, extra
        return False, self.incorrect_message, reward, extra

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """The score of the latest answer against the ground truth."""
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            raise ValueError("Gsm8kInteraction needs ground_truth in the row's interaction_kwargs")
        return compute_score(state["response"], str(state["ground_truth"]), self.method, self.format_score, self.score)

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
