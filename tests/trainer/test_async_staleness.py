"""Admission control and the lag bound of asynchronous training (``agentgym.trainer.staleness``,
``agentgym.trainer.async_loop``), on a simulated rollout side with heavy-tailed episode lengths."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from agentgym.rollout.data_pool import DataPool, PoolClient
from agentgym.trainer.async_loop import AsyncCoordinator
from agentgym.trainer.dynamic_sampling import GroupFilter
from agentgym.trainer.staleness import StalenessPlan, select_batch
from agentgym.types import Trajectory, Turn


def test_budget_and_bound_formulas():
    assert StalenessPlan(8, 1, 0.0).budget == 8 and StalenessPlan(8, 1, 0.0).max_lag == 0
    assert StalenessPlan(8, 4, 0.0).max_lag == 3
    plan = StalenessPlan(8, 4, 0.1)
    assert plan.budget == 35 and plan.max_lag == 4  # floor(1.1 * 32) = 35; ceil(35 / 8) - 1
    assert plan.may_admit(34, 0) and not plan.may_admit(35, 0) and plan.may_admit(35, 4)
    assert StalenessPlan(8, 4, 0.1, total_tasks=20).admission_limit(0) == 20
    assert StalenessPlan(4, 2, 1.0).max_lag == 3


def test_select_batch_takes_completion_order_unless_a_deadline_needs_a_group():
    plan = StalenessPlan(2, 1, 1.0)  # A = 4, L = 1: a task admitted under v is due by update v + 2
    groups = [
        {"group_id": f"g{i}", "ticket": i, "version": 0, "complete": i >= 1, "completed": 3 - i} for i in range(4)
    ]
    # update 1: completion order (g3, g2), g0 is still running but not due before update 2
    assert select_batch(groups, 1, plan, version=0, started=4).group_ids == ["g2", "g3"]
    left = [g for g in groups if g["group_id"] in ("g0", "g1")]
    # update 2: g0 and g1 are due now; g0 still runs, so the trainer waits although ...
    choice = select_batch(
        left
        + [
            {"group_id": "g4", "ticket": 4, "version": 1, "complete": True, "completed": 9},
            {"group_id": "g5", "ticket": 5, "version": 1, "complete": True, "completed": 10},
        ],
        2,
        plan,
        1,
        6,
    )
    assert choice.group_ids is None and choice.deadline_wait  # ... two other groups are complete
    left[0]["complete"], left[0]["completed"] = True, 11
    assert select_batch(left, 2, plan, version=1, started=6).group_ids == ["g0", "g1"]


class SimServer:
    """A policy server's weight version, and pushes that take a moment."""

    def __init__(self) -> None:
        self.version = 0

    async def push(self, version: int, snapshot: object, abort: bool) -> dict[str, float]:
        await asyncio.sleep(0.002)
        self.version = version
        return {"weight_sync/version": float(version)}


class SimSource:
    """Tasks with heavy-tailed lengths; each token is stamped with the server's version when sampled
    (a push in the middle of an episode shows up in its versions, as with partial rollout)."""

    resumes_aborted = True

    def __init__(self, server: SimServer, rng: random.Random, lengths: list[int], n: int, tick: float) -> None:
        self.server, self.lengths, self.n, self.tick = server, lengths, n, tick
        self.next_index = 0
        self.started_lengths: list[int] = []

    async def next_tasks(self) -> list[dict]:
        out = [{"index": self.next_index + i} for i in range(4)]
        self.next_index += 4
        return out

    async def run_task(self, task: dict, group_id: str) -> list[Trajectory]:
        length = self.lengths[task["index"] % len(self.lengths)]
        self.started_lengths.append(length)
        versions = []
        for _ in range(length):
            await asyncio.sleep(self.tick)
            versions.append(self.server.version)
        turn = Turn(
            prompt_ids=[1],
            response_ids=[2] * length,
            logprobs=[0.0] * length,
            weight_version=versions[0],
            token_versions=versions,
        )
        return [Trajectory(turns=[turn], task=dict(task), metrics={"length": float(length)}) for _ in range(self.n)]


async def _simulate(
    plan: StalenessPlan,
    steps: int,
    partial: bool,
    lengths: list[int],
    rng: random.Random,
    require_batches: int = 1,
    checkpoint_engine: bool = False,
    max_queue: int | None = None,
):
    server = SimServer()
    source = SimSource(server, rng, lengths, n=2, tick=0.0004)
    pool = PoolClient(DataPool(max_queue_size=max_queue))
    snapshot = (lambda: "weights") if checkpoint_engine else None
    coordinator = AsyncCoordinator(
        source, pool, plan, server.push, partial_rollout=partial, snapshot=snapshot, max_tasks_in_flight=16
    )
    trained, lags, deadline_waits = [], [], 0
    step = 0
    try:
        while step < steps:
            count = min(require_batches, steps - step, plan.sync_every - step % plan.sync_every)
            batches = [await coordinator.next_batch(step + 1 + i) for i in range(count)]
            for trajectories, metrics, _ in batches:
                step += 1
                for traj in trajectories:
                    lags.append(step - 1 - traj.oldest_version())
                trained += [(t.task["index"], t.metrics["length"]) for t in trajectories[::2]]
                deadline_waits += metrics["async/deadline_wait"]
                await asyncio.sleep(rng.uniform(0.0, 0.004))  # the update
                await coordinator.after_update(step, last=step == steps)
        await coordinator.wait_push()
    finally:
        await coordinator.stop()
    return trained, lags, deadline_waits, source, coordinator


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("AGENTGYM_ASYNC_SEEDS", 6))))
def test_lag_bound_exactly_once_and_no_length_bias_under_heavy_tails(seed):
    """Random heavy-tailed lengths (Pareto; and 10% of episodes 8x longer), random b, K, s, partial
    rollout, require_batches, checkpoint engine: every trained sample within the bound, every admitted
    task trained exactly once, so trained and started episodes have the same mean length."""
    rng = random.Random(seed)
    b, k, s = rng.choice([2, 3, 4]), rng.choice([1, 2, 3]), rng.choice([0.0, 0.1, 0.5, 1.0])
    plan = StalenessPlan(b, k, s, total_tasks=None)
    steps = rng.randint(6, 10)
    plan = StalenessPlan(b, k, s, total_tasks=steps * b)
    if seed % 2:
        lengths = [int(min(200, 3 * rng.paretovariate(1.3))) for _ in range(64)]
    else:
        lengths = [24 if rng.random() < 0.1 else 3 for _ in range(64)]
    partial = bool(seed % 3)
    trained, lags, deadline_waits, source, coordinator = asyncio.run(
        _simulate(
            plan,
            steps,
            partial,
            lengths,
            rng,
            require_batches=rng.choice([1, 2]),
            checkpoint_engine=rng.random() < 0.5,
            max_queue=rng.choice([None, 2 * b]),
        )
    )
    assert max(lags) <= plan.max_lag, (lags, plan)
    indices = [index for index, _ in trained]
    assert sorted(indices) == list(range(steps * b))  # admitted = trained, each once
    assert coordinator.started == steps * b
    started_mean = statistics.mean(source.started_lengths)
    assert statistics.mean(length for _, length in trained) == pytest.approx(started_mean)
    if not partial:  # completion order alone keeps the bound: the trainer never waits for a deadline
        assert deadline_waits == 0


def test_staleness_zero_sync_every_step_trains_in_task_order_on_fresh_weights():
    rng = random.Random(7)
    plan = StalenessPlan(3, 1, 0.0, total_tasks=15)
    lengths = [rng.choice([1, 2, 12]) for _ in range(32)]
    trained, lags, _, _, _ = asyncio.run(_simulate(plan, 5, False, lengths, rng))
    assert lags == [0] * len(lags)
    assert [index for index, _ in trained] == list(range(15))  # the synchronous trainer's batches


def test_max_queue_size_holds_admission_back_and_drops_nothing():
    async def main():
        server = SimServer()
        source = SimSource(server, random.Random(0), [1], n=1, tick=0.0)
        pool = DataPool(max_queue_size=2)
        coordinator = AsyncCoordinator(
            source, PoolClient(pool), StalenessPlan(2, 1, 10.0, total_tasks=40), server.push, max_tasks_in_flight=3
        )
        coordinator.start()
        await asyncio.sleep(0.1)  # the trainer takes nothing meanwhile: admission stops at the bound
        assert coordinator.started <= 2 + 3 and pool.ready_count() <= 2 + 3
        trained = []
        for step in range(1, 21):
            trajectories, _, _ = await coordinator.next_batch(step)
            trained += [t.task["index"] for t in trajectories]
            assert pool.ready_count() <= 2 + 3
            await coordinator.after_update(step, last=step == 20)
        await coordinator.stop()
        assert sorted(trained) == list(range(40))  # every finished group was trained: none dropped

    asyncio.run(main())


# ---- dynamic sampling where groups form ----------------------------------------------------------------------


class FlatSimSource(SimSource):
    """``SimSource`` whose groups of tasks with ``flat(index)`` all score 0; the others score 0 and 1."""

    def __init__(self, *args, flat, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.flat = flat

    async def run_task(self, task: dict, group_id: str) -> list[Trajectory]:
        group = await super().run_task(task, group_id)
        if not self.flat(task["index"]):
            group[-1].outcome_reward = 1.0
        return group


async def _filtered(plan: StalenessPlan, steps: int, partial: bool, flat, drop_budget, rng: random.Random):
    server = SimServer()
    lengths = [rng.choice([1, 2, 3, 12]) for _ in range(64)]
    source = FlatSimSource(server, rng, lengths, n=2, tick=0.0004, flat=flat)
    pool = DataPool()
    coordinator = AsyncCoordinator(
        source,
        PoolClient(pool),
        plan,
        server.push,
        partial_rollout=partial,
        max_tasks_in_flight=16,
        group_filter=GroupFilter(drop_budget=drop_budget),
    )
    trained, lags, windows = [], [], []
    try:
        for step in range(1, steps + 1):
            trajectories, metrics, _ = await coordinator.next_batch(step)
            lags += [step - 1 - t.oldest_version() for t in trajectories]
            trained += [t.task["index"] for t in trajectories[::2]]
            windows.append({**metrics, "trained": [t.task["index"] for t in trajectories[::2]]})
            await asyncio.sleep(rng.uniform(0.0, 0.004))
            await coordinator.after_update(step, last=step == steps)
        await coordinator.wait_push()
    finally:
        await coordinator.stop()
    return trained, lags, windows, coordinator, pool


@pytest.mark.parametrize("seed", range(4))
def test_dynamic_sampling_drops_flat_groups_as_they_form_and_keeps_the_lag_bound(seed):
    """Every third task is flat: none of them is trained, every other task admitted is trained exactly once
    within the lag bound, dropped tasks give their admission place back (the run admits past steps * b and
    still ends), and nothing is left in the pool."""
    rng = random.Random(seed)
    b, k, s = rng.choice([2, 3]), rng.choice([1, 2]), rng.choice([0.0, 0.5])
    steps = rng.randint(4, 7)
    plan = StalenessPlan(b, k, s, total_tasks=steps * b)
    trained, lags, windows, coordinator, pool = asyncio.run(
        _filtered(plan, steps, bool(seed % 2), lambda i: i % 3 == 0, None, rng)
    )
    assert not [i for i in trained if i % 3 == 0]
    assert sorted(trained) == [i for i in range(coordinator.started) if i % 3]
    assert coordinator.dropped == sum(w["sampling/groups_dropped"] for w in windows) > 0
    assert coordinator.started - coordinator.dropped == steps * b and len(pool) == 0 and not coordinator.in_flight
    assert max(lags) <= plan.max_lag
    assert sum(w["sampling/groups_kept"] for w in windows) == steps * b
    assert all(
        w["sampling/groups_sampled"] == w["sampling/groups_kept"] + w["sampling/groups_dropped"] for w in windows
    )


def test_when_every_group_is_flat_the_drop_budget_ends_each_step():
    """All groups flat: at most ``drop_budget`` drops between two batches, then flat groups are kept, so the
    run still ends (as the synchronous trainer trains its last round after max_num_gen_batches)."""
    rng = random.Random(3)
    plan = StalenessPlan(2, 1, 0.0, total_tasks=8)
    trained, _, windows, coordinator, _ = asyncio.run(_filtered(plan, 4, False, lambda i: True, 3, rng))
    assert len(trained) == 8
    assert all(w["sampling/groups_dropped"] <= 3 and w["sampling/flat_group_frac"] == 1.0 for w in windows)
    assert windows[0]["sampling/groups_dropped"] == 3  # the first step waits for its budget to run out
    assert coordinator.dropped == sum(w["sampling/groups_dropped"] for w in windows)


@pytest.mark.parametrize("seed", range(4))
def test_flat_groups_kept_past_the_drop_budget_never_train_beside_a_signal(seed):
    """No drop budget (``max_num_gen_batches=1``: every flat group reaches the pool): every batch that holds a
    group with a signal trains those alone, the flat ones taken with it are counted as left out, and only a
    batch of flat groups alone trains them (the synchronous trainer's last unfiltered round)."""
    rng = random.Random(seed)
    b, k, s = rng.choice([2, 3]), rng.choice([1, 2]), rng.choice([0.0, 0.5])
    steps = rng.randint(4, 7)
    plan = StalenessPlan(b, k, s, total_tasks=steps * b)
    trained, lags, windows, coordinator, pool = asyncio.run(
        _filtered(plan, steps, bool(seed % 2), lambda i: i % 3 == 0, 0, rng)
    )
    batches = [w["trained"] for w in windows]
    assert all(all(i % 3 == 0 for i in batch) or not any(i % 3 == 0 for i in batch) for batch in batches)
    flat_alone = sum(len(batch) for batch in batches if all(i % 3 == 0 for i in batch))
    left_out = sum(w["sampling/flat_groups_left_out"] for w in windows)
    assert left_out > 0 and coordinator.dropped == 0
    assert left_out + flat_alone == len([i for i in range(coordinator.started) if i % 3 == 0])
    assert sorted(i for i in trained if i % 3) == [i for i in range(coordinator.started) if i % 3]
    assert len(pool) == 0 and max(lags) <= plan.max_lag


def test_the_drop_budget_grows_with_the_groups_with_a_signal_kept():
    """``drop_budget`` per ``b`` groups with a signal, plus one: a burst of groups finished between two takes
    (several batches' worth) drops its flat groups as the synchronous trainer's rounds would for as many
    batches, instead of keeping them once one batch's budget is spent; the next window starts from one budget."""

    def group(flat: bool) -> list[Trajectory]:
        group = [Trajectory(turns=[Turn(prompt_ids=[1], response_ids=[2], logprobs=[0.0])]) for _ in range(2)]
        group[1].outcome_reward = 0.0 if flat else 1.0
        return group

    f = GroupFilter(drop_budget=2, batch_groups=2)
    kept = [f.keep(group(flat)) for flat in [True] * 3 + [False] * 4 + [True] * 5]
    # 2 dropped, the 3rd kept (no signal yet: one budget); 4 with a signal: 2 + 2 * 2 = 6 drops in all
    assert kept == [False, False, True] + [True] * 4 + [False] * 4 + [True]
    metrics = f.step_metrics()
    assert metrics["sampling/groups_dropped"] == 6 and metrics["sampling/groups_kept"] == 6
    assert [f.keep(group(True)) for _ in range(3)] == [False, False, True]
    assert f.has_signal(group(False)) and not f.has_signal(group(True))
