"""Token-budget micro-batches (veRL's use_dynamic_bsz) and sequence packing (use_remove_padding,
ChatLearn's packing / max_token_in_packing): same numbers as the padded path, less padding."""

from __future__ import annotations

import random

import pytest
import torch

from agentgym.trainer import algos
from agentgym.trainer.batch import build_batch, micro_batch_cost, micro_batches, padding_report, update_plan
from agentgym.trainer.config import load_config
from agentgym.trainer.forward import ValueModel, policy_forward, value_forward
from agentgym.types import Trajectory, Turn


def trajectories(groups: int, n: int, seed: int, long_every: int = 0) -> list[Trajectory]:
    """Multi-turn trajectories (observation tokens between sampled turns); every ``long_every``-th one long."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, 600) for _ in range(rng.randrange(3, 8))]
        for k in range(n):
            longer = long_every and (g * n + k) % long_every == 0
            turns = []
            for t in range(2):
                delta = prompt if t == 0 else [rng.randrange(3, 600) for _ in range(rng.randrange(1, 4))]
                response = [
                    rng.randrange(3, 600) for _ in range(rng.randrange(20, 40) if longer else rng.randrange(1, 6))
                ]
                turns.append(
                    Turn(
                        prompt_ids=list(delta),
                        response_ids=response,
                        logprobs=[-6.0] * len(response),
                        reward=rng.choice([0.0, 0.5]),
                    )
                )
            out.append(Trajectory(turns=turns, outcome_reward=rng.choice([0.0, 1.0]), group_id=f"g{g}"))
    return out


def test_token_budget_micro_batches_cover_every_row_within_budget():
    lengths = [5, 40, 7, 33, 6, 8, 90, 4]
    rows = list(range(8))
    for packed in (False, True):
        micros = micro_batches(rows, lengths, 0, max_tokens=100, packed=packed)
        assert sorted(r for m in micros for r in m) == rows
        for m in micros:
            assert len(m) == 1 or micro_batch_cost([lengths[r] for r in m], packed) <= 100
        equal = micro_batches(rows, lengths, 0, max_tokens=100, packed=packed, count=len(micros) + 2)
        assert len(equal) == len(micros) + 2 and sorted(r for m in equal for r in m) == rows
    assert micro_batches(rows, lengths, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    fixed = padding_report(rows, lengths, micro_batches(rows, lengths, 4))
    dynamic = padding_report(rows, lengths, micro_batches(rows, lengths, 0, max_tokens=100))
    packed = padding_report(rows, lengths, micro_batches(rows, lengths, 0, max_tokens=100, packed=True), packed=True)
    assert packed["padding_frac"] == 0 < dynamic["padding_frac"] < fixed["padding_frac"]


def test_packed_forward_matches_the_padded_one():
    from agentgym.model import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm("tiny")
    batch, _ = build_batch(trajectories(3, 2, seed=1, long_every=3), pad_token_id=0)
    t = batch.tensors
    with torch.no_grad():
        padded, padded_entropy = policy_forward(model, t, with_entropy=True)
        packed, packed_entropy = policy_forward(model, t, with_entropy=True, packed=True)
    mask = t["response_mask"].bool()
    assert torch.allclose(padded[mask], packed[mask], atol=1e-5)
    assert torch.allclose(padded_entropy[mask], packed_entropy[mask], atol=1e-5)
    critic = ValueModel("tiny")
    torch.nn.init.normal_(critic.value_head.weight)
    with torch.no_grad():
        assert torch.allclose(value_forward(critic, t)[mask], value_forward(critic, t, packed=True)[mask], atol=1e-5)


def test_packed_rows_get_no_gradient_on_observation_tokens():
    from agentgym.model import load_causal_lm

    model = load_causal_lm("tiny").train()
    batch, _ = build_batch(trajectories(2, 2, seed=3), pad_token_id=0)
    t = batch.tensors
    log_prob, _ = policy_forward(model, t, packed=True)
    log_prob.retain_grad()
    loss, _ = algos.compute_actor_loss(log_prob.detach(), log_prob, torch.randn_like(log_prob), t["response_mask"])
    loss.backward()
    observation = t["response_mask"] == 0
    assert torch.all(log_prob.grad[observation] == 0) and torch.any(log_prob.grad[~observation] != 0)


def _step(overrides: list[str]) -> dict[str, torch.Tensor]:
    from agentgym.trainer.worker_group import WorkerGroup
    from agentgym.trainer.workers import PolicyWorker

    cfg = load_config(
        env="first_letter",
        overrides=[
            "trainer.use_ray=false",
            "trainer.device=cpu",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "trainer.cpu_threads_per_worker=1",
            *overrides,
        ],
        warn=False,
    )
    batch, _ = build_batch(trajectories(2, 4, seed=6, long_every=3), pad_token_id=0)
    mask = batch["response_mask"]
    adv, _ = algos.compute_advantage(
        "grpo", token_level_rewards=batch["token_level_scores"], response_mask=mask, index=batch.uid
    )
    batch["advantages"] = adv
    plan = update_plan(mask, len(batch), [], 1, 1, 1)
    torch.manual_seed(0)
    group = WorkerGroup(PolicyWorker, cfg, 1, False)
    try:
        group.call("init_model", 10, False)
        group.call("update_actor", batch.tensors, per_rank=[(p,) for p in plan])
        return group.call("full_state_dict")[0]
    finally:
        group.shutdown()


@pytest.mark.parametrize(
    "mode",
    [
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=120"],
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=120",
            "actor_rollout_ref.model.use_remove_padding=true",
        ],
    ],
)
def test_dynamic_micro_batches_and_packing_take_the_same_step(mode):
    reference = _step(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    other = _step(mode)
    worst = max(float((other[k] - reference[k]).abs().max()) for k in reference)
    # One Adam step of lr 1e-3: a wrong split or mask moves weights by about the lr; float noise in the
    # packed attention moves a few near-zero-gradient weights by a few 1e-5 (Adam divides by sqrt(v))
    assert worst < 5e-5, worst
