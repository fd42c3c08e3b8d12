"""LoRA for the actor, with veRL's keys: ``actor_rollout_ref.model.lora_rank`` (0: off),
``lora_alpha`` and ``target_modules`` (``all-linear`` or a list of module names), through
``peft`` (in agentgym's core install).

* **Training**: ``wrap`` puts adapters on the target modules and freezes everything else, so
  the optimizer holds the adapters only.
* **Reference policy**: the same model with its adapters disabled (``reference``), so no
  second copy of the weights exists.
* **Checkpoints** hold the adapters only: the wrapped model's ``state_dict`` leaves the frozen
  base out, and loading one does not miss it (the base comes from ``model.path``).
* **Pushes** carry the adapters only (``push_state``: ``<module>.lora_A.weight`` and
  ``<module>.lora_B.weight`` with the scale ``lora_alpha / lora_rank`` folded into B, under the
  base model's module names); the embedded engine adds ``B @ A`` to those modules' outputs
  (``agentgym.server.lora_adapters``). vLLM servers load peft's adapter directory
  (``save_adapter``) through ``/v1/load_lora_adapter``.
* **HF export** writes the adapter directory, or with ``actor_rollout_ref.model.lora_export_merged``
  the base model with the adapters merged in (``merged_model``). agentgym's loaders read an adapter
  directory as its base with the adapters merged in (``agentgym.model.loading``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

ADAPTER = "default"


@dataclass
class LoraSettings:
    rank: int
    alpha: float
    target_modules: Any


def settings(model_cfg: dict[str, Any]) -> LoraSettings | None:
    """The LoRA settings of ``actor_rollout_ref.model``, or None when ``lora_rank`` is 0."""
    rank = int(model_cfg.get("lora_rank", 0) or 0)
    if rank <= 0:
        return None
    targets = model_cfg.get("target_modules") or "all-linear"
    if not isinstance(targets, str):
        targets = [str(t) for t in targets]
        if targets == ["all-linear"]:
            targets = "all-linear"
    return LoraSettings(rank, float(model_cfg.get("lora_alpha", 16)), targets)


def wrap(model: Any, lora: LoraSettings) -> Any:
    """``model`` with LoRA adapters on ``lora.target_modules``; only the adapters train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ImportError(
            "actor_rollout_ref.model.lora_rank > 0 needs peft, part of agentgym's core install: pip install peft"
        ) from None
    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, target_modules=lora.target_modules, lora_dropout=0.0, bias="none"
    )
    peft_model = get_peft_model(model, config, adapter_name=ADAPTER)
    peft_model._register_state_dict_hook(_adapters_only)
    peft_model.register_load_state_dict_post_hook(_base_is_not_missing)
    return peft_model


def _adapters_only(module: Any, state: dict[str, Any], prefix: str, local_metadata: Any) -> dict[str, Any]:
    for key in [k for k in state if ".lora_" not in k]:
        del state[key]
    return state


def _base_is_not_missing(module: Any, incompatible: Any) -> None:
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if ".lora_" in k]


@contextmanager
def reference(model: Any):
    """``model`` as the reference policy: the base weights, adapters off."""
    with model.disable_adapter():
        yield model


def _lora_layers(model: Any):
    """``(base module name, lora layer)`` for every adapted module."""
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and ADAPTER in getattr(module, "lora_A", {}):
            yield name.removeprefix("base_model.model."), module


@torch.no_grad()
def push_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapters as a server takes them: A and scale * B per module, under base module names."""
    out: dict[str, torch.Tensor] = {}
    for name, layer in _lora_layers(model):
        out[f"{name}.lora_A.weight"] = layer.lora_A[ADAPTER].weight.detach()
        out[f"{name}.lora_B.weight"] = layer.lora_B[ADAPTER].weight.detach() * layer.scaling[ADAPTER]
    return out


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter merged in (``W + scale * B @ A``), without
    touching ``model``."""
    base = model.get_base_model()
    deltas = {
        f"{name}.weight": (layer.lora_B[ADAPTER].weight.float() @ layer.lora_A[ADAPTER].weight.float())
        * layer.scaling[ADAPTER]
        for name, layer in _lora_layers(model)
    }
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict(keep_vars=False).items():
        clean = name.replace(".base_layer.", ".")
        if ".lora_" in name:
            continue
        delta = deltas.get(clean)
        out[clean] = tensor.detach().clone() if delta is None else (tensor.float() + delta).to(tensor.dtype)
    return out


def unties_head(model: Any) -> bool:
    """Whether an adapter on a head tied to the embeddings makes the merged model's head its own."""
    tied = getattr(model.get_base_model().config, "tie_word_embeddings", False)
    return bool(tied) and any(name.split(".")[-1] == "lm_head" for name, _ in _lora_layers(model))


def merged_model(model: Any) -> Any:
    """A plain ``transformers`` model: the base with every adapter merged in (with a head of its own
    when an adapter sat on a head tied to the embeddings)."""
    from transformers import AutoModelForCausalLM

    base = model.get_base_model()
    config = base.config.__class__.from_dict(base.config.to_dict())
    if unties_head(model):
        config.tie_word_embeddings = False
    merged = AutoModelForCausalLM.from_config(config, dtype=base.dtype)
    merged.load_state_dict(merged_state_dict(model), strict=False)
    merged.generation_config = base.generation_config
    return merged


def save_adapter(model: Any, directory: str, base_path: str) -> None:
    """peft's adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``), which peft
    and vLLM load on top of ``base_path`` (a local directory's absolute path, so the adapters load from
    anywhere)."""
    from pathlib import Path

    from agentgym.model.tiny import is_tiny

    if not is_tiny(base_path) and Path(base_path).is_dir():
        base_path = str(Path(base_path).resolve())
    model.peft_config[ADAPTER].base_model_name_or_path = base_path
    model.save_pretrained(directory, selected_adapters=[ADAPTER])
