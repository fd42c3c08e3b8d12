"""A model with its optimizer and learning-rate schedule, on one rank, under either strategy
(``actor_rollout_ref.actor.strategy``): ``fsdp2`` shards the model with PyTorch FSDP2
(``fully_shard`` on every decoder layer, then the root); ``dp`` keeps the whole model on every
rank and averages the gradients with one all-reduce per mini-batch (``allreduce_mean``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

Tensors = dict[str, torch.Tensor]
CONTENTS = ("model", "optimizer", "extra")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def lr_lambda(optim: DictConfig, total_steps: int) -> Callable[[int], float]:
    """veRL's schedules: linear warm-up from 0, then constant or cosine down to ``min_lr_ratio``.
    ``optim``: an ``optim`` section of the training config."""
    warmup = optim.lr_warmup_steps
    if warmup <= 0:
        warmup = int(optim.lr_warmup_steps_ratio * total_steps)
    style = optim.warmup_style
    min_ratio = optim.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        if style == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


class TrainState:
    """A model with its optimizer and lr schedule, and the rank-sharing strategy's plumbing."""

    def __init__(
        self,
        module: nn.Module,
        optim: DictConfig,
        total_steps: int,
        strategy: str,
        world_size: int,
        device: str,
        fsdp_config: DictConfig | None = None,
        layer_classes: Sequence[str] = (),
    ) -> None:
        """``optim`` and ``fsdp_config``: those sections of the training config (``fsdp_config`` is
        read only under ``fsdp2``)."""
        self.strategy = strategy
        self.world_size = world_size
        self.device = device
        module.to(device)
        if strategy == "fsdp2":
            if fsdp_config is None:
                raise ValueError("strategy fsdp2 needs the fsdp_config section of the training config")
            shard(module, fsdp_config, device, layer_classes)
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
    def full_state_dict(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """The whole model's weights on CPU (on rank 0; other ranks get ``{}``). Collective under fsdp2.
        ``on_device``: where they are (dp: the parameters themselves, no copy), for a push that hands
        them to a server on the same device."""
        if self.strategy == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(
                self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=not on_device)
            )
        return {k: v.detach() if on_device else v.detach().to("cpu") for k, v in self.module.state_dict().items()}

    def save(self, directory: Path, rank: int, contents: Sequence[str] = CONTENTS) -> None:
        """One layout whatever the strategy and the number of ranks: ``model.pt`` (the whole
        model's weights) and ``optim.pt`` (the whole AdamW state), both unsharded, on CPU and
        keyed by parameter name, and ``extra.pt`` (lr schedule, every rank's RNG state); so a
        checkpoint saved under fsdp2 on GPUs resumes under dp on a CPU, with another number of
        workers, and back. ``contents`` (veRL's ``checkpoint.save_contents``) picks the parts.
        Rank 0 writes; every rank must call it (collective under fsdp2)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(self.module, options=options) if "model" in contents else None
        optim_state = (
            get_optimizer_state_dict(self.module, self.optimizer, options=options) if "optimizer" in contents else None
        )
        rngs = _gather_objects(rng_state(), self.world_size) if "extra" in contents else None
        if rank != 0:
            return
        directory.mkdir(parents=True, exist_ok=True)
        if model_state is not None:
            torch.save(model_state, directory / "model.pt")
        if optim_state is not None:
            torch.save(optim_state, directory / "optim.pt")
        if rngs is not None:
            torch.save(
                {
                    "scheduler": self.scheduler.state_dict(),
                    "rng": rngs,
                    "strategy": self.strategy,
                    "world_size": self.world_size,
                },
                directory / "extra.pt",
            )

    def load(self, directory: Path, rank: int, contents: Sequence[str] = CONTENTS) -> None:
        """Read back what ``save`` wrote, whatever strategy and number of ranks wrote it (every rank
        reads the files); ``contents`` (veRL's ``checkpoint.load_contents``) picks the parts. A rank
        the checkpoint has no RNG state for keeps its own seeded one."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        parts = {"model": directory / "model.pt", "optimizer": directory / "optim.pt", "extra": directory / "extra.pt"}
        for part in contents:
            if part in parts and not parts[part].is_file():
                found = ", ".join(sorted(p.name for p in directory.glob("*.pt"))) or "nothing"
                raise FileNotFoundError(
                    f"no {parts[part].name} in {directory} (found {found}); point trainer.resume_from_path at a "
                    "global_step_N directory written by agentgym train, and load only what its "
                    "checkpoint.save_contents held (set checkpoint.load_contents to match); on a Ray cluster, "
                    "a rank on a node that does not mount the run directory sees nothing there: see docs/cluster.md"
                )
        options = StateDictOptions(full_state_dict=True)
        if "model" in contents:
            set_model_state_dict(
                self.module, torch.load(parts["model"], map_location="cpu", weights_only=False), options=options
            )
        if "optimizer" in contents:
            optim_state = torch.load(parts["optimizer"], map_location="cpu", weights_only=False)
            if self.strategy == "dp" and all(isinstance(k, int) for k in optim_state.get("state", {})):
                self.optimizer.load_state_dict(optim_state)  # written before names keyed it (dp only)
            else:
                set_optimizer_state_dict(self.module, self.optimizer, optim_state, options=options)
        if "extra" in contents:
            extra = torch.load(parts["extra"], weights_only=False)
            self.scheduler.load_state_dict(extra["scheduler"])
            rngs = extra["rng"] if isinstance(extra["rng"], list) else [extra["rng"]]
            if rank < len(rngs):
                set_rng_state(rngs[rank])


def _gather_objects(value: Any, world_size: int) -> list[Any]:
    """``value`` from every rank, in rank order (collective when there is more than one rank)."""
    import torch.distributed as dist

    if world_size == 1 or not dist.is_initialized():
        return [value]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered


def adamw(params: list[nn.Parameter], optim: DictConfig) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this torch has one for these parameters (on a CPU it
    steps a 0.5B model about 6x faster than the default multi-tensor path), else the default."""
    kwargs = {
        "lr": optim.lr,
        "betas": tuple(optim.betas),
        "eps": optim.eps,
        "weight_decay": optim.weight_decay,
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


def shard(module: nn.Module, fsdp_config: DictConfig, device: str, layer_classes: Sequence[str]) -> None:
    """FSDP2: ``fully_shard`` each transformer block (the classes HF lists in
    ``_no_split_modules``), then the whole model, over all ranks on ``device``. On a GPU,
    ``param_offload`` or ``optimizer_offload`` (veRL's keys) turn on FSDP2's CPU offload:
    parameters, gradients and optimizer state stay in CPU memory between uses (FSDP2 offloads
    them together). Without a GPU they are in CPU memory anyway.

    The mesh is named explicitly: without one, ``fully_shard`` shards over the accelerator
    whenever one is visible, so ``trainer.device=cpu`` on a CUDA machine moved the weights to
    ``cuda:0`` while the batches stayed on the CPU ("index is on cpu, different from other
    tensors on cuda:0")."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"reshard_after_forward": fsdp_config.reshard_after_forward}
    if dist.is_initialized():  # the workers always are (Worker.init_distributed)
        kwargs["mesh"] = init_device_mesh(device, (dist.get_world_size(),))
    if device == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=getattr(torch, fsdp_config.param_dtype),
            reduce_dtype=getattr(torch, fsdp_config.reduce_dtype),
        )
        if fsdp_config.param_offload or fsdp_config.optimizer_offload:
            from torch.distributed.fsdp import CPUOffloadPolicy

            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    names = set(layer_classes)
    for sub in module.modules():
        if type(sub).__name__ in names:
            fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)


def layer_classes(model: nn.Module) -> list[str]:
    found = getattr(model, "_no_split_modules", None) or []
    for sub in model.modules():  # a ValueModel wraps the HF body
        found = found or list(getattr(sub, "_no_split_modules", None) or [])
    return list(found)
