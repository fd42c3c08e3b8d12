"""The asynchronous trainer: the same ``PPOTrainer``, with rollout and training overlapped.

``AsyncPPOTrainer`` runs the very same ``train_step`` (batch, log-probs, advantages, updates) as the
synchronous trainer; what changes is where a step's trajectories come from and when the weights go
out. Its asyncio loop runs in a thread of its own, so the rollout side (``AsyncCoordinator._produce``:
admission control, env episodes or gateway sessions, the DataPool) keeps working while the main
thread trains:

* ``AsyncCollector`` stands in for the trajectory source: ``collect(step)`` hands out the groups the
  coordinator's batch choice picks from the DataPool (``async_training.require_batches`` batches are
  taken at once, never across a weight push), ``state_dict`` is the coordinator's consistent cut;
* ``AsyncWeightSync`` stands in for ``WeightSync``: ``push(step)`` pushes every
  ``trigger_parameter_sync_step`` updates and after the last, draining or aborting running
  generations (``partial_rollout``) and, with ``checkpoint_engine.enable``, from a copy of the
  weights taken at that moment while training goes on;
* with Ray and ``hybrid_engine=false`` the trainer's workers go in the trainer pool's placement group,
  disjoint from the rollout pool's (``agentgym.trainer.resource_pools``).

Each step also logs ``async/*``: the version lag (min/mean/max) of the trained trajectories and its
bound, the DataPool's size, the rollout side's and the trainer's idle fractions, the servers'
version; ``rollout_corr/*`` when ``algorithm.rollout_correction.rollout_is`` is on; and ``sampling/*``
with dynamic sampling (``algorithm.filter_groups``), which the coordinator applies to each group as it
finishes (``agentgym.trainer.dynamic_sampling.GroupFilter``) instead of wrapping the source.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from agentgym.rollout.data_pool import DataPool, PoolClient
from agentgym.rollout.sources import TrajectorySource, filter_groups_active, require_source
from agentgym.trainer.async_config import AsyncSettings
from agentgym.trainer.async_loop import AsyncCoordinator
from agentgym.trainer.ppo_trainer import PPOTrainer
from agentgym.trainer.workers import PolicyWorker
from agentgym.types import Trajectory


class AsyncCollector(TrajectorySource):
    """The trajectory source the trainer sees in asynchronous mode (see the module docstring); the
    source it gathers from feeds the coordinator (``next_tasks`` / ``run_task``)."""

    def __init__(self, trainer: AsyncPPOTrainer, source: TrajectorySource) -> None:
        self.trainer = trainer
        self.source = require_source(source)
        self.last_metrics: Mapping[str, float] = {}
        self.step_metrics: dict[str, float] = {}
        self._batches: collections.deque[tuple[int, list[Trajectory], dict[str, float], list[dict[str, Any]]]] = (
            collections.deque()
        )
        self.step_groups: list[dict[str, Any]] = []
        self._pending_state: dict[str, Any] | None = None

    @property
    def steps_per_epoch(self) -> int | None:  # type: ignore[override]
        return self.source.steps_per_epoch

    async def steps_per_epoch_async(self) -> int | None:
        return await self.source.steps_per_epoch_async()

    async def collect(self, step: int) -> list[Trajectory]:
        coordinator = await self.trainer.coordinator_ready()
        if not self._batches:
            settings, total = self.trainer.settings, self.trainer.total_steps
            sync = settings.trigger_parameter_sync_step
            count = min(settings.require_batches, total - step + 1, sync - (step - 1) % sync)
            for k in range(count):
                self._batches.append((step + k, *await coordinator.next_batch(step + k)))
        planned, trajectories, metrics, groups = self._batches.popleft()
        if planned != step:
            raise RuntimeError(f"asynchronous batches out of order: step {step} got update {planned}'s")
        self.step_metrics = metrics
        self.step_groups = groups
        self.last_metrics = self.source.last_metrics
        return trajectories

    async def validate(self) -> list[Trajectory]:
        return await self.source.validate()

    def state_dict(self) -> dict[str, Any]:
        """A consistent cut of the asynchronous state (called from the trainer's thread)."""
        coordinator = self.trainer.run(self.trainer.coordinator_ready())
        state = self.trainer.run(coordinator.checkpoint_state())
        for _, trajectories, _, groups in self._batches:  # taken (require_batches) but not trained yet: back
            for info in groups:  # into the saved pool, to be trained after a resume
                mine = [t.to_dict() for t in trajectories if t.group_id == info["group_id"]]
                state["pool"]["groups"].append({**info, "size": 1, "sessions": [mine]})
        return {"async": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending_state = state.get("async")

    async def aclose(self) -> None:
        if self.trainer.coordinator is not None:
            await self.trainer.coordinator.stop()
        await self.source.aclose()


class AsyncWeightSync:
    """Pushes through the coordinator (see the module docstring); wraps ``WeightSync`` (or nothing,
    for a source that needs no servers: then a push only moves the version)."""

    version = None  # unlike WeightSync's, no version to check samples against: the coordinator bounds the lag

    def __init__(self, trainer: AsyncPPOTrainer, inner: Any) -> None:
        self.trainer = trainer
        self.inner = inner

    async def push(self, version: int) -> dict[str, float]:
        coordinator = await self.trainer.coordinator_ready()
        if coordinator._producer is None:  # before the rollout side starts (a resumed run): push now
            metrics = await self.push_now(version, None, False)
            coordinator.version = version
            return metrics
        return await coordinator.after_update(version, last=version >= self.trainer.total_steps)

    def snapshot(self) -> dict[str, Any]:
        """The trainer's weights as they are now, copied (the checkpoint engine's buffer)."""
        state = self.inner.actor.call(PolicyWorker.full_state_dict)[0]
        return {k: v.detach().clone() for k, v in state.items()}

    async def push_now(self, version: int, snapshot: Any, abort: bool) -> dict[str, float]:
        if self.inner is None:
            return {"weight_sync/version": float(version)}
        return await self.inner.push(version, abort=abort, state=snapshot)

    def cleanup(self) -> None:
        if self.inner is not None:
            self.inner.cleanup()


class AsyncPPOTrainer(PPOTrainer):
    """``PPOTrainer`` with ``hybrid_engine=false`` (see the module docstring)."""

    def __init__(
        self,
        cfg: DictConfig,
        source: TrajectorySource,
        servers: Any = None,
        pad_token_id: int | None = None,
        show_progress: bool = True,
    ) -> None:
        self.settings = AsyncSettings.from_cfg(cfg)
        self.collector = AsyncCollector(self, source)
        self.coordinator: AsyncCoordinator | None = None
        self.pool_actor: Any = None
        self.placement_group: Any = None
        super().__init__(cfg, self.collector, servers, pad_token_id, show_progress)
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="agentgym-async-loop", daemon=True)
        self._loop_thread.start()

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the loop thread and wait for it (the rollout side keeps running meanwhile)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # ---- set-up ----------------------------------------------------------------------------------
    def worker_bundles(self, num_gpus: float) -> Any:
        if not self.use_ray:
            return None
        from agentgym.trainer.resource_pools import trainer_pool

        self.placement_group = trainer_pool(self.cfg, self.world_size, num_gpus)  # always: pools are disjoint
        return self.placement_group

    def init_workers(self) -> None:
        super().init_workers()
        self.weight_sync = AsyncWeightSync(self, self.weight_sync)

    async def coordinator_ready(self) -> AsyncCoordinator:
        """The coordinator, made on first use on the loop thread (with the checkpoint's state)."""
        if self.coordinator is None:
            s = self.settings
            rollout = self.cfg.actor_rollout_ref.rollout
            n = rollout.n
            pool = DataPool(max_queue_size=s.max_queue_size, group_size=n)  # n: sessions of a group pushed
            if self.use_ray:  # from outside (a gateway process)
                from agentgym.rollout.data_pool import create_pool_actor

                self.pool_actor = create_pool_actor(max_queue_size=s.max_queue_size, group_size=n)
                pool = self.pool_actor
            sync = self.weight_sync
            group_filter = None
            if filter_groups_active(self.cfg):
                from agentgym.trainer.dynamic_sampling import GroupFilter

                group_filter = GroupFilter.from_cfg(self.cfg)
            coordinator = AsyncCoordinator(
                self.collector.source,
                PoolClient(pool),
                s.plan(self.cfg.data.train_batch_size, self.total_steps),
                sync.push_now,
                partial_rollout=s.partial_rollout,
                snapshot=sync.snapshot if s.checkpoint_engine and sync.inner is not None else None,
                max_tasks_in_flight=max(1, rollout.concurrency // n),
                group_filter=group_filter,
            )
            if self.collector._pending_state is not None:
                await coordinator.load_state_dict(self.collector._pending_state)
                self.collector._pending_state = None
            self.coordinator = coordinator
        return self.coordinator

    # ---- one step ------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        metrics = super().train_step(step)
        metrics.update(self.collector.step_metrics)
        self.record_batch(step)
        return metrics

    def record_batch(self, step: int) -> None:
        """``<run dir>/async_batches.jsonl``: which tasks each update trained, admitted when and under
        which version (a resumed run writes the steps after its checkpoint again: the last line wins)."""
        import json

        record = {
            "step": step,
            "groups": [
                {"ticket": g.get("ticket"), "version": g.get("version"), "task": g.get("task")}
                for g in self.collector.step_groups
            ],
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "async_batches.jsonl", "a") as f:
            f.write(json.dumps(record, default=str) + "\n")

    def fit(self) -> dict[str, Any]:
        summary = super().fit()
        if self.coordinator is not None:
            self.run(self.coordinator.wait_push())
            summary["lag_histogram"] = dict(sorted(self.coordinator.lag_histogram.items()))
        if self.use_ray and self.actor is not None:  # where the pools landed
            summary["placement"] = {
                "trainer": self.actor.call(PolicyWorker.node_id),
                "rollout": [i["node_id"] for i in getattr(self.servers, "infos", [])],
            }
        return summary

    def shutdown(self) -> None:
        try:
            if self.coordinator is not None:
                self.run(self.coordinator.stop())
        finally:
            super().shutdown()

    def close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=30)
        self.loop.close()
        if self.pool_actor is not None:
            from agentgym.rollout.data_pool import kill_pool_actor

            kill_pool_actor(self.pool_actor)
        if self.placement_group is not None:
            import ray

            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.placement_group)
