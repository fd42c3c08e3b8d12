"""Resolve a model path (``tiny``, ``smollm2-135m``, a ``.gguf`` file, a Hugging Face directory or a
hub name) and load it.

Every place that takes a model path goes through here, so ``tiny`` works everywhere a
real model does and a real model works everywhere ``tiny`` does. A LoRA run's exported model is
peft's adapter directory (``adapter_config.json`` naming its base, ``adapter_model.safetensors``):
loading it loads the base with the adapters merged in, and the base's tokenizer.
"""

from __future__ import annotations

import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentgym.model.gguf_convert import gguf_model_path
from agentgym.model.smollm2 import is_smollm2, smollm2_model_path
from agentgym.model.tiny import is_tiny, tiny_model_path

ADAPTER_CONFIG = "adapter_config.json"


def is_gguf(path: str | os.PathLike[str]) -> bool:
    return str(path).lower().endswith(".gguf") and Path(path).expanduser().is_file()


def is_builtin(path: str | os.PathLike[str]) -> bool:
    """A name or file agentgym turns into a model directory itself: ``tiny``, ``smollm2-135m``, a ``.gguf`` file."""
    return is_tiny(path) or is_smollm2(path) or is_gguf(path)


def resolve_model_path(path: str | os.PathLike[str]) -> str:
    """``tiny`` -> the built tiny model's directory; ``smollm2-135m`` and ``*.gguf`` files -> their
    converted directories (``ModelUnavailable`` names the install command when a package is missing);
    anything else is returned unchanged."""
    if is_tiny(path):
        return str(tiny_model_path())
    if is_smollm2(path):
        return str(smollm2_model_path())
    if is_gguf(path):
        return str(gguf_model_path(str(Path(path).expanduser().resolve())))
    return str(path)


def adapter_base(path: str | os.PathLike[str]) -> str | None:
    """The base model of a peft adapter directory (``adapter_config.json`` and no ``config.json``),
    or None when ``path`` is a whole model."""
    directory = Path(resolve_model_path(path))
    if not (directory / ADAPTER_CONFIG).is_file() or (directory / "config.json").is_file():
        return None
    try:
        base = json.loads((directory / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{directory / ADAPTER_CONFIG} is unreadable ({exc})") from None
    if not base:
        raise ValueError(
            f"{directory} holds LoRA adapters but {ADAPTER_CONFIG} names no base model "
            "(base_model_name_or_path): set it to the model the adapters were trained on"
        )
    return str(base)


@lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any:
    """A tokenizer with a chat template (a LoRA adapter directory's: its base model's). Cached per
    path: tokenizers are read-only here."""
    from transformers import AutoTokenizer

    base = adapter_base(path)
    if base is not None:
        return load_tokenizer(base)
    resolved = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    except OSError as exc:
        raise OSError(
            f"could not load a tokenizer from {path!r}: {exc}\n"
            "Pass 'tiny' for the built-in model, smollm2-135m, a .gguf file, a local Hugging Face model "
            "directory, or a hub name "
            "reachable from this machine."
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer at {path!r} has no chat template; agentgym renders chats with it")
    return tokenizer


def load_causal_lm(path: str, dtype: str | Any = "float32", device: str = "cpu") -> Any:
    """A ``transformers`` causal LM in eval mode on ``device``; a LoRA adapter directory gives its
    base model with the adapters merged in."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    base = adapter_base(path)
    if base is not None:
        return _merged_adapter(path, base, torch_dtype).to(device).eval()
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=torch_dtype)
    return model.to(device).eval()


def _merged_adapter(path: str, base: str, dtype: Any) -> Any:
    import torch

    try:
        from peft import PeftModel
    except ImportError:
        raise ImportError(
            f"{path} is a LoRA adapter directory (on {base}); loading it needs peft: pip install "
            "'agentgym[lora]' (or export merged weights: actor_rollout_ref.model.lora_export_merged=true)"
        ) from None
    try:
        model = load_causal_lm(base, dtype=torch.float32)
    except OSError as exc:
        raise OSError(
            f"{path} holds LoRA adapters on {base!r} ({ADAPTER_CONFIG}), which could not be loaded: {exc}"
        ) from exc
    targets = json.loads((Path(resolve_model_path(path)) / ADAPTER_CONFIG).read_text()).get("target_modules") or []
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head" in targets:
        # merging into a head tied to the embeddings would change the embeddings too
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        model.config.tie_word_embeddings = False
    with warnings.catch_warnings():  # peft asks transformers about deprecated gradient-checkpointing flags
        warnings.simplefilter("ignore", FutureWarning)
        merged = PeftModel.from_pretrained(model, resolve_model_path(path)).merge_and_unload()
    return merged.to(dtype)
