"""Checkpoints: veRL's layout, exact resume, and a final model that transformers loads."""

from __future__ import annotations

import json

import pytest
import torch

from agentgym.rollout.sources import FixedTrajectorySource, TaskSampler
from agentgym.trainer import checkpoint
from agentgym.trainer.config import load_config
from agentgym.trainer.run import train
from tests.trainer.test_trainer import make_trajectories, ray_session  # noqa: F401 - ray_session is a fixture

OVERRIDES = [
    "trainer.use_ray=false",
    "trainer.logger=[jsonl]",
    "trainer.val_before_train=false",
    "data.max_response_length=64",
    "algorithm=ppo",  # critic and GAE: its state must resume too
    "actor_rollout_ref.actor.use_kl_loss=true",  # and the reference policy
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # two optimizer steps per epoch ...
    "actor_rollout_ref.actor.ppo_epochs=2",  # ... and two epochs: AdamW state matters
    "actor_rollout_ref.actor.shuffle=true",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.optim.warmup_style=cosine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
]


class Interrupted(Exception):
    pass


class _Source(FixedTrajectorySource):
    """Fixed batches (one per step); optionally the run is killed when it asks for ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__([make_trajectories(4, 2, seed=100 + s) for s in range(4)])
        self.stop_at = stop_at

    async def collect(self, step: int):
        if step == self.stop_at:
            raise Interrupted(f"stopped before step {step}")
        return await super().collect(step)


def _run(directory, steps: int, *extra: str, stop_at: int | None = None) -> list[dict]:
    cfg = load_config(
        env="first_letter",
        overrides=[
            *OVERRIDES,
            f"trainer.default_local_dir={directory}",
            f"trainer.total_training_steps={steps}",
            *extra,
        ],
    )
    train(cfg, source=_Source(stop_at), servers=False, show_progress=False)
    with open(directory / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_resume_continues_exactly(tmp_path):
    straight = _run(tmp_path / "straight", 3, "trainer.save_freq=3")
    stopped = tmp_path / "stopped"
    with pytest.raises(Interrupted):  # the same run, killed after step 2's checkpoint
        _run(stopped, 3, "trainer.save_freq=1", stop_at=3)
    assert (stopped / checkpoint.LATEST_FILE).read_text() == "2"
    for step in (1, 2):
        d = stopped / f"global_step_{step}"
        assert (d / "actor" / "model.pt").is_file() and (d / "actor" / "optim.pt").is_file()
        assert (d / "critic" / "model.pt").is_file() and (d / checkpoint.STATE_FILE).is_file()
    resumed = _run(stopped, 3, "trainer.save_freq=1")  # resume_mode=auto picks up global_step_2
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for key in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "actor/grad_norm", "actor/lr"):
        assert resumed[-1][key] == pytest.approx(straight[-1][key], abs=1e-6), key
    assert straight[-1]["actor/pg_loss"] != pytest.approx(straight[-2]["actor/pg_loss"], abs=1e-6)
    a = torch.load(tmp_path / "straight" / "global_step_3" / "actor" / "model.pt")
    b = torch.load(stopped / "global_step_3" / "actor" / "model.pt")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


def test_final_model_loads_with_transformers_and_agentgym(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.model import load_causal_lm, load_tokenizer

    _run(
        tmp_path,
        1,
        "algorithm=grpo",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=-1",
    )
    hf = tmp_path / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    assert tokenizer.chat_template and tokenizer("hello")["input_ids"] == load_tokenizer("tiny")("hello")["input_ids"]
    trained = torch.load(tmp_path / "global_step_1" / "actor" / "model.pt")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    assert not torch.equal(
        model.state_dict()["model.norm.weight"], load_causal_lm("tiny").state_dict()["model.norm.weight"]
    )
    served = load_causal_lm(str(hf))  # what `agentgym serve --model DIR` loads
    ids = torch.tensor([[5, 6, 7]])
    assert torch.allclose(served(ids).logits, model(ids).logits)
    assert load_tokenizer(str(hf)).chat_template


def test_resume_modes(tmp_path):
    assert checkpoint.resume_dir(tmp_path, "auto") is None
    (tmp_path / "global_step_3").mkdir()
    checkpoint.save_trainer_state(tmp_path / "global_step_3", {"global_step": 3})
    checkpoint.mark_latest(tmp_path, 3)
    assert checkpoint.resume_dir(tmp_path, "auto") == tmp_path / "global_step_3"
    assert checkpoint.resume_dir(tmp_path, "disable") is None
    assert checkpoint.resume_dir(tmp_path, "resume_path", str(tmp_path / "global_step_3")) == tmp_path / "global_step_3"
    with pytest.raises(FileNotFoundError, match="global_step_N"):
        checkpoint.resume_dir(tmp_path, "resume_path", str(tmp_path))
    for step in (1, 2):
        (tmp_path / f"global_step_{step}").mkdir()
    removed = checkpoint.prune(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["global_step_1"]


def test_task_sampler_state_resumes_the_data_order():
    a = TaskSampler(num_tasks=10, batch_size=4, seed=3, shuffle=True)
    seen = [a.next_batch() for _ in range(3)]  # crosses an epoch boundary (10 // 4 = 2 per epoch)
    b = TaskSampler(num_tasks=10, batch_size=4, seed=3, shuffle=True)
    b.next_batch()
    state = b.state_dict()
    c = TaskSampler(num_tasks=10, batch_size=4, seed=3, shuffle=True)
    c.load_state_dict(state)
    assert [c.next_batch(), c.next_batch()] == seen[1:]
    assert len({t["index"] for t in seen[0] + seen[1]}) == 8  # an epoch never repeats a row
    seeds = TaskSampler(num_tasks=None, batch_size=2, seed_start=50)
    assert [seeds.next_batch(), seeds.next_batch()] == [[{"seed": 50}, {"seed": 51}], [{"seed": 52}, {"seed": 53}]]


# ---- one layout whatever the strategy and the number of workers ------------------------------------
def _actor(strategy: str, world_size: int, device: str = "cpu"):
    """The actor's worker group: ``world_size`` ranks on ``device`` (Ray actors when more than one;
    gloo on the CPU, NCCL on GPUs)."""

    from agentgym.trainer.config import load_config
    from agentgym.trainer.worker_group import WorkerGroup
    from agentgym.trainer.workers import PolicyWorker

    cfg = load_config(
        env="first_letter",
        overrides=[
            f"trainer.n_gpus_per_node={world_size}",
            f"trainer.use_ray={str(world_size > 1).lower()}",
            f"trainer.device={device}",
            f"actor_rollout_ref.actor.strategy={strategy}",
            "trainer.cpu_threads_per_worker=1",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
        ],
    )
    group = WorkerGroup(PolicyWorker, cfg, world_size, world_size > 1)
    group.call("init_model", 10, False)
    return group


def _step(group, seed: int) -> dict[str, torch.Tensor]:
    """One update (two optimizer steps, so AdamW's state is used) on a fixed batch; the new weights."""
    from agentgym.trainer import algos
    from agentgym.trainer.batch import build_batch, pad_for_workers, update_plan

    batch, _ = build_batch(make_trajectories(2, 4, seed=seed), pad_token_id=0)
    batch["advantages"], _ = algos.compute_advantage(
        "grpo", token_level_rewards=batch["token_level_scores"], response_mask=batch["response_mask"], index=batch.uid
    )
    rows = len(batch)
    batch, pads = pad_for_workers(batch, group.world_size, [2])
    plan = update_plan(batch["response_mask"], rows, pads, 2, 1, group.world_size)
    group.call("update_actor", group.put(batch.tensors), per_rank=[(p,) for p in plan])
    return _weights(group)


def _weights(group) -> dict[str, torch.Tensor]:
    """A copy of the actor's weights (a worker in this process hands out views of its live tensors)."""
    return {k: v.clone() for k, v in group.call("full_state_dict")[0].items()}


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _resume_and_step(strategy: str, world_size: int, checkpoint_dir, seed: int, device: str = "cpu"):
    group = _actor(strategy, world_size, device)
    try:
        group.call("load_checkpoint", str(checkpoint_dir))
        loaded = _weights(group)
        return loaded, _step(group, seed), group
    except BaseException:
        group.shutdown()
        raise


def test_fsdp2_and_dp_checkpoints_are_one_layout_and_resume_into_each_other(tmp_path):
    """Saved under FSDP2 (gloo, on the CPU), resumed under dp: the same files, the same weights,
    and the next step equal to the one FSDP2 itself takes (so the AdamW state came across);
    then saved under dp and resumed under FSDP2."""
    sharded = _actor("fsdp2", 1)
    try:
        _step(sharded, seed=1)
        sharded.call("save_checkpoint", str(tmp_path / "fsdp2"))
        saved = _weights(sharded)
        straight = _step(sharded, seed=2)
    finally:
        sharded.shutdown()
    assert sorted(p.name for p in (tmp_path / "fsdp2" / "actor").iterdir()) == ["extra.pt", "model.pt", "optim.pt"]
    loaded, resumed, plain = _resume_and_step("dp", 1, tmp_path / "fsdp2", seed=2)
    try:
        assert _largest_difference(loaded, saved) == 0.0
        assert _largest_difference(resumed, straight) == 0.0  # the optimizer state came across too
        plain.call("save_checkpoint", str(tmp_path / "dp"))
    finally:
        plain.shutdown()
    assert sorted(p.name for p in (tmp_path / "dp" / "actor").iterdir()) == ["extra.pt", "model.pt", "optim.pt"]
    loaded, _, back = _resume_and_step("fsdp2", 1, tmp_path / "dp", seed=3)
    back.shutdown()
    assert _largest_difference(loaded, resumed) == 0.0


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_resume_across_strategies_and_numbers_of_workers(tmp_path):
    """FSDP2 over two Ray workers saves; one dp worker resumes and takes the same next step as
    the two FSDP2 workers; two dp workers resume from that and match too."""
    sharded = _actor("fsdp2", 2)
    try:
        _step(sharded, seed=1)
        sharded.call("save_checkpoint", str(tmp_path / "fsdp2x2"))
        straight = _step(sharded, seed=2)
    finally:
        sharded.shutdown()
    _, one, group = _resume_and_step("dp", 1, tmp_path / "fsdp2x2", seed=2)
    group.shutdown()
    assert _largest_difference(one, straight) < 1e-6
    _, two, group = _resume_and_step("dp", 2, tmp_path / "fsdp2x2", seed=2)
    group.shutdown()
    assert _largest_difference(two, straight) < 1e-6


def test_fsdp2_shards_over_the_workers_device_even_when_an_accelerator_is_visible(monkeypatch):
    """``fully_shard`` without a mesh shards over CUDA whenever CUDA is visible: with
    ``trainer.device=cpu`` on a GPU machine the weights went to cuda:0 and the CPU batches hit
    "index is on cpu, different from other tensors on cuda:0". ``shard`` names its mesh."""
    import torch.distributed as dist
    import torch.distributed.fsdp as fsdp

    from agentgym.model import load_causal_lm
    from agentgym.server.handles import free_port
    from agentgym.trainer.train_state import layer_classes, shard

    meshes = []
    real = fsdp.fully_shard

    def recording(module, **kwargs):
        meshes.append(kwargs.get("mesh"))
        return real(module, **kwargs)

    monkeypatch.setattr(fsdp, "fully_shard", recording)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = load_causal_lm("tiny")
        shard(model, load_config(warn=False).actor_rollout_ref.actor.fsdp_config, "cpu", layer_classes(model))
    finally:
        dist.destroy_process_group()
    assert meshes and all(m is not None and m.device_type == "cpu" for m in meshes)
    assert all(p.device.type == "cpu" for p in model.parameters())
