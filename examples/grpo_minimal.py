"""GRPO in one file: the built-in tiny model learns an env, in this process, on a CPU, without Ray.

What ``agentgym train`` does with ``trainer.use_ray=false`` and one rank, written top to bottom
(CleanRL-style) with the very same pieces: the embedded engine samples (token ids and logprobs),
``build_batch`` lays the trajectories out as tensors, ``algos.compute_advantage("grpo", ...)`` and
``algos.compute_actor_loss`` are the maths, ``policy_forward`` the forward pass. One step:

1. rollout: ``prompts_per_step`` tasks (env seeds) x ``group_size`` samples each (one GRPO group);
2. batch: trajectories -> padded tensors, the env's rewards on the last sampled token;
3. advantages: each reward against its group's mean, divided by the group's std;
4. update: one AdamW step on the clipped policy-gradient loss over the whole batch (token-mean);
5. sync: the new weights go to the engine as version ``step``.

    python examples/grpo_minimal.py --steps 10

On ``first_letter`` (seed 0) the reward goes from 0.22 at step 1 to 0.83-1.0 at steps 8-10, in about
20 seconds on a CPU. ``pg_loss`` prints as 0: at ratio 1 the surrogate's value is minus the mean
advantage, which group normalisation makes (nearly) 0, while its gradient is not.

``tests/trainer/test_grpo_minimal.py`` checks that one ``update`` here gives the loss, gradient norm and new
weights ``PPOTrainer`` gives on the same batch.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

import agentgym
from agentgym.model import load_causal_lm, load_tokenizer
from agentgym.rollout.chat import ChatTokenizer
from agentgym.server.engine import Engine
from agentgym.server.sampling import GenerationParams
from agentgym.trainer import algos
from agentgym.trainer.batch import Batch, build_batch
from agentgym.trainer.forward import policy_forward
from agentgym.types import Trajectory, Turn


@dataclass
class Args:
    """The hyper-parameters, with ``agentgym train``'s config names where they have one."""

    env: str = "first_letter"  # env.name: any registered single-turn env
    model: str = "tiny"  # actor_rollout_ref.model.path
    steps: int = 10  # trainer.total_training_steps
    prompts_per_step: int = 8  # data.train_batch_size
    group_size: int = 8  # actor_rollout_ref.rollout.n
    max_tokens: int = 4  # actor_rollout_ref.rollout.max_tokens_per_turn
    temperature: float = 1.0  # actor_rollout_ref.rollout.temperature
    lr: float = 1e-2  # actor_rollout_ref.actor.optim.lr
    weight_decay: float = 0.01  # actor_rollout_ref.actor.optim.weight_decay
    clip_ratio: float = 0.2  # actor_rollout_ref.actor.clip_ratio
    grad_clip: float = 1.0  # actor_rollout_ref.actor.grad_clip
    seed: int = 0  # trainer.seed


# ---- 1. rollout -------------------------------------------------------------------------------------
async def rollout(engine: Engine, chat: ChatTokenizer, args: Args, seeds: list[int], version: int) -> list[Trajectory]:
    """``group_size`` episodes of each seed's task, sampled by the engine in one batch."""
    params = GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed + version)
    envs, prompts, requests = [], [], []
    for seed in seeds:
        env = agentgym.make(args.env)
        messages, info = env.reset(seed=seed)
        prompt_ids = chat.prompt_ids(messages, info.get("tools"))
        envs.append(env)
        prompts.append(prompt_ids)
        requests.append(engine.submit(prompt_ids, params, n=args.group_size))
    trajectories = []
    for seed, env, prompt_ids, request in zip(seeds, envs, prompts, requests):
        for sample in await request.done:
            reply = chat.assistant_content(sample.output_ids)
            env.reset(seed=seed)
            _, reward, _, _, info = env.step({"role": "assistant", "content": reply})
            turn = Turn(
                prompt_ids=list(prompt_ids),
                response_ids=list(sample.output_ids),
                logprobs=list(sample.logprobs),
                reward=float(reward),
                weight_version=sample.weight_version,
            )
            outcome = float(info.get("outcome_reward", 0.0))
            metrics = {"success": float(bool(info.get("success", outcome > 0)))}
            trajectories.append(
                Trajectory(turns=[turn], outcome_reward=outcome, group_id=f"seed-{seed}", seed=seed, metrics=metrics)
            )
    return trajectories


# ---- 2. batch ---------------------------------------------------------------------------------------
def make_batch(trajectories: list[Trajectory], pad_token_id: int) -> Batch:
    """Padded tensors: ``input_ids``, ``responses``, ``response_mask``, ``token_level_scores`` (the
    turn rewards and the outcome reward on the tokens, as the trainer scores them)."""
    batch, _ = build_batch(trajectories, pad_token_id, turn_reward_coef=1.0, outcome_reward_coef=1.0)
    return batch


# ---- 3. advantages ----------------------------------------------------------------------------------
def grpo_advantages(batch: Batch) -> torch.Tensor:
    """GRPO (Shao et al. 2024): ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` on every sampled token."""
    advantages, _ = algos.compute_advantage(
        "grpo",
        token_level_rewards=batch["token_level_scores"],
        response_mask=batch["response_mask"],
        index=np.array(batch.uid, dtype=object),
        norm_adv_by_std_in_grpo=True,
    )
    return advantages * batch["response_mask"]


# ---- 4. update --------------------------------------------------------------------------------------
def update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, advantages: torch.Tensor, args: Args
) -> dict[str, float]:
    """One optimizer step on PPO's clipped surrogate. One epoch over one mini-batch: the old policy is
    the current one, so ``old_log_prob`` is this pass's own log-prob, detached (ratio 1, clipping inactive
    until a second epoch); the gradient is plain REINFORCE with the group baseline."""
    model.train()
    mask = batch["response_mask"]
    log_prob, _ = policy_forward(model, batch.tensors)
    pg_loss, metrics = algos.compute_actor_loss(
        log_prob.detach(),
        log_prob,
        advantages,
        mask,
        loss_agg_mode="token-mean",
        clip_ratio=args.clip_ratio,
        global_batch_info={"dp_size": 1, "batch_num_tokens": float(mask.sum().clamp(min=1))},
    )
    pg_loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"actor/pg_loss": float(pg_loss.detach()), "actor/grad_norm": float(grad_norm), **metrics}


def adamw(model: torch.nn.Module, args: Args) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay, eps=1e-8)


# ---- the loop ---------------------------------------------------------------------------------------
def train(args: Args) -> list[dict[str, float]]:
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model)
    chat = ChatTokenizer(tokenizer)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = load_causal_lm(args.model, dtype="float32", device="cpu").train()  # the policy we train
    optimizer = adamw(model, args)
    engine = Engine(load_causal_lm(args.model, dtype="float32", device="cpu").eval(), tokenizer).start()
    loop = asyncio.new_event_loop()
    history = []
    try:
        for step in range(1, args.steps + 1):
            started = time.perf_counter()
            seeds = [(step - 1) * args.prompts_per_step + i for i in range(args.prompts_per_step)]
            trajectories = loop.run_until_complete(rollout(engine, chat, args, seeds, version=step - 1))
            batch = make_batch(trajectories, pad_token_id)
            advantages = grpo_advantages(batch)
            metrics = update(model, optimizer, batch, advantages, args)
            engine.update_weights(model.state_dict(), version=step).result()
            metrics["reward/mean"] = float(np.mean([t.total_reward for t in trajectories]))
            metrics["success_rate"] = float(np.mean([t.metrics["success"] for t in trajectories]))
            metrics["timing_s/step"] = time.perf_counter() - started
            history.append(metrics)
            print(
                f"step {step:3d} | reward {metrics['reward/mean']:.3f} | pg_loss {metrics['actor/pg_loss']:+.4f} "
                f"| grad_norm {metrics['actor/grad_norm']:.3f} | {metrics['timing_s/step']:.2f}s",
                flush=True,
            )
    finally:
        engine.stop()
        loop.close()
    return history


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in fields(Args):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(Args(), f.name)), default=f.default)
    args = Args(**vars(parser.parse_args(argv)))
    print(asdict(args), flush=True)
    return train(args)


if __name__ == "__main__":
    main()
