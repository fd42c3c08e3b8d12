"""DAPO's dynamic sampling (Yu et al. 2025; veRL's ``algorithm.filter_groups``): a step trains only
on groups whose episodes scored differently.

A group whose episodes all score the same gets advantage 0 under every group-relative estimator,
yet it still costs its forward and backward passes and, with a per-sequence loss mean, dilutes the
groups that do carry a signal. ``DynamicSamplingSource`` wraps any trajectory source: it collects
rounds from the source (``data.gen_batch_size`` tasks each, for env sources), keeps the groups
whose ``metric`` has a spread, and stops once it holds ``data.train_batch_size`` of them (the rest
of the last round is dropped, as DAPO does) or after ``max_num_gen_batches`` rounds, when the step
trains on the groups it has. A step where no group had a spread returns its last round unfiltered,
so the trainer's flat-reward warning still fires.

``metric``: ``score``, the trajectory's reward as the trainer sums it (``turn_reward_coef`` x turn
rewards + ``outcome_reward_coef`` x outcome), or ``acc``, its success. Metrics of each step (in
``sampling_metrics``, logged as ``sampling/*``): rollout rounds, groups sampled and kept, the share
of sampled groups that were flat, the episodes sampled beyond one round, and the success rate over
every sampled episode (the step's ``success_rate`` is over the kept groups only).
"""

from __future__ import annotations

from typing import Any

from agentgym.rollout.sources import SourceWrapper, TrajectorySource
from agentgym.trainer.algos import scores_equal
from agentgym.types import Trajectory


def episode_score(traj: Trajectory, metric: str, turn_reward_coef: float, outcome_reward_coef: float) -> float:
    if metric == "acc":
        return float(traj.success)
    return turn_reward_coef * sum(t.reward for t in traj.turns) + outcome_reward_coef * traj.outcome_reward


def groups_in_order(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {}
    for i, traj in enumerate(trajectories):
        groups.setdefault(traj.group_id or f"traj-{i}", []).append(traj)
    return list(groups.values())


def has_spread(group: list[Trajectory], metric: str, turn_reward_coef: float, outcome_reward_coef: float) -> bool:
    played = [t for t in group if t.trainable]
    if len(played) < 2:
        return False
    return not scores_equal([episode_score(t, metric, turn_reward_coef, outcome_reward_coef) for t in played])


class DynamicSamplingSource(SourceWrapper):
    """A trajectory source that keeps only groups with a score spread, sampling more rounds to fill a step."""

    def __init__(
        self,
        source: TrajectorySource,
        train_batch_size: int,
        metric: str = "score",
        max_rounds: int = 4,
        turn_reward_coef: float = 1.0,
        outcome_reward_coef: float = 1.0,
    ) -> None:
        super().__init__(source)
        self.train_batch_size = int(train_batch_size)
        self.metric = metric
        self.max_rounds = int(max_rounds)
        self.turn_reward_coef = turn_reward_coef
        self.outcome_reward_coef = outcome_reward_coef
        self._sampling_metrics: dict[str, float] = {}

    @classmethod
    def from_cfg(cls, cfg: Any, source: TrajectorySource) -> DynamicSamplingSource:
        fg = cfg.algorithm.filter_groups
        return cls(
            source,
            cfg.data.train_batch_size,
            fg.metric,
            fg.max_num_gen_batches,
            cfg.algorithm.turn_reward_coef,
            cfg.algorithm.outcome_reward_coef,
        )

    @property
    def sampling_metrics(self) -> dict[str, float]:  # type: ignore[override]
        return self._sampling_metrics

    async def collect(self, step: int) -> list[Trajectory]:
        kept: list[list[Trajectory]] = []
        rounds = sampled = flat = episodes = solved = first_round = 0
        last: list[Trajectory] = []
        while len(kept) < self.train_batch_size and (self.max_rounds <= 0 or rounds < self.max_rounds):
            last = await self.source.collect(step)
            rounds += 1
            first_round = first_round if rounds > 1 else len(last)
            episodes += len(last)
            solved += sum(episode_score(t, "acc", 0.0, 0.0) > 0 for t in last)
            for group in groups_in_order(last):
                sampled += 1
                if has_spread(group, self.metric, self.turn_reward_coef, self.outcome_reward_coef):
                    kept.append(group)
                else:
                    flat += 1
        kept = kept[: self.train_batch_size]
        self._sampling_metrics = {
            "sampling/rounds": float(rounds),
            "sampling/groups_sampled": float(sampled),
            "sampling/groups_kept": float(len(kept)),
            "sampling/flat_group_frac": flat / sampled if sampled else 0.0,
            "sampling/extra_episodes": float(episodes - first_round),
            "sampling/success_rate": solved / episodes if episodes else 0.0,  # every sampled episode, kept or not
        }
        if not kept:
            return last
        return [traj for group in kept for traj in group]


class GroupFilter:
    """Dynamic sampling where groups form, for the asynchronous trainer (``AsyncCoordinator``): each
    finished group is judged before it reaches the DataPool; a flat one is dropped and frees its admission
    place, so the rollout side starts another task in its stead.

    ``drop_budget`` bounds the drops as ``max_num_gen_batches`` bounds the synchronous trainer's rounds: a
    step samples at most ``max_num_gen_batches * gen_batch_size`` tasks to train ``train_batch_size`` (``b``)
    groups, so at most the difference is dropped per ``b`` groups with a signal. Between two batches taken
    the filter drops up to ``drop_budget`` flat groups, and ``drop_budget`` more for every ``b`` groups with a
    signal it kept in that time (the rollout side finishes groups in bursts after each weight push, several
    batches' worth between two takes: a fixed count per take ran out while most of the burst was still to
    come, and the Sokoban main job kept 44 flat groups past it on one seed). Past that flat groups
    are kept, so a run whose groups are all flat still ends; they reach the pool, but the coordinator never
    trains one beside a group with a signal (``has_signal`` at the take: as the synchronous trainer, a step
    trains on the groups with a signal it has, and only a step with none trains its flat groups, which get
    the flat-reward warning). None: no bound (``max_num_gen_batches <= 0``).

    ``step_metrics()`` gives the ``sampling/*`` counts of the groups finished since the last call (the
    synchronous trainer's names where they apply) and starts the next window.
    """

    def __init__(
        self,
        metric: str = "score",
        drop_budget: int | None = None,
        turn_reward_coef: float = 1.0,
        outcome_reward_coef: float = 1.0,
        batch_groups: int = 1,
    ) -> None:
        self.metric = metric
        self.drop_budget = drop_budget
        self.batch_groups = max(1, int(batch_groups))
        self.turn_reward_coef = turn_reward_coef
        self.outcome_reward_coef = outcome_reward_coef
        self._window = dict.fromkeys(("sampled", "kept", "signal", "flat", "dropped", "episodes", "solved"), 0)

    @classmethod
    def from_cfg(cls, cfg: Any) -> GroupFilter:
        fg = cfg.algorithm.filter_groups
        b = cfg.data.train_batch_size
        rounds = fg.max_num_gen_batches
        budget = None if rounds <= 0 else max(0, rounds * (cfg.data.gen_batch_size or b) - b)
        return cls(fg.metric, budget, cfg.algorithm.turn_reward_coef, cfg.algorithm.outcome_reward_coef, b)

    def has_signal(self, group: list[Trajectory]) -> bool:
        """Whether ``group``'s episodes scored differently (the spread test, counting nothing)."""
        return has_spread(group, self.metric, self.turn_reward_coef, self.outcome_reward_coef)

    def allowance(self) -> int | None:
        """Flat groups this window may drop: ``drop_budget``, plus ``drop_budget`` per ``b`` groups with a signal
        kept in it (see the class docstring); None: no bound."""
        if self.drop_budget is None:
            return None
        return self.drop_budget * (1 + self._window["signal"] // self.batch_groups)

    def keep(self, group: list[Trajectory]) -> bool:
        """Whether ``group`` (one task's trajectories) goes to the pool; counts it."""
        w = self._window
        w["sampled"] += 1
        w["episodes"] += len(group)
        w["solved"] += sum(bool(t.success) for t in group)
        if self.has_signal(group):
            w["kept"] += 1
            w["signal"] += 1
            return True
        w["flat"] += 1
        allowance = self.allowance()
        if allowance is not None and w["dropped"] >= allowance:
            w["kept"] += 1
            return True
        w["dropped"] += 1
        return False

    def step_metrics(self) -> dict[str, float]:
        w, self._window = self._window, dict.fromkeys(self._window, 0)
        return {
            "sampling/groups_sampled": float(w["sampled"]),
            "sampling/groups_kept": float(w["kept"]),
            "sampling/groups_dropped": float(w["dropped"]),
            "sampling/flat_group_frac": w["flat"] / w["sampled"] if w["sampled"] else 0.0,
            "sampling/success_rate": w["solved"] / w["episodes"] if w["episodes"] else 0.0,
        }
