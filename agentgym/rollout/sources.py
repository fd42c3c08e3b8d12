"""Where the trainer's trajectories come from.

The trainer asks a ``TrajectorySource`` for one step's trajectories and does not care who
made them: ``EnvRolloutSource`` runs a registered env against the policy servers with the
rollout runner; ``FixedTrajectorySource`` replays given trajectories (tests, replays); the
gateway plugs in its own source for black-box agents (``agentgym train --agent``).

``TrajectorySource`` is the whole contract the trainers use: a source subclasses it and
implements ``collect``; everything else has a default (no validation, no epochs, no state)
that a source overrides when it has the capability. ``SourceWrapper`` is the base of sources
that wrap another one (dynamic sampling, reward models, the overlong penalty): it passes every
part of the contract on to the inner source, and a wrapper overrides what it changes.
"""

from __future__ import annotations

import abc
import contextlib
import copy
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import MappingProxyType
from typing import Any

from agentgym.types import Trajectory

NO_METRICS: Mapping[str, float] = MappingProxyType({})


class TrajectorySource(abc.ABC):
    """Anything that hands the trainer one step's trajectories (see the module docstring).

    Attributes a source sets when it has them (the defaults say it has none):

    * ``steps_per_epoch``: steps in one pass over a dataset (None: endless, e.g. seeds; or only
      known once the env is up, see ``steps_per_epoch_async``);
    * ``last_metrics``: the rollout's metrics of the last ``collect`` (``template_mismatch``,
      ``throughput/episodes_per_s``, ... ; the trainer logs some of them under ``rollout/``);
    * ``sampling_metrics`` / ``reward_metrics``: this step's counts of dynamic sampling and of the
      reward sources, logged as they are;
    * ``resumes_aborted``: whether its episodes continue a generation a weight push aborted
      (partial rollout); a source that cannot holds model calls in ``weight_update`` instead.
    """

    steps_per_epoch: int | None = None
    last_metrics: Mapping[str, float] = NO_METRICS
    sampling_metrics: Mapping[str, float] = NO_METRICS
    reward_metrics: Mapping[str, float] = NO_METRICS
    resumes_aborted: bool = True

    @abc.abstractmethod
    async def collect(self, step: int) -> list[Trajectory]:
        """Step ``step``'s trajectories (trajectories of one task share a ``group_id``)."""

    async def steps_per_epoch_async(self) -> int | None:
        """``steps_per_epoch``, for a source that learns it from its env (an awaited ``env_info``)."""
        return self.steps_per_epoch

    async def validate(self) -> list[Trajectory]:
        """The validation episodes (greedy by default); none by default."""
        return []

    def state_dict(self) -> dict[str, Any] | None:
        """Its data order, saved in checkpoints (None: nothing to save)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        return None

    async def aclose(self) -> None:
        """Release what it holds (runners, clients, threads)."""
        return None

    # ---- asynchronous training (agentgym.trainer.async_trainer) ----------------------------------
    async def next_tasks(self) -> list[dict[str, Any]]:
        """The next update's tasks, in the order ``collect`` would take them."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot feed the asynchronous trainer (it has no next_tasks/run_task); "
            "train it with actor_rollout_ref.hybrid_engine=true, or implement both methods"
        )

    async def run_task(self, task: dict[str, Any], group_id: str) -> list[Trajectory]:
        """One task's group of trajectories."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot feed the asynchronous trainer (it has no next_tasks/run_task); "
            "train it with actor_rollout_ref.hybrid_engine=true, or implement both methods"
        )

    def weight_update(self, weight_version: int | None = None) -> AbstractAsyncContextManager[Any]:
        """``async with source.weight_update(version): <push weights>``: holds model calls during a push
        (a source whose ``resumes_aborted`` is False); by default nothing is held."""
        return contextlib.nullcontext()


class SourceWrapper(TrajectorySource):
    """A source around another one: every part of the contract goes on to ``source`` unless the
    wrapper overrides it."""

    def __init__(self, source: TrajectorySource) -> None:
        self.source = source

    async def collect(self, step: int) -> list[Trajectory]:
        return await self.source.collect(step)

    @property
    def steps_per_epoch(self) -> int | None:  # type: ignore[override]
        return self.source.steps_per_epoch

    @property
    def last_metrics(self) -> Mapping[str, float]:  # type: ignore[override]
        return self.source.last_metrics

    @property
    def sampling_metrics(self) -> Mapping[str, float]:  # type: ignore[override]
        return self.source.sampling_metrics

    @property
    def reward_metrics(self) -> Mapping[str, float]:  # type: ignore[override]
        return self.source.reward_metrics

    @property
    def resumes_aborted(self) -> bool:  # type: ignore[override]
        return self.source.resumes_aborted

    async def steps_per_epoch_async(self) -> int | None:
        return await self.source.steps_per_epoch_async()

    async def validate(self) -> list[Trajectory]:
        return await self.source.validate()

    def state_dict(self) -> dict[str, Any] | None:
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)

    async def aclose(self) -> None:
        await self.source.aclose()

    async def next_tasks(self) -> list[dict[str, Any]]:
        return await self.source.next_tasks()

    async def run_task(self, task: dict[str, Any], group_id: str) -> list[Trajectory]:
        return await self.source.run_task(task, group_id)

    def weight_update(self, weight_version: int | None = None) -> AbstractAsyncContextManager[Any]:
        return self.source.weight_update(weight_version)


def require_source(source: Any) -> TrajectorySource:
    """``source``, refused with a clear error unless it is a ``TrajectorySource``."""
    if not isinstance(source, TrajectorySource):
        raise TypeError(
            f"the trainer's trajectory source must subclass agentgym.rollout.sources.TrajectorySource "
            f"(got {type(source).__name__}): implement its collect(step), and override validate, state_dict, "
            f"... where the source has them (a source wrapping another one: SourceWrapper)"
        )
    return source


class TaskSampler:
    """The data order: which tasks each step trains on.

    A dataset env (``num_tasks`` rows) is walked epoch by epoch, each epoch a permutation
    seeded by ``(seed, epoch)`` when ``shuffle`` (veRL's ``data.shuffle``), dropping the
    last incomplete batch. A generated env (``num_tasks`` None) takes consecutive seeds from
    ``seed_start``. ``state_dict`` is the position, so a resumed run sees the same tasks.
    """

    def __init__(
        self, num_tasks: int | None, batch_size: int, seed: int = 0, shuffle: bool = True, seed_start: int = 0
    ) -> None:
        if num_tasks is not None and num_tasks < batch_size:
            raise ValueError(
                f"the env has {num_tasks} tasks, fewer than data.train_batch_size={batch_size}; "
                "lower data.train_batch_size or give more data"
            )
        self.num_tasks = num_tasks
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.seed_start = seed_start
        self.epoch = 0
        self.position = 0

    @property
    def steps_per_epoch(self) -> int | None:
        return None if self.num_tasks is None else self.num_tasks // self.batch_size

    def _order(self, epoch: int) -> list[int]:
        from agentgym.rollout.runner import epoch_order

        return epoch_order(self.num_tasks or 0, epoch, self.seed, self.shuffle)

    def next_batch(self) -> list[dict[str, int]]:
        """The next step's tasks as ``{"seed": s}`` or ``{"seed": s, "index": row}``."""
        if self.num_tasks is None:
            start = self.seed_start + self.position
            self.position += self.batch_size
            return [{"seed": start + i} for i in range(self.batch_size)]
        if self.position + self.batch_size > self.num_tasks:
            self.epoch += 1
            self.position = 0
        rows = self._order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [{"seed": self.seed_start + self.epoch * self.num_tasks + row, "index": row} for row in rows]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


class FixedTrajectorySource(TrajectorySource):
    """Replays fixed batches: step ``s`` gets ``batches[(s - 1) % len(batches)]`` (fresh copies)."""

    def __init__(self, batches: Sequence[Sequence[Trajectory]], validation: Sequence[Trajectory] = ()) -> None:
        if not batches:
            raise ValueError("FixedTrajectorySource needs at least one batch")
        self.batches = [list(b) for b in batches]
        self.validation = list(validation)
        self.steps_per_epoch: int | None = len(self.batches)

    async def collect(self, step: int) -> list[Trajectory]:
        return copy.deepcopy(self.batches[(step - 1) % len(self.batches)])

    async def validate(self) -> list[Trajectory]:
        return copy.deepcopy(self.validation)


class EnvRolloutSource(TrajectorySource):
    """Episodes of a registered env, sampled from the policy servers by the rollout runner.

    Training: ``data.train_batch_size`` tasks per ``collect`` (``TaskSampler``; ``data.gen_batch_size``
    per round under dynamic sampling), ``rollout.n`` episodes each. Validation: ``data.val_batch_size`` tasks (seeds
    from
    ``env.val_seed_start``, or the rows of ``data.val_files``), sampled with
    ``rollout.val_kwargs`` (greedy by default).
    """

    def __init__(self, cfg: Any, client: Any, tokenizer: Any) -> None:
        from agentgym.rollout.runner import RolloutConfig, RolloutRunner

        self.cfg = cfg
        rollout = cfg.actor_rollout_ref.rollout
        env_cfg = cfg.env
        common = {
            "max_tokens": int(rollout.max_tokens_per_turn),
            "prompt_length": cfg.data.max_prompt_length,
            "response_length": cfg.data.max_response_length,
            "max_turns": rollout.multi_turn.max_assistant_turns,
            "max_concurrency": int(rollout.concurrency),
            "env_executor": env_cfg.executor,
            "env_timeout": env_cfg.timeout,
            "env_workers": env_cfg.workers,
            "worker_env_executor": env_cfg.worker_executor,
            "env_urls": list(env_cfg.urls or ()),
            "sampling_seed": rollout.sampling_seed,
            "context_policy": rollout.multi_turn.context_policy,
            "context_window": rollout.multi_turn.context_window,
        }
        train_kwargs = dict(env_cfg.kwargs)
        if cfg.data.train_files:
            train_kwargs["data_files"] = _files(cfg.data.train_files)
        val_kwargs = {**train_kwargs, **dict(env_cfg.val_kwargs)}
        if cfg.data.val_files:
            val_kwargs["data_files"] = _files(cfg.data.val_files)
        self.train_runner = RolloutRunner(
            env_cfg.name,
            client,
            tokenizer,
            RolloutConfig(
                n=int(rollout.n),
                temperature=float(rollout.temperature),
                top_p=float(rollout.top_p),
                top_k=int(rollout.top_k),
                partial_rollout=cfg.async_training.partial_rollout,
                **common,
            ),
            env_kwargs=train_kwargs,
        )
        val = rollout.val_kwargs
        self.val_runner = RolloutRunner(
            env_cfg.name,
            client,
            tokenizer,
            RolloutConfig(
                n=int(val.n), temperature=float(val.temperature), top_p=float(val.top_p), top_k=int(val.top_k), **common
            ),
            env_kwargs=val_kwargs,
        )
        self.baseline_runner = None
        if str(cfg.algorithm.adv_estimator) == "remax":  # veRL's ReMax: one greedy episode per task as its baseline
            self.baseline_runner = RolloutRunner(
                env_cfg.name,
                client,
                tokenizer,
                RolloutConfig(n=1, temperature=0.0, top_p=1.0, top_k=-1, **common),
                env_kwargs=train_kwargs,
            )
        self.sampler: TaskSampler | None = None
        self._pending_state: dict[str, int] | None = None
        self.last_metrics: dict[str, float] = {}

    async def _sampler(self) -> TaskSampler:
        if self.sampler is None:
            info = await self.train_runner.env_info()
            self.sampler = TaskSampler(
                info.get("num_tasks"),
                round_size(self.cfg),
                seed=self.cfg.trainer.seed,
                shuffle=self.cfg.data.shuffle,
                seed_start=self.cfg.env.train_seed_start,
            )
            if self._pending_state is not None:
                self.sampler.load_state_dict(self._pending_state)
        return self.sampler

    async def steps_per_epoch_async(self) -> int | None:
        return (await self._sampler()).steps_per_epoch

    async def collect(self, step: int) -> list[Trajectory]:
        from agentgym.rollout.runner import Task

        sampler = await self._sampler()
        tasks = [Task(seed=t["seed"], index=t.get("index")) for t in sampler.next_batch()]
        result = await self.train_runner.run(tasks)
        self.last_metrics = result.metrics
        if self.baseline_runner is not None:
            await self.add_greedy_baselines(tasks, result.trajectories)
        return result.trajectories

    async def add_greedy_baselines(self, tasks: list[Any], trajectories: list[Trajectory]) -> None:
        """ReMax: one greedy episode per task; its score (as the trainer scores: the reward coefficients
        applied) becomes ``metrics["reward_baseline"]`` of every sampled episode of that task. The greedy
        episodes are not trained on."""
        a = self.cfg.algorithm
        turn_coef, outcome_coef = float(a.turn_reward_coef), float(a.outcome_reward_coef)
        greedy = (await self.baseline_runner.run(tasks)).trajectories
        scores = {t.seed: sum(t.token_rewards(turn_coef, outcome_coef)) for t in greedy}
        for traj in trajectories:
            if traj.seed in scores:
                traj.metrics["reward_baseline"] = float(scores[traj.seed])
        if greedy:
            self.last_metrics["rollout/reward_baseline_mean"] = sum(scores.values()) / len(scores)

    # ---- asynchronous training -------------------------------------------------------------
    async def next_tasks(self) -> list[dict[str, Any]]:
        return (await self._sampler()).next_batch()

    async def run_task(self, task: dict[str, Any], group_id: str) -> list[Trajectory]:
        from agentgym.rollout.runner import Task

        result = await self.train_runner.run([Task(seed=task["seed"], index=task.get("index"))])
        self.last_metrics = result.metrics
        return result.trajectories

    async def validate(self) -> list[Trajectory]:
        from agentgym.rollout.runner import Task

        info = await self.val_runner.env_info()
        count = self.cfg.data.val_batch_size
        num_tasks = info.get("num_tasks")
        if num_tasks is None:
            start = self.cfg.env.val_seed_start
            tasks = [Task(seed=start + i) for i in range(count)]
        else:
            tasks = [Task(seed=i, index=i) for i in range(min(count, num_tasks))]
        return (await self.val_runner.run(tasks)).trajectories

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict() if self.sampler is not None else self._pending_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("sampler") is None:
            return
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        else:
            self._pending_state = dict(state["sampler"])

    async def aclose(self) -> None:
        await self.train_runner.aclose()
        await self.val_runner.aclose()
        if self.baseline_runner is not None:
            await self.baseline_runner.aclose()


def filter_groups_active(cfg: Any) -> bool:
    """Whether dynamic sampling (``algorithm.filter_groups``) drops groups: its ``enable``, except while a
    distillation teacher scores. The filter judges env scores, and a group whose env scores are all equal
    still learns from the teacher's per-token advantages, so it must reach the update."""
    return cfg.algorithm.filter_groups.enable and not cfg.distillation.enable


def round_size(cfg: Any) -> int:
    """Tasks per ``collect``: ``data.train_batch_size``, or ``data.gen_batch_size`` when dynamic sampling
    (``algorithm.filter_groups``) collects several rounds per step."""

    if filter_groups_active(cfg) and cfg.data.gen_batch_size:
        return cfg.data.gen_batch_size
    return cfg.data.train_batch_size


def _files(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
