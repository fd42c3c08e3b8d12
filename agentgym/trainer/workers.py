"""The trainer's workers: the actor (with the frozen reference when a KL term is on) and the
critic, one object per data-parallel rank, run as Ray actors or in this process.

A ``WorkerGroup`` (``worker_group.py``) is N copies of one worker class; the driver calls a method on all of
them at once and each works on its share of the rows. How ranks share the work
(``actor_rollout_ref.actor.strategy``):

* ``fsdp2`` (the ``auto`` choice on CUDA): the model is sharded with PyTorch FSDP2
  (``torch.distributed.fsdp.fully_shard`` on every decoder layer, then the root) over
  ``trainer.nnodes * trainer.n_gpus_per_node`` ranks; NCCL on GPUs (gloo on CPU also works).
* ``dp`` (the ``auto`` choice on CPU): every rank holds the whole model; after each
  mini-batch's micro-batches the gradients are averaged with one all-reduce over gloo
  (DDP's arithmetic), so every rank takes the same optimizer step.

Either way a rank's loss is its share of the *global* mini-batch loss (``agg_loss`` with
the mini-batch's global token and row counts, see ``batch.update_plan``) and gradients are
averaged over the ranks, so N ranks take the same step as one rank on the whole batch.

The forward passes are in ``forward.py``, the model-and-optimizer state per rank in
``train_state.py``.
"""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from agentgym.model import lora
from agentgym.trainer import algos
from agentgym.trainer.algos.distill import topk_generalized_jsd, topk_metrics, topk_reverse_kl
from agentgym.trainer.batch import micro_batches
from agentgym.trainer.forward import ValueModel, chunks, policy_forward, select_rows, value_forward
from agentgym.trainer.train_state import (
    CONTENTS,
    TrainState,
    layer_classes,
    seed_everything,
    shard,
)

Tensors = dict[str, torch.Tensor]

# ---- small helpers -------------------------------------------------------------------------------


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but this worker sees no CUDA device; use trainer.device=auto or cpu")
    return requested


def resolve_strategy(requested: str, device: str) -> str:
    return ("fsdp2" if device == "cuda" else "dp") if requested == "auto" else requested


def quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - logging only
        pass


def written_files(directory: str, part: str) -> list[str]:
    """The files under ``directory/part``, relative to ``directory`` (what a rank saved, as it sees them)."""
    root = Path(directory)
    return sorted(str(f.relative_to(root)) for f in (root / part).rglob("*") if f.is_file())


# ---- workers ----------------------------------------------------------------------------------------


class Worker:
    """One data-parallel rank. ``config`` is the resolved training config (the driver's ``DictConfig``,
    pickled through Ray), read by attribute as the driver reads it."""

    def __init__(self, config: DictConfig, rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        trainer = config.trainer
        self.device = resolve_device(trainer.device)
        self.strategy = resolve_strategy(config.actor_rollout_ref.actor.strategy, self.device)
        threads = trainer.cpu_threads_per_worker or max(1, (os.cpu_count() or 1) // world_size)
        if self.device == "cpu":
            torch.set_num_threads(threads)
        seed_everything(trainer.seed + rank)
        quiet_transformers()

    # ---- process group ------------------------------------------------------------------------
    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port, for rank 0 to host the process group."""
        host = "127.0.0.1"
        if self.world_size > 1:
            try:  # the address other nodes reach this one at
                import ray

                host = ray.util.get_node_ip_address() if ray.is_initialized() else host
            except ImportError:  # pragma: no cover - ray is a dependency
                pass
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return host, port

    def init_distributed(self, host: str, port: int) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            return
        backend = "nccl" if self.device == "cuda" else "gloo"
        if self.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size)

    def micro_batches(self, batch: Tensors, rows: Sequence[int], section: DictConfig) -> list[list[int]]:
        """``rows`` (this rank's share of a mini-batch) cut into micro-batches: by row count, or by
        token budget with ``use_dynamic_bsz`` (the same count on every rank, so sharded passes line up)."""
        packed = self.packed
        if not section.use_dynamic_bsz:
            return micro_batches(rows, [], section.ppo_micro_batch_size_per_gpu)
        lengths = batch["attention_mask"].sum(-1)
        budget = section.ppo_max_token_len_per_gpu
        micros = micro_batches(rows, lengths, 0, budget, packed)
        if self.world_size > 1:
            import torch.distributed as dist

            count = torch.tensor([len(micros)])
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            micros = micro_batches(rows, lengths, 0, budget, packed, count=int(count))
        return micros

    @staticmethod
    def checkpoint_parts(section: DictConfig, which: str) -> list[str]:
        """``checkpoint.save_contents`` / ``load_contents`` of ``section``; an empty list still means every part."""
        return list(section.checkpoint[which]) or list(CONTENTS)

    @property
    def packed(self) -> bool:
        return self.config.actor_rollout_ref.model.use_remove_padding

    def node_id(self) -> str | None:
        """The Ray node this rank runs on (None outside Ray): where the trainer pool landed."""
        try:
            import ray

            return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        except Exception:  # noqa: BLE001 - informational only
            return None

    def sees_run_dir(self, root: str, token: str) -> dict[str, Any]:
        """Whether this rank sees the driver's run directory (``run_storage.check_shared``)."""
        from agentgym.trainer.run_storage import sees_run_dir

        return sees_run_dir(root, token, self.rank)

    def needs_process_group(self) -> bool:
        return self.world_size > 1 or self.strategy == "fsdp2"

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class PolicyWorker(Worker):
    """The actor (trained) and, when ``with_ref``, the reference policy (frozen initial weights)."""

    def init_model(self, total_steps: int, with_ref: bool) -> None:
        from agentgym.model import load_causal_lm
        from agentgym.model.weights import push_dir
        from agentgym.trainer.weight_sync import remove_orphans

        remove_orphans(push_dir())  # what killed runs left in this node's shared memory

        cfg = self.config.actor_rollout_ref
        path = cfg.model.path
        dtype = cfg.model.dtype
        actor = load_causal_lm(path, dtype=dtype, device="cpu").train()
        if cfg.model.enable_gradient_checkpointing:
            actor.gradient_checkpointing_enable()
        self.lora = lora.settings(cfg.model)
        if self.lora is not None:  # only adapters train; the reference is the base with them off
            if cfg.model.enable_gradient_checkpointing:
                actor.enable_input_require_grads()
            actor = lora.wrap(actor, self.lora)
            with_ref = False
        layers = layer_classes(actor)
        self.actor = TrainState(
            actor,
            cfg.actor.optim,
            total_steps,
            self.strategy,
            self.world_size,
            self.device,
            cfg.actor.fsdp_config,
            layers,
        )
        self.ref = None
        if with_ref:
            ref = load_causal_lm(path, dtype=dtype, device="cpu").eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            ref.to(self.device)
            if self.strategy == "fsdp2":
                fsdp = OmegaConf.merge(
                    cfg.actor.fsdp_config,
                    {"param_offload": cfg.ref.fsdp_config.param_offload, "optimizer_offload": False},
                )
                shard(ref, fsdp, self.device, layers)
            self.ref = ref

    # ---- log-probs ------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_log_prob(self, batch: Tensors, rows: Sequence[int], with_entropy: bool = True) -> Tensors:
        """Old log-probs (and entropies) of the current weights on ``rows``."""
        size = self.config.actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu
        model = self.actor.module
        model.eval()
        outs, ents = [], []
        for chunk in chunks(rows, size):
            lp, ent = policy_forward(
                model, select_rows(batch, chunk, self.device), with_entropy=with_entropy, packed=self.packed
            )
            outs.append(lp.cpu())
            ents.append(ent.cpu() if ent is not None else torch.zeros_like(lp).cpu())
        model.train()
        return {"old_log_probs": torch.cat(outs), "entropys": torch.cat(ents)}

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: Tensors, rows: Sequence[int]) -> Tensors:
        size = self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        if self.lora is not None:
            model = self.actor.module
            model.eval()
            with lora.reference(model):
                outs = [policy_forward(model, select_rows(batch, c, self.device))[0].cpu() for c in chunks(rows, size)]
            model.train()
            return {"ref_log_prob": torch.cat(outs)}
        if self.ref is None:
            raise RuntimeError("the reference policy was not loaded (no KL term is on)")
        outs = [
            policy_forward(self.ref, select_rows(batch, chunk, self.device), packed=self.packed)[0].cpu()
            for chunk in chunks(rows, size)
        ]
        return {"ref_log_prob": torch.cat(outs)}

    # ---- the update -------------------------------------------------------------------------------
    def update_actor(self, batch: Tensors, plan: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step per ``plan`` entry (ppo_epochs x mini-batches), each accumulating
        gradients over micro-batches of ``ppo_micro_batch_size_per_gpu`` rows."""
        cfg = self.config.actor_rollout_ref.actor
        loss_kwargs = {
            "loss_mode": cfg.policy_loss.loss_mode,
            "loss_agg_mode": cfg.loss_agg_mode,
            "clip_ratio": cfg.clip_ratio,
            "clip_ratio_low": cfg.clip_ratio_low,
            "clip_ratio_high": cfg.clip_ratio_high,
            "clip_ratio_c": cfg.clip_ratio_c,
            "entropy_coeff": cfg.entropy_coeff,
            "use_kl_loss": cfg.use_kl_loss,
            "kl_loss_coef": cfg.kl_loss_coef,
            "kl_loss_type": cfg.kl_loss_type,
            "dual_clip": cfg.dual_clip_loss,
            "sft_loss_coef": cfg.sft_loss_coef,
            "topr_positive_weight": cfg.policy_loss.topr_positive_weight,
            "topr_negative_weight": cfg.policy_loss.topr_negative_weight,
        }
        state = self.actor
        model = state.module
        model.train()
        totals: dict[str, list[float]] = defaultdict(list)
        started = time.perf_counter()
        tokens = 0
        correction = algos.RolloutCorrection.from_cfg(self.config)
        in_pass: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (old, behaviour, mask) rows
        for entry in plan:
            per_step: dict[str, list[float]] = defaultdict(list)
            micros = self.micro_batches(batch, entry["rows"], cfg)
            for i, chunk in enumerate(micros):
                micro = select_rows(batch, chunk, self.device)
                state.set_gradient_sync(i == len(micros) - 1)
                aux: Tensors | None = {} if "teacher_topk_ids" in micro else None
                log_prob, entropy = policy_forward(
                    model, micro, with_entropy=True, entropy_grad=cfg.entropy_coeff != 0, packed=self.packed, aux=aux
                )
                mask = micro["response_mask"]
                # One epoch over one mini-batch: the weights have not moved since the rollout's
                # old log-probs would have been computed, so they are this pass's own, detached.
                old = micro["old_log_probs"] if "old_log_probs" in micro else log_prob.detach()
                is_weights = micro.get("rollout_is_weights")
                if is_weights is None and correction.enabled:
                    # decoupled PPO's weights pi_old / pi_behav from this same pass (the trainer skipped
                    # the recompute: ``PPOTrainer.compute_log_probs``)
                    is_weights, _ = algos.rollout_is_weights(
                        old, micro["rollout_log_probs"], mask, correction.rollout_is, correction.rollout_is_threshold
                    )
                    in_pass.append((old.cpu(), micro["rollout_log_probs"].cpu(), mask.cpu()))
                loss, metrics = algos.compute_actor_loss(
                    old,
                    log_prob,
                    micro["advantages"],
                    mask,
                    entropy=entropy,
                    ref_log_prob=micro.get("ref_log_prob"),
                    rollout_is_weights=is_weights,
                    global_batch_info=entry["global"],
                    episode_scores=micro["token_level_scores"].sum(-1),
                    **loss_kwargs,
                )
                if aux:
                    loss = loss + self.distill_loss(aux, micro, entry["global"], metrics)
                loss.backward()
                tokens += int(micro["attention_mask"].sum())
                for key, value in metrics.items():
                    per_step[key].append(value)
                if mask.sum() > 0:
                    diff = (log_prob.detach() - micro["rollout_log_probs"]).abs()
                    per_step["training/rollout_probs_diff_mean"].append(float(algos.masked_mean(diff, mask)))
            grad_norm = state.step(cfg.grad_clip)
            for key, values in per_step.items():
                # losses are already shares of the global mini-batch loss: they add up
                summed = key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/distill_loss")
                totals[key].append(sum(values) if summed else sum(values) / len(values))
            totals["actor/grad_norm"].append(grad_norm)
        state.scheduler.step()
        out = {key: float(np.mean(values)) for key, values in totals.items()}
        if in_pass:  # the weights' metrics over the whole batch, as the trainer reports them otherwise
            old_all, behaviour, mask_all = (torch.cat(parts) for parts in zip(*in_pass))
            out.update(
                algos.rollout_is_weights(
                    old_all, behaviour, mask_all, correction.rollout_is, correction.rollout_is_threshold
                )[1]
            )
        out["actor/lr"] = state.lr
        out["perf/update_tokens"] = float(tokens)
        out["perf/update_s"] = time.perf_counter() - started
        return out

    def distill_loss(
        self, aux: Tensors, micro: Tensors, global_info: dict[str, Any], metrics: dict[str, float]
    ) -> torch.Tensor:
        """On-policy distillation against the teacher's top-k tokens (``distillation.loss_mode=topk``):
        ``kl_coef`` times the per-token reverse KL over them and a tail bucket (``algos.distill``; with
        ``distillation.beta`` < 1 GKD's generalized JSD, forward KL at 0),
        aggregated like the policy loss over the scored tokens; 0 with ``loss_mode=sampled``, where only
        the ``distill/greedy_agreement*`` and ``distill/topk_kl*`` metrics are read from it."""
        d = self.config.distillation
        mask = micro["distill_mask"]
        kl = topk_reverse_kl(aux["student_topk_log_probs"], micro["teacher_topk_log_probs"])
        teacher_greedy = micro["teacher_topk_ids"][..., 0]
        metrics.update(topk_metrics(kl, aux["student_greedy"], teacher_greedy, mask, micro.get("distill_action")))
        if d.loss_mode != "topk":
            return torch.zeros((), device=kl.device)
        divergence = (
            kl
            if d.beta >= 1.0
            else topk_generalized_jsd(aux["student_topk_log_probs"], micro["teacher_topk_log_probs"], d.beta)
        )
        loss = algos.agg_loss(divergence, mask, self.config.actor_rollout_ref.actor.loss_agg_mode, **global_info)
        metrics["actor/distill_loss"] = float(loss.detach())
        return d.kl_coef * loss

    # ---- supervised fine-tuning (agentgym sft) ------------------------------------------------------
    def update_sft(self, batch: Tensors, plan: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step per ``plan`` entry on the negative log-likelihood of the masked-in
        (assistant) tokens, averaged over the mini-batch's tokens (``token-mean``)."""
        cfg = self.config.actor_rollout_ref.actor
        micro_size = cfg.ppo_micro_batch_size_per_gpu
        state = self.actor
        model = state.module
        model.train()
        losses, norms, tokens = [], [], 0
        started = time.perf_counter()
        for entry in plan:
            total = 0.0
            micros = chunks(entry["rows"], micro_size)
            for i, chunk in enumerate(micros):
                micro = select_rows(batch, chunk, self.device)
                state.set_gradient_sync(i == len(micros) - 1)
                log_prob, _ = policy_forward(model, micro)
                loss = algos.agg_loss(-log_prob, micro["response_mask"], "token-mean", **entry["global"])
                loss.backward()
                total += float(loss.detach())
                tokens += int(micro["response_mask"].sum())
            norms.append(state.step(cfg.grad_clip))
            losses.append(total)
            state.scheduler.step()
        return {
            "sft/loss": float(np.mean(losses)),
            "sft/grad_norm": float(np.mean(norms)),
            "sft/lr": state.lr,
            "perf/update_tokens": float(tokens),
            "perf/update_s": time.perf_counter() - started,
        }

    @torch.no_grad()
    def sft_loss(self, batch: Tensors, rows: Sequence[int]) -> dict[str, float]:
        """Summed negative log-likelihood and token count of the masked-in tokens of ``rows``."""
        size = self.config.actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu
        model = self.actor.module
        model.eval()
        nll, count = 0.0, 0.0
        for chunk in chunks(rows, size):
            micro = select_rows(batch, chunk, self.device)
            log_prob, _ = policy_forward(model, micro)
            nll += float(-(log_prob * micro["response_mask"]).sum())
            count += float(micro["response_mask"].sum())
        model.train()
        return {"nll": nll, "tokens": count}

    # ---- weights out -------------------------------------------------------------------------------
    def full_state_dict(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """What a push sends: the whole policy, or with LoRA its adapters only (``lora.push_state``);
        ``on_device``: left where training keeps them (a server on the same device copies from there)."""
        if self.lora is not None:
            return lora.push_state(self.actor.module)
        return self.actor.full_state_dict(on_device=on_device)

    def weight_handles(self) -> dict[str, Any] | None:
        """Handles of the pushed weights' memory for servers on this host (rank 0; CPU tensors move
        into shared memory the first time, CUDA ones travel as IPC handles): see
        ``agentgym.model.weights.share_handles``. The tensors stay referenced until the next push."""
        from agentgym.model.weights import share_handles

        state = self.full_state_dict(on_device=True)
        if self.rank != 0:
            return None
        self._pushed = state
        return share_handles(state)

    def shutdown(self) -> None:
        """Free the models: the weights ``weight_handles`` moved into shared memory
        (``/dev/shm/torch_<pid>_*``, the whole model) are unlinked by torch when their last tensor goes.
        Left to the end of the process, torch's manager process would do it, but Ray ends a worker
        together with its child processes, the manager among them, and the files (RAM) stayed behind."""
        import gc

        for name in ("_pushed", "actor", "ref"):
            if hasattr(self, name):
                setattr(self, name, None)
        gc.collect()
        super().shutdown()

    def weight_buckets(self, size_mb: float) -> list[Any] | None:
        """The pushed weights in the Ray object store, in buckets of at most ``size_mb`` MB (rank 0; a
        collective under fsdp2): how a driver on another node gets them without a shared path. Returns
        the buckets' object references (the data stays in this node's object store until fetched)."""
        import ray

        from agentgym.model.weights import buckets

        state = self.full_state_dict()
        if self.rank != 0:
            return None
        return [ray.put(part) for part in buckets(state, size_mb)]

    def push_weights(self, path: str) -> dict[str, float] | None:
        """Write the weights as one safetensors file at ``path`` (rank 0; collective under fsdp2)."""
        started = time.perf_counter()
        state = self.full_state_dict()
        if self.rank != 0:
            return None
        from agentgym.model.weights import save_for_push

        target = save_for_push(state, path)
        return {"seconds": time.perf_counter() - started, "bytes": float(target.stat().st_size)}

    def save_hf(self, directory: str) -> None:
        """The policy as a Hugging Face model directory with its tokenizer (rank 0 writes); with LoRA
        peft's adapter directory, or the merged model with ``lora_export_merged``."""
        if self.lora is not None and self.rank == 0:
            model_cfg = self.config.actor_rollout_ref.model
            if not model_cfg.lora_export_merged:
                lora.save_adapter(self.actor.module, directory, model_cfg.path)
                return
            from agentgym.model import load_tokenizer

            lora.merged_model(self.actor.module).save_pretrained(directory)
            load_tokenizer(model_cfg.path).save_pretrained(directory)
            return
        state = self.actor.full_state_dict()
        if self.rank != 0:
            return
        from agentgym.model import load_tokenizer

        module = self.actor.module
        if self.strategy == "fsdp2":  # write from a plain copy, not the sharded module
            from transformers import AutoModelForCausalLM

            module = AutoModelForCausalLM.from_config(module.config, dtype=next(iter(state.values())).dtype)
            module.load_state_dict(state, strict=False)
            module.generation_config = self.actor.module.generation_config
        module.save_pretrained(directory, state_dict=state)
        load_tokenizer(self.config.actor_rollout_ref.model.path).save_pretrained(directory)

    def save_adapter(self, directory: str) -> None:
        """LoRA: peft's adapter directory (rank 0), what vLLM's ``/v1/load_lora_adapter`` reads."""
        if self.rank == 0:
            lora.save_adapter(self.actor.module, directory, self.config.actor_rollout_ref.model.path)

    def save_checkpoint(self, directory: str) -> list[str]:
        """Save this rank's part; returns the files written (relative to ``directory``), which the
        driver's manifest must list."""
        contents = self.checkpoint_parts(self.config.actor_rollout_ref.actor, "save_contents")
        self.actor.save(Path(directory) / "actor", self.rank, contents)
        if "hf_model" in contents:
            self.save_hf(str(Path(directory) / "actor" / "huggingface"))
        return written_files(directory, "actor") if self.rank == 0 else []

    def load_checkpoint(self, directory: str) -> None:
        self.actor.load(
            Path(directory) / "actor",
            self.rank,
            self.checkpoint_parts(self.config.actor_rollout_ref.actor, "load_contents"),
        )


class CriticWorker(Worker):
    """The value model: ``V(s_t)`` at every response token, trained with the clipped value loss."""

    def init_model(self, total_steps: int) -> None:
        cfg = self.config.critic
        dtype = getattr(torch, self.config.actor_rollout_ref.model.dtype)
        model = ValueModel(cfg.model.path, dtype=dtype).train()
        # the actor's FSDP settings, with the critic's own offload switches
        fsdp = OmegaConf.merge(
            self.config.actor_rollout_ref.actor.fsdp_config, OmegaConf.to_container(cfg.model.fsdp_config)
        )
        self.critic = TrainState(
            model,
            cfg.optim,
            total_steps,
            self.strategy,
            self.world_size,
            self.device,
            fsdp,
            layer_classes(model.body),
        )

    @torch.no_grad()
    def compute_values(self, batch: Tensors, rows: Sequence[int]) -> Tensors:
        size = self.config.critic.forward_micro_batch_size_per_gpu
        model = self.critic.module
        model.eval()
        outs = [
            value_forward(model, select_rows(batch, chunk, self.device), self.packed).cpu()
            for chunk in chunks(rows, size)
        ]
        model.train()
        return {"values": torch.cat(outs)}

    def update_critic(self, batch: Tensors, plan: list[dict[str, Any]]) -> dict[str, float]:
        cfg = self.config.critic
        state = self.critic
        model = state.module
        totals: dict[str, list[float]] = defaultdict(list)
        for entry in plan:
            losses, clipfracs, vpred_means = [], [], []
            micros = self.micro_batches(batch, entry["rows"], cfg)
            for i, chunk in enumerate(micros):
                micro = select_rows(batch, chunk, self.device)
                state.set_gradient_sync(i == len(micros) - 1)
                vpreds = value_forward(model, micro, self.packed)
                mask = micro["response_mask"]
                vf_loss, vf_clipfrac = algos.compute_value_loss(
                    vpreds,
                    micro["returns"],
                    micro["values"],
                    mask,
                    cfg.cliprange_value,
                    cfg.loss_agg_mode,
                    global_batch_info=entry["global"],
                )
                vf_loss.backward()
                losses.append(float(vf_loss.detach()))
                clipfracs.append(float(vf_clipfrac))
                vpred_means.append(float(algos.masked_mean(vpreds.detach(), mask)))
            totals["critic/vf_loss"].append(sum(losses))
            totals["critic/vf_clipfrac"].append(sum(clipfracs) / len(clipfracs))
            totals["critic/vpred_mean"].append(sum(vpred_means) / len(vpred_means))
            totals["critic/grad_norm"].append(state.step(cfg.grad_clip))
        state.scheduler.step()
        out = {key: float(np.mean(values)) for key, values in totals.items()}
        out["critic/lr"] = state.lr
        return out

    def save_checkpoint(self, directory: str) -> list[str]:
        self.critic.save(
            Path(directory) / "critic", self.rank, self.checkpoint_parts(self.config.critic, "save_contents")
        )
        return written_files(directory, "critic") if self.rank == 0 else []

    def load_checkpoint(self, directory: str) -> None:
        self.critic.load(
            Path(directory) / "critic", self.rank, self.checkpoint_parts(self.config.critic, "load_contents")
        )
