"""Each turn's reward taken from a fact the env reports about the turn (``algorithm.turn_reward_from``).

An env's step reward often mixes what the run should learn from with what it shows the model: Sokoban's
feedback text prints each move's reward, and a policy fine-tuned on that text sees other prompts once the
move rewards change. An env can report other per-turn facts in its step ``info`` (``Turn.metrics``),
e.g. Sokoban's ``format_reward`` (0 for a well-formed reply, -1 otherwise). ``TurnFactScorer`` makes
such a fact each turn's reward for training, leaving the env, its rewards and its text as they are: the
env's own step reward is kept in ``Turn.metrics["env_reward"]``, and ``algorithm.turn_reward_coef``
weighs the new turn rewards as it weighs the env's. Validation keeps the env's rewards
(``ScoredSource`` scores training episodes only).
"""

from __future__ import annotations

from typing import Any

from agentgym.types import Trajectory


class TurnFactScorer:
    """Replaces every turn's reward with ``turn.metrics[key]`` (0 when the env did not report it)."""

    def __init__(self, key: str) -> None:
        self.key = key

    async def score(self, trajectories: list[Trajectory]) -> dict[str, float]:
        values: list[float] = []
        missing = 0
        for traj in trajectories:
            for turn in traj.turns:
                turn.metrics["env_reward"] = turn.reward
                value = turn.metrics.get(self.key)
                missing += value is None
                turn.reward = float(value or 0.0)
                values.append(turn.reward)
        out: dict[str, Any] = {f"reward/{self.key}/mean": sum(values) / len(values) if values else 0.0}
        out[f"reward/{self.key}/missing"] = float(missing)  # turns whose env reported no such fact: reward 0
        return out
