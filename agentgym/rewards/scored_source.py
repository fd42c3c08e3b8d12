"""A trajectory source whose trajectories a model scores before the trainer sees them.

``ScoredSource`` wraps any trajectory source (env rollouts, several envs, the gateway's agent
sessions): after each ``collect`` (and each ``run_task`` of the asynchronous trainer) it hands the
finished trajectories to a scorer (a reward model, an LLM judge, a distillation teacher) and returns
them. Validation episodes are not scored: they keep the env's own score, so ``val/*`` measures the
task while training follows the model.

A scorer is ``async score(trajectories) -> dict[str, float]`` (its counts for the step) with an
optional ``async aclose()``. Over the rounds of one step (dynamic sampling collects several) counts
are summed and ``*/mean`` values averaged; the trainer logs them from ``reward_metrics``.

``apply_score`` is how a model's score meets the env's: veRL's reward managers return the reward
model's scores as the reward and do not compute the rule-based score at all, so ``replace`` (the
default) makes the score the trajectory's whole reward (its outcome reward; turn rewards set to 0)
and keeps the env's in ``metrics["rule_reward"]``; ``add`` adds the score to the env's rewards.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from agentgym.config import ConfigError
from agentgym.rollout.sources import SourceWrapper, TrajectorySource
from agentgym.types import Trajectory

COMBINE_MODES = ("replace", "add")


class Scorer(Protocol):
    async def score(self, trajectories: list[Trajectory]) -> dict[str, float]: ...


def apply_score(traj: Trajectory, score: float, combine: str) -> None:
    """Put a model's ``score`` on ``traj`` (see the module docstring); the env's reward is kept in
    ``metrics["rule_reward"]`` and the model's in ``metrics["model_score"]``."""
    if combine not in COMBINE_MODES:
        raise ConfigError(f"combine={combine!r} is not one of {', '.join(COMBINE_MODES)}")
    traj.metrics["rule_reward"] = traj.total_reward
    traj.metrics["model_score"] = float(score)
    if combine == "replace":
        for turn in traj.turns:
            turn.reward = 0.0
        traj.outcome_reward = float(score)
    else:
        traj.outcome_reward += float(score)


def refuse(traj: Trajectory, why: str) -> None:
    """Keep ``traj`` for inspection but out of training (the trainer never trains a failed episode)."""
    traj.status = "failed"
    traj.failure = why


def scorable(traj: Trajectory) -> bool:
    return traj.status != "failed" and bool(traj.turns)


class ScoredSource(SourceWrapper):
    """``source`` with ``scorer`` applied to every trajectory it collects (see the module docstring)."""

    def __init__(self, source: TrajectorySource, scorer: Scorer, name: str) -> None:
        super().__init__(source)
        self.scorer = scorer
        self.name = name
        self._sums: dict[str, float] = {}
        self._rounds: dict[str, int] = {}
        self._step: int | None = None

    @property
    def reward_metrics(self) -> dict[str, float]:  # type: ignore[override]
        """This step's counts: the scorer's, and those of any scored source inside this one."""
        own = {k: v / self._rounds[k] if k.endswith("/mean") else v for k, v in self._sums.items()}
        return {**self.source.reward_metrics, **own}

    def _count(self, step: int | None, counts: dict[str, float]) -> None:
        if step is None or step != self._step:  # a new step (run_task: each task on its own)
            self._sums, self._rounds = {}, {}
            self._step = step
        for key, value in counts.items():
            self._sums[key] = self._sums.get(key, 0.0) + float(value)
            self._rounds[key] = self._rounds.get(key, 0) + 1

    async def collect(self, step: int) -> list[Trajectory]:
        trajectories = await self.source.collect(step)
        self._count(step, await self.scorer.score(trajectories))
        return trajectories

    async def run_task(self, task: dict[str, Any], group_id: str) -> list[Trajectory]:
        trajectories = await self.source.run_task(task, group_id)
        self._count(None, await self.scorer.score(trajectories))
        return trajectories

    async def aclose(self) -> None:
        try:
            closer = getattr(self.scorer, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        finally:
            await self.source.aclose()
