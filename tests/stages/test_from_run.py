"""Reproducing a run from its directory: ``agentgym eval/rollout/serve --run DIR`` take the run's saved
settings (flags given win), and a model directory remembers how it was trained (``agentgym_run.json``)
so that ``eval --model`` warns when it is scored otherwise."""

from __future__ import annotations

import shutil

import pytest
import torch

from agentgym.cli import build_parser, main
from agentgym.model import load_causal_lm, tiny_model_path
from agentgym.rollout.storage import read_trajectories
from agentgym.stages import held_out
from agentgym.stages.from_run import settle_rollout_args, settle_serve_args
from agentgym.stages.run_dir import RunError, find_run
from agentgym.trainer import checkpoint
from agentgym.trainer.config import load_config
from agentgym.trainer.training_record import FILE, read_training_record, write_training_record

SEED = 1_000_000
SETTINGS = [
    "held_out.enable=true",
    "held_out.num_tasks=3",
    "actor_rollout_ref.rollout.max_tokens_per_turn=12",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
    "env.kwargs.max_steps=9",
    "actor_rollout_ref.rollout.concurrency=4",
]


def make_run(tmp_path, *overrides, model=True):
    """A run directory as `agentgym train` leaves it: config.yaml and huggingface/ (the tiny model)."""
    run_dir = tmp_path / "outputs" / "run"
    cfg = load_config(env="sokoban", overrides=[f"trainer.default_local_dir={run_dir}", *SETTINGS, *overrides])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(__import__("omegaconf").OmegaConf.to_yaml(cfg))
    if model:
        shutil.copytree(tiny_model_path(), run_dir / "huggingface")
        write_training_record(run_dir / "huggingface", cfg, 1)
    return run_dir, cfg


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_eval_run_replays_the_held_out_scoring_token_for_token(tmp_path, monkeypatch, capsys):
    from agentgym.rollout.runner import RolloutRunner

    run_dir, cfg = make_run(tmp_path)
    seen = []
    original = RolloutRunner.run

    async def spy(self, *args, **kwargs):
        result = await original(self, *args, **kwargs)
        seen.extend(result.trajectories)
        return result

    monkeypatch.setattr(RolloutRunner, "run", spy)
    score = held_out.score_model(cfg, str(run_dir / "huggingface"), 0.0, "held-out", show_progress=False)
    reference = {t.seed: t for t in seen}
    assert sorted(reference) == [SEED, SEED + 1, SEED + 2]

    out = tmp_path / "eval.jsonl"
    assert (
        main(
            [
                "eval",
                "--run",
                str(run_dir),
                "--tasks",
                "3",
                "--seed",
                str(SEED),
                "--temperature",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    replayed = {t.seed: t for t in read_trajectories(out)}
    assert sorted(replayed) == sorted(reference)
    for seed, traj in replayed.items():
        assert traj.token_ids() == reference[seed].token_ids()  # same prompts, limits, sampling: same tokens
    assert [float(bool(replayed[s].metrics.get("success"))) for s in sorted(replayed)] == score.per_task
    # the run's settings, not the defaults: the run's empty system prompt, its 2 turns of <= 12 tokens
    first = replayed[SEED]
    assert "Sokoban" not in first.messages[0].get("content", "") and len(first.turns) <= 2
    assert all(len(turn.response_ids) <= 12 for turn in first.turns)
    # it says what it used and where from, and the flag given wins
    assert "max_tokens" in err and "(run: actor_rollout_ref.rollout.max_tokens_per_turn)" in err
    assert "temperature" in err and "(flag)" in err and '"max_steps": 9' in err
    assert "eval sokoban: 100% 3/3" in err  # the progress, as lines (stderr is not a terminal here)


def test_flags_and_env_args_win_over_the_run_and_every_setting_is_printed(tmp_path, capsys):
    run_dir, _ = make_run(
        tmp_path,
        "data.apply_chat_template_kwargs={enable_thinking: false}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
        "actor_rollout_ref.rollout.device=cpu",
    )
    args = parse(
        "eval",
        "--run",
        str(run_dir / "huggingface"),
        "--max-tokens",
        "5",
        "--env-arg",
        "max_steps=4",
        "--env-arg",
        "system_prompt=null",
    )
    settle_rollout_args(args, "eval")
    assert args.model == str(run_dir / "huggingface") and args.env == "sokoban"
    assert args.max_tokens == 5 and args.max_turns == 2 and args.temperature == 0.7
    assert args.env_kwargs["max_steps"] == 4 and args.env_kwargs["system_prompt"] is None
    assert args.env_kwargs["dim_room"] == [6, 6] and args.env_kwargs["offer_tools"] is False
    assert args.seed == SEED and args.tasks == 3 and args.sampling_seed == 0
    assert (
        args.max_model_len == 1024 and args.chat_template_kwargs == {"enable_thinking": False} and args.device == "cpu"
    )
    err = capsys.readouterr().err
    assert "--env-arg max_steps, system_prompt over it" in err and "val_kwargs.temperature" in err

    rollout = parse("rollout", "--run", str(run_dir), "--temperature", "0.5")
    settle_rollout_args(rollout, "rollout")
    assert rollout.n == 8 and rollout.temperature == 0.5 and rollout.seed == 0  # rollout.n and train seeds
    assert "max_steps" in rollout.env_kwargs and rollout.max_tokens == 12


def test_serve_run_takes_the_runs_model_and_context(tmp_path, capsys):
    run_dir, _ = make_run(tmp_path)
    args = parse("serve", "--run", str(run_dir))
    settle_serve_args(args)
    assert args.model == str(run_dir / "huggingface") and args.max_model_len == 1024
    assert "the run's final model" in capsys.readouterr().err
    assert settle_serve_args(parse("serve")) is None  # no --run: the plain defaults
    plain = parse("serve")
    settle_serve_args(plain)
    assert plain.model == "tiny" and plain.max_model_len is None


def test_a_run_is_found_from_any_directory_inside_it(tmp_path):
    run_dir, cfg = make_run(tmp_path, model=False)
    with pytest.raises(RunError, match="no final model"):
        find_run(run_dir)
    with pytest.raises(RunError, match="no config.yaml of an `agentgym train` run"):
        find_run(tmp_path)
    # a checkpoint without an HF model: its model.pt becomes a model directory on the run's start model
    base = load_causal_lm("tiny")
    state = {k: v + 0.01 for k, v in base.state_dict().items()}
    step = checkpoint.step_dir(run_dir, 2)
    (step / "actor").mkdir(parents=True)
    torch.save(state, step / "actor" / "model.pt")
    checkpoint.save_trainer_state(step, {"global_step": 2})
    checkpoint.mark_latest(run_dir, 2)
    for given in (run_dir, step, step / "actor"):
        run = find_run(given)
        assert run.directory == run_dir.resolve() and run.cfg.env.name == "sokoban"
        exported = load_causal_lm(run.model).state_dict()
        assert torch.equal(exported["model.norm.weight"], state["model.norm.weight"])
    # the warm start's SFT model: its own config.yaml is an SFT config, the run's is above it
    sft = run_dir / "warm_start" / "sft"
    shutil.copytree(tiny_model_path(), sft / "huggingface")
    (sft / "config.yaml").write_text("data: {train_files: demos.jsonl}\nmodel: {partial_pretrain: tiny}\n")
    run = find_run(sft / "huggingface")
    assert run.directory == run_dir.resolve() and run.model == str((sft / "huggingface").resolve())


def test_a_model_dir_remembers_its_training_and_eval_warns_when_scored_otherwise(tmp_path, capsys):
    run_dir, cfg = make_run(tmp_path)
    record = read_training_record(run_dir / "huggingface")
    assert record["env"]["name"] == "sokoban" and record["env"]["eval_kwargs"]["system_prompt"] == ""
    assert record["rollout"]["max_tokens_per_turn"] == 12 and record["model"]["export"] == "full"
    assert record["agentgym_version"] and record["run_dir"] == str(run_dir.resolve())

    args = parse("eval", "--env", "sokoban", "--model", str(run_dir / "huggingface"))
    settle_rollout_args(args, "eval")
    err = capsys.readouterr().err
    assert f"trained and scored with other settings ({FILE})" in err
    assert "system_prompt='' in training, null here" in err and "max_steps=9 in training, 100 here" in err
    assert "dim_room" not in err  # [6, 6] is sokoban's default too: not a difference
    assert f"agentgym eval --run {run_dir.resolve()}" in err

    same = [
        f"--env-arg={a}"
        for a in (
            "system_prompt=",
            "max_steps=9",
            "offer_tools=false",
            "max_actions_per_turn=5",
            "dim_room=[6,6]",
            "num_boxes=1",
        )
    ]
    args = parse(
        "eval",
        "--env",
        "sokoban",
        "--model",
        str(run_dir / "huggingface"),
        "--max-turns",
        "2",
        "--max-tokens",
        "12",
        *same,
    )
    settle_rollout_args(args, "eval")
    assert "warning" not in capsys.readouterr().err
    args = parse("eval", "--env", "gsm8k", "--model", str(run_dir / "huggingface"))
    settle_rollout_args(args, "eval")
    assert "was trained on sokoban" in capsys.readouterr().err
