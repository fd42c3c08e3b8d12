"""The TrajectorySource contract: defaults for what a source lacks, wrappers that pass everything on,
and a trainer that refuses anything else."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agentgym.rollout.sources import FixedTrajectorySource, SourceWrapper, TrajectorySource
from agentgym.trainer.dynamic_sampling import DynamicSamplingSource
from agentgym.types import Trajectory, Turn


def episode(group: str, outcome: float) -> Trajectory:
    turn = Turn(prompt_ids=[5, 6], response_ids=[7], logprobs=[-1.0])
    return Trajectory(turns=[turn], outcome_reward=outcome, group_id=group)


class OnlyCollect(TrajectorySource):
    async def collect(self, step: int) -> list[Trajectory]:
        return [episode("g", 1.0)]


class Everything(TrajectorySource):
    """A source with every optional part, recording what reached it."""

    steps_per_epoch = 7
    resumes_aborted = False

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.loaded = None
        self.last_metrics = {"template_mismatch": 2.0}
        self.reward_metrics = {"reward/rm_scored": 3.0}

    async def collect(self, step: int) -> list[Trajectory]:
        return [episode("a", 0.0), episode("a", 1.0)]

    async def validate(self) -> list[Trajectory]:
        return [episode("v", 1.0)]

    def state_dict(self):
        return {"position": 4}

    def load_state_dict(self, state) -> None:
        self.loaded = state

    async def next_tasks(self):
        return [{"seed": 1}]

    async def run_task(self, task, group_id):
        return [episode(group_id, 1.0)]

    @contextlib.asynccontextmanager
    async def weight_update(self, weight_version=None):
        self.calls.append(f"hold {weight_version}")
        yield

    async def aclose(self) -> None:
        self.calls.append("aclose")


def test_a_source_with_only_collect_gets_the_defaults():
    source = OnlyCollect()
    assert asyncio.run(source.validate()) == []
    assert source.state_dict() is None and source.steps_per_epoch is None
    assert asyncio.run(source.steps_per_epoch_async()) is None
    assert dict(source.last_metrics) == {} and dict(source.reward_metrics) == {} and source.resumes_aborted
    with pytest.raises(NotImplementedError, match="hybrid_engine=true"):
        asyncio.run(source.next_tasks())


def test_a_wrapper_passes_every_part_of_the_contract_on():
    inner = Everything()
    wrapped = DynamicSamplingSource(SourceWrapper(inner), train_batch_size=1, max_rounds=1)
    assert wrapped.steps_per_epoch == 7 and asyncio.run(wrapped.steps_per_epoch_async()) == 7
    assert not wrapped.resumes_aborted
    assert wrapped.last_metrics == {"template_mismatch": 2.0} and wrapped.reward_metrics == {"reward/rm_scored": 3.0}
    assert [t.group_id for t in asyncio.run(wrapped.validate())] == ["v"]
    assert wrapped.state_dict() == {"position": 4}
    wrapped.load_state_dict({"position": 9})
    assert inner.loaded == {"position": 9}
    assert asyncio.run(wrapped.next_tasks()) == [{"seed": 1}]
    assert [t.group_id for t in asyncio.run(wrapped.run_task({"seed": 1}, "x"))] == ["x"]

    async def push() -> None:
        async with wrapped.weight_update(3):
            pass
        await wrapped.aclose()

    asyncio.run(push())
    assert inner.calls == ["hold 3", "aclose"]
    assert len(asyncio.run(wrapped.collect(1))) == 2  # the wrapper's own part: the group has a spread
    assert wrapped.sampling_metrics["sampling/groups_kept"] == 1


def test_the_trainer_refuses_what_is_not_a_trajectory_source():
    from agentgym.trainer.config import load_config
    from agentgym.trainer.ppo_trainer import PPOTrainer

    class Duck:
        async def collect(self, step):
            return []

    cfg = load_config(env="first_letter", overrides=["trainer.use_ray=false"])
    with pytest.raises(TypeError, match="subclass agentgym.rollout.sources.TrajectorySource"):
        PPOTrainer(cfg, Duck(), pad_token_id=0, show_progress=False)
    trainer = PPOTrainer(cfg, FixedTrajectorySource([[episode("g", 1.0)]]), pad_token_id=0, show_progress=False)
    trainer.loop.close()
