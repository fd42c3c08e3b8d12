"""Resolve a model path (``tiny``, ``smollm2-135m``, a ``.gguf`` file, a Hugging Face directory or a
hub name) and load it.

Every place that takes a model path goes through here, so ``tiny`` works everywhere a
real model does and a real model works everywhere ``tiny`` does.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentgym.model.gguf_convert import gguf_model_path
from agentgym.model.smollm2 import is_smollm2, smollm2_model_path
from agentgym.model.tiny import is_tiny, tiny_model_path


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


@lru_cache(maxsize=8)
def load_tokenizer(path: str) -> Any:
    """A tokenizer with a chat template. Cached per path: tokenizers are read-only here."""
    from transformers import AutoTokenizer

    resolved = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    except OSError as exc:
        raise OSError(
            f"could not load a tokenizer from {path!r}: {exc}\n"
            "Pass 'tiny' for the built-in model, smollm2-135m, a .gguf file, a local Hugging Face model directory, or a hub name "
            "reachable from this machine."
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer at {path!r} has no chat template; agentgym renders chats with it")
    return tokenizer


def load_causal_lm(path: str, dtype: str | Any = "float32", device: str = "cpu") -> Any:
    """A ``transformers`` causal LM in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=torch_dtype)
    return model.to(device).eval()
