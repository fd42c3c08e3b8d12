"""Env executors: failures counted once per episode, dead workers, episode workers, remote OpenEnv envs.

The policy is the stand-in server (tests/support/standin_server.py in a thread), which records every
request, so trajectories made in worker processes are checked token for token against what the
server saw and returned. ``FlakyEnv`` lives here at module level so worker processes can import it.
"""

from __future__ import annotations

import os
import time

import pytest

from agentgym.client import PolicyClient
from agentgym.envs.base import TextEnv, reply_text
from agentgym.model import load_tokenizer
from agentgym.rollout import RolloutConfig, RolloutRunner, Task

TOK = load_tokenizer("tiny")
RAISES, HANGS, DIES, ODD = 13, 17, 19, 29  # seeds whose second step raises, hangs for 4 s, kills its process,
# or raises an exception that pickles but does not unpickle


class OddError(Exception):
    def __init__(self, what: str, where: str) -> None:
        super().__init__(f"{what} at {where}")


class FlakyEnv(TextEnv):
    """Three turns, reward 0.5 each, outcome 1; some seeds misbehave on their second step."""

    max_turns = 3

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.turn = seed, 0
        return [{"role": "user", "content": f"Task {seed}"}], {}

    def step(self, action):
        self.turn += 1
        if self.turn == 2 and self.seed_ == RAISES:
            raise RuntimeError("env exploded")
        if self.turn == 2 and self.seed_ == HANGS:
            time.sleep(4.0)
        if self.turn == 2 and self.seed_ == DIES:
            os._exit(3)
        if self.turn == 2 and self.seed_ == ODD:
            raise OddError("odd", "turn 2")
        done = self.turn >= 3
        info = {"outcome_reward": 1.0, "success": True} if done else {}
        return [{"role": "user", "content": f"turn {self.turn}: {reply_text(action)[:10]}"}], 0.5, done, False, info


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def counting_policy(request: dict) -> tuple[list[int], list[float], str]:
    """A move every time; request k's logprobs are unique, to match turns to requests."""
    k = counting_policy.count
    counting_policy.count += 1
    tokens = ids("<answer>Up</answer><|im_end|>")[: request["max_tokens"]]
    return tokens, [-(k + 1) / 1000 - j / 1e7 for j in range(len(tokens))], "stop"


counting_policy.count = 0


def check_token_exact(trajectories, requests) -> None:
    by_first_logprob = {r["logprobs"][0]: r for r in requests if r["status"] == 200 and r["logprobs"]}
    for traj in trajectories:
        sent: list[int] = []
        for turn in traj.turns:
            sent += turn.prompt_ids
            record = by_first_logprob[turn.logprobs[0]]
            assert record["request"]["prompt"] == sent
            assert turn.response_ids == record["token_ids"] and turn.logprobs == record["logprobs"]
            sent += turn.response_ids
        assert traj.token_ids() == sent


async def run(standin_server, env, seeds, n=2, **config):
    standin_server.token_ids = ids("fine<|im_end|>")
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner(env, client, "tiny", RolloutConfig(n=n, **config))
        try:
            return await runner.run([Task(seed=s) for s in seeds])
        finally:
            await runner.aclose()


def by_seed(result) -> dict[int, list]:
    out: dict[int, list] = {}
    for t in result.trajectories:
        out.setdefault(t.seed, []).append(t)
    return out


# ---- process: each failing episode counted once ---------------------------------------------
async def test_process_executor_counts_each_failing_episode_once(standin_server):
    """The known bug: a hung step held its ProcessPoolExecutor worker, so every call queued behind it
    timed out too (10 failures counted for 4 failing episodes here). Calls now run on threads
    inside the worker: only the hung episode times out."""
    seeds = [11, RAISES, 15, HANGS, 21, ODD, 23]
    result = await run(
        standin_server, FlakyEnv, seeds, env_executor="process", env_workers=2, env_timeout=1.5, max_concurrency=14
    )
    groups = by_seed(result)
    assert all("OddError: odd at turn 2" in t.failure for t in groups[ODD])
    assert all("env.step raised: RuntimeError: env exploded" in t.failure for t in groups[RAISES]), [
        t.failure for t in result.trajectories
    ]
    assert all("env.step timed out" in t.failure for t in groups[HANGS])
    for seed in (11, 15, 21, 23):
        assert all(t.status == "ok" and t.num_turns == 3 and t.total_reward == 2.5 for t in groups[seed]), [
            t.failure for t in groups[seed]
        ]
    assert result.metrics["failed"] == 6 and len(result.trainable()) == 8


@pytest.mark.slow
async def test_a_dead_process_worker_fails_its_episodes_and_is_started_again(standin_server):
    result = await run(
        standin_server,
        FlakyEnv,
        [11, DIES, 15, 21],
        n=1,
        env_executor="process",
        env_workers=1,
        env_timeout=5.0,
        max_concurrency=1,
    )
    groups = by_seed(result)
    (dead,) = groups[DIES]
    assert dead.status == "failed" and "WorkerCrashed" in dead.failure and "exit code 3" in dead.failure
    assert all(groups[s][0].status == "ok" for s in (11, 15, 21))  # 15 and 21 ran on a new worker
    assert result.metrics["failed"] == 1


async def test_process_worker_start_up_is_not_an_env_call(standin_server):
    """The first call waits for the worker to start (imports: seconds) apart from env_timeout."""
    result = await run(
        standin_server, "sokoban", [0], n=1, env_executor="process", env_workers=1, env_timeout=0.5, max_turns=1
    )
    assert result.trajectories[0].status != "failed", result.trajectories[0].failure


# ---- workers: whole episodes in worker processes --------------------------------------------
async def test_workers_executor_is_token_exact(standin_server):
    counting_policy.count = 0
    standin_server.policy = counting_policy
    config = RolloutConfig(n=2, max_turns=3, env_executor="workers", env_workers=2, worker_env_executor="inline")
    async with PolicyClient(standin_server.url) as client:
        runner = RolloutRunner("sokoban", client, "tiny", config)
        result = await runner.run(tasks=3)
        await runner.aclose()
        inline = RolloutRunner("sokoban", client, "tiny", RolloutConfig(n=1, max_turns=1, env_executor="inline"))
        reference = await inline.run([Task(seed=s) for s in range(3)])
    trajs = result.trajectories
    assert len(trajs) == 6 and all(t.status != "failed" and t.num_turns >= 1 for t in trajs), [t.failure for t in trajs]
    check_token_exact(trajs, standin_server.requests)
    assert sorted(len(g) for g in result.groups().values()) == [2, 2, 2]
    first_prompts = {t.seed: t.turns[0].prompt_ids for t in reference.trajectories}
    assert all(t.turns[0].prompt_ids == first_prompts[t.seed] for t in trajs)  # same envs, same seeds
    assert all(t.env_id == "sokoban" for t in trajs) and result.metrics["throughput/turns_per_s"] > 0


@pytest.mark.slow
async def test_a_dead_episode_worker_fails_exactly_its_episodes(standin_server):
    result = await run(
        standin_server, FlakyEnv, [11, DIES, 15], n=1, env_executor="workers", env_workers=1, max_concurrency=1
    )
    groups = by_seed(result)
    (dead,) = groups[DIES]
    assert dead.status == "failed" and "episode worker crashed" in dead.failure and "exit code 3" in dead.failure
    assert groups[11][0].status == "ok" and groups[15][0].status == "ok"
    assert result.metrics["failed"] == 1


@pytest.mark.slow
async def test_a_hung_step_times_out_inside_an_episode_worker(standin_server):
    result = await run(
        standin_server,
        FlakyEnv,
        [11, HANGS, 15],
        n=2,
        env_executor="workers",
        env_workers=1,
        env_timeout=1.0,
        max_concurrency=6,
    )
    groups = by_seed(result)
    assert all(t.status == "failed" and "timed out" in t.failure for t in groups[HANGS])
    assert all(t.status == "ok" for s in (11, 15) for t in groups[s])
    assert result.metrics["failed"] == 2


@pytest.mark.slow
async def test_ray_executor_runs_episodes_on_actors(standin_server):
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        counting_policy.count = 0
        standin_server.policy = counting_policy
        config = RolloutConfig(n=2, max_turns=2, env_executor="ray", env_workers=1, worker_env_executor="inline")
        async with PolicyClient(standin_server.url) as client:
            runner = RolloutRunner("sokoban", client, "tiny", config)
            result = await runner.run(tasks=2)
            await runner.aclose()
        assert len(result.trajectories) == 4 and all(t.status != "failed" for t in result.trajectories)
        check_token_exact(result.trajectories, standin_server.requests)
    finally:
        if started:
            ray.shutdown()


# ---- openenv: envs in an env server ---------------------------------------------------------
@pytest.fixture
def env_server():
    from agentgym.envs.adapters.openenv_server import create_app
    from agentgym.server.handles import AppThread

    servers = []

    def start(name: str, factory=None):
        server = AppThread(create_app(name, factory=factory))
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


async def test_openenv_executor_matches_inline(standin_server, env_server):
    url = env_server("sokoban")
    standin_server.token_ids = ids("<answer>Up</answer><|im_end|>")
    async with PolicyClient(standin_server.url) as client:
        remote = RolloutRunner(
            "sokoban", client, "tiny", RolloutConfig(n=2, max_turns=3, env_executor="openenv", env_urls=[url])
        )
        local = RolloutRunner("sokoban", client, "tiny", RolloutConfig(n=2, max_turns=3, env_executor="inline"))
        a = await remote.run(tasks=2)
        b = await local.run(tasks=2)
        await remote.aclose()
    assert [t.token_ids() for t in a.trajectories] == [t.token_ids() for t in b.trajectories]
    assert [[u.reward for u in t.turns] for t in a.trajectories] == [
        [u.reward for u in t.turns] for t in b.trajectories
    ]
    assert [t.status for t in a.trajectories] == [t.status for t in b.trajectories]


async def test_openenv_executor_times_out_only_the_hung_episode(standin_server, env_server):
    url = env_server("flaky", factory=FlakyEnv)
    result = await run(
        standin_server, FlakyEnv, [11, HANGS, RAISES], env_executor="openenv", env_urls=[url], env_timeout=1.0
    )
    groups = by_seed(result)
    assert all("timed out" in t.failure for t in groups[HANGS])
    assert all("env exploded" in t.failure for t in groups[RAISES])
    assert all(t.status == "ok" and t.total_reward == 2.5 for t in groups[11])
    assert result.metrics["failed"] == 4


def test_openenv_executor_needs_urls():
    with pytest.raises(ValueError, match="env-serve"):
        RolloutRunner("sokoban", object(), "tiny", RolloutConfig(env_executor="openenv"))
