"""rg/<task>: reasoning-gym datasets through the adapter, scored by the package's own scorer."""

from __future__ import annotations

import pytest

import agentgym
from agentgym.registry import UnknownNameError
from tests.support.adapter_checks import assert_token_exact, needs, train_two_steps

pytestmark = [pytest.mark.extras, needs("reasoning_gym", "reasoning-gym")]

TASKS = ["basic_arithmetic", "chain_sum", "letter_counting", "spell_backward", "word_sorting"]


@pytest.mark.parametrize("task", TASKS)
def test_reward_is_the_packages_own_score(task):
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    env = agentgym.make(f"rg/{task}", size=6, seed=3)
    dataset = reasoning_gym.create_dataset(task, size=6, seed=3)  # the same rows, built by the package
    for index in range(6):
        messages, info = env.reset(options={"index": index})
        entry = dataset[index]
        assert messages[-1] == {"role": "user", "content": entry["question"]} and info["index"] == index
        right, wrong = entry["answer"], entry["answer"] + "x"
        for reply in (
            f"<answer>{right}</answer>",
            f"so: <answer>{wrong}</answer>",
            "no tags",
            f"<answer> {right} </answer>",
        ):
            env.reset(options={"index": index})
            new, reward, terminated, truncated, step_info = env.step(reply)
            expected = dataset.score_answer(extract_answer(reply), entry)
            assert (new, reward, terminated, truncated) == ([], 0.0, True, False)
            assert step_info["outcome_reward"] == expected
        assert env.score(f"<answer>{right}</answer>")[0] == 1.0


def test_dataset_arguments_and_rows():
    env = agentgym.make("rg/chain_sum", size=5, seed=1, min_terms=2, max_terms=2)
    assert env.num_tasks() == 5
    assert env.dataset.config.min_terms == 2 and env.dataset.config.max_terms == 2
    first, _ = env.reset(seed=7)  # seed % size picks the row
    again, _ = agentgym.make("rg/chain_sum", size=5, seed=1, min_terms=2, max_terms=2).reset(options={"index": 2})
    assert first == again
    assert agentgym.make("rg/chain_sum", system_prompt=None, size=2).reset(seed=0)[0][0]["role"] == "user"


def test_family_lists_the_packages_datasets_and_suggests_names():
    from reasoning_gym.factory import DATASETS

    from agentgym.registry import env_family

    assert env_family("rg").members() == sorted(DATASETS)
    with pytest.raises(UnknownNameError, match="rg/basic_arithmetic"):
        agentgym.make("rg/basic_arithmetc")


@pytest.mark.slow
def test_two_step_train_is_token_exact(monkeypatch, tmp_path):
    trajs, calls = train_two_steps(
        monkeypatch,
        tmp_path,
        "rg/basic_arithmetic",
        "+env.kwargs.size=16",
        "data.max_response_length=16",
        "actor_rollout_ref.rollout.max_tokens_per_turn=16",
    )
    assert len(trajs) == 2 * 2 * 2 and all(t.env_id == "rg/basic_arithmetic" for t in trajs)
    assert_token_exact(trajs, calls)
