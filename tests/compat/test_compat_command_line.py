"""Their launch scripts with only the command name changed: Hydra's command-line forms, other systems' files
and keys given to ``agentgym train``, dumped veRL configs, veRL values, the device check before any Ray
request, and every optional package named with its install command."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentgym.config import ConfigError, hydra_config_file
from agentgym.stages.config_command import resolve_command_line
from agentgym.trainer.config import compose_training, config_notes, load_config

FIXTURES = Path(__file__).parent / "fixtures"


def loaded(config_file=None, overrides=(), config_path=None, config_name=None):
    """What ``agentgym train`` composes for this command line: the config and its notes."""
    line = resolve_command_line(config_file, list(overrides), config_path, config_name)
    try:
        comp = compose_training(config_file=line.config_file, overrides=line.overrides, config_name=line.config_name)
    finally:
        line.delete()
    return comp.cfg, line.notes + config_notes(comp)


# ---- Hydra's forms -----------------------------------------------------------------------------------


def test_config_path_and_name_load_a_verl_recipe_with_a_defaults_list(tmp_path):
    recipe = tmp_path / "config"
    recipe.mkdir()
    (recipe / "gsm8k_multiturn_grpo.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 300\n  train_batch_size: 8\nactor_rollout_ref:\n  rollout:\n    name: hf\n"
        "    multi_turn:\n      enable: true\n      max_assistant_turns: 5\n"
    )
    cfg, notes = loaded(
        None,
        ["data.train_batch_size=4", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
        str(recipe),
        "gsm8k_multiturn_grpo",
    )
    assert cfg.data.max_prompt_length == 300 and cfg.data.train_batch_size == 4  # the command line wins
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5
    assert cfg.actor_rollout_ref.rollout.name == "embedded"
    assert any("rollout.name=hf" in n and "embedded server" in n for n in notes)


def test_a_missing_hydra_file_names_the_directory_and_the_closest_name(tmp_path):
    (tmp_path / "agentic_val_sokoban.yaml").write_text("seed: 1\n")
    with pytest.raises(ConfigError, match="Did you mean --config-name agentic_val_sokoban"):
        hydra_config_file(str(tmp_path), "agentic_val_sokoban_typo")
    with pytest.raises(ConfigError, match="named configs"):
        resolve_command_line(None, [], None, "not_a_named_config")


def test_agentgym_named_configs_and_verl_base_names_still_work():
    assert resolve_command_line(None, [], None, "async_ppo_trainer").config_name == "async_ppo_trainer"
    line = resolve_command_line(None, [], None, "ppo_trainer")
    assert line.config_name is None and "configs/train.yaml" in line.notes[0]


def test_plus_tilde_and_double_plus(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "data:\n  train_batch_size: 2\n  max_prompt_length: 77\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 2\n"
    )
    cfg, notes = loaded(
        str(mine),
        ["~data.max_prompt_length", "++trainer.note=x", "+actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"],
    )
    assert cfg.data.max_prompt_length == 512 and cfg.data.train_batch_size == 2  # ~ back to train.yaml's
    assert cfg.trainer.note == "x"
    text = "\n".join(notes)
    assert "+trainer.note" in text  # kept, and said that nothing reads it
    assert "actor_rollout_ref.actor.fsdp_config.model_dtype" in text and "FSDP wrapping" in text  # a veRL key: noted


# ---- other systems' files and keys given to agentgym train ------------------------------------------


def test_chatlearn_launch_script_keys_are_translated_on_the_command_line():
    cfg, notes = loaded(
        str(FIXTURES / "chatlearn_grpo_fsdp.yaml"),
        [
            "runtime_args.sample_per_episode=16",
            "models.policy.num_inference_per_prompt=4",
            "runtime_args.num_inference_per_prompt=4",
            "runtime_args.train_global_batch_size=16",
            "models.policy_trainer.load=tiny",
            "models.policy_trainer.num_gpu=1",
            "trainer.logger=[console]",
        ],
    )
    assert cfg.data.train_batch_size == 4 and cfg.actor_rollout_ref.rollout.n == 4  # 16 samples / 4 per prompt
    assert cfg.actor_rollout_ref.model.path == "tiny" and list(cfg.trainer.logger) == ["console"]
    assert "translated as `agentgym config --from chatlearn`" in notes[0]


def test_chatlearn_keys_alone_are_recognised():
    line = resolve_command_line(None, ["runtime_args.num_episode=2", "data.train_batch_size=3"])
    try:
        assert "chatlearn" in line.notes[0] and line.overrides == ["data.train_batch_size=3"]
        assert OmegaConf.load(line.config_file).trainer.total_training_steps == 2
    finally:
        line.delete()


def test_roll_keys_on_the_command_line_go_into_the_roll_file():
    cfg, _ = loaded(
        str(FIXTURES / "roll_agentic_sokoban.yaml"), ["pretrain=tiny", "max_steps=3", "actor_rollout_ref.rollout.n=2"]
    )
    assert cfg.actor_rollout_ref.model.path == "tiny" and cfg.trainer.total_training_steps == 3
    assert cfg.actor_rollout_ref.rollout.n == 2  # agentgym's key, after the translation


# ---- dumped veRL configs -------------------------------------------------------------------------------


def test_a_dumped_verl_config_loads_with_notes():
    cfg, notes = loaded(
        str(FIXTURES / "verl_dumped_config.yaml"),
        [
            "actor_rollout_ref.model.path=tiny",
            "critic.model.path=tiny",
            "trainer.n_gpus_per_node=1",
            "trainer.project_name=mine",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        ],
    )
    text = "\n".join(notes)
    assert cfg.actor_rollout_ref.rollout.name == "embedded" and "rollout.name=None" in text
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 8 and "launch script" in text
    assert cfg.trainer.device == "auto" and "trainer.device=cuda" in text
    assert cfg.trainer.default_local_dir == "checkpoints/mine/gsm8k"  # the interpolations stayed live
    assert cfg.critic.ppo_mini_batch_size == 1  # ${oc.select:actor_rollout_ref.actor.ppo_mini_batch_size,256}
    from agentgym.stages.config_command import translate_file

    dropped = dict(translate_file("verl", str(FIXTURES / "verl_dumped_config.yaml")).dropped)
    assert "model path" in dropped["critic.model.tokenizer_path"]  # accepted, and said to have no effect
    assert "with no effect" in text  # agentgym train says how many, config --from lists them


def test_rollout_name_hf_on_the_command_line():
    comp = compose_training(env="first_letter", overrides=["actor_rollout_ref.rollout.name=hf"])
    assert comp.cfg.actor_rollout_ref.rollout.name == "embedded"
    assert any("HF" in n or "Hugging Face" in n for n in comp.notes)


# ---- before any work: devices and packages ---------------------------------------------------------------


def test_cuda_on_a_machine_without_one_is_refused_before_ray():
    from agentgym.preflight import check_device

    cfg = load_config(env="first_letter", overrides=["trainer.device=cuda"], warn=False)
    with pytest.raises(ConfigError, match="no CUDA device.*trainer.device=auto"):
        check_device(cfg, devices=0)
    check_device(load_config(env="first_letter", overrides=["trainer.device=auto"], warn=False), devices=0)
    many = load_config(
        env="first_letter",
        overrides=[
            "trainer.n_gpus_per_node=8",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        ],
        warn=False,
    )
    with pytest.raises(ConfigError, match="n_gpus_per_node=1"):
        check_device(many, devices=1)
    server = load_config(env="first_letter", overrides=["actor_rollout_ref.rollout.device=cuda"], warn=False)
    with pytest.raises(ConfigError, match="rollout.device=cuda"):
        check_device(server, devices=0)


def test_the_cli_fails_fast_on_cuda_without_one(tmp_path, capsys):
    import torch

    from agentgym.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["train", "--env", "first_letter", "trainer.device=cuda", f"trainer.default_local_dir={tmp_path}"])
    assert code == 2 and "trainer.device=cuda but this machine has no CUDA device" in capsys.readouterr().err


def test_every_missing_optional_package_is_named_with_its_install_command(monkeypatch):
    from agentgym import preflight

    cfg = load_config(
        env="first_letter",
        overrides=["trainer.logger=[console,wandb]", "actor_rollout_ref.model.lora_rank=8"],
        warn=False,
    )
    monkeypatch.setattr(preflight, "_importable", lambda module: module not in ("wandb", "peft"))
    with pytest.raises(ConfigError) as raised:
        preflight.check_optional_packages(cfg)
    assert "pip install wandb" in str(raised.value) and "pip install peft" in str(raised.value)
    monkeypatch.setattr(preflight, "_importable", lambda module: True)
    preflight.check_optional_packages(cfg)


# ---- veRL's interaction classes and tool rows --------------------------------------------------------------


def test_verls_gsm8k_interaction_class_is_the_builtin():
    from agentgym.interactions.config import build_interactions
    from agentgym.interactions.gsm8k import Gsm8kInteraction

    built = build_interactions(
        {
            "interaction": [
                {"name": "gsm8k", "config": {}, "class_name": "verl.interactions.gsm8k_interaction.Gsm8kInteraction"}
            ]
        }
    )
    assert isinstance(built["gsm8k"], Gsm8kInteraction)


def test_rows_made_for_verl_tools_are_refused_not_trained_without_their_tools():
    from agentgym.preflight import check_tool_rows

    cfg = load_config(env="rows", warn=False)
    row = {
        "prompt": [{"role": "user", "content": "q"}],
        "data_source": "openai/gsm8k",
        "extra_info": {
            "need_tools_kwargs": True,
            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "3"}}},
        },
    }
    with pytest.raises(ConfigError, match="calc_gsm8k_reward.*--env gsm8k_tool"):
        check_tool_rows(cfg, [row])
    check_tool_rows(cfg, [{**row, "extra_info": {}}])


def test_a_json_file_of_json_lines_is_read(tmp_path):
    from agentgym.envs.data import read_rows

    lines = tmp_path / "train.json"
    lines.write_text('{"a": 1}\n{"a": 2}\n')
    listed = tmp_path / "test.json"
    listed.write_text('[{"a": 1}, {"a": 2}]')
    assert read_rows(lines) == read_rows(listed) == [{"a": 1}, {"a": 2}]
