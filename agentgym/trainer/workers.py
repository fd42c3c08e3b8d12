"""The trainer's workers: the actor (with the frozen reference when a KL term is on) and the
critic, one object per data-parallel rank, run as Ray actors or in this process.

A ``WorkerGroup`` is N copies of one worker class; the driver calls a method on all of
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

Log-probs are ``log_softmax`` of the raw logits (no temperature), as the policy servers
report them, so ``use_rollout_log_probs`` and recomputed old log-probs mean the same thing.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from agentgym.trainer import algos

Tensors = dict[str, torch.Tensor]

# ---- small helpers -------------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but this worker sees no CUDA device; use trainer.device=auto or cpu")
    return requested


def resolve_strategy(requested: str, device: str) -> str:
    return ("fsdp2" if device == "cuda" else "dp") if requested == "auto" else requested


def lr_lambda(optim: dict[str, Any], total_steps: int) -> Callable[[int], float]:
    """veRL's schedules: linear warm-up from 0, then constant or cosine down to ``min_lr_ratio``."""
    warmup = int(optim.get("lr_warmup_steps", -1) or -1)
    if warmup <= 0:
        warmup = int(float(optim.get("lr_warmup_steps_ratio", 0.0)) * total_steps)
    style = optim.get("warmup_style", "constant")
    min_ratio = float(optim.get("min_lr_ratio", 0.0) or 0.0)

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if style == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


def quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - logging only
        pass


# ---- forward passes --------------------------------------------------------------------------------


def _response_positions(micro: Tensors) -> tuple[torch.Tensor, int, int, int]:
    """Trim a micro-batch's padding; returns (index of the logit that predicts each response
    token relative to the first kept position, kept sequence length, first kept position, R_eff)."""
    lengths = micro["attention_mask"].sum(-1)
    prompt = micro["prompt_lengths"]
    seq_len = int(lengths.max())
    resp_len = max(1, int((lengths - prompt).max()))
    first = int(prompt.min()) - 1  # the logit at position p-1 predicts token p
    offsets = (prompt - 1 - first).unsqueeze(1) + torch.arange(resp_len, device=prompt.device).unsqueeze(0)
    offsets = offsets.clamp(max=seq_len - first - 1)
    return offsets, seq_len, first, resp_len


def policy_forward(model: nn.Module, micro: Tensors, with_entropy: bool = False,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of each row's response tokens, ``(b, R)`` (0 past the row's end), and the
    per-token entropy when asked. Only the logits of response positions are computed
    (``logits_to_keep``), which matters with a large vocabulary."""
    offsets, seq_len, first, resp_len = _response_positions(micro)
    input_ids = micro["input_ids"][:, :seq_len]
    attention_mask = micro["attention_mask"][:, :seq_len]
    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=seq_len - first,
                use_cache=False)
    logits = out.logits
    vocab = logits.shape[-1]
    logits = torch.gather(logits, 1, offsets.unsqueeze(-1).expand(-1, -1, vocab)).float()
    targets = micro["responses"][:, :resp_len]
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        if entropy_grad:
            entropy = algos.entropy_from_logits(logits)
        else:
            with torch.no_grad():
                entropy = algos.entropy_from_logits(logits.detach())
    full = micro["responses"].shape[1]
    if resp_len < full:
        log_probs = nn.functional.pad(log_probs, (0, full - resp_len))
        entropy = nn.functional.pad(entropy, (0, full - resp_len)) if entropy is not None else None
    return log_probs, entropy


class ValueModel(nn.Module):
    """A value head (one linear unit, zero-initialised) on the policy's transformer body."""

    def __init__(self, path: str, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        from transformers import AutoModel

        from agentgym.model import resolve_model_path

        self.body = AutoModel.from_pretrained(resolve_model_path(path), dtype=dtype)
        hidden = self.body.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.value_head(hidden).squeeze(-1)


def value_forward(model: ValueModel, micro: Tensors) -> torch.Tensor:
    """``V(s_t)`` for each response token: the value at the position before it, ``(b, R)``."""
    offsets, seq_len, first, resp_len = _response_positions(micro)
    values = model(micro["input_ids"][:, :seq_len], micro["attention_mask"][:, :seq_len])[:, first:].float()
    values = torch.gather(values, 1, offsets)
    full = micro["responses"].shape[1]
    return nn.functional.pad(values, (0, full - resp_len)) if resp_len < full else values


def _select(tensors: Tensors, rows: Sequence[int], device: str) -> Tensors:
    index = torch.as_tensor(list(rows), dtype=torch.long)
    return {k: v.index_select(0, index).to(device) for k, v in tensors.items()}


def _chunks(rows: Sequence[int], size: int) -> list[list[int]]:
    rows = list(rows)
    return [rows[i : i + size] for i in range(0, len(rows), max(1, size))] or [[]]


# ---- training state shared by actor and critic -------------------------------------------------------


class TrainState:
    """A model with its optimizer and lr schedule, and the rank-sharing strategy's plumbing."""

    def __init__(self, module: nn.Module, optim: dict[str, Any], total_steps: int, strategy: str,
                 world_size: int, device: str, fsdp_config: dict[str, Any] | None = None,
                 layer_classes: Sequence[str] = ()) -> None:
        self.strategy = strategy
        self.world_size = world_size
        self.device = device
        module.to(device)
        if strategy == "fsdp2":
            shard(module, fsdp_config or {}, device, layer_classes)
        self.module = module
        self.optimizer = adamw([p for p in module.parameters() if p.requires_grad], optim)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(optim, total_steps))

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_gradient_sync(self, enabled: bool) -> None:
        """FSDP2 reduce-scatters gradients only on a mini-batch's last micro-batch."""
        if self.strategy == "fsdp2":
            self.module.set_requires_gradient_sync(enabled)

    def step(self, grad_clip: float | None) -> float:
        """Average gradients over ranks (dp), clip, step; returns the pre-clip grad norm.
        A non-finite norm skips the step (the gradients are dropped)."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        if self.strategy == "dp" and self.world_size > 1:
            allreduce_mean([p.grad for p in params if p.grad is not None])
        max_norm = float(grad_clip) if grad_clip and grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm_value = float(norm)
        if math.isfinite(norm_value):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm_value

    # ---- state ----------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on CPU (on rank 0; other ranks get ``{}``). Collective under fsdp2."""
        if self.strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().to("cpu") for k, v in self.module.state_dict().items()}

    def save(self, directory: Path, rank: int) -> None:
        """dp: rank 0 writes the (replicated) state; fsdp2: every rank writes its shard."""
        directory.mkdir(parents=True, exist_ok=True)
        tag = f"world_size_{self.world_size}_rank_{rank}" if self.strategy == "fsdp2" else ""
        if self.strategy == "dp" and rank != 0:
            return
        suffix = f"_{tag}" if tag else ""
        torch.save(self.module.state_dict(), directory / f"model{suffix}.pt")
        torch.save(self.optimizer.state_dict(), directory / f"optim{suffix}.pt")
        torch.save({"scheduler": self.scheduler.state_dict(), "rng": rng_state()}, directory / f"extra{suffix}.pt")

    def load(self, directory: Path, rank: int) -> None:
        suffix = f"_world_size_{self.world_size}_rank_{rank}" if self.strategy == "fsdp2" else ""
        model_file = directory / f"model{suffix}.pt"
        if not model_file.is_file():
            found = ", ".join(sorted(p.name for p in directory.glob("model*.pt"))) or "nothing"
            raise FileNotFoundError(
                f"no {model_file.name} in {directory} (found {found}); a sharded (fsdp2) checkpoint resumes only "
                f"with the same strategy and number of workers it was saved with"
            )
        self.module.load_state_dict(torch.load(model_file, map_location=self.device, weights_only=False))
        self.optimizer.load_state_dict(torch.load(directory / f"optim{suffix}.pt", map_location=self.device,
                                                  weights_only=False))
        extra = torch.load(directory / f"extra{suffix}.pt", weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        set_rng_state(extra["rng"])


def adamw(params: list[nn.Parameter], optim: dict[str, Any]) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this torch has one for these parameters (on a CPU it
    steps a 0.5B model about 6x faster than the default multi-tensor path), else the default."""
    kwargs = {
        "lr": float(optim["lr"]),
        "betas": tuple(float(b) for b in optim.get("betas", (0.9, 0.999))),
        "eps": float(optim.get("eps", 1e-8)),
        "weight_decay": float(optim.get("weight_decay", 0.0)),
    }
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(params, **kwargs)


def allreduce_mean(grads: list[torch.Tensor]) -> None:
    """Average gradients over ranks with one flat all-reduce (DDP's arithmetic)."""
    import torch.distributed as dist

    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def shard(module: nn.Module, fsdp_config: dict[str, Any], device: str, layer_classes: Sequence[str]) -> None:
    """FSDP2: ``fully_shard`` each transformer block (the classes HF lists in
    ``_no_split_modules``), then the whole model."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"reshard_after_forward": bool(fsdp_config.get("reshard_after_forward", True))}
    if device == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=getattr(torch, fsdp_config.get("param_dtype", "bfloat16")),
            reduce_dtype=getattr(torch, fsdp_config.get("reduce_dtype", "float32")),
        )
    names = set(layer_classes)
    for sub in module.modules():
        if type(sub).__name__ in names:
            fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)


def _layer_classes(model: nn.Module) -> list[str]:
    found = getattr(model, "_no_split_modules", None) or []
    for sub in model.modules():  # a ValueModel wraps the HF body
        found = found or list(getattr(sub, "_no_split_modules", None) or [])
    return list(found)


# ---- workers ----------------------------------------------------------------------------------------


class Worker:
    """One data-parallel rank. ``config`` is the resolved training config as a plain dict."""

    def __init__(self, config: dict[str, Any], rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.rank = rank
        self.world_size = world_size
        trainer = config["trainer"]
        self.device = resolve_device(trainer.get("device", "auto"))
        self.strategy = resolve_strategy(config["actor_rollout_ref"]["actor"].get("strategy", "auto"), self.device)
        threads = trainer.get("cpu_threads_per_worker") or max(1, (os.cpu_count() or 1) // world_size)
        if self.device == "cpu":
            torch.set_num_threads(int(threads))
        seed_everything(int(trainer.get("seed", 0)) + rank)
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
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size)

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

        cfg = self.config["actor_rollout_ref"]
        path = str(cfg["model"]["path"])
        dtype = cfg["model"].get("dtype", "float32")
        actor = load_causal_lm(path, dtype=dtype, device="cpu").train()
        if cfg["model"].get("enable_gradient_checkpointing"):
            actor.gradient_checkpointing_enable()
        layers = _layer_classes(actor)
        self.actor = TrainState(actor, cfg["actor"]["optim"], total_steps, self.strategy, self.world_size,
                                self.device, cfg["actor"].get("fsdp_config"), layers)
        self.ref = None
        if with_ref:
            ref = load_causal_lm(path, dtype=dtype, device="cpu").eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            ref.to(self.device)
            if self.strategy == "fsdp2":
                shard(ref, cfg["actor"].get("fsdp_config") or {}, self.device, layers)
            self.ref = ref

    # ---- log-probs ------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_log_prob(self, batch: Tensors, rows: Sequence[int], with_entropy: bool = True) -> Tensors:
        """Old log-probs (and entropies) of the current weights on ``rows``."""
        size = int(self.config["actor_rollout_ref"]["actor"].get("log_prob_micro_batch_size_per_gpu", 16))
        model = self.actor.module
        model.eval()
        outs, ents = [], []
        for chunk in _chunks(rows, size):
            lp, ent = policy_forward(model, _select(batch, chunk, self.device), with_entropy=with_entropy)
            outs.append(lp.cpu())
            ents.append(ent.cpu() if ent is not None else torch.zeros_like(lp).cpu())
        model.train()
        return {"old_log_probs": torch.cat(outs), "entropys": torch.cat(ents)}

    @torch.no_grad()
    def compute_ref_log_prob(self, batch: Tensors, rows: Sequence[int]) -> Tensors:
        if self.ref is None:
            raise RuntimeError("the reference policy was not loaded (no KL term is on)")
        size = int(self.config["actor_rollout_ref"]["ref"].get("log_prob_micro_batch_size_per_gpu", 16))
        outs = [policy_forward(self.ref, _select(batch, chunk, self.device))[0].cpu() for chunk in _chunks(rows, size)]
        return {"ref_log_prob": torch.cat(outs)}

    # ---- the update -------------------------------------------------------------------------------
    def update_actor(self, batch: Tensors, plan: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step per ``plan`` entry (ppo_epochs x mini-batches), each accumulating
        gradients over micro-batches of ``ppo_micro_batch_size_per_gpu`` rows."""
        cfg = self.config["actor_rollout_ref"]["actor"]
        micro_size = int(cfg["ppo_micro_batch_size_per_gpu"])
        entropy_coeff = float(cfg.get("entropy_coeff", 0.0))
        use_kl_loss = bool(cfg.get("use_kl_loss", False))
        loss_kwargs = {
            "loss_mode": cfg["policy_loss"]["loss_mode"],
            "loss_agg_mode": cfg["loss_agg_mode"],
            "clip_ratio": float(cfg["clip_ratio"]),
            "clip_ratio_low": cfg.get("clip_ratio_low"),
            "clip_ratio_high": cfg.get("clip_ratio_high"),
            "clip_ratio_c": float(cfg.get("clip_ratio_c", 3.0)),
            "entropy_coeff": entropy_coeff,
            "use_kl_loss": use_kl_loss,
            "kl_loss_coef": float(cfg.get("kl_loss_coef", 0.001)),
            "kl_loss_type": cfg.get("kl_loss_type", "low_var_kl"),
        }
        state = self.actor
        model = state.module
        model.train()
        totals: dict[str, list[float]] = defaultdict(list)
        started = time.perf_counter()
        tokens = 0
        for entry in plan:
            per_step: dict[str, list[float]] = defaultdict(list)
            micros = _chunks(entry["rows"], micro_size)
            for i, chunk in enumerate(micros):
                micro = _select(batch, chunk, self.device)
                state.set_gradient_sync(i == len(micros) - 1)
                log_prob, entropy = policy_forward(model, micro, with_entropy=True, entropy_grad=entropy_coeff != 0)
                mask = micro["response_mask"]
                # One epoch over one mini-batch: the weights have not moved since the rollout's
                # old log-probs would have been computed, so they are this pass's own, detached.
                old = micro["old_log_probs"] if "old_log_probs" in micro else log_prob.detach()
                loss, metrics = algos.compute_actor_loss(
                    old, log_prob, micro["advantages"], mask, entropy=entropy,
                    ref_log_prob=micro.get("ref_log_prob"), global_batch_info=entry["global"], **loss_kwargs,
                )
                loss.backward()
                tokens += int(micro["attention_mask"].sum())
                for key, value in metrics.items():
                    per_step[key].append(value)
                if mask.sum() > 0:
                    diff = (log_prob.detach() - micro["rollout_log_probs"]).abs()
                    per_step["training/rollout_probs_diff_mean"].append(float(algos.masked_mean(diff, mask)))
            grad_norm = state.step(cfg.get("grad_clip"))
            for key, values in per_step.items():
                # losses are already shares of the global mini-batch loss: they add up
                summed = key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy")
                totals[key].append(sum(values) if summed else sum(values) / len(values))
            totals["actor/grad_norm"].append(grad_norm)
        state.scheduler.step()
        out = {key: float(np.mean(values)) for key, values in totals.items()}
        out["actor/lr"] = state.lr
        out["perf/update_tokens"] = float(tokens)
        out["perf/update_s"] = time.perf_counter() - started
        return out

    # ---- weights out -------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.actor.full_state_dict()

    def push_weights(self, path: str) -> dict[str, float] | None:
        """Write the weights as one safetensors file at ``path`` (rank 0; collective under fsdp2)."""
        started = time.perf_counter()
        state = self.actor.full_state_dict()
        if self.rank != 0:
            return None
        from agentgym.server.weights import save_for_push

        target = save_for_push(state, path)
        return {"seconds": time.perf_counter() - started, "bytes": float(target.stat().st_size)}

    def save_hf(self, directory: str) -> None:
        """The policy as a Hugging Face model directory with its tokenizer (rank 0 writes)."""
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
        load_tokenizer(str(self.config["actor_rollout_ref"]["model"]["path"])).save_pretrained(directory)

    def save_checkpoint(self, directory: str) -> None:
        self.actor.save(Path(directory) / "actor", self.rank)

    def load_checkpoint(self, directory: str) -> None:
        self.actor.load(Path(directory) / "actor", self.rank)


class CriticWorker(Worker):
    """The value model: ``V(s_t)`` at every response token, trained with the clipped value loss."""

    def init_model(self, total_steps: int) -> None:
        cfg = self.config["critic"]
        dtype = getattr(torch, self.config["actor_rollout_ref"]["model"].get("dtype", "float32"))
        model = ValueModel(str(cfg["model"]["path"]), dtype=dtype).train()
        self.critic = TrainState(model, cfg["optim"], total_steps, self.strategy, self.world_size, self.device,
                                 self.config["actor_rollout_ref"]["actor"].get("fsdp_config"),
                                 _layer_classes(model.body))

    @torch.no_grad()
    def compute_values(self, batch: Tensors, rows: Sequence[int]) -> Tensors:
        size = int(self.config["critic"].get("forward_micro_batch_size_per_gpu", 16))
        model = self.critic.module
        model.eval()
        outs = [value_forward(model, _select(batch, chunk, self.device)).cpu() for chunk in _chunks(rows, size)]
        model.train()
        return {"values": torch.cat(outs)}

    def update_critic(self, batch: Tensors, plan: list[dict[str, Any]]) -> dict[str, float]:
        cfg = self.config["critic"]
        micro_size = int(cfg["ppo_micro_batch_size_per_gpu"])
        state = self.critic
        model = state.module
        totals: dict[str, list[float]] = defaultdict(list)
        for entry in plan:
            losses, clipfracs, vpred_means = [], [], []
            micros = _chunks(entry["rows"], micro_size)
            for i, chunk in enumerate(micros):
                micro = _select(batch, chunk, self.device)
                state.set_gradient_sync(i == len(micros) - 1)
                vpreds = value_forward(model, micro)
                mask = micro["response_mask"]
                vf_loss, vf_clipfrac = algos.compute_value_loss(
                    vpreds, micro["returns"], micro["values"], mask, float(cfg["cliprange_value"]),
                    cfg["loss_agg_mode"], global_batch_info=entry["global"],
                )
                vf_loss.backward()
                losses.append(float(vf_loss.detach()))
                clipfracs.append(float(vf_clipfrac))
                vpred_means.append(float(algos.masked_mean(vpreds.detach(), mask)))
            totals["critic/vf_loss"].append(sum(losses))
            totals["critic/vf_clipfrac"].append(sum(clipfracs) / len(clipfracs))
            totals["critic/vpred_mean"].append(sum(vpred_means) / len(vpred_means))
            totals["critic/grad_norm"].append(state.step(cfg.get("grad_clip")))
        state.scheduler.step()
        out = {key: float(np.mean(values)) for key, values in totals.items()}
        out["critic/lr"] = state.lr
        return out

    def save_checkpoint(self, directory: str) -> None:
        self.critic.save(Path(directory) / "critic", self.rank)

    def load_checkpoint(self, directory: str) -> None:
        self.critic.load(Path(directory) / "critic", self.rank)


# ---- worker groups ---------------------------------------------------------------------------------


class WorkerGroup:
    """``world_size`` copies of a worker class, one per rank: Ray actors (``use_ray``), or a
    single object in this process. ``call`` runs a method on every rank and returns the
    results in rank order; ``per_rank`` arguments give each rank its own value."""

    def __init__(self, cls: type[Worker], config: dict[str, Any], world_size: int, use_ray: bool,
                 name: str = "", num_gpus: float = 0.0, placement_group: Any = None) -> None:
        self.cls = cls
        self.world_size = world_size
        self.use_ray = use_ray
        self.name = name or cls.__name__
        if use_ray:
            import ray

            remote = ray.remote(cls)
            self.workers = []
            for rank in range(world_size):
                options: dict[str, Any] = {"num_cpus": 0, "num_gpus": num_gpus}
                if placement_group is not None:  # rank r of every group shares bundle r (one GPU)
                    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                    options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                        placement_group, placement_group_bundle_index=rank)
                self.workers.append(remote.options(**options).remote(config, rank, world_size))
        else:
            if world_size != 1:
                raise ValueError("a WorkerGroup without Ray holds exactly one worker")
            self.workers = [cls(config, 0, 1)]
        if self.call("needs_process_group")[0]:
            host, port = self.call_rank0("rendezvous_address")
            self.call("init_distributed", host, port)

    def call_async(self, method: str, *args: Any, per_rank: Sequence[Sequence[Any]] | None = None,
                   **kwargs: Any) -> Any:
        """Start ``method`` on every rank; returns something ``get`` turns into the results."""
        if self.use_ray:
            futures = []
            for rank, worker in enumerate(self.workers):
                extra = tuple(per_rank[rank]) if per_rank is not None else ()
                futures.append(getattr(worker, method).remote(*args, *extra, **kwargs))
            return futures
        extra = tuple(per_rank[0]) if per_rank is not None else ()
        return [getattr(self.workers[0], method)(*args, *extra, **kwargs)]

    def get(self, pending: Any) -> list[Any]:
        if self.use_ray:
            import ray

            return ray.get(pending)
        return pending

    def call(self, method: str, *args: Any, per_rank: Sequence[Sequence[Any]] | None = None, **kwargs: Any) -> list[Any]:
        return self.get(self.call_async(method, *args, per_rank=per_rank, **kwargs))

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.use_ray:
            import ray

            return ray.get(getattr(self.workers[0], method).remote(*args, **kwargs))
        return getattr(self.workers[0], method)(*args, **kwargs)

    def put(self, value: Any) -> Any:
        """Share a large argument once (the Ray object store), not once per rank."""
        if self.use_ray:
            import ray

            return ray.put(value)
        return value

    def shutdown(self) -> None:
        if self.use_ray:
            import ray

            for worker in self.workers:
                with contextlib.suppress(Exception):  # best effort on the way out
                    ray.get(worker.shutdown.remote(), timeout=10)
                ray.kill(worker)
        else:
            self.workers[0].shutdown()
