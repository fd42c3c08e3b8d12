"""Interactions: veRL-style classes running unchanged, YAML loading, the multi-turn adapter env."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
import threading
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

import pytest

import agentgym
from agentgym.envs.data import DataError
from agentgym.interactions import BaseInteraction, InteractionConfigError, load_interactions
from agentgym.interactions.env import InteractionEnv
from agentgym.interactions.gsm8k import Gsm8kInteraction
from tests.support.shared_data import GSM8K_TEST

REPO = Path(__file__).resolve().parents[2]


# ---- an interaction written for veRL: imports nothing from agentgym -----------------------
class _VerlBaseStub:
    """Stands in for verl.interactions.base.BaseInteraction."""

    def __init__(self, config: dict):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")


class VerlStyleInteraction(_VerlBaseStub):
    """Shaped like veRL's Gsm8kInteraction: same method names, arguments and return tuple."""

    def __init__(self, config: dict):
        super().__init__(config)
        self._instance_dict: dict[str, dict] = {}
        self.finalized: list[str] = []

    # written as veRL writes it (typing.Optional)
    async def start_interaction(
        self,
        instance_id: Optional[str] = None,  # noqa: UP045
        ground_truth: Optional[str] = None,  # noqa: UP045
        **kwargs,
    ) -> str:
        if instance_id is None:
            instance_id = str(uuid4())
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float, dict]:
        content = ""
        for item in reversed(messages):
            if item.get("role") == "assistant":
                content = item.get("content")
                break
        self._instance_dict[instance_id]["response"] = content
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, "Your response is correct!", reward, {}
        return False, "Your response is incorrect! You need to reflect on your answer and try again.", reward, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        numbers = re.findall(r"-?\d+", self._instance_dict[instance_id]["response"] or "")
        return 1.0 if numbers and numbers[-1] == str(self._instance_dict[instance_id]["ground_truth"]) else 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self.finalized.append(instance_id)
        del self._instance_dict[instance_id]


class OldVerlBaseInteraction:
    """veRL's older base signatures: calculate_score(self) and finalize_interaction(self)."""

    def __init__(self, config: dict):
        self.config = config
        self.finalize_calls = 0

    async def start_interaction(self, instance_id=None, **kwargs):
        return instance_id or "fixed"

    async def generate_response(self, instance_id, messages, **kwargs):
        return len(messages) >= 4, "go on", 0.5, {"seen": len(messages)}

    async def calculate_score(self):
        return 0.25

    async def finalize_interaction(self):
        self.finalize_calls += 1


def verl_interaction_rows(name: str = "verl_gsm8k") -> list[dict]:
    """Rows as veRL's gsm8k_multiturn_w_interaction.py writes them."""
    rows = []
    for i, (q, a) in enumerate([("What is 2 + 3?", "5"), ("What is 10 * 4?", "40")]):
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "system", "content": "You are a math expert."}, {"role": "user", "content": q}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": a},
                "extra_info": {
                    "split": "test",
                    "index": i,
                    "interaction_kwargs": {"name": name, "query": q, "ground_truth": a},
                },
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def verl_env(tmp_path: Path) -> tuple[InteractionEnv, VerlStyleInteraction]:
    interaction = VerlStyleInteraction({"name": "verl_gsm8k"})
    env = InteractionEnv(
        data_files=write_jsonl(tmp_path / "rows.jsonl", verl_interaction_rows()),
        interactions={"verl_gsm8k": interaction},
        max_turns=4,
    )
    return env, interaction


# ---- the veRL-style class, unchanged -------------------------------------------------------
def test_verl_style_interaction_runs_unchanged(verl_env: tuple[InteractionEnv, VerlStyleInteraction]) -> None:
    env, interaction = verl_env
    messages, info = env.reset(options={"index": 1})
    assert [m["role"] for m in messages] == ["system", "user"] and info["interaction"] == "verl_gsm8k"
    new, reward, terminated, truncated, info = env.step("It is 14")
    assert new == [
        {"role": "user", "content": "Your response is incorrect! You need to reflect on your answer and try again."}
    ]
    assert (reward, terminated, truncated) == (0.0, False, False)
    new, reward, terminated, truncated, info = env.step({"role": "assistant", "content": "10 * 4 = 40"})
    assert new[0]["content"] == "Your response is correct!"
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["outcome_reward"] == 1.0 and info["success"] and info["turn_scores"] == [0.0, 1.0]
    assert interaction.finalized and not interaction._instance_dict  # finalized and released


def test_verl_style_class_loads_from_yaml_by_dotted_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "my_verl_interactions.py"
    module.write_text(
        textwrap.dedent("""
        from uuid import uuid4

        class EchoInteraction:
            def __init__(self, config):
                self.config = config
                self.name = config.get("name")
                self._instance_dict = {}

            async def start_interaction(self, instance_id=None, **kwargs):
                instance_id = instance_id or str(uuid4())
                self._instance_dict[instance_id] = kwargs
                return instance_id

            async def generate_response(self, instance_id, messages, **kwargs):
                done = "stop" in messages[-1]["content"]
                return done, "echo: " + messages[-1]["content"], float(done) * self.config["bonus"], {}

            async def calculate_score(self, instance_id, **kwargs):
                return self.config["bonus"]

            async def finalize_interaction(self, instance_id, **kwargs):
                self._instance_dict.pop(instance_id)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "interaction.yaml"
    config.write_text("interaction:\n  - class_name: my_verl_interactions.EchoInteraction\n    config: {bonus: 0.5}\n")
    loaded = load_interactions(config)
    assert list(loaded) == ["echo"] and loaded["echo"].config == {"bonus": 0.5, "name": "echo"}
    env = InteractionEnv(
        data_files=write_jsonl(tmp_path / "rows.jsonl", verl_interaction_rows("echo")),
        interaction_config=config,
        success_threshold=0.5,
    )
    env.reset(seed=0)
    assert env.step("hello")[0] == [{"role": "user", "content": "echo: hello"}]
    _, reward, terminated, _, info = env.step("please stop")
    assert terminated and reward == 0.5 and info["outcome_reward"] == 0.5 and info["success"]


def test_older_verl_base_signatures_work(tmp_path: Path) -> None:
    interaction = OldVerlBaseInteraction({})
    env = InteractionEnv(
        data_files=write_jsonl(tmp_path / "rows.jsonl", verl_interaction_rows("old")), interactions={"old": interaction}
    )
    env.reset(seed=0)
    assert env.step("a")[1:3] == (0.5, False)
    _, reward, terminated, _, info = env.step("b")
    assert terminated and info["outcome_reward"] == 0.25 and not info["success"]
    assert info["turn_extra"] == {"seen": 5} and interaction.finalize_calls == 1


# ---- the gsm8k interaction and its preset env ----------------------------------------------
@pytest.fixture()
def gsm8k_interaction_env() -> InteractionEnv:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    return agentgym.make("gsm8k_interaction", data_files=GSM8K_TEST)


def test_multi_turn_feedback_ends_on_the_correct_answer(gsm8k_interaction_env: InteractionEnv) -> None:
    env = gsm8k_interaction_env
    messages, info = env.reset(options={"index": 0})
    assert messages[0]["role"] == "system" and "####" in messages[0]["content"]
    rewards = []
    for reply in ("I think #### 16", "Hmm, #### 20"):
        new, reward, terminated, truncated, _ = env.step(reply)
        assert not terminated and not truncated and "incorrect" in new[0]["content"]
        rewards.append(reward)
    new, reward, terminated, truncated, info = env.step("16 - 3 - 4 = 9 eggs, 9 * 2 = 18. #### 18")
    assert terminated and not truncated and new[0]["content"] == "Your response is correct!"
    assert rewards + [reward] == [0.0, 0.0, 1.0]
    assert info["outcome_reward"] == 1.0 and info["success"] and info["metrics"]["turns"] == 3.0


def test_gsm8k_interaction_stops_after_max_turns(gsm8k_interaction_env: InteractionEnv) -> None:
    env = gsm8k_interaction_env
    env.reset(options={"index": 0})
    results = [env.step("#### 1") for _ in range(3)]  # Gsm8kInteraction allows 3 answers by default
    assert [r[2] for r in results] == [False, False, True]
    assert "no attempts" in results[-1][0][0]["content"]
    assert results[-1][4]["outcome_reward"] == 0.0 and not results[-1][4]["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("#### 18")


def test_env_max_turns_truncates(tmp_path: Path) -> None:
    env = InteractionEnv(data_files=write_jsonl(tmp_path / "r.jsonl", verl_interaction_rows("gsm8k")), max_turns=2)
    env.reset(seed=0)
    assert env.step("#### 1")[2:4] == (False, False)
    _, _, terminated, truncated, info = env.step("#### 2")
    assert (terminated, truncated) == (False, True) and info["outcome_reward"] == 0.0


def test_gsm8k_interaction_directly_as_verl_calls_it() -> None:
    async def episode() -> tuple:
        interaction = Gsm8kInteraction({"name": "gsm8k", "max_turns": 2})
        kwargs = {"name": "gsm8k", "query": "1+1?", "ground_truth": "2"}
        instance_id = await interaction.start_interaction("req-1", **kwargs)
        first = await interaction.generate_response(instance_id, [{"role": "assistant", "content": "#### 3"}], **kwargs)
        second = await interaction.generate_response(
            instance_id, [{"role": "assistant", "content": "#### 2"}], **kwargs
        )
        score = await interaction.calculate_score(instance_id)
        await interaction.finalize_interaction(instance_id)
        return first, second, score, interaction._instances

    first, second, score, left = asyncio.run(episode())
    assert first[:3] == (False, "Your response is incorrect! You need to reflect on your answer and try again.", 0.0)
    assert second[:3] == (True, "Your response is correct!", 1.0) and score == 1.0 and left == {}


def test_base_interaction_defaults() -> None:
    async def run() -> tuple:
        base = BaseInteraction({"name": "b"})
        return base.name, await base.start_interaction(), await base.generate_response("x", [])

    name, instance_id, response = asyncio.run(run())
    assert name == "b" and len(instance_id) == 36 and response == (False, "", 0.0, {})


# ---- YAML ----------------------------------------------------------------------------------
def test_repo_yaml_and_registered_names(tmp_path: Path) -> None:
    loaded = load_interactions(REPO / "configs" / "interaction" / "gsm8k.yaml")
    assert isinstance(loaded["gsm8k"], Gsm8kInteraction) and loaded["gsm8k"].max_turns == 3
    by_name = load_interactions(
        {"interaction": [{"name": "feedback", "class_name": "gsm8k", "config": {"max_turns": 5}}]}
    )
    assert isinstance(by_name["feedback"], Gsm8kInteraction) and by_name["feedback"].max_turns == 5
    assert by_name["feedback"].name == "feedback"
    assert "gsm8k" in agentgym.registered("interaction")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"interaction": [{"class_name": "nope"}]}, "neither a registered interaction"),
        ({"interaction": [{"class_name": "no_such_module.Thing"}]}, "cannot import"),
        ({"interaction": [{"class_name": "agentgym.interactions.gsm8k.Missing"}]}, "has no 'Missing'"),
        ({"interaction": [{"class_name": "gsm8k"}, {"class_name": "gsm8k"}]}, "duplicate interaction name"),
        ({"interaction": [{"name": "x"}]}, "needs a 'class_name'"),
        ({"interactions": []}, "top-level 'interaction:'"),
    ],
)
def test_bad_interaction_configs(config: dict, message: str) -> None:
    with pytest.raises(InteractionConfigError, match=message):
        load_interactions(config)


def test_unknown_or_missing_interaction_name_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown interaction 'mystery'"):
        InteractionEnv(data_files=write_jsonl(tmp_path / "a.jsonl", verl_interaction_rows("mystery")))
    rows = verl_interaction_rows()
    for row in rows:
        del row["extra_info"]["interaction_kwargs"]
    with pytest.raises(DataError, match="extra_info.interaction_kwargs.name"):
        InteractionEnv(data_files=write_jsonl(tmp_path / "b.jsonl", rows))


def test_parquet_rows_select_their_interaction(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(verl_interaction_rows("gsm8k")), tmp_path / "train.parquet")
    env = InteractionEnv(data_files=tmp_path)
    env.reset(options={"index": 1})
    _, reward, terminated, _, info = env.step("#### 40")
    assert terminated and reward == 1.0 and info["interaction"] == "gsm8k"


# ---- threads and event loops ---------------------------------------------------------------
async def test_step_inside_run_in_executor(verl_env: tuple[InteractionEnv, VerlStyleInteraction]) -> None:
    env, _ = verl_env
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: env.reset(options={"index": 0}))
    result = await loop.run_in_executor(None, env.step, "2 + 3 = 5")
    assert result[2] and result[4]["outcome_reward"] == 1.0


async def test_step_called_synchronously_from_a_running_loop(
    verl_env: tuple[InteractionEnv, VerlStyleInteraction],
) -> None:
    env, _ = verl_env
    env.reset(options={"index": 0})  # this thread runs an event loop right now
    assert env.step("5")[2]


def test_step_from_worker_threads_while_main_thread_runs_a_loop(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "rows.jsonl", verl_interaction_rows("gsm8k"))
    outcomes: list[float] = []

    def worker() -> None:
        env = InteractionEnv(data_files=data)
        for index, answer in ((0, "#### 5"), (1, "#### 40")):
            env.reset(options={"index": index})
            outcomes.append(env.step(answer)[4]["outcome_reward"])

    async def main() -> None:
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert outcomes == [1.0] * 8


def test_reset_mid_episode_finalizes_the_open_instance(verl_env: tuple[InteractionEnv, VerlStyleInteraction]) -> None:
    env, interaction = verl_env
    env.reset(options={"index": 0})
    env.step("wrong 1")
    env.reset(options={"index": 1})
    assert len(interaction.finalized) == 1 and len(interaction._instance_dict) == 1
    env.close()
    assert not interaction._instance_dict


def test_a_bad_return_value_names_the_class(tmp_path: Path) -> None:
    class Broken(VerlStyleInteraction):
        async def generate_response(self, instance_id, messages, **kwargs):
            return "oops"

    interaction = Broken({})
    env = InteractionEnv(
        data_files=write_jsonl(tmp_path / "r.jsonl", verl_interaction_rows("b")), interactions={"b": interaction}
    )
    env.reset(seed=0)
    with pytest.raises(TypeError, match="Broken.generate_response must return"):
        env.step("x")
    assert not interaction._instance_dict  # finalized anyway
