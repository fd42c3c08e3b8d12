"""The trainer-side part of veRL's reward managers: DAPO's overlong penalty (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.rollout.sources import SourceWrapper, TrajectorySource
from agentgym.types import Trajectory


@dataclass(frozen=True)
class OverlongBuffer:
    """DAPO's soft overlong punishment: responses past ``max_resp_len - len`` tokens lose reward linearly."""

    length: int
    penalty_factor: float
    max_resp_len: int
    log: bool = False

    def __post_init__(self) -> None:
        if self.length <= 0:
            raise ConfigError(
                "reward_model.reward_kwargs.overlong_buffer_cfg.len must be positive when the overlong "
                "penalty is enabled (or set overlong_buffer_cfg.enable=false)"
            )
        if self.max_resp_len < self.length:
            raise ConfigError(
                f"reward_model.reward_kwargs.max_resp_len={self.max_resp_len} must be at least "
                f"overlong_buffer_cfg.len={self.length}"
            )

    def penalty(self, response_length: int) -> float:
        """``min(-(length - expected) / len * penalty_factor, 0)`` with ``expected = max_resp_len - len``."""
        expected = self.max_resp_len - self.length
        return min(-(response_length - expected) / self.length * self.penalty_factor, 0.0)


def overlong_buffer(cfg: DictConfig) -> OverlongBuffer | None:
    """The configured overlong buffer, or None (not dapo, or not enabled)."""
    if cfg.reward_model.reward_manager != "dapo":
        return None
    kwargs = OmegaConf.to_container(cfg.reward_model.reward_kwargs, resolve=True) or {}
    buffer = kwargs.get("overlong_buffer_cfg") or {}
    if not buffer.get("enable"):
        return None
    return OverlongBuffer(
        int(buffer.get("len", 0)),
        float(buffer.get("penalty_factor", 1.0)),
        int(kwargs.get("max_resp_len") or cfg.data.max_response_length),
        bool(buffer.get("log")),
    )


class OverlongPenaltySource(SourceWrapper):
    """Wraps a trajectory source: each collected trajectory's outcome reward gets the overlong penalty
    of its response length (sampled and observation tokens from the first sampled one, veRL's
    ``valid_response_length``). Validation episodes are left as scored."""

    def __init__(self, source: TrajectorySource, buffer: OverlongBuffer) -> None:
        super().__init__(source)
        self.buffer = buffer

    async def collect(self, step: int) -> list[Trajectory]:
        trajectories = await self.source.collect(step)
        for traj in trajectories:
            if traj.status == "failed" or not traj.turns:
                continue
            penalty = self.buffer.penalty(traj.response_length())
            traj.outcome_reward += penalty
            if self.buffer.log:
                traj.metrics["overlong_reward"] = penalty
                traj.metrics["overlong"] = float(penalty < 0)
        return trajectories


def reward_manager_source(cfg: DictConfig, source: Any) -> Any:
    """``source`` with the reward manager's trainer-side part around it (dapo's overlong penalty)."""
    buffer = overlong_buffer(cfg)
    return OverlongPenaltySource(source, buffer) if buffer is not None else source
