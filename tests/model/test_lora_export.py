"""A LoRA run's model is usable like any other: its adapter directory loads as the base with the adapters
merged in (with the base's tokenizer), a LoRA checkpoint exports to a model directory, and the main
job's LoRA command ends with its held-out table, which ``agentgym eval --run`` reproduces."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

pytestmark = [
    pytest.mark.lora,
    pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install 'agentgym[lora]'"),
]

from agentgym.model import (  # noqa: E402
    load_causal_lm,
    load_tokenizer,
    lora,  # noqa: E402
    tiny_model_path,
)

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = torch.tensor([list(range(5, 30))])


def trained_adapters(targets, base="tiny"):
    model = lora.wrap(load_causal_lm(base).train(), lora.LoraSettings(8, 16, targets))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.mark.parametrize("targets", [ALL, [*ALL, "lm_head"]])
def test_an_adapter_directory_loads_as_its_base_with_the_adapters_merged(tmp_path, monkeypatch, targets):
    shutil.copytree(tiny_model_path(), tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    model = trained_adapters(targets, base="base")
    lora.save_adapter(model, str(tmp_path / "adapter"), "base")  # a relative base path, as runs have
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(tmp_path / "base")  # absolute: loads from anywhere
    monkeypatch.chdir("/")
    loaded = load_causal_lm(str(tmp_path / "adapter"))
    with torch.no_grad():
        assert torch.allclose(loaded(IDS).logits, model(IDS).logits, atol=1e-4)
        base_logits = load_causal_lm("tiny")(IDS).logits
    assert not torch.allclose(loaded(IDS).logits, base_logits, atol=1e-3)  # the adapters are in
    text = "<answer>Up</answer>"
    assert load_tokenizer(str(tmp_path / "adapter")).encode(text) == load_tokenizer("tiny").encode(text)


def test_a_lora_checkpoint_exports_to_a_model_directory(tmp_path):
    from agentgym.stages.run_dir import export_checkpoint
    from agentgym.trainer.config import load_config

    model = trained_adapters(ALL)
    torch.save(model.state_dict(), tmp_path / "model.pt")  # a LoRA checkpoint holds the adapters only
    cfg = load_config(
        env="sokoban", overrides=["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16"]
    )
    export_checkpoint(tmp_path / "model.pt", cfg, tmp_path / "out", "tiny")
    with torch.no_grad():
        assert torch.allclose(load_causal_lm(str(tmp_path / "out"))(IDS).logits, model(IDS).logits, atol=1e-4)


@pytest.mark.slow
def test_the_lora_main_job_ends_with_its_table_and_eval_run_reproduces_it(tmp_path, monkeypatch, capsys):
    """The issue's command, sized down: few demos and SFT steps, 2 RL steps, 4 held-out tasks."""
    from agentgym.cli import main
    from agentgym.rollout.runner import RolloutRunner
    from agentgym.rollout.storage import read_trajectories

    seen: dict[str, list] = {}
    original = RolloutRunner.run

    async def spy(self, *args, **kwargs):
        result = await original(self, *args, **kwargs)
        if isinstance(kwargs.get("progress"), str):
            seen[kwargs["progress"]] = result.trajectories
        return result

    monkeypatch.setattr(RolloutRunner, "run", spy)
    run_dir = tmp_path / "run"
    overrides = [
        f"trainer.default_local_dir={run_dir}",
        "warm_start.demos=40",
        "warm_start.sft.trainer.total_training_steps=3",
        "warm_start.sft.data.train_batch_size=8",
        "warm_start.sft.data.micro_batch_size_per_gpu=8",
        "trainer.total_training_steps=2",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "held_out.num_tasks=4",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        "actor_rollout_ref.rollout.max_tokens_per_turn=16",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear",
    ]
    assert main(["train", "--env", "sokoban", *overrides]) == 0
    out = capsys.readouterr().out
    assert "held-out: 4 tasks of sokoban" in out and "after RL - after SFT" in out
    exported = run_dir / "huggingface"
    assert (exported / "adapter_config.json").is_file() and not (exported / "config.json").exists()
    record = json.loads((exported / "agentgym_run.json").read_text())
    sft_model = str((run_dir / "warm_start" / "sft" / "huggingface").resolve())
    assert record["model"]["export"] == "lora_adapter" and record["model"]["base"] == sft_model
    assert record["model"]["lora"]["rank"] == 8 and record["env"]["eval_kwargs"]["max_steps"] == 15

    trajectories = tmp_path / "eval.jsonl"
    assert (
        main(
            [
                "eval",
                "--run",
                str(run_dir),
                "--tasks",
                "4",
                "--seed",
                "1000000",
                "--temperature",
                "0",
                "--out",
                str(trajectories),
            ]
        )
        == 0
    )
    greedy = json.loads((run_dir / "held_out.json").read_text())["policies"]["after RL"]["0.0"]["per_task"]
    replayed = {t.seed: t for t in read_trajectories(trajectories)}
    assert [float(bool(replayed[1_000_000 + i].metrics.get("success"))) for i in range(4)] == greedy
    scored = {t.seed: t for t in seen["held-out RL T=0"]}
    assert all(replayed[s].token_ids() == scored[s].token_ids() for s in scored)
