"""veRL users move over by changing the command name: veRL's quickstart runs as written, veRL's keys
take veRL's defaults, and every key either does what it says or is refused / warned about."""

from __future__ import annotations

import importlib.util
import json
import logging
import time

import pytest
import yaml
from omegaconf import OmegaConf

from agentgym.cli import main
from agentgym.compat.verl import DEFAULT_EXCEPTIONS, VERL_DEFAULTS, verl_key_policy
from agentgym.config import ConfigError, compose
from agentgym.model import tiny_model_path
from agentgym.trainer.config import load_config
from tests.support.compat_fixtures import quickstart_command, with_overrides, write_gsm8k_parquet

TINY = str(tiny_model_path())


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    return write_gsm8k_parquet(tmp_path_factory.mktemp("gsm8k"))


def small(command: list[str], run_dir, *extra: str) -> list[str]:
    """The quickstart shrunk to seconds: 8 prompts, 16-token answers, two steps, in-process."""
    return with_overrides(
        command,
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_response_length=16",
        "trainer.total_training_steps=2",
        "trainer.use_ray=false",
        f"trainer.default_local_dir={run_dir}",
        *extra,
    )


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_config(run_dir) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


# ---- the quickstart -------------------------------------------------------------------------------


def test_quickstart_runs_ppo_with_its_critic(gsm8k, tmp_path, capsys):
    """veRL's GSM8K PPO quickstart (no --env): the env comes from the rows, GAE with a trained critic,
    the status line counts steps, and trainer.logger=console still writes metrics.jsonl."""
    assert main(["train", *small(quickstart_command(gsm8k, TINY), tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gae + critic" in out and "| 2 steps |" in out and "epoch(s) steps" not in out
    assert "env chosen: rows" in out and "openai/gsm8k" in out
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows if "critic/vf_loss" in r] == [1, 2]
    assert all("critic/values/mean" in r for r in rows if "critic/vf_loss" in r)
    assert rows[-1]["val/episodes"] == 16  # veRL validates on every row of data.val_files
    assert (tmp_path / "global_step_2" / "critic").is_dir()
    cfg = run_config(tmp_path)
    assert cfg["algorithm"]["adv_estimator"] == "gae" and cfg["actor_rollout_ref"]["rollout"]["n"] == 1
    assert cfg["env"]["name"] == "rows" and cfg["critic"]["enable"] is True


def test_quickstart_with_grpo_runs_grpo_and_warns_about_the_critic_keys(gsm8k, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "agentgym.config")
    command = small(
        quickstart_command(gsm8k, TINY), tmp_path, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"
    )
    assert main(["train", *command]) == 0
    warned = [r.getMessage() for r in caplog.records if "trains no critic" in r.getMessage()]
    assert len(warned) == 1 and "critic.model.path" in warned[0] and "critic.optim.lr" in warned[0]
    rows = metrics(tmp_path)
    assert rows and not any("critic/vf_loss" in r for r in rows)
    assert any("critic/advantages/mean" in r for r in rows)
    assert not (tmp_path / "global_step_2" / "critic").exists()
    assert run_config(tmp_path)["algorithm"]["adv_estimator"] == "grpo"


@pytest.mark.slow
def test_quickstart_as_written_on_ray_with_a_timeline(tmp_path):
    """The quickstart's own batch sizes (256 prompts, mini-batches of 64, micro-batches of 4) on Ray, two
    steps; Ray's timeline is written. Answers are cut to 64 tokens: 256 x 512 sampled tokens take tens of
    minutes on a shared 2-core CPU."""
    data = write_gsm8k_parquet(tmp_path / "data", train_rows=512)
    timeline = tmp_path / "timeline.json"
    command = with_overrides(
        quickstart_command(data, TINY),
        "trainer.total_training_steps=2",
        "data.max_response_length=64",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"ray_init.timeline_json_file={timeline}",
    )
    assert main(["train", *command]) == 0
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows if "critic/vf_loss" in r] == [1, 2]
    assert json.loads(timeline.read_text())  # chrome://tracing events


# ---- defaults --------------------------------------------------------------------------------------


def test_keys_verl_defines_take_verls_defaults():
    cfg = compose(key_policy=verl_key_policy).cfg
    for key, verl in VERL_DEFAULTS.items():
        if key in DEFAULT_EXCEPTIONS:
            continue
        ours = OmegaConf.select(cfg, key)
        ours = OmegaConf.to_container(ours) if OmegaConf.is_config(ours) else ours
        assert ours == verl, f"{key}: train.yaml has {ours!r}, veRL {verl!r} (or list it in DEFAULT_EXCEPTIONS)"
    assert set(DEFAULT_EXCEPTIONS) <= set(VERL_DEFAULTS)


def test_env_presets_choose_their_own_algorithm_explicitly():
    verl = load_config(overrides=["data.train_batch_size=256"], warn=False)
    assert verl.algorithm.adv_estimator == "gae" and verl.actor_rollout_ref.rollout.n == 1 and verl.critic.enable
    sokoban = load_config(env="sokoban", warn=False)
    assert sokoban.algorithm.adv_estimator == "gigpo" and sokoban.actor_rollout_ref.rollout.n == 8
    assert not sokoban.critic.enable
    assert load_config(env="sokoban", overrides=["algorithm=ppo"], warn=False).algorithm.adv_estimator == "gae"
    assert load_config(env="gsm8k_tool", warn=False).algorithm.adv_estimator == "grpo"  # generic preset
    agent = load_config(agent="examples.gsm8k_agent:run", overrides=["data.train_files=x"], warn=False)
    assert agent.algorithm.adv_estimator == "grpo" and agent.actor_rollout_ref.rollout.n == 8


def test_agent_runs_are_named_after_the_agent():
    cfg = load_config(agent="examples.gsm8k_agent:run", warn=False)
    assert cfg.trainer.experiment_name == "gsm8k_agent-grpo"
    assert cfg.trainer.default_local_dir == "outputs/agentgym/gsm8k_agent-grpo"
    named = load_config(env="sokoban", overrides=["trainer.experiment_name=mine"], warn=False)
    assert named.trainer.default_local_dir == "outputs/agentgym/mine"


# ---- keys: accepted, refused, warned --------------------------------------------------------------


def test_rollout_log_prob_micro_batch_size_sets_the_old_log_prob_chunks(monkeypatch):
    from agentgym.trainer import workers

    cfg = load_config(
        env="first_letter",
        overrides=["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3", "trainer.use_ray=false"],
        warn=False,
    )
    assert cfg.actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu == 3
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 3
    seen = []

    def fake_forward(model, micro, with_entropy=False, entropy_grad=False, packed=False):
        import torch

        seen.append(int(micro["input_ids"].shape[0]))
        return torch.zeros(micro["responses"].shape), None

    monkeypatch.setattr(workers, "policy_forward", fake_forward)
    worker = workers.PolicyWorker.__new__(workers.PolicyWorker)
    worker.config, worker.device = cfg, "cpu"
    worker.actor = type("S", (), {"module": type("M", (), {"eval": lambda s: s, "train": lambda s: s})()})()
    import torch

    batch = {"input_ids": torch.zeros(7, 4, dtype=torch.long), "responses": torch.zeros(7, 2, dtype=torch.long)}
    worker.compute_log_prob(batch, list(range(7)), with_entropy=False)
    assert seen == [3, 3, 1]


def test_a_misplaced_key_names_where_it_belongs():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu"):
        load_config(overrides=["actor_rollout_ref.rollout.ppo_micro_batch_size_per_gpu=4"])


def test_every_unknown_key_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        load_config(
            overrides=[
                "data.train_bach_size=8",
                "trainer.totl_epochs=3",
                "critic.model.lora_rank=8",
                "trainer.save_freq=2",
            ]
        )
    message = str(info.value)
    assert message.startswith("3 config keys cannot be used")
    assert "data.train_batch_size" in message and "trainer.total_epochs" in message
    assert "lora_rank=8" in message and "LoRA" in message


def test_verl_keys_with_no_effect_are_accepted_and_warned_once(caplog):
    caplog.set_level(logging.WARNING, "agentgym.config")
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.use_torch_compile=false",
            "trainer.balance_batch=true",
            "ray_kwargs.ray_init.num_cpus=2",
            "+trainer.my_note=hi",
        ]
    )
    assert cfg.ray_init.num_cpus == 2  # veRL's newer name for ray_init.num_cpus
    messages = [r.getMessage() for r in caplog.records]
    ignored = [m for m in messages if "accepted with no effect" in m]
    assert len(ignored) == 1 and "use_torch_compile" in ignored[0] and "trainer.balance_batch" in ignored[0]
    assert any("+trainer.my_note: nothing in agentgym reads" in m for m in messages)


@pytest.mark.parametrize(
    "override,says",
    [
        ("algorithm.kl_penalty=full", "low_var_kl"),
        ("actor_rollout_ref.actor.kl_loss_type=k4", "not one of kl, k1"),
        ("data.truncation=top", "error, left, right, middle"),
        ("reward_model.reward_manager=batchy", "naive, dapo, prime"),
        ("critic.loss_agg_mode=token_mean", "Did you mean 'token-mean'"),
        ("actor_rollout_ref.actor.checkpoint.save_contents=[model,weights]", "hf_model"),
        ("reward_model.enable=true", "reward_model.model.path"),
        ("reward_model.combine=sum", "replace, add"),
        ("reward_model.rollout.name=vllm", "judge.enable=true"),
    ],
)
def test_every_enum_is_checked_at_load(override, says):
    with pytest.raises(ConfigError, match=says):
        load_config(env="first_letter", overrides=[override])


def test_clip_ratio_with_both_bounds_set_has_no_effect_and_says_so(caplog):
    caplog.set_level(logging.WARNING, "agentgym.config")
    load_config(env="first_letter", overrides=["actor_rollout_ref.actor.clip_ratio=0.3"])
    assert any("clip_ratio=0.3: no effect" in r.getMessage() for r in caplog.records)
    caplog.clear()
    load_config(
        env="first_letter",
        overrides=[
            "actor_rollout_ref.actor.clip_ratio=0.3",
            "actor_rollout_ref.actor.clip_ratio_low=null",
            "actor_rollout_ref.actor.clip_ratio_high=null",
        ],
    )
    assert not caplog.records


# ---- failing before any work -----------------------------------------------------------------------


@pytest.fixture
def no_servers(monkeypatch):
    """Fail the test if anything starts policy servers."""
    from agentgym.trainer import rollout_servers

    def refuse(*_a, **_k):
        raise AssertionError("servers were started before the config was checked")

    monkeypatch.setattr(rollout_servers.RolloutServers, "__init__", refuse)


def test_a_batch_larger_than_the_data_fails_before_any_work(gsm8k, capsys, no_servers):
    assert (
        main(
            [
                "train",
                f"data.train_files={gsm8k}/train.parquet",
                "data.train_batch_size=256",
                "actor_rollout_ref.actor.ppo_mini_batch_size=64",
            ]
        )
        == 2
    )
    assert "data.train_batch_size=256 is larger than the 64 rows" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_vllm_names_what_works(gsm8k, capsys, no_servers):
    assert (
        main(
            [
                "train",
                f"data.train_files={gsm8k}/train.parquet",
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.rollout.name=vllm",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.name=embedded" in err and "--engine" not in err


def test_a_hub_name_without_hub_access_fails_at_once(gsm8k, capsys, monkeypatch, tmp_path, no_servers):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    started = time.perf_counter()
    assert (
        main(
            [
                "train",
                f"data.train_files={gsm8k}/train.parquet",
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
            ]
        )
        == 2
    )
    assert time.perf_counter() - started < 10
    err = capsys.readouterr().err
    assert "not in the Hugging Face cache" in err and "actor_rollout_ref.model.path=tiny" in err


def test_the_gateway_root_says_to_create_a_session_first():
    import openai

    from agentgym.gateway.serve import start_gateway

    handle = start_gateway(["http://127.0.0.1:9"], model="tiny", max_model_len=256)
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError, match=r"Create one first: POST .*/sessions"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        handle.stop()
