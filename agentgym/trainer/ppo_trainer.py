"""The single-controller PPO driver: one process that owns the loop and calls worker groups.

One training step (``train_step``), top to bottom, each phase a method and timed as
``timing_s/<phase>``:

1. ``gen``: the trajectory source (``agentgym.rollout.sources.TrajectorySource``) returns this
   step's trajectories (env episodes from the policy servers, or anything else that yields
   ``Trajectory`` objects); ``rollout_metrics`` logs them and ``check_rollouts`` checks them.
2. ``batch`` (``make_batch``): trajectories -> padded tensors; turn and outcome rewards go onto tokens
   weighted by ``algorithm.turn_reward_coef`` / ``algorithm.outcome_reward_coef``.
3. ``old_log_prob`` (``compute_log_probs``, as 4 and 5): the actor's log-probs before the update; or the servers' own
   (``actor.use_rollout_log_probs``); or, with one epoch over one mini-batch, the update's
   own first forward pass (the weights have not moved, so it is the same number), which then also
   gives decoupled PPO's weights (``algorithm.rollout_correction``).
4. ``ref``: the reference policy's log-probs, only when a KL term is on.
5. ``values``: the critic's values, only for ``gae``.
6. ``adv`` (``compute_advantages``): ROLL's reward shaping, KL in the reward
   (``algorithm.use_kl_in_reward``), then the advantage estimator named by
   ``algorithm.adv_estimator`` (``algos.compute_advantage``). The share
   of groups whose rewards are all equal is ``batch/zero_variance_group_frac``; a step where
   every group is flat (so the advantages are zero and nothing is learned) is warned about
   once per run and counted in the summary (``flat_reward_steps``).
7. ``update_critic`` / ``update_actor`` (``update``): ``ppo_epochs`` x mini-batches x micro-batches
   with gradient accumulation and clipping, on every rank (``batch.update_plan``); the actor's loss is
   ``algos.compute_actor_loss`` (``PolicyWorker.update_actor``), the critic's ``algos.compute_value_loss``.
8. ``weight_sync``: the new weights go to every policy server as version ``step``.

Validation runs before training (``trainer.val_before_train``) and every
``trainer.test_freq`` steps; checkpoints every ``trainer.save_freq`` steps; as in veRL, a
positive frequency also fires on the last step and ``-1`` turns it off. ``resume_mode=auto``
continues from the latest checkpoint; the final policy is saved as a Hugging Face model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from agentgym.model.identity import model_key
from agentgym.rollout.sources import TrajectorySource, require_source
from agentgym.tracking import (
    Progress,
    Tracking,
    mean_of_dicts,
    per_source_metrics,
    trajectory_metrics,
    truncate_jsonl,
    write_samples,
)
from agentgym.trainer import algos, checkpoint, step_checks
from agentgym.trainer.batch import Batch, build_batch, episode_rows, pad_for_workers, rank_shards, update_plan
from agentgym.trainer.config import uses_reference, world_size
from agentgym.trainer.distillation import distill_advantages, distilling
from agentgym.trainer.run_storage import check_shared, resolve_in_config
from agentgym.trainer.step_checks import (
    GroupRewardSpread,
    advantages_vanish,
    flat_rewards_warning,
    group_reward_spread,
)
from agentgym.trainer.train_state import rng_state, set_rng_state
from agentgym.trainer.training_record import write_training_record
from agentgym.trainer.worker_group import WorkerGroup, init_ray
from agentgym.trainer.workers import CriticWorker, PolicyWorker
from agentgym.types import Trajectory

if TYPE_CHECKING:
    from agentgym.trainer.weight_sync import WeightSync

log = logging.getLogger("agentgym.trainer")


@contextlib.contextmanager
def timer(name: str, timing: dict[str, float]) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[f"timing_s/{name}"] = timing.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


@dataclass(frozen=True)
class BatchLayout:
    """How a step's batch is cut: ``rows`` trajectories then ``pad_rows`` (so every rank gets its share
    of every mini-batch), ``actor_minis`` / ``critic_minis`` mini-batches per epoch, ``shards`` (the
    rows each rank computes log-probs and values for) and the trajectories left out, by reason."""

    rows: int
    pad_rows: list[int]
    actor_minis: int
    critic_minis: int
    shards: list[list[int]]
    skipped: dict[str, int]


class PPOTrainer:
    """Owns the loop; the maths is in ``algos``, the model work in the worker groups."""

    def __init__(
        self,
        cfg: DictConfig,
        source: TrajectorySource,
        servers: Any = None,
        pad_token_id: int | None = None,
        show_progress: bool = True,
    ) -> None:
        self.cfg = cfg
        self.source = require_source(source)
        self.servers = servers
        self.world_size = world_size(cfg)
        self.use_ray = cfg.trainer.use_ray
        # one absolute location, fixed here on the driver, which the workers are given (run_storage)
        self.run_dir = Path(resolve_in_config(cfg))
        # the files RL starts from, saved with each checkpoint: a resume from other ones is refused
        self.start_model = model_key(str(cfg.actor_rollout_ref.model.path))
        self.show_progress = show_progress
        self.loop = asyncio.new_event_loop()
        if pad_token_id is None:
            from agentgym.model import load_tokenizer

            tok = load_tokenizer(str(cfg.actor_rollout_ref.model.path))
            pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.pad_token_id = int(pad_token_id or 0)
        kl = cfg.algorithm.kl_ctrl
        self.kl_ctrl = algos.get_kl_controller(
            type=kl.type, kl_coef=kl.kl_coef, target_kl=kl.target_kl, horizon=kl.horizon
        )
        self.global_step = 0
        self.actor: WorkerGroup | None = None
        self.critic: WorkerGroup | None = None
        self.placement_group: Any = None  # the trainer pool's, when the workers have one
        # pushes the weights after each update (None: no servers to push to; AsyncWeightSync when asynchronous)
        self.weight_sync: WeightSync | None = None
        self.tracking: Tracking | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_val_metrics: dict[str, float] = {}
        self.total_steps = 0
        self.steps_run = 0  # training steps taken by this fit() (not counting resumed ones)
        self.flat_steps = 0  # of which every group got identical rewards (advantages all zero)
        self.warned_flat = False
        self.warned_plot = False
        self.curves: Path | None = None
        # ROLL's reward_norm=running: the running mean/std of the rewards, over the whole run
        self.reward_moments = algos.RunningMoments() if cfg.algorithm.reward_norm == "running" else None
        self.resumed_metrics: dict[str, float] | None = None  # the checkpointed step's metrics line
        self.noted_split = False  # said once that trajectories train as several rows

    # ---- set-up ---------------------------------------------------------------------------------
    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def compute_total_steps(self) -> int:
        cfg = self.cfg.trainer
        if cfg.total_training_steps is not None:
            return cfg.total_training_steps
        per_epoch = self.run(self.source.steps_per_epoch_async())
        if not per_epoch:
            raise ValueError(
                "this trajectory source has no epochs (its tasks are generated from seeds): "
                "set trainer.total_training_steps"
            )
        return int(per_epoch) * cfg.total_epochs

    def init_workers(self) -> None:
        """Start Ray (unless ``trainer.use_ray=false``) and the actor/ref and critic groups."""
        self.total_steps = self.compute_total_steps()
        if self.use_ray:
            init_ray(self.cfg)
        cuda = self.cfg.trainer.device == "cuda" or (self.cfg.trainer.device == "auto" and torch.cuda.is_available())
        groups = 2 if self.cfg.critic.enable else 1
        num_gpus = 1.0 / groups if cuda and self.use_ray else 0.0
        bundles = self.worker_bundles(num_gpus)
        self.actor = WorkerGroup(PolicyWorker, self.cfg, self.world_size, self.use_ray, "actor", num_gpus, bundles)
        check_shared(self.actor, self.run_dir)  # every rank sees the run directory, before any model is loaded
        pending = [self.actor.call_async(PolicyWorker.init_model, self.total_steps, uses_reference(self.cfg))]
        if self.cfg.critic.enable:
            self.critic = WorkerGroup(
                CriticWorker, self.cfg, self.world_size, self.use_ray, "critic", num_gpus, bundles
            )
            check_shared(self.critic, self.run_dir)
            pending.append(self.critic.call_async(CriticWorker.init_model, self.total_steps))
        self.actor.get(pending[0])
        if self.critic is not None:
            self.critic.get(pending[1])
        if self.servers is not None:
            from agentgym.trainer.weight_sync import WeightSync

            self.weight_sync = WeightSync(self.servers, self.actor, str(self.cfg.actor_rollout_ref.model.path))

    def worker_bundles(self, num_gpus: float) -> Any:
        """The trainer pool's placement group the workers go in (rank r in bundle r; actor rank r and
        critic rank r share bundle r, ranks never do), or None: on GPUs always; on CPU when the pool
        spans nodes (``trainer.nnodes > 1``) or the cluster pins it (``agentgym_trainer_pool``); a
        single-node CPU pool is left to Ray's scheduler."""
        if not self.use_ray:
            return None
        from agentgym.trainer.resource_pools import POOL_RESOURCE, cluster_offers, trainer_pool

        if not num_gpus and self.cfg.trainer.nnodes <= 1 and not cluster_offers(POOL_RESOURCE["trainer"]):
            return None
        self.placement_group = trainer_pool(self.cfg, self.world_size, num_gpus)
        return self.placement_group

    # ---- one step -------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict[str, float]:
        """One PPO step, phase by phase (see the module docstring); returns the step's metrics."""
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        step_start = time.perf_counter()
        with timer("gen", timing):
            trajectories = self.run(self.source.collect(step))
        metrics.update(self.rollout_metrics(step, trajectories))
        metrics.update(self.check_rollouts(step, trajectories))  # stops the run, or refuses stale samples
        write_samples(self.run_dir / "samples.jsonl", trajectories, step, self.cfg.trainer.log_samples)
        with timer("batch", timing):
            batch, layout = self.make_batch(trajectories, metrics)
        if not bool(batch["valid"].any()):
            return self.skip_update(step, layout, timing, metrics, step_start)
        self.compute_log_probs(batch, layout, timing, metrics)
        with timer("adv", timing):
            episodes = self.compute_advantages(batch, trajectories, metrics)  # one row per episode
        spread = group_reward_spread(episodes["token_level_scores"].sum(-1), episodes.uid, episodes["valid"])
        metrics.update(self._batch_metrics(episodes, spread))
        self.check_flat_rewards(step, spread, episodes["advantages"], episodes["response_mask"])
        update_tokens = self.update(step, batch, layout, timing, metrics)
        if self.weight_sync is not None:
            with timer("weight_sync", timing):
                metrics.update(self.run(self.weight_sync.push(step)))
        timing["timing_s/step"] = time.perf_counter() - step_start
        metrics.update(timing)
        total_tokens = float(batch["attention_mask"][: layout.rows].sum())
        metrics["perf/total_tokens"] = total_tokens
        metrics["perf/throughput_tokens_per_s"] = total_tokens / timing["timing_s/step"]
        metrics["perf/update_tokens_per_s"] = update_tokens / max(timing.get("timing_s/update_actor", 0.0), 1e-9)
        metrics["training/global_step"] = float(step)
        return metrics

    # ---- collect --------------------------------------------------------------------------------
    def rollout_metrics(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """The step's episode metrics, the source's counts and rollout metrics, the weight-version lag."""
        metrics = trajectory_metrics(trajectories)
        metrics.update(per_source_metrics(trajectories))
        metrics.update(self.source.sampling_metrics)  # dynamic sampling's rounds
        metrics.update(self.source.reward_metrics)  # reward sources' counts
        pushed = self.weight_sync.version if self.weight_sync is not None else None  # the last push
        latest = pushed if pushed is not None else step - 1
        lags = [latest - turn.weight_version for traj in trajectories for turn in traj.turns]
        if lags and self.weight_sync is not None:  # 0: every turn was sampled by the latest weights
            metrics["rollout/weight_version_lag"] = float(np.mean(lags))
        for key in ("template_mismatch", "throughput/episodes_per_s"):
            if key in self.source.last_metrics:
                metrics[f"rollout/{key}"] = float(self.source.last_metrics[key])
        return metrics

    # ---- batch ----------------------------------------------------------------------------------
    def make_batch(self, trajectories: list[Trajectory], metrics: dict[str, float]) -> tuple[Batch, BatchLayout]:
        """Trajectories -> padded tensors with the rewards on their tokens, padded for the ranks'
        mini-batches; and how its rows are cut (``BatchLayout``)."""
        cfg = self.cfg
        n = cfg.actor_rollout_ref.rollout.n
        batch, skipped = build_batch(
            trajectories,
            self.pad_token_id,
            cfg.algorithm.turn_reward_coef,
            cfg.algorithm.outcome_reward_coef,
            cfg.data.max_prompt_length,
            cfg.data.max_response_length,
            step_wise=cfg.trainer.step_wise_training,
        )
        rows = len(batch)
        for reason, count in skipped.items():
            metrics[f"batch/skipped_{reason}"] = float(count)
        if batch.episodes is not None:
            self.note_split(trajectories)
            metrics["batch/samples_per_episode"] = rows / max(1, len(trajectories))
        # mini-batches count episodes (ppo_mini_batch_size is in tasks, x n episodes), however many rows each has
        episodes = len(trajectories)
        actor_minis = max(1, min(rows, episodes // (cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n)))
        critic_minis = max(1, min(rows, episodes // (cfg.critic.ppo_mini_batch_size * n))) if self.critic else 1
        batch, pad_rows = pad_for_workers(batch, self.world_size, [actor_minis, critic_minis])
        shards = rank_shards(len(batch), self.world_size)
        return batch, BatchLayout(rows, pad_rows, actor_minis, critic_minis, shards, skipped)

    def note_split(self, trajectories: list[Trajectory]) -> None:
        """Say once per run that trajectories train as several rows, and why (docs/long_horizon.md)."""
        if self.noted_split:
            return
        self.noted_split = True
        if self.cfg.trainer.step_wise_training:
            why = "trainer.step_wise_training=true: one sample per turn"
        else:
            count = sum(not t.single_sequence for t in trajectories)
            why = (
                f"{count} of {len(trajectories)} trajectories have turns whose prompt does not extend the previous "
                f"turn's (a context policy, or an agent that rewrote its messages): one sample per token sequence "
                f"(set trainer.step_wise_training=true for one per turn)"
            )
        mode = self.cfg.actor_rollout_ref.actor.loss_agg_mode
        if mode == "seq-mean-token-mean":
            agg = f"{mode}: each sample (a turn or a sequence), not each episode, counts as a sequence"
        else:
            agg = f"{mode}: the same loss as with one row per episode"
        print(f"per-turn samples: {why}; advantages are computed per episode and reach every sample; {agg}", flush=True)

    def skip_update(
        self, step: int, layout: BatchLayout, timing: dict[str, float], metrics: dict[str, float], step_start: float
    ) -> dict[str, float]:
        """A step with nothing to train on: warned about, logged, no update."""
        log.warning(
            "step %d: no trajectory in the batch can be trained on (%s); skipping the update",
            step,
            ", ".join(f"{k}: {v}" for k, v in layout.skipped.items()),
        )
        timing["timing_s/step"] = time.perf_counter() - step_start
        metrics.update(timing)
        metrics["batch/trainable"] = 0.0
        return metrics

    # ---- log-probs, reference, values -----------------------------------------------------------
    def compute_log_probs(
        self, batch: Batch, layout: BatchLayout, timing: dict[str, float], metrics: dict[str, float]
    ) -> None:
        """``old_log_probs`` (the actor before the update; or the servers' own; or none, then the update's
        first forward pass gives them), the rollout-correction weights, ``ref_log_prob`` when a KL term is
        on and the critic's ``values``; actor and critic groups work at the same time."""
        cfg = self.cfg
        actor_cfg = cfg.actor_rollout_ref.actor
        on_policy_single_pass = actor_cfg.ppo_epochs == 1 and layout.actor_minis == 1
        correction = algos.RolloutCorrection.from_cfg(cfg)  # decoupled PPO needs the proximal policy's log-probs
        # With one epoch over one mini-batch the proximal policy is the update's own first pass, so the
        # worker weighs each micro-batch there (one forward pass a step less); a batch-normalised weight
        # or a KL in the reward needs the whole batch's log-probs first.
        weights_in_update = (
            correction.enabled
            and on_policy_single_pass
            and not correction.rollout_is_batch_normalize
            and not cfg.algorithm.use_kl_in_reward
        )
        need_old = (
            correction.enabled
            and not weights_in_update
            or not actor_cfg.use_rollout_log_probs
            and (not on_policy_single_pass or cfg.algorithm.use_kl_in_reward)
        )
        shared = self.actor.put(batch.tensors)
        per_rank = [(shard,) for shard in layout.shards]
        critic_pending = None
        if self.critic is not None:
            critic_started = time.perf_counter()
            critic_pending = self.critic.call_async(CriticWorker.compute_values, shared, per_rank=per_rank)
        if need_old:
            with timer("old_log_prob", timing):
                outs = self.actor.call(PolicyWorker.compute_log_prob, shared, per_rank=per_rank)
                batch["old_log_probs"] = torch.cat([o["old_log_probs"] for o in outs])
                entropy = torch.cat([o["entropys"] for o in outs])
                metrics["actor/entropy_before_update"] = float(algos.masked_mean(entropy, batch["response_mask"]))
        elif actor_cfg.use_rollout_log_probs and not weights_in_update:
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
        if correction.enabled and not weights_in_update:
            batch["rollout_is_weights"], is_metrics = algos.rollout_is_weights(
                batch["old_log_probs"],
                batch["rollout_log_probs"],
                batch["response_mask"],
                correction.rollout_is,
                correction.rollout_is_threshold,
                correction.rollout_is_batch_normalize,
            )
            metrics.update(is_metrics)
        if uses_reference(cfg):
            with timer("ref", timing):
                outs = self.actor.call(PolicyWorker.compute_ref_log_prob, shared, per_rank=per_rank)
                batch["ref_log_prob"] = torch.cat([o["ref_log_prob"] for o in outs])
        if critic_pending is not None:
            batch["values"] = torch.cat([o["values"] for o in self.critic.get(critic_pending)])
            timing["timing_s/values"] = time.perf_counter() - critic_started

    # ---- rewards and advantages -----------------------------------------------------------------
    def compute_advantages(self, batch: Batch, trajectories: list[Trajectory], metrics: dict[str, float]) -> Batch:
        """``token_level_rewards`` (the scores, shaped, with the KL penalty when it is in the reward),
        then ``advantages`` and ``returns`` by ``algorithm.adv_estimator``. Returns the batch the
        statistics are read from: ``batch`` itself, or, when trajectories are trained as several rows
        (``Batch.episodes``), the one-row-per-episode view the advantages were computed on; they are
        then put back on every row that holds one of the episode's turns."""
        if batch.episodes is None:
            self._advantages(batch, trajectories, metrics)
            return batch
        view = self.episode_view(batch)
        self._advantages(view, trajectories, metrics, sampled_only=True)
        position = batch["episode_position"]
        mask = batch["response_mask"]
        for key in ("token_level_rewards", "advantages", "returns"):
            batch[key] = batch.episodes.scatter(position, view[key]) * (mask if key == "advantages" else 1.0)
        return view

    @staticmethod
    def episode_view(batch: Batch) -> Batch:
        """The one-row-per-episode view of a batch whose trajectories span several rows (``EpisodeMap``):
        every episode's sampled tokens in order, with the rows' scores, log-probs and values on them."""
        episodes = batch.episodes
        assert episodes is not None
        position = batch["episode_position"]
        mask = episodes.view_mask()
        tensors = {
            "response_mask": mask,
            "turn_index": episodes.turn_index,
            "valid": mask.sum(-1) > 0,
            "input_ids": torch.zeros(episodes.count, 1, dtype=torch.long),  # only its length is read (len())
        }
        for key in ("token_level_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"):
            if key in batch.tensors:
                tensors[key] = episodes.gather(position, batch[key])
        return Batch(tensors, list(episodes.uid), [list(k) for k in episodes.step_keys])

    def _advantages(
        self, batch: Batch, trajectories: list[Trajectory], metrics: dict[str, float], sampled_only: bool = False
    ) -> None:
        cfg = self.cfg
        mask = batch["response_mask"]
        rewards, shaping_metrics = self.shape_rewards(batch, trajectories)  # ROLL's reward normalisation
        metrics.update(shaping_metrics)
        if cfg.algorithm.use_kl_in_reward:
            old = batch["old_log_probs"] if "old_log_probs" in batch.tensors else batch["rollout_log_probs"]
            rewards, kl_metrics = algos.apply_kl_penalty(
                rewards, old, batch["ref_log_prob"], mask, self.kl_ctrl, str(cfg.algorithm.kl_penalty)
            )
            metrics.update(kl_metrics)
        batch["token_level_rewards"] = rewards
        advantages, returns = algos.compute_advantage(
            str(cfg.algorithm.adv_estimator),
            token_level_rewards=rewards,
            response_mask=mask,
            values=batch.tensors.get("values"),
            index=np.array(batch.uid, dtype=object),
            gamma=cfg.algorithm.gamma,
            lam=cfg.algorithm.lam,
            norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo,
            turn_index=batch["turn_index"],
            step_keys=batch.step_keys,
            reward_baselines=(
                algos.reward_baselines_of(trajectories, len(batch)) if cfg.algorithm.adv_estimator == "remax" else None
            ),
            **OmegaConf.to_container(cfg.algorithm.gigpo, resolve=True),
        )
        advantages, adv_metrics = algos.postprocess_advantages(
            advantages, mask, cfg.algorithm.whiten_advantages, cfg.algorithm.advantage_clip
        )
        metrics.update(adv_metrics)
        # a teacher's, per token
        advantages = distill_advantages(cfg, batch, trajectories, advantages, metrics, sampled_only)
        batch["advantages"] = advantages * mask
        batch["returns"] = returns

    # ---- the update -----------------------------------------------------------------------------
    def update(
        self, step: int, batch: Batch, layout: BatchLayout, timing: dict[str, float], metrics: dict[str, float]
    ) -> float:
        """The critic's and the actor's updates (at the same time): ``ppo_epochs`` x mini-batches x
        micro-batches on every rank (``batch.update_plan``). The actor's loss is
        ``algos.compute_actor_loss`` (in ``PolicyWorker.update_actor``), the critic's
        ``algos.compute_value_loss`` (in ``CriticWorker.update_critic``). Returns the tokens the actor
        trained on."""
        cfg = self.cfg
        actor_cfg = cfg.actor_rollout_ref.actor
        mask = batch["response_mask"]
        shared = self.actor.put(batch.tensors)
        plan_seed = cfg.trainer.seed * 100_003 + step
        scale = cfg.data.max_response_length
        episodes = episode_rows(batch)  # several rows per episode: seq-mean-token-sum counts episodes
        critic_update = None
        if self.critic is not None:
            critic_plan = update_plan(
                mask,
                layout.rows,
                layout.pad_rows,
                layout.critic_minis,
                cfg.critic.ppo_epochs,
                self.world_size,
                actor_cfg.shuffle,
                plan_seed,
                str(cfg.critic.loss_agg_mode),
                scale,
                episodes,
            )
            critic_started = time.perf_counter()
            critic_update = self.critic.call_async(
                CriticWorker.update_critic, shared, per_rank=[(p,) for p in critic_plan]
            )
        actor_plan = update_plan(
            mask,
            layout.rows,
            layout.pad_rows,
            layout.actor_minis,
            actor_cfg.ppo_epochs,
            self.world_size,
            actor_cfg.shuffle,
            plan_seed,
            str(actor_cfg.loss_agg_mode),
            scale,
            episodes,
        )
        actor_metrics: dict[str, float] = {}
        if step >= cfg.trainer.critic_warmup:  # veRL: the actor waits critic_warmup steps for the critic
            with timer("update_actor", timing):
                actor_metrics = mean_of_dicts(
                    self.actor.call(PolicyWorker.update_actor, shared, per_rank=[(p,) for p in actor_plan])
                )
        update_tokens = actor_metrics.pop("perf/update_tokens", 0.0) * self.world_size
        actor_metrics.pop("perf/update_s", None)
        metrics.update(actor_metrics)
        if critic_update is not None:
            metrics.update(mean_of_dicts(self.critic.get(critic_update)))
            timing["timing_s/update_critic"] = time.perf_counter() - critic_started
        return update_tokens

    def check_rollouts(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """Stop the run when too many episodes failed; refuse samples of lost weights and push the
        weights again (``agentgym.trainer.step_checks``)."""
        max_frac = self.cfg.trainer.max_failed_episode_frac
        failed = sum(t.status == "failed" for t in trajectories)
        dead = []
        if trajectories and failed / len(trajectories) > max_frac and self.servers is not None:
            dead = self.run(step_checks.dead_servers(self.servers.client))
        out = step_checks.failed_episode_check(trajectories, step, max_frac, dead)
        expected = self.weight_sync.version if self.weight_sync is not None else None  # the last push
        if expected is not None:  # synchronous training (the async trainer bounds version lag itself)
            stale = step_checks.stale_trajectories(trajectories, expected)
            out["rollout/stale_episodes"] = float(len(stale))
            if stale:
                log.warning("step %d: %s", step, step_checks.refuse_stale(stale, expected))
                self.run(self.weight_sync.push(expected))
        return out

    def shape_rewards(self, batch: Batch, trajectories: list[Trajectory]) -> tuple[torch.Tensor, dict[str, float]]:
        """ROLL's reward normalisation / reward_norm / reward_clip (``algos.shape_rewards``) on the token
        rewards; groups are the batch's uids, tags the trajectories' sources (env tags)."""
        a = self.cfg.algorithm
        tags = [t.data_source or t.env_id for t in trajectories]
        tags += ["pad"] * (len(batch) - len(tags))
        return algos.shape_rewards(
            batch["token_level_scores"],
            batch["response_mask"],
            batch.uid,
            tags,
            grouping=str(a.reward_normalization.grouping),
            method=str(a.reward_normalization.method),
            reward_norm_mode=a.reward_norm,
            reward_shift=a.reward_shift,
            reward_scale=a.reward_scale,
            reward_clip=a.reward_clip,
            running=self.reward_moments,
            valid=batch["valid"],
        )

    def check_flat_rewards(
        self,
        step: int,
        spread: GroupRewardSpread,
        advantages: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> bool:
        """Count a step whose groups all got identical rewards (so its advantages are zero), and
        warn about it the first time in a run. Returns whether the step was flat."""
        flat = advantages_vanish(spread, str(self.cfg.algorithm.adv_estimator), advantages, mask) and not distilling(
            self.cfg
        )  # the teacher's advantages remain
        if flat:
            self.flat_steps += 1
            if not self.warned_flat:
                self.warned_flat = True
                rollout = self.cfg.actor_rollout_ref.rollout
                log.warning(
                    "%s",
                    flat_rewards_warning(
                        spread,
                        step,
                        str(self.cfg.actor_rollout_ref.model.path),
                        self.cfg.env.name,
                        rollout.n,
                        rollout.temperature,
                    ),
                )
        return flat

    def _batch_metrics(self, batch: Batch, spread: GroupRewardSpread | None = None) -> dict[str, float]:
        """veRL's ``critic/*`` batch statistics over the rows that train, and the share of groups
        whose rewards are all equal (``batch/zero_variance_group_frac``: their advantages are 0
        under a group-relative estimator)."""
        mask = batch["response_mask"]
        valid = batch["valid"]
        out: dict[str, float] = {"batch/trainable": float(valid.sum())}
        if spread is None:
            spread = group_reward_spread(batch["token_level_scores"].sum(-1), batch.uid, valid)
        if spread.zero_variance_frac is not None:
            out["batch/zero_variance_group_frac"] = spread.zero_variance_frac
        if valid.sum() == 0:
            return out
        out["critic/score/mean"] = float(batch["token_level_scores"].sum(-1)[valid].mean())
        out["critic/rewards/mean"] = float(batch["token_level_rewards"].sum(-1)[valid].mean())
        out.update(algos.masked_stats("critic/advantages", batch["advantages"], mask))
        out.update(algos.masked_stats("critic/returns", batch["returns"], mask))
        if "values" in batch.tensors:
            out.update(algos.masked_stats("critic/values", batch["values"], mask))
        out["response_length/sampled_mean"] = float(mask.sum(-1)[valid].mean())
        return out

    # ---- validation -----------------------------------------------------------------------------
    def validate(self, step: int) -> dict[str, float]:
        started = time.perf_counter()
        trajectories = self.run(self.source.validate())
        if not trajectories:
            return {}
        metrics = trajectory_metrics(trajectories, prefix="val/")
        metrics.update(per_source_metrics(trajectories, "val/"))
        metrics["timing_s/validate"] = time.perf_counter() - started
        write_samples(self.run_dir / "samples.jsonl", trajectories, step, self.cfg.trainer.log_samples, "val")
        return metrics

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, step: int, metrics: dict[str, float] | None = None) -> Path:
        """Save the workers' and the driver's state; ``metrics``: the step's metrics line, restored at
        resume if the run dies before writing it."""
        directory = checkpoint.step_dir(self.run_dir, step)
        directory.mkdir(parents=True, exist_ok=True)
        pending = [self.actor.call_async(PolicyWorker.save_checkpoint, str(directory))]
        if self.critic is not None:
            pending.append(self.critic.call_async(CriticWorker.save_checkpoint, str(directory)))
        written = [name for part in self.actor.get(pending[0]) for name in part or ()]
        if self.critic is not None:
            written += [name for part in self.critic.get(pending[1]) for name in part or ()]
        state = {
            "global_step": step,
            "source": self.source.state_dict(),
            "kl_ctrl_value": self.kl_ctrl.value,
            "rng": rng_state(),
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "start_model": self.start_model,
            "metrics": {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))},
        }
        checkpoint.save_trainer_state(directory, state)
        checkpoint.mark_latest(self.run_dir, step, written)
        checkpoint.prune(self.run_dir, self.cfg.trainer.max_actor_ckpt_to_keep)
        return directory

    def load_checkpoint(self, directory: Path) -> int:
        state = checkpoint.load_trainer_state(directory)
        started = state.get("start_model")
        if self.cfg.trainer.resume_mode == "auto" and started is not None and started != self.start_model:
            # e.g. the warm start's SFT redone with other settings: its RL would go on from the old one
            raise checkpoint.CheckpointError(
                f"the checkpoint {directory} continues RL from another start model than this run's "
                f"({self.cfg.actor_rollout_ref.model.path}: its files differ from those the checkpoint started "
                f"from). Start over with trainer.resume_mode=disable or another trainer.default_local_dir; to "
                f"resume it anyway: trainer.resume_mode=resume_path trainer.resume_from_path={directory}"
            )
        self.actor.call(PolicyWorker.load_checkpoint, str(directory))
        if self.critic is not None:
            self.critic.call(CriticWorker.load_checkpoint, str(directory))
        if state.get("source") is not None:
            self.source.load_state_dict(state["source"])
        self.kl_ctrl.value = float(state["kl_ctrl_value"])
        set_rng_state(state["rng"])
        self.global_step = int(state["global_step"])
        self.resumed_metrics = state.get("metrics")
        return self.global_step

    def save_hf_model(self) -> Path:
        target = self.run_dir / "huggingface"
        self.actor.call(PolicyWorker.save_hf, str(target))
        write_training_record(target, self.cfg, self.global_step)  # agentgym_run.json: how it was trained
        return target

    # ---- the loop -------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train to ``total_steps``; returns a summary (final metrics, where things are)."""
        cfg = self.cfg.trainer
        if self.actor is None:
            self.init_workers()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg))
        resumed_from = checkpoint.resume_dir(self.run_dir, str(cfg.resume_mode), cfg.resume_from_path)
        if resumed_from is not None:
            self.load_checkpoint(resumed_from)
            if self.weight_sync is not None:  # the servers still hold the initial weights
                self.run(self.weight_sync.push(self.global_step))
            log.info("resumed from %s (step %d)", resumed_from, self.global_step)
        seed = cfg.seed
        if resumed_from is None:
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
        resume_step = self.global_step if resumed_from is not None else None
        self.tracking = Tracking(
            list(cfg.logger),
            self.run_dir,
            str(cfg.project_name),
            str(cfg.experiment_name),
            OmegaConf.to_container(self.cfg, resolve=True),
            resume_step,
            self.resumed_metrics,
        )
        if resume_step is not None:  # steps after the checkpoint are taken again: their samples too
            truncate_jsonl(self.run_dir / "samples.jsonl", resume_step)
        test_freq, save_freq = cfg.test_freq, cfg.save_freq
        started = time.perf_counter()
        if resumed_from is not None:
            print(f"resuming from {resumed_from} at step {self.global_step}", flush=True)
            if self.global_step >= self.total_steps:
                print(
                    f"this run already reached trainer.total_training_steps={self.total_steps}; raise it to "
                    f"train further, or start over with trainer.resume_mode=disable (or another "
                    f"trainer.default_local_dir)",
                    flush=True,
                )
        if cfg.val_before_train and self.global_step == 0:
            val = self.validate(0)
            if val:
                self.last_val_metrics = val
                self.tracking.log(val, 0)
        progress = Progress(self.total_steps, initial=self.global_step, enabled=self.show_progress)
        last_saved: Path | None = None
        minutes = cfg.total_training_minutes
        steps_started = time.perf_counter()
        out_of_time = False
        try:
            for step in range(self.global_step + 1, self.total_steps + 1):
                metrics = self.train_step(step)
                self.global_step = step
                self.steps_run += 1
                # a time budget ends the run after the step that passes it (this process's steps only)
                out_of_time = minutes is not None and time.perf_counter() - steps_started >= 60 * minutes
                last = step == self.total_steps or out_of_time
                # veRL's rule: a positive frequency also fires on the last step; <= 0 never fires
                if test_freq > 0 and (step % test_freq == 0 or last):
                    val = self.validate(step)
                    metrics.update(val)
                    self.last_val_metrics = val or self.last_val_metrics
                if save_freq > 0 and (step % save_freq == 0 or last):
                    with timer("save_checkpoint", metrics):
                        last_saved = self.save_checkpoint(step, dict(metrics))
                self.last_metrics = metrics
                self.tracking.log(metrics, step)
                if "val/reward/mean" in metrics:
                    self.write_curves()
                progress.update(metrics)
                if out_of_time and step < self.total_steps:
                    print(
                        f"stopped after step {step} of {self.total_steps}: trainer.total_training_minutes="
                        f"{minutes:g} reached ({(time.perf_counter() - steps_started) / 60:.1f} min of steps)",
                        flush=True,
                    )
                    break
        finally:
            progress.close()
        self.write_curves()
        hf_dir = self.save_hf_model() if cfg.save_hf_model and self.global_step > 0 else None
        summary = {
            "steps": self.global_step,
            "seconds": time.perf_counter() - started,
            "metrics": self.last_metrics,
            "val_metrics": self.last_val_metrics,
            "run_dir": str(self.run_dir),
            "checkpoint": str(last_saved) if last_saved else None,
            "hf_model": str(hf_dir) if hf_dir else None,
            "metrics_file": str(self.tracking.jsonl_path) if self.tracking.jsonl_path else None,
            "tensorboard": str(self.tracking.tensorboard_dir) if self.tracking.tensorboard_dir else None,
            "samples_file": str(self.run_dir / "samples.jsonl"),
            "curves": str(self.curves) if self.curves else None,
            "steps_run": self.steps_run,
            "stopped_by_time": out_of_time and self.global_step < self.total_steps,
            "flat_reward_steps": self.flat_steps,
        }
        if self.use_ray:  # where the trainer's ranks ran (Ray node ids, rank order)
            summary["placement"] = {"trainer": self.actor.call(PolicyWorker.node_id)}
        return summary

    def write_curves(self) -> None:
        """``<run dir>/curves.png`` from the metrics so far (``agentgym plot``); a run without
        matplotlib or without a metrics file says so once and goes on."""
        from agentgym.plots import PlotError, plot_run

        try:
            self.curves = plot_run(self.run_dir, self.run_dir / "curves.png")
        except PlotError as exc:
            if not self.warned_plot:
                self.warned_plot = True
                log.warning("no curves.png: %s", exc)

    def shutdown(self) -> None:
        if self.tracking is not None:
            self.tracking.close()
        if self.weight_sync is not None:
            self.weight_sync.cleanup()
        for group in (self.actor, self.critic):
            if group is not None:
                group.shutdown()
        with contextlib.suppress(Exception):
            self.run(self.source.aclose())
        if self.servers is not None:
            with contextlib.suppress(Exception):
                self.run(self.servers.aclose())
            self.servers.stop()
        self.close_loop()
        if self.placement_group is not None:
            import ray

            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.placement_group)
            self.placement_group = None

    def close_loop(self) -> None:
        self.loop.close()
