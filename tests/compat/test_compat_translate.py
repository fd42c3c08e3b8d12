"""`agentgym config --from SYSTEM FILE`: every key of their file is accounted for, the result loads and
runs, and the "coming from X" pages are the translators' own tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.cli import main
from agentgym.compat.translate import load_their_yaml
from agentgym.config import flatten
from agentgym.stages.config_command import translate_file
from tests.support.compat_fixtures import write_gsm8k_parquet

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    return write_gsm8k_parquet(tmp_path_factory.mktemp("gsm8k"), train_rows=16, test_rows=4)


def filled(name: str, tmp_path: Path, data: Path) -> Path:
    text = (FIXTURES / name).read_text().replace("DATA_DIR", str(data)).replace("OUTPUT_DIR", str(tmp_path / "run"))
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "system,name",
    [
        ("roll", "roll_agentic_sokoban.yaml"),
        ("chatlearn", "chatlearn_grpo_fsdp.yaml"),
        ("verl", "verl_ppo_config.yaml"),
        ("claw-r1", "claw_r1_async.yaml"),
    ],
)
def test_every_key_of_their_file_is_accounted_for(system, name):
    tr = translate_file(system, str(FIXTURES / name))
    data = load_their_yaml(str(FIXTURES / name))
    accounted = (
        {m[0] for m in tr.mapped} | {d[0] for d in tr.dropped} | {r[0] for r in tr.refused} | {d[0] for d in tr.derived}
    )
    for key in flatten(data):
        assert key in accounted or any(a.startswith(key + ".") or key.startswith(a + ".") for a in accounted), key


def test_chatlearn_grpo_translates_and_runs_two_steps(gsm8k, tmp_path, capsys):
    path = filled("chatlearn_grpo_fsdp.yaml", tmp_path, gsm8k)
    out = tmp_path / "agentgym.yaml"
    assert main(["config", "--from", "chatlearn", str(path), "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert "models.policy_trainer.max_token_in_packing" in report and "ppo_max_token_len_per_gpu = 2048" in report
    assert main(["train", "--config", str(out), "actor_rollout_ref.model.path=tiny", "trainer.use_ray=false"]) == 0
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and rows[-1]["episodes"] == 8  # 8 samples per episode
    config = (run / "config.yaml").read_text()
    assert "use_remove_padding: true" in config and "use_dynamic_bsz: true" in config
    assert "enable_thinking: false" in config


def test_verl_config_file_translates_with_aliases_and_refusals(gsm8k, tmp_path):
    path = filled("verl_ppo_config.yaml", tmp_path, gsm8k)
    tr = translate_file("verl", str(path))
    assert tr.get("actor_rollout_ref.actor.grad_clip") == 1.0  # optim.clip_grad, veRL's newer name
    assert tr.get("ray_init.num_cpus") == 2
    assert any(k == "actor_rollout_ref.actor.use_torch_compile" for k, _ in tr.dropped)
    assert not tr.refused, tr.refused
    text = path.read_text().replace("lora_rank: 0", "lora_rank: 16")
    path.write_text(text)
    tr = translate_file("verl", str(path))
    assert tr.get("actor_rollout_ref.model.lora_rank") == 16 and not tr.refused  # the actor trains LoRA


def test_claw_r1_async_keys_map_to_the_async_trainer():
    tr = translate_file("claw-r1", str(FIXTURES / "claw_r1_async.yaml"))
    refused = dict(tr.refused)
    assert [k for k in refused if k.startswith("async_training.")] == ["async_training.enable_prefix_tree_merge"]
    assert tr.get("async_training.staleness_threshold") == 0.1
    assert tr.get("async_training.trigger_parameter_sync_step") == 4
    assert tr.get("rollout.n_gpus_per_node") is not None
    assert tr.get("actor_rollout_ref.rollout.agent.agent_flow_config_path") is not None


def test_the_coming_from_pages_are_generated_from_the_tables():
    from agentgym.compat.docs import main as docs_main

    assert docs_main(["--check"]) == 0, "run: python -m agentgym.compat.docs"
