"""Training config: composition, dotted overrides, typo suggestions, batch-size arithmetic."""

from __future__ import annotations

import pytest

from agentgym.config import ConfigError, config_dir, flatten
from agentgym.trainer.config import check_batch_sizes, load_config


def test_configs_dir_has_the_groups():
    root = config_dir()
    assert (root / "train.yaml").is_file()
    for group in ("algorithm", "env", "model", "server"):
        assert list((root / group).glob("*.yaml")), group


def test_env_group_and_dotted_overrides():
    cfg = load_config(
        env="sokoban",
        overrides=[
            "data.train_batch_size=8",
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "trainer.logger=[console,tensorboard]",
            "actor_rollout_ref.rollout.n=2",
        ],
    )
    assert cfg.env.name == "sokoban" and cfg.env.kwargs.dim_room == [6, 6]
    assert cfg.data.train_batch_size == 8
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-3)  # "1e-3" is a float, not a string
    assert list(cfg.trainer.logger) == ["console", "tensorboard"]
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8  # null: the whole step's tasks
    assert cfg.trainer.experiment_name == "sokoban-grpo"
    assert cfg.trainer.default_local_dir == "outputs/agentgym/sokoban-grpo"


def test_group_choice_and_derived_critic():
    cfg = load_config(env="sokoban", overrides=["algorithm=ppo"])
    assert cfg.algorithm.adv_estimator == "gae" and cfg.critic.enable
    assert cfg.critic.ppo_micro_batch_size_per_gpu == cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    assert not load_config(env="sokoban").critic.enable


def test_unknown_env_falls_back_to_generic_group():
    cfg = load_config(env="gsm8k_tool")
    assert cfg.env.name == "gsm8k_tool" and cfg.trainer.total_training_steps == 20


def test_mistyped_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"data\.train_batch_size"):
        load_config(env="sokoban", overrides=["data.train_bach_size=8"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.ppo_mini_batch_size"):
        load_config(env="sokoban", overrides=["actor_rollout_ref.actor.ppo_mini_batchsize=2"])
    with pytest.raises(ConfigError, match=r"Did you mean 'algorithm\.adv_estimator'"):
        load_config(overrides=["algorithm.adv_estimater=gae"])


def test_mistyped_value_and_group_choice():
    with pytest.raises(ConfigError, match="Did you mean 'grpo'"):
        load_config(env="sokoban", overrides=["algorithm.adv_estimator=grp"])
    with pytest.raises(ConfigError, match="algorithm=ppo"):
        load_config(env="sokoban", overrides=["algorithm=ppoo"])
    with pytest.raises(ConfigError, match="takes a number"):
        load_config(env="sokoban", overrides=["data.train_batch_size=eight"])
    with pytest.raises(ConfigError, match="tensorboard"):
        load_config(env="sokoban", overrides=["trainer.logger=[tensorbord]"])


def test_plus_adds_a_key_and_open_sections_take_anything():
    cfg = load_config(env="sokoban", overrides=["env.kwargs.max_steps=20", "+trainer.note=hello"])
    assert cfg.env.kwargs.max_steps == 20 and cfg.trainer.note == "hello"


def test_user_config_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("defaults:\n  algorithm: rloo\ndata:\n  train_batch_size: 2\n")
    cfg = load_config(env="sokoban", config_file=path, overrides=["actor_rollout_ref.rollout.n=2"])
    assert cfg.algorithm.adv_estimator == "rloo" and cfg.data.train_batch_size == 2
    path.write_text("data:\n  train_batch_sise: 2\n")
    with pytest.raises(ConfigError, match=r"data\.train_batch_size"):
        load_config(env="sokoban", config_file=path)


def test_batch_size_conflicts_name_the_numbers():
    with pytest.raises(ConfigError, match=r"data\.train_batch_size=6 is not a multiple of .*ppo_mini_batch_size=4"):
        load_config(
            env="sokoban", overrides=["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
        )
    with pytest.raises(ConfigError, match=r"3 \* 3 = 9 trajectories does not split evenly over .* 2 workers"):
        load_config(
            env="sokoban",
            overrides=[
                "data.train_batch_size=3",
                "actor_rollout_ref.rollout.n=3",
                "trainer.n_gpus_per_node=2",
                "trainer.use_ray=true",
            ],
        )
    with pytest.raises(
        ConfigError, match=r"4 \* 4 / 2 = 8 trajectories, not a multiple of .*micro_batch_size_per_gpu=3"
    ):
        load_config(
            env="sokoban",
            overrides=[
                "trainer.n_gpus_per_node=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
                "trainer.use_ray=true",
                "data.train_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
            ],
        )
    with pytest.raises(ConfigError, match="larger than data.train_batch_size"):
        check_batch_sizes(2, 4, 4, 1, 1, "actor_rollout_ref.actor")
    check_batch_sizes(8, 4, 4, 8, 2, "actor_rollout_ref.actor")  # 4*4/2 = 8: fine


def test_in_process_run_needs_one_worker_and_gae_needs_the_critic():
    with pytest.raises(ConfigError, match="use_ray=false"):
        load_config(env="sokoban", overrides=["trainer.use_ray=false", "trainer.n_gpus_per_node=2"])
    with pytest.raises(ConfigError, match="needs the critic"):
        load_config(env="sokoban", overrides=["algorithm.adv_estimator=gae", "critic.enable=false"])


def test_every_group_file_composes():
    root = config_dir()
    for group in ("algorithm", "model", "server"):
        for path in (root / group).glob("*.yaml"):
            load_config(env="sokoban", overrides=[f"{group}={path.stem}"])
    for path in (root / "env").glob("*.yaml"):
        load_config(env=path.stem)


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {}}, "d": [1]}) == {"a.b": 1, "a.c": {}, "d": [1]}


def test_agentgym_train_reports_config_errors_before_any_work(capsys):
    from agentgym.cli import main

    assert main(["train", "--env", "sokoban", "data.train_bach_size=8"]) == 2
    assert "Did you mean 'data.train_batch_size'" in capsys.readouterr().err
    assert main(["train", "--env", "sokobn"]) == 2
    assert "Did you mean 'sokoban'" in capsys.readouterr().err
    assert main(["train", "--env", "gsm8k", "data.train_files=/nonexistent/train.jsonl"]) == 2
    assert "data.train_files=/nonexistent/train.jsonl does not exist" in capsys.readouterr().err


def test_an_installed_wheel_finds_its_packaged_configs(tmp_path, monkeypatch):
    """From a wheel, agentgym sits in site-packages with no configs/ beside it: it uses the copy
    built into the package (agentgym/configs, see setup.py), from any working directory."""
    import agentgym.config as config_module

    site = tmp_path / "site-packages"
    (site / "agentgym" / "configs").mkdir(parents=True)
    (site / "agentgym" / "configs" / "train.yaml").write_text((config_dir() / "train.yaml").read_text())
    monkeypatch.setattr(config_module, "__file__", str(site / "agentgym" / "config.py"))
    monkeypatch.delenv("AGENTGYM_CONFIG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert config_dir() == site / "agentgym" / "configs"
    (site / "agentgym" / "configs" / "train.yaml").unlink()
    with pytest.raises(ConfigError, match="AGENTGYM_CONFIG_DIR"):
        config_dir()
