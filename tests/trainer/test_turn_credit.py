"""Turn-level credit (``algorithm.adv_estimator=gigpo``) and dynamic sampling (``algorithm.filter_groups``).

GiGPO's numbers are worked by hand in the comments. The running example is one task with three
episodes of up to three turns, outcome reward only (1 when solved):

    episode a: turn 1 in state S0, turn 2 in state S1, solved at turn 2      -> score 1
    episode b: turn 1 in S0, turn 2 in S1, turn 3 in S2, not solved           -> score 0
    episode c: turn 1 in S0, solved at turn 1                                -> score 1
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from agentgym.rollout.sources import TrajectorySource
from agentgym.trainer import algos
from agentgym.trainer.batch import build_batch
from agentgym.trainer.dynamic_sampling import DynamicSamplingSource
from agentgym.types import Trajectory, Turn


def episode(group: str, states: list[str], outcome: float, reply: int = 2, obs: int = 1) -> Trajectory:
    turns = [
        Turn(prompt_ids=[9] * (3 if k == 0 else obs), response_ids=[5] * reply, logprobs=[0.0] * reply, state_key=s)
        for k, s in enumerate(states)
    ]
    return Trajectory(turns=turns, outcome_reward=outcome, group_id=group, metrics={"success": float(outcome > 0)})


def example() -> list[Trajectory]:
    return [episode("g", ["S0", "S1"], 1.0), episode("g", ["S0", "S1", "S2"], 0.0), episode("g", ["S0"], 1.0)]


def gigpo(trajs: list[Trajectory], **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    batch, _ = build_batch(trajs, pad_token_id=0)
    adv, _ = algos.compute_advantage(
        "gigpo",
        token_level_rewards=batch["token_level_scores"],
        response_mask=batch["response_mask"],
        index=batch.uid,
        turn_index=batch["turn_index"],
        step_keys=batch.step_keys,
        **kwargs,
    )
    return adv, batch["turn_index"]


def turn_values(adv: torch.Tensor, turn_index: torch.Tensor, row: int) -> list[float]:
    """The advantage each turn of a row got (every token of a turn must carry the same one)."""
    out = []
    for k in range(int(turn_index[row].max()) + 1):
        values = adv[row][turn_index[row] == k].unique()
        assert len(values) == 1, f"turn {k} of row {row} has several advantages: {values}"
        out.append(float(values[0]))
    return out


def test_batch_marks_each_sampled_token_with_its_turn():
    batch, _ = build_batch([episode("g", ["S0", "S1"], 1.0, reply=2, obs=1)], pad_token_id=0)
    # response region: turn 0's 2 tokens, 1 observation token, turn 1's 2 tokens
    assert batch["turn_index"][0].tolist() == [0, 0, -1, 1, 1]
    assert batch.step_keys == [["S0", "S1"]]


def test_turn_returns_discount_later_rewards():
    rewards = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0]])
    turns = torch.tensor([[0, 0, -1, 1, 1]])
    # R = [0.5, 1.0]; G_1 = 1.0; G_0 = 0.5 + 0.9 * 1.0 = 1.4
    assert algos.turn_returns(rewards, turns, 0.9) == [[pytest.approx(1.4), pytest.approx(1.0)]]


def test_gigpo_by_hand_state_grouping():
    adv, turns = gigpo(example())
    # episode level: scores [1, 0, 1], mean 2/3, std sqrt(1/3) -> [+0.57735, -1.1547, +0.57735]
    s = math.sqrt(1 / 3)
    ep = [(1 - 2 / 3) / s, (0 - 2 / 3) / s, (1 - 2 / 3) / s]
    # step level (gamma 1, outcome only: every turn's return is the episode's score):
    #   S0: a 1, b 0, c 1 -> the same normalisation as the episode level
    #   S1: a 1, b 0 -> mean 0.5, std sqrt(0.5) -> a +0.7071, b -0.7071
    #   S2: b alone -> 0
    s1 = 0.5 / math.sqrt(0.5)
    assert turn_values(adv, turns, 0) == pytest.approx([ep[0] + ep[0], ep[0] + s1], abs=1e-5)
    assert turn_values(adv, turns, 1) == pytest.approx([ep[1] + ep[1], ep[1] - s1, ep[1] + 0.0], abs=1e-5)
    assert turn_values(adv, turns, 2) == pytest.approx([2 * ep[2]], abs=1e-5)
    assert (adv[turns < 0] == 0).all()


def test_gigpo_without_the_episode_term_stops_blame_where_only_failures_go():
    # episode_advantage_w=0: b's lone turn 3 (state S2, reached by no solved episode) gets nothing,
    # where GRPO would push it down with b's episode advantage
    adv, turns = gigpo(example(), episode_advantage_w=0.0)
    assert turn_values(adv, turns, 1)[2] == 0.0
    grpo, _ = algos.compute_advantage(
        "grpo",
        token_level_rewards=build_batch(example(), 0)[0]["token_level_scores"],
        response_mask=build_batch(example(), 0)[0]["response_mask"],
        index=["g"] * 3,
    )
    assert float(grpo[1][turns[1] == 2][0]) < -1.0


def test_gigpo_turn_grouping_compares_episodes_that_reached_the_turn():
    trajs = [episode("g", ["S0", "X"], 1.0), episode("g", ["S0", "Y", "Z"], 0.0), episode("g", ["S0"], 1.0)]
    by_state, turns = gigpo(trajs, episode_advantage_w=0.0)
    by_turn, _ = gigpo(trajs, episode_advantage_w=0.0, step_grouping="turn")
    # turn 2 states X and Y differ: alone under state grouping; under turn grouping a (1) and b (0) compare
    assert turn_values(by_state, turns, 0)[1] == 0.0 and turn_values(by_state, turns, 1)[1] == 0.0
    assert turn_values(by_turn, turns, 0)[1] == pytest.approx(0.5 / math.sqrt(0.5), abs=1e-5)
    assert turn_values(by_turn, turns, 1)[1] == pytest.approx(-0.5 / math.sqrt(0.5), abs=1e-5)


def test_gigpo_mean_norm_and_weights():
    adv, turns = gigpo(example(), mode="mean_norm", step_advantage_w=0.5, episode_advantage_w=2.0)
    # mean_norm: score - mean. Episode: a +1/3. Step S1: a +0.5. Turn 2 of a: 2 * 1/3 + 0.5 * 0.5
    assert turn_values(adv, turns, 0)[1] == pytest.approx(2 / 3 + 0.25, abs=1e-6)


def test_gigpo_groups_are_per_task_and_equal_scores_teach_nothing():
    trajs = [episode("g", ["S0"], 1.0), episode("g", ["S0"], 1.0), episode("h", ["S0"], 0.0), episode("h", ["S0"], 1.0)]
    adv, turns = gigpo(trajs)
    assert (adv[0] == 0).all() and (adv[1] == 0).all()  # g: both solved
    assert turn_values(adv, turns, 3)[0] > 0 > turn_values(adv, turns, 2)[0]  # h's S0 is not g's S0


def test_gigpo_rejects_unknown_choices():
    with pytest.raises(ValueError, match="step_grouping"):
        gigpo(example(), step_grouping="turns")
    with pytest.raises(ValueError, match="mode"):
        gigpo(example(), mode="zscore")


# ---- dynamic sampling -----------------------------------------------------------------------------


class Rounds(TrajectorySource):
    """A source that returns the given rounds in order, counting its calls."""

    def __init__(self, rounds: list[list[Trajectory]]) -> None:
        self.rounds = rounds
        self.calls = 0
        self.validated = False

    async def collect(self, step: int) -> list[Trajectory]:
        self.calls += 1
        return self.rounds[self.calls - 1]

    async def validate(self) -> list[Trajectory]:
        self.validated = True
        return []


def group(name: str, outcomes: list[float]) -> list[Trajectory]:
    return [episode(name, ["S"], o) for o in outcomes]


def test_dynamic_sampling_keeps_only_groups_with_a_spread_and_fills_the_step():
    source = Rounds(
        [group("a", [1, 1]) + group("b", [0, 1]), group("c", [0, 0]) + group("d", [1, 0]) + group("e", [0, 1])]
    )
    ds = DynamicSamplingSource(source, train_batch_size=2, max_rounds=4)
    trajs = asyncio.run(ds.collect(1))
    assert sorted({t.group_id for t in trajs}) == ["b", "d"]  # e is past the batch: dropped, as DAPO does
    assert source.calls == 2
    m = ds.sampling_metrics
    assert (m["sampling/rounds"], m["sampling/groups_sampled"], m["sampling/groups_kept"]) == (2, 5, 2)
    assert m["sampling/flat_group_frac"] == pytest.approx(2 / 5)
    assert m["sampling/extra_episodes"] == 6 and m["sampling/success_rate"] == pytest.approx(5 / 10)


def test_dynamic_sampling_stops_at_the_cap_and_never_returns_nothing():
    flat = Rounds([group("a", [1, 1]), group("b", [0, 0]), group("c", [0, 0])])
    ds = DynamicSamplingSource(flat, train_batch_size=2, max_rounds=2)
    trajs = asyncio.run(ds.collect(1))
    assert flat.calls == 2 and [t.group_id for t in trajs] == ["b", "b"]  # the last round, unfiltered
    some = Rounds([group("a", [0, 1]), group("b", [0, 0])])
    ds = DynamicSamplingSource(some, train_batch_size=4, max_rounds=2)
    assert {t.group_id for t in asyncio.run(ds.collect(1))} == {"a"}
    asyncio.run(ds.validate())  # everything else passes through to the source
    assert some.validated


def test_dynamic_sampling_metric_acc_ignores_turn_rewards():
    trajs = group("a", [1, 1])
    trajs[0].turns[0].reward = -0.1  # different scores, equal success
    assert len(asyncio.run(DynamicSamplingSource(Rounds([trajs]), 1, metric="score", max_rounds=1).collect(1))) == 2
    ds = DynamicSamplingSource(Rounds([trajs]), 1, metric="acc", max_rounds=1)
    asyncio.run(ds.collect(1))
    assert ds.sampling_metrics["sampling/groups_kept"] == 0


# ---- metrics for every episode --------------------------------------------------------------------


def test_sokoban_says_per_turn_whether_a_reply_was_well_formed_and_keeps_episode_metrics():
    import agentgym

    env = agentgym.make("sokoban", max_steps=15)
    _, info = env.reset(seed=3)
    start = info["state_key"]
    _, _, _, _, info = env.step("<answer>Up || Left</answer>")
    assert info["well_formed"] and not info["format_error"] and info["moves"] == 2
    assert info["metrics"]["turns"] == 1  # the episode so far, on a step that does not end it
    _, _, _, _, info = env.step("<answer>Up</answer></answer>")  # plays (the last answer is read), not well formed
    assert not info["well_formed"] and not info["format_error"]
    _, _, _, _, info = env.step("<answer>Up || Up || Up || Up || Up || Up</answer>")  # six moves: cut to five
    assert not info["well_formed"]
    _, _, _, _, info = env.step("Up")
    assert info["format_error"] and not info["well_formed"] and info["metrics"]["format_errors"] == 1
    assert isinstance(info["state_key"], str) and info["state_key"].count("\n") == start.count("\n")


def test_per_turn_metrics_count_episodes_cut_at_the_turn_limit():
    from agentgym.rollout.metrics import per_turn_metrics

    def t(well_formed: float, cut: float = 0.0, tokens: int = 2) -> Turn:
        return Turn(
            prompt_ids=[1],
            response_ids=[5] * tokens,
            logprobs=[0.0] * tokens,
            metrics={"well_formed": well_formed, "moves": 1.0, "cut": cut},
        )

    trajs = [
        Trajectory(turns=[t(1), t(0)], status="truncated"),
        Trajectory(turns=[t(1)]),
        Trajectory(turns=[t(1), t(1, cut=1.0, tokens=6), t(0)], status="truncated"),
        Trajectory(turns=[t(0)], status="failed"),
    ]
    m = per_turn_metrics(trajs)
    assert m["turn1/reached"] == 1.0 and m["turn2/reached"] == pytest.approx(2 / 3)
    assert m["turn1/malformed"] == 0.0
    assert m["turn2/malformed"] == 1.0  # one not well formed, one cut at the token cap
    assert m["turn2/reply_tokens"] == 4.0 and m["turn3/malformed"] == 1.0 and m["turn3/reached"] == pytest.approx(1 / 3)


def test_sokoban_strict_format_plays_only_well_formed_replies():
    import agentgym

    lenient, strict = agentgym.make("sokoban"), agentgym.make("sokoban", strict_format=True)
    for env in (lenient, strict):
        env.reset(seed=3)
    assert not lenient.step("<answer>Up</answer></answer>")[4]["format_error"]
    _, reward, _, _, info = strict.step("<answer>Up</answer></answer>")
    assert info["format_error"] and reward == strict.format_penalty and info["metrics"]["actions"] == 0
    assert strict.step("<answer>Up || Up || Up || Up || Up || Up</answer>")[4]["format_error"]  # over the cap
    assert not strict.step("<answer>Up || Left</answer>")[4]["format_error"]


# ---- wired into the training loop -------------------------------------------------------------------


def _train_one_step(tmp_path, overrides: list[str], batch: list[Trajectory]) -> dict[str, float]:
    from agentgym.rollout.sources import FixedTrajectorySource
    from agentgym.trainer.config import load_config
    from agentgym.trainer.run import train

    cfg = load_config(
        env="sokoban",
        overrides=[
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[]",
            "trainer.use_ray=false",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.save_hf_model=false",
            "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "warm_start.enable=false",
            "held_out.enable=false",
            "algorithm.adv_estimator=grpo",
            "algorithm.filter_groups.enable=false",
            "algorithm.turn_reward_from=null",
            *overrides,
        ],
    )
    return train(cfg, source=FixedTrajectorySource([batch]), servers=False, show_progress=False)["metrics"]


def _one_turn_groups() -> list[Trajectory]:
    return [
        episode("flat", ["A"], 0.0),
        episode("flat", ["A"], 0.0),
        episode("g", ["S"], 1.0),
        episode("g", ["S"], 0.0),
    ]


def test_the_trainer_drops_flat_groups_only_with_dynamic_sampling(tmp_path):
    off = _train_one_step(tmp_path / "off", [], _one_turn_groups())
    on = _train_one_step(
        tmp_path / "on",
        ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=1"],
        _one_turn_groups(),
    )
    assert off["batch/zero_variance_group_frac"] == 0.5 and "sampling/rounds" not in off
    assert on["batch/zero_variance_group_frac"] == 0.0  # the flat group never reached the update
    assert on["sampling/groups_kept"] == 1 and on["sampling/flat_group_frac"] == 0.5 and on["episodes"] == 2


def test_the_trainer_hands_turns_and_states_to_gigpo(tmp_path):
    grpo = _train_one_step(tmp_path / "grpo", [], _one_turn_groups())
    gigpo = _train_one_step(tmp_path / "gigpo", ["algorithm.adv_estimator=gigpo"], _one_turn_groups())
    # one turn per episode in the group's one state: GiGPO's step term repeats the episode term
    assert grpo["critic/advantages/max"] == pytest.approx(0.5 / math.sqrt(0.5), abs=1e-4)
    assert gigpo["critic/advantages/max"] == pytest.approx(2 * 0.5 / math.sqrt(0.5), abs=1e-4)


def test_a_turn_fact_replaces_the_env_reward_in_training_only():
    """algorithm.turn_reward_from=format_reward: each training turn's reward is the env's per-turn fact
    (Sokoban: 0 well formed, -1 not), the env's own step reward is kept aside, validation untouched."""
    from agentgym.rewards import reward_sources
    from agentgym.trainer.config import load_config

    def turn(reward: float, fact: float | None) -> Turn:
        return Turn(
            prompt_ids=[1],
            response_ids=[2],
            logprobs=[0.0],
            reward=reward,
            metrics={} if fact is None else {"format_reward": fact},
        )

    batch = [Trajectory(turns=[turn(-0.1, 0.0), turn(0.9, -1.0), turn(-0.1, None)], group_id="g")]
    cfg = load_config(env="sokoban", overrides=["algorithm.turn_reward_from=format_reward"])
    source = reward_sources(cfg, Rounds([batch]))
    trajs = asyncio.run(source.collect(1))
    assert [t.reward for t in trajs[0].turns] == [0.0, -1.0, 0.0]
    assert [t.metrics["env_reward"] for t in trajs[0].turns] == [-0.1, 0.9, -0.1]
    assert source.reward_metrics["reward/format_reward/missing"] == 1
    asyncio.run(source.validate())
    assert source.source.validated  # validation passes through unscored


def test_sokoban_reports_a_format_reward_without_changing_its_feedback():
    import agentgym

    env = agentgym.make("sokoban")
    env.reset(seed=3)
    text_before = env.step("<answer>Up</answer></answer>")
    assert text_before[4]["format_reward"] == -1.0 and "Reward: -0.1" in text_before[0][0]["content"]
    assert env.step("<answer>Down</answer>")[4]["format_reward"] == 0.0
