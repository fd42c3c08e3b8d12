"""The typed configuration: the schema (agentgym.config_schema) is the one home of every key's type,
default and help; the composed config is a structured config of it; configs/train.yaml is written from it."""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from agentgym.config import ConfigError, compose, config_dir, flatten
from agentgym.config_schema import (
    SCHEMAS,
    EvaluationConfig,
    GenerationConfig,
    SFTConfig,
    TrainConfig,
    base_defaults,
    leaves,
)
from agentgym.config_schema.__main__ import files
from agentgym.config_schema.__main__ import main as write_yaml
from agentgym.config_schema.keys import OPEN_SECTIONS
from agentgym.trainer.config import CHOICES, load_config

FIELDS = leaves(TrainConfig)


@pytest.mark.parametrize("schema", [TrainConfig, SFTConfig, GenerationConfig, EvaluationConfig])
def test_every_field_has_a_help_text_that_does_not_restate_its_default(schema):
    fields = leaves(schema)
    missing = [key for key, leaf in fields.items() if not leaf.help.strip()]
    assert not missing, f"fields without help: {missing}"
    restating = [
        key
        for key, leaf in fields.items()
        if leaf.default not in (None, "", [], {})
        and re.search(rf"\(\s*(default:?\s*)?{re.escape(str(leaf.default))}\s*\)", leaf.help)
    ]
    assert not restating, f"help texts that restate the default: {restating}"


def test_checked_in_train_yaml_is_what_the_schema_writes(tmp_path):
    for name, text in files().items():
        assert (config_dir() / name).read_text() == text, (
            f"configs/{name} is out of date: run python -m agentgym.config_schema"
        )
    (tmp_path / "train.yaml").write_text("stale\n")
    assert write_yaml(["--check", "--configs", str(tmp_path)]) == 1
    assert write_yaml(["--configs", str(tmp_path)]) == 0
    assert write_yaml(["--check", "--configs", str(tmp_path)]) == 0
    assert set(files()) == {f"{name}.yaml" for name in SCHEMAS}
    for name in SCHEMAS:
        written = (tmp_path / f"{name}.yaml").read_text()
        assert OmegaConf.to_container(OmegaConf.create(written)) == base_defaults(name), name
    text = (tmp_path / "train.yaml").read_text()
    assert "lr: 1.0e-06" in text and "# learning rate (AdamW)" in text  # key, default, help as a comment
    text = (tmp_path / "generation.yaml").read_text()
    assert text.splitlines()[2].startswith("# `agentgym generate`: veRL's main_generation")  # the header kept
    assert re.search(r"^  n_samples: 5 +# responses per prompt$", text, re.M)


def test_choices_are_the_schemas_literal_fields():
    assert CHOICES["actor_rollout_ref.rollout.name"] == ("embedded", "vllm", "sglang")
    assert CHOICES["algorithm.reward_norm"] == (None, "batch", "group", "running")
    assert set(CHOICES) >= {"trainer.device", "env.executor", "judge.mode", "data.truncation"}


def test_open_sections_are_mappings_in_the_schema():
    for key in OPEN_SECTIONS:
        leaf = FIELDS.get(key)
        assert (leaf is not None and leaf.kind == "dict") or key == "ray_init", key


def _check_types(cfg):
    for key, leaf in FIELDS.items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            assert leaf.optional, key
            continue
        python = {"bool": bool, "int": int, "float": float, "str": str}.get(leaf.kind)
        if python is not None:
            assert type(value) is python, f"{key}={value!r} is not {leaf.kind}"
        if leaf.kind == "choice":
            assert value in leaf.choices, key


@pytest.mark.parametrize("env", sorted(p.stem for p in (config_dir() / "env").glob("*.yaml")))
def test_every_preset_composes_to_a_typed_structured_config(env):
    cfg = load_config(env=env, warn=False)
    assert OmegaConf.get_type(cfg) is TrainConfig
    assert set(FIELDS) <= set(flatten(cfg)) | {k for k in FIELDS if FIELDS[k].kind == "dict"}
    _check_types(cfg)
    with pytest.raises(ValidationError):  # typed after loading too: no caller needs int()/float()
        cfg.data.train_batch_size = "many"


def test_values_take_their_fields_types():
    cfg = load_config(
        env="sokoban",
        overrides=["actor_rollout_ref.actor.optim.lr=1", "data.train_batch_size=8.0", "judge.score_range=[1,5]"],
        warn=False,
    )
    lr = cfg.actor_rollout_ref.actor.optim.lr
    assert lr == 1.0 and type(lr) is float
    assert cfg.data.train_batch_size == 8 and type(cfg.data.train_batch_size) is int
    assert list(cfg.judge.score_range) == [1.0, 5.0]
    with pytest.raises(ConfigError, match=r"data\.train_batch_size takes a whole number, got 2\.5"):
        load_config(env="sokoban", overrides=["data.train_batch_size=2.5"])
    with pytest.raises(ConfigError, match=r"trainer\.nnodes takes a number, not null .*default 1"):
        load_config(env="sokoban", overrides=["trainer.nnodes=null"])
    with pytest.raises(ConfigError, match=r"env\.kwargs takes a mapping"):
        load_config(env="sokoban", overrides=["env.kwargs=3"])
    with pytest.raises(
        ConfigError, match=r"rollout\.name='vlm' is not one of embedded, vllm, sglang\. Did you mean 'vllm'"
    ):
        load_config(env="sokoban", overrides=["actor_rollout_ref.rollout.name=vlm"])


def test_config_file_values_are_checked_too(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("trainer:\n  device: gpu\n")
    with pytest.raises(ConfigError, match=r"trainer\.device='gpu' is not one of auto, cpu, cuda"):
        load_config(env="sokoban", config_file=path)
    path.write_text("trainer:\n  val_before_train: maybe\n")
    with pytest.raises(ConfigError, match=r"trainer\.val_before_train takes true or false, got 'maybe'"):
        load_config(env="sokoban", config_file=path)


def test_open_sections_keep_any_key_and_mappings_are_replaced(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("actor_rollout_ref:\n  rollout:\n    engine_kwargs: {}\n")
    cfg = load_config(
        env="sokoban", config_file=path, overrides=["ray_init.runtime_env={env_vars: {A: '1'}}"], warn=False
    )
    assert cfg.ray_init.runtime_env.env_vars.A == "1" and cfg.ray_init.address is None
    assert dict(cfg.actor_rollout_ref.rollout.engine_kwargs) == {}  # replaced, as the file says, not merged
    assert compose().cfg.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {}, "sglang": {}}


def test_plus_key_survives_the_structured_config():
    composition = compose(env="sokoban", overrides=["+trainer.note=hello"])
    assert composition.cfg.trainer.note == "hello" and composition.added == {"trainer.note": "hello"}


def test_origins_name_where_each_value_came_from(tmp_path):
    from agentgym.trainer.config import compose_training

    path = tmp_path / "mine.yaml"
    path.write_text("trainer:\n  seed: 3\n")
    composition = compose_training(
        "sokoban",
        path,
        ["data.train_batch_size=8", "~trainer.seed", "algorithm.filter_groups.enable=false"],
        config_name="async_ppo_trainer",
    )
    origin = composition.origin
    assert origin("data.train_batch_size") == "command line"
    assert origin("env.kwargs.dim_room") == "group file env/sokoban.yaml"
    assert origin("algorithm.adv_estimator") == "group file algorithm/gigpo.yaml"
    assert origin("async_training.staleness_threshold") == "named config async_ppo_trainer"
    assert origin("actor_rollout_ref.actor.ppo_mini_batch_size") == "derived by load_config"
    assert origin("trainer.seed") == "default"  # ~key: back to what it was before the file
    assert origin("data.shuffle") == "default"
    path.write_text("data:\n  shuffle: false\n")
    assert compose_training("sokoban", path).origin("data.shuffle") == f"--config {path}"


def test_agentgym_config_show_prints_values_with_origins(capsys):
    from agentgym.cli import main

    assert main(["config", "--show", "--env", "sokoban", "data.train_batch_size=8", "+trainer.note=hi"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines() if not line.startswith("#")}
    assert re.match(r"data\.train_batch_size: 8 +# command line$", lines["data.train_batch_size"])
    assert lines["env.name"].endswith("# group file env/sokoban.yaml")
    assert lines["trainer.project_name"].endswith("# default")
    assert "sokoban-gigpo" in lines["trainer.experiment_name"]
    assert lines["trainer.experiment_name"].endswith("# derived by load_config")
    assert "+key" in lines["trainer.note"]
    assert main(["config", "--show", "--env", "sokoban", "data.train_bach_size=8"]) == 2
    assert "Did you mean 'data.train_batch_size'" in capsys.readouterr().err
    assert main(["config"]) == 2
    assert "--show" in capsys.readouterr().err


def test_generation_and_evaluation_configs_are_typed():
    from agentgym.stages.offline.common import load_offline_config

    cfg, ignored = load_offline_config(
        "generation.yaml", ["data.n_samples=2.0", "rollout.temperature=1", "trainer.n_gpus_per_node=1"]
    )
    assert OmegaConf.get_type(cfg) is GenerationConfig and "trainer.n_gpus_per_node" in ignored
    assert type(cfg.data.n_samples) is int and type(cfg.rollout.temperature) is float
    with pytest.raises(ConfigError, match=r"rollout\.name='vlm' is not one of embedded, vllm, sglang\. Did you mean"):
        load_offline_config("generation.yaml", ["rollout.name=vlm"])
    with pytest.raises(ConfigError, match=r"data\.batch_size takes a whole number"):
        load_offline_config("generation.yaml", ["data.batch_size=1.5"])
    cfg, _ = load_offline_config("evaluation.yaml", ["data.path=rows.jsonl"])
    assert OmegaConf.get_type(cfg) is EvaluationConfig and cfg.custom_reward_function.name == "compute_score"
    with pytest.raises(ConfigError, match=r"Did you mean 'data\.response_key'"):
        load_offline_config("evaluation.yaml", ["data.response_keys=r"])


def test_sft_config_is_typed_too():
    from agentgym.stages.sft import load_sft_config

    cfg = load_sft_config(overrides=["data.train_files=demos.jsonl", "optim.lr=1"], warn=False)
    assert OmegaConf.get_type(cfg) is SFTConfig
    assert type(cfg.optim.lr) is float and cfg.trainer.default_local_dir == "outputs/agentgym-sft/sft"
    with pytest.raises(ConfigError, match=r"data\.train_batch_size takes a number"):
        load_sft_config(overrides=["data.train_files=demos.jsonl", "data.train_batch_size=many"])
