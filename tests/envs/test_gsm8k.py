"""The GSM8K env: raw and veRL-format data, JSONL and Parquet, row choice, scoring, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium
import pytest

import agentgym
from agentgym.envs.data import DataError
from agentgym.envs.gsm8k import INSTRUCTION, Gsm8kEnv
from tests.support.shared_data import GSM8K_DIR, GSM8K_TEST  # noqa: F401


@pytest.fixture(scope="module")
def env() -> Gsm8kEnv:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    return Gsm8kEnv(data_files=GSM8K_TEST)


def verl_rows() -> list[dict]:
    """Rows as veRL's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "test", "index": i, "answer": f"{a}+{b}={a + b}\n#### {a + b}"},
        }
        for i, (a, b) in enumerate([(1, 2), (30, 12), (500, 500)])
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_raw_rows_score_the_reference_answer(env: Gsm8kEnv) -> None:
    assert env.num_tasks() == 1319
    messages, info = env.reset(options={"index": 0})
    assert messages[0]["role"] == "user" and messages[0]["content"].endswith(INSTRUCTION)
    assert "Janet" in messages[0]["content"]
    assert info["data_source"] == "openai/gsm8k" and info["index"] == 0
    new, reward, terminated, truncated, info = env.step(env.tasks[0].extra_info["answer"])
    assert (new, reward, terminated, truncated) == ([], 0.0, True, False)
    assert info["outcome_reward"] == 1.0 and info["success"] and info["answer"] == "18"
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step({"role": "assistant", "content": env.tasks[1].extra_info["answer"]})
    assert info["outcome_reward"] == 0.0 and not info["success"]


def test_seed_picks_a_row_deterministically(env: Gsm8kEnv) -> None:
    assert env.reset(seed=7)[1]["index"] == env.reset(seed=7)[1]["index"] == 7
    assert env.reset(seed=1319 + 5)[1]["index"] == 5
    with pytest.raises(IndexError, match="1319 rows"):
        env.reset(options={"index": 5000})


def test_step_needs_reset(env: Gsm8kEnv) -> None:
    env.reset(seed=0)
    env.step("#### 18")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("#### 18")


def test_method_and_scores_are_configurable(env: Gsm8kEnv) -> None:
    flexible = Gsm8kEnv(data_files=GSM8K_TEST, method="flexible", format_score=0.1)
    flexible.reset(options={"index": 0})
    assert flexible.step("She makes 18 dollars.")[4]["outcome_reward"] == 1.0
    flexible.reset(options={"index": 0})
    assert flexible.step("She makes 17 dollars.")[4]["outcome_reward"] == 0.1
    with pytest.raises(ValueError, match="unknown answer extraction method"):
        Gsm8kEnv(data_files=GSM8K_TEST, method="fuzzy")


def test_verl_format_jsonl(tmp_path: Path) -> None:
    env = Gsm8kEnv(data_files=write_jsonl(tmp_path / "test.jsonl", verl_rows()))
    messages, info = env.reset(options={"index": 1})
    assert messages == verl_rows()[1]["prompt"]
    assert env.tasks[1].extra_info["index"] == 1
    assert env.step("30 + 12 = 42\n#### 42")[4]["outcome_reward"] == 1.0
    env.reset(options={"index": 2})
    assert env.step("#### 1,000")[4]["success"]


def test_verl_format_parquet_and_split_directories(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(verl_rows()), tmp_path / "train.parquet")
    write_jsonl(tmp_path / "test.jsonl", verl_rows()[:1])
    train = Gsm8kEnv(data_files=tmp_path, split="train")
    assert train.num_tasks() == 3
    messages, _ = train.reset(options={"index": 2})
    assert messages == verl_rows()[2]["prompt"]
    assert train.step("#### 1000")[4]["outcome_reward"] == 1.0
    assert Gsm8kEnv(data_files=tmp_path, split="test").num_tasks() == 1
    both = Gsm8kEnv(data_files=[tmp_path / "train.parquet", tmp_path / "test.jsonl"])
    assert both.num_tasks() == 4 and both.tasks[3].index == 3


def test_parquet_without_pyarrow_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match="pyarrow") as err:
        Gsm8kEnv(data_files=path)
    assert str(path) in str(err.value)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match="data file not found") as err:
        Gsm8kEnv(data_files=missing)
    assert str(missing) in str(err.value)
    with pytest.raises(DataError, match="no validation.parquet"):
        Gsm8kEnv(data_files=tmp_path, split="validation")


def test_no_data_files_says_to_pass_them() -> None:
    with pytest.raises(DataError, match="data_files="):
        Gsm8kEnv()


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ({"question": "q"}, "'answer'"),
        ({"answer": "#### 1"}, "'question'"),
        (
            {"prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule"}},
            "'reward_model.ground_truth'",
        ),
        ({"prompt": [{"role": "user", "content": "q"}]}, "'reward_model.ground_truth'"),
    ],
)
def test_missing_column_names_the_column_and_path(tmp_path: Path, row: dict, column: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "ok", "answer": "#### 1"}, row])
    with pytest.raises(DataError, match="missing column") as err:
        Gsm8kEnv(data_files=path)
    assert column in str(err.value) and f"{path}:1" in str(err.value)


def test_answer_without_marker_and_bad_json_are_reported(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="'answer'.*####"):
        Gsm8kEnv(data_files=write_jsonl(tmp_path / "a.jsonl", [{"question": "q", "answer": "42"}]))
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(DataError, match=f"{bad}:2"):
        Gsm8kEnv(data_files=bad)


def test_made_through_the_registry_and_gymnasium(env: Gsm8kEnv) -> None:
    assert "gsm8k" in agentgym.registered("env")
    made = agentgym.make("gsm8k", data_files=GSM8K_TEST, split="test")
    assert isinstance(made, Gsm8kEnv) and made.num_tasks() == 1319
    gym_env = gymnasium.make("agentgym/Gsm8k-v0", data_files=str(GSM8K_TEST))
    messages, _ = gym_env.reset(seed=3)
    assert "sprints" in messages[0]["content"]
    assert made.render() is None
