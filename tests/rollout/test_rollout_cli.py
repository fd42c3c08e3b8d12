"""``agentgym rollout`` / ``agentgym eval`` end to end, and the runner against the real embedded server."""

from __future__ import annotations

import json

import pytest

from agentgym.cli import main
from agentgym.client import PolicyClient
from agentgym.model import load_tokenizer
from agentgym.rollout import RolloutConfig, RolloutRunner, read_trajectories
from tests.support.shared_data import GSM8K_TEST

GSM8K = str(GSM8K_TEST)
TOK = load_tokenizer("tiny")


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_rollout_writes_trajectories_and_metrics(standin_server, tmp_path, capsys):
    standin_server.token_ids = ids("<answer>Up</answer><|im_end|>")
    out = tmp_path / "runs" / "x.jsonl"
    code = main(
        [
            "rollout",
            "--env",
            "sokoban",
            "--server",
            standin_server.url,
            "-n",
            "3",
            "--tasks",
            "2",
            "--max-turns",
            "2",
            "--out",
            str(out),
            "--env-executor",
            "inline",
        ]
    )
    assert code == 0
    trajs = read_trajectories(out)
    assert len(trajs) == 6 and len({t.group_id for t in trajs}) == 2
    assert all(t.status != "failed" and t.turns[0].weight_version == 1 for t in trajs)
    printed = capsys.readouterr()
    assert "episodes" in printed.out and "pass@2" in printed.out
    assert "wrote 6 trajectories" in printed.err


def test_eval_reports_success_and_pass_at_k_per_source(standin_server, tmp_path, capsys):
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test data not found at {GSM8K_TEST}")
    with open(GSM8K, encoding="utf-8") as f:
        first_answer = json.loads(f.readline())["answer"].split("####")[-1].strip()
    standin_server.token_ids = ids(f"So #### {first_answer}<|im_end|>")  # right for row 0 only
    out = tmp_path / "eval.parquet"
    code = main(
        [
            "eval",
            "--env",
            "gsm8k",
            "--server",
            standin_server.url,
            "--env-arg",
            f"data_files={GSM8K}",
            "--tasks",
            "2",
            "-n",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out.splitlines()
    header, row = table[0].split(), table[1].split()
    assert row[0] == "openai/gsm8k"
    values = dict(zip(header[2:], row[1:]))  # header starts with "data source"
    assert values["episodes"] == "4" and values["success"] == "0.500" and values["pass@2"] == "0.500"
    assert len(read_trajectories(out)) == 4


def test_unknown_env_suggests_a_name(capsys):
    assert main(["rollout", "--env", "sokobna", "--server", "http://127.0.0.1:9"]) == 2
    assert "Did you mean 'sokoban'" in capsys.readouterr().err


def test_every_episode_failing_exits_nonzero(capsys):
    code = main(["rollout", "--env", "sokoban", "--server", "http://127.0.0.1:9", "--tasks", "1", "-n", "1"])
    assert code == 1
    assert "every episode failed" in capsys.readouterr().err


class RecordingClient(PolicyClient):
    """Records every (session, prompt sent, sample returned) on the client side of the wire."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    async def generate(self, prompt_ids, sampling=None, session_id=None):
        sent = list(prompt_ids)
        sample = await super().generate(prompt_ids, sampling, session_id)
        self.calls.append((session_id, sent, sample))
        return sample


async def test_real_embedded_server_sequences_are_token_exact(embedded_server):
    config = RolloutConfig(n=2, max_turns=3, max_tokens=16, temperature=1.0, env_executor="inline")
    async with RecordingClient(embedded_server.url) as client:
        runner = RolloutRunner("sokoban", client, "tiny", config)
        result = await runner.run(tasks=2)
    assert all(t.status != "failed" for t in result.trajectories), [t.failure for t in result.trajectories]
    by_session = {}
    for session, sent, sample in client.calls:
        by_session.setdefault(session, []).append((sent, sample))
    for traj in result.trajectories:
        calls = by_session[traj.task["session"]]
        assert len(calls) == traj.num_turns
        prefix: list[int] = []
        for turn, (sent, sample) in zip(traj.turns, calls):
            prefix += turn.prompt_ids
            assert sent == prefix
            assert turn.response_ids == sample.token_ids and turn.logprobs == sample.logprobs
            prefix += turn.response_ids
        last_sent, last_sample = calls[-1]
        assert traj.token_ids() == last_sent + last_sample.token_ids
        assert traj.metrics["template_mismatch"] == 0.0


def test_cli_starts_its_own_embedded_server(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    code = main(
        [
            "rollout",
            "--env",
            "sokoban",
            "--model",
            "tiny",
            "-n",
            "2",
            "--tasks",
            "1",
            "--max-turns",
            "2",
            "--max-tokens",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert len(read_trajectories(out)) == 2
    assert "server ready at" in capsys.readouterr().err


def test_env_arg_with_nothing_after_the_equals_sign_is_the_empty_string(capsys):
    from agentgym.envs.env_args import parse_env_args
    from agentgym.registry import make

    assert parse_env_args(["system_prompt="]) == {"system_prompt": ""}
    assert parse_env_args(["system_prompt=''", 'b=""', "c=null", "d=[6,6]"]) == {
        "system_prompt": "",
        "b": "",
        "c": None,
        "d": [6, 6],
    }
    with pytest.raises(ValueError, match="not YAML"):
        parse_env_args(["k=[1,"])
    empty, _ = make("sokoban", **parse_env_args(["system_prompt="])).reset(seed=1)
    rules, _ = make("sokoban", **parse_env_args(["system_prompt=null"])).reset(seed=1)
    assert "Sokoban" not in json.dumps(empty) and "Sokoban" in json.dumps(rules)
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "KEY= with nothing after '=' is the empty string" in " ".join(capsys.readouterr().out.split())
