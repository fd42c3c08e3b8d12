"""The main job's stages: demos -> SFT -> RL from the SFT model -> the held-out table; each stage
cached under the run dir; bad settings refused before any work."""

from __future__ import annotations

import json
import math

import pytest

from agentgym.cli import main
from agentgym.stages import held_out
from agentgym.trainer.config import load_config

SMALL = [
    "warm_start.demos=40",
    "warm_start.sft.trainer.total_training_steps=3",
    "warm_start.sft.data.train_batch_size=8",
    "warm_start.sft.data.micro_batch_size_per_gpu=8",
    "trainer.total_training_steps=1",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "held_out.num_tasks=4",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.save_freq=-1",
    "trainer.logger=[jsonl]",
    "actor_rollout_ref.rollout.max_tokens_per_turn=16",
]


def _train(run_dir, *overrides):
    return main(["train", "--env", "sokoban", f"trainer.default_local_dir={run_dir}", *SMALL, *overrides])


def test_main_job_stages_run_in_order_and_are_cached(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _train(run_dir) == 0
    out = capsys.readouterr().out
    demos = run_dir / "warm_start" / "demos" / "demos.jsonl"
    sft_model = run_dir / "warm_start" / "sft" / "huggingface"
    records = [json.loads(line) for line in demos.read_text().splitlines()]
    assert len(records) == 40 and {r["seed"] for r in records} == set(range(2_000_000, 2_000_040))
    assert (sft_model / "config.json").is_file()
    # RL started from the SFT model, not from the config's base model
    assert f"RL starts from the SFT model {sft_model}" in out
    report = json.loads((run_dir / "held_out.json").read_text())
    assert set(report["policies"]) == {"after SFT", "after RL"}
    for by_temp in report["policies"].values():
        assert set(by_temp) == {"0.0", "1.0"}
        assert all(len(s["per_task"]) == 4 for s in by_temp.values())
    assert len(report["random_policy"]["per_task"]) == 4
    assert report["start_model"] == str(sft_model)
    assert "held-out: 4 tasks of sokoban (seeds 1000000..1000003" in out
    assert "after RL - after SFT" in out and "random policy" in out

    # the same command again: demos and SFT come from the cache, only RL runs (from its checkpoint or anew)
    mtime = sft_model.joinpath("config.json").stat().st_mtime_ns
    assert _train(run_dir, "trainer.total_training_steps=2", "trainer.save_freq=2") == 0
    out = capsys.readouterr().out
    assert "demos cached" in out and "SFT model cached" in out
    assert sft_model.joinpath("config.json").stat().st_mtime_ns == mtime
    assert "scores of the start model reused" in out
    again = json.loads((run_dir / "held_out.json").read_text())["policies"]["after SFT"]
    assert again == report["policies"]["after SFT"]
    start_stamp = json.loads((run_dir / "held_out_start" / "stage.json").read_text())
    # another SFT setting redoes SFT (and only SFT); RL's checkpoints went on from the old SFT model,
    # so they are not resumed silently
    assert _train(tmp_path / "run", "warm_start.sft.optim.lr=1e-3", "trainer.total_training_steps=2") == 1
    captured = capsys.readouterr()
    assert "demos cached" in captured.out and "SFT model cached" not in captured.out
    assert "warm start: SFT done" in captured.out
    assert "scores of the start model reused" not in captured.out  # a new start model is scored anew
    assert "continues RL from another start model" in captured.err and "resume_mode=disable" in captured.err
    assert (
        _train(
            tmp_path / "run",
            "warm_start.sft.optim.lr=1e-3",
            "trainer.total_training_steps=1",
            "trainer.resume_mode=disable",
        )
        == 0
    )
    # the start scores were made for the new SFT model's files
    assert json.loads((run_dir / "held_out_start" / "stage.json").read_text())["key"] != start_stamp["key"]


def test_bad_stage_settings_are_refused_before_any_work(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _train(run_dir, "env.val_seed_start=2000010") == 2
    assert "overlap the held-out seeds" in capsys.readouterr().err
    assert _train(run_dir, "trainer.total_training_steps=100000", "data.train_batch_size=16") == 2
    assert "RL task seeds 0..1599999 overlap" in capsys.readouterr().err
    assert _train(run_dir, "warm_start.sft.optim.lrr=1") == 2
    assert "warm_start.sft: unknown config key 'optim.lrr'" in capsys.readouterr().err
    assert not run_dir.exists()


def test_an_env_without_an_expert_asks_for_another_start():
    from agentgym.config import ConfigError
    from agentgym.stages.train_command import check_stages

    cfg = load_config(env="first_letter", overrides=["warm_start.enable=true"])
    with pytest.raises(ConfigError, match="warm_start.enable=false"):
        check_stages(cfg)


def test_random_policy_and_paired_standard_error():
    cfg = load_config(env="sokoban", overrides=["held_out.num_tasks=200"])
    score = held_out.score_random(cfg)
    assert score is not None and len(score.per_task) == 200
    assert 0.05 < score.success < 0.6  # random moves solve some 1-box levels, not most
    assert held_out.score_random(cfg).per_task == score.per_task  # seeded
    before = held_out.Score("a", 0.0, [0.0, 1.0, 0.0, 1.0])
    after = held_out.Score("b", 0.0, [1.0, 1.0, 0.0, 1.0])
    gain, se = held_out.paired_gain(before, after)
    assert gain == 0.25 and math.isclose(se, 0.25)  # diffs 1,0,0,0: sd 0.5, / sqrt(4)
    assert math.isclose(before.se, math.sqrt(0.25 / 4))
