"""Shared by tests/envs/adapters/test_adapters_*.py: a 2-step ``agentgym train`` whose trajectories are checked
token for token against every call the policy client made, and the skip for a missing package."""

from __future__ import annotations

import importlib.util

import pytest

from agentgym import cli


def needs(module: str, extra: str) -> pytest.MarkDecorator:
    """Skip (cleanly, with the install line) when ``module`` is not importable."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed: pip install 'agentgym[{extra}]'"
    )


def train_two_steps(monkeypatch, tmp_path, env: str, *overrides: str) -> tuple[list, dict]:
    """``agentgym train --env ENV`` for 2 steps in this process; returns (every trained trajectory,
    every generate call as {(prompt ids, response ids): logprobs})."""
    from agentgym.client import PolicyClient
    from agentgym.rollout.sources import EnvRolloutSource

    calls: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]] = {}
    trajectories: list = []
    generate, collect = PolicyClient.generate, EnvRolloutSource.collect

    async def recording_generate(self, prompt_ids, sampling=None, session_id=None):
        sample = await generate(self, prompt_ids, sampling, session_id=session_id)
        calls[(tuple(prompt_ids), tuple(sample.token_ids))] = list(sample.logprobs)
        return sample

    async def recording_collect(self, step):
        out = await collect(self, step)
        trajectories.extend(out)
        return out

    monkeypatch.setattr(PolicyClient, "generate", recording_generate)
    monkeypatch.setattr(EnvRolloutSource, "collect", recording_collect)
    code = cli.main(
        [
            "train",
            "--env",
            env,
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[jsonl]",
            "trainer.use_ray=false",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.log_samples=0",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            *overrides,
        ]
    )
    assert code == 0
    assert (tmp_path / "metrics.jsonl").is_file()
    return trajectories, calls


def assert_token_exact(trajectories: list, calls: dict) -> None:
    """Every turn: the sequence so far is a prompt the server was sent, and the turn's tokens and
    logprobs are exactly what it answered to that prompt."""
    assert trajectories and calls
    for traj in trajectories:
        assert traj.status != "failed", traj.failure
        sent: list[int] = []
        for turn in traj.turns:
            sent += turn.prompt_ids
            key = (tuple(sent), tuple(turn.response_ids))
            assert key in calls, "a turn's tokens are not what the server sampled for that prompt"
            assert turn.logprobs == calls[key]
            sent += turn.response_ids
        assert traj.token_ids() == sent
