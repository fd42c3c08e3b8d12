"""Trajectory storage: JSONL and Parquet round-trip to equal objects; lines are written whole."""

from __future__ import annotations

import json
import threading

import pytest

from agentgym.rollout.storage import TrajectoryWriter, read_trajectories, write_trajectories
from agentgym.types import Trajectory, Turn


def sample_trajectories() -> list[Trajectory]:
    call = {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": '{"e": "2+2"}'}}
    full = Trajectory(
        turns=[
            Turn(
                prompt_ids=[1, 2, 3],
                response_ids=[4, 5],
                logprobs=[-0.125, -1.0e-9],
                reward=0.5,
                weight_version=3,
                finish_reason="stop",
                observation=[{"role": "user", "content": "héllo ∑"}],
                response_text="<tool_call>…</tool_call>",
            ),
            Turn(
                prompt_ids=[6],
                response_ids=[7],
                logprobs=[-2.718281828459045],
                reward=-0.1,
                weight_version=4,
                finish_reason="length",
                observation=[{"role": "tool", "tool_call_id": "call_0", "content": "4"}],
            ),
        ],
        outcome_reward=1.0,
        env_id="gsm8k_tool",
        group_id="abc-0",
        seed=7,
        status="truncated",
        data_source="openai/gsm8k",
        messages=[
            {"role": "user", "content": "héllo ∑"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": "4"},
        ],
        metrics={"turns": 2.0, "template_mismatch": 0.0, "env/score": 1.0},
        task={"seed": 7, "index": 3, "sample": 1, "session": "abc-0/1"},
    )
    failed = Trajectory(
        env_id="sokoban", group_id="abc-1", seed=None, status="failed", failure="env.step raised: RuntimeError: boom"
    )
    empty_turn = Trajectory(turns=[Turn(prompt_ids=[9], response_ids=[], logprobs=[])], env_id="x")
    return [full, failed, empty_turn]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip(tmp_path, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    trajs = sample_trajectories()
    path = tmp_path / f"runs/out{suffix}"
    assert write_trajectories(path, trajs) == 3
    back = read_trajectories(path)
    assert back == trajs
    assert back[0].token_ids() == trajs[0].token_ids() and back[0].loss_mask() == trajs[0].loss_mask()


def test_parquet_appears_only_when_closed(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "out.parquet"
    writer = TrajectoryWriter(path)
    writer.write(sample_trajectories()[0])
    assert not path.exists()
    writer.close()
    assert path.exists() and not list(tmp_path.glob(".*tmp"))
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.column("status").to_pylist() == ["truncated"]
    assert table.column("turns").to_pylist()[0][1]["logprobs"] == [-2.718281828459045]


def test_concurrent_jsonl_writes_never_interleave(tmp_path):
    path = tmp_path / "out.jsonl"
    big = sample_trajectories()[0]
    big.turns[0].response_text = "x" * 200_000  # longer than any buffer
    with TrajectoryWriter(path) as writer:
        threads = [threading.Thread(target=lambda: [writer.write(big) for _ in range(10)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert writer.count == 40
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 40 and all(json.loads(line)["group_id"] == "abc-0" for line in lines)
    assert read_trajectories(path)[0] == big


def test_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match=".jsonl or .parquet"):
        TrajectoryWriter(tmp_path / "out.txt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": []}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_trajectories(bad)


def test_fast_record_is_the_same_json_as_to_dict():
    from agentgym.rollout.storage import record

    for t in sample_trajectories():
        assert json.dumps(record(t), ensure_ascii=False) == json.dumps(t.to_dict(), ensure_ascii=False)
