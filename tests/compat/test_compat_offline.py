"""Offline generation and scoring in veRL's formats: `agentgym generate` (main_generation) writes a
responses column; `agentgym eval data.path=...` (main_eval) scores it per data source."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from agentgym.cli import main
from tests.support.compat_fixtures import write_gsm8k_parquet


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("offline")
    data = write_gsm8k_parquet(root / "data", train_rows=4, test_rows=3)
    out = root / "out.parquet"
    assert (
        main(
            [
                "generate",
                f"data.path={data}/test.parquet",
                "data.n_samples=2",
                f"data.output_path={out}",
                "model.path=tiny",
                "rollout.response_length=8",
                "rollout.top_k=-1",
                "trainer.n_gpus_per_node=1",
                "ray_kwargs.ray_init.num_cpus=2",
            ]
        )
        == 0
    )
    return out


def test_generate_writes_n_responses_per_prompt(generated):
    rows = pq.read_table(generated).to_pylist()
    assert len(rows) == 3
    for row in rows:
        assert len(row["responses"]) == 2 and all(isinstance(r, str) for r in row["responses"])
        assert row["data_source"] == "openai/gsm8k" and row["prompt"][0]["role"] == "user"  # the rows kept


def test_eval_scores_each_data_source(generated, tmp_path, capsys):
    rows = pq.read_table(generated).to_pylist()
    rows[0]["responses"] = [f"#### {rows[0]['reward_model']['ground_truth']}", "no answer"]
    rows[1]["data_source"] = "other/source"
    rows[1]["responses"] = ["abc"]
    data = tmp_path / "scored.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", f"data.path={data}"]) == 2  # other/source has no built-in rule
    assert "custom_reward_function.path" in capsys.readouterr().err
    reward = tmp_path / "reward.py"
    reward.write_text(
        "from agentgym.envs.rewards import compute_score as gsm8k\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return gsm8k(solution_str, ground_truth) if data_source == 'openai/gsm8k' else len(solution_str)\n"
    )
    assert main(["eval", f"data.path={data}", f"custom_reward_function.path={reward}"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["test_score/other/source"] == 3.0
    assert result["test_score/openai/gsm8k"] == pytest.approx(0.5 / 2)  # row 0: (1 + 0) / 2, row 2: 0


def test_generate_refuses_greedy_with_several_samples(tmp_path, capsys):
    assert (
        main(
            [
                "generate",
                "data.path=x.parquet",
                f"data.output_path={tmp_path}/o.parquet",
                "rollout.do_sample=false",
                "data.n_samples=3",
            ]
        )
        == 2
    )
    assert "set data.n_samples=1" in capsys.readouterr().err


def test_generate_names_a_cache_size_for_servers_it_does_not_start(tmp_path, capsys):
    main(
        [
            "generate",
            f"data.path={tmp_path}/missing.parquet",
            f"data.output_path={tmp_path}/o.parquet",
            "model.path=tiny",
            "rollout.server_urls=[http://127.0.0.1:9]",
            "rollout.kv_cache_memory_bytes=2G",
        ]
    )
    assert "warning: rollout.kv_cache_memory_bytes: no effect (rollout.server_urls" in capsys.readouterr().err


def test_eval_with_env_keeps_its_options(capsys):
    assert main(["eval", "--env", "first_letter", "data.path=x"]) == 2
    assert "with --env use the options" in capsys.readouterr().err
