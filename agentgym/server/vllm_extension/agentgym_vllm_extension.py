"""agentgym's vLLM worker extension: vLLM loads it into each of its worker processes
(``--worker-extension-cls agentgym_vllm_extension.VLLMWorkerWeights``) so that a pushed
weights file can be loaded in place.

It runs in vLLM's environment, which need not have agentgym's dependencies (gymnasium, ray,
fastapi, ...), so this file imports nothing but the standard library, torch and vLLM, and
sits outside the ``agentgym`` package's import path (importing ``agentgym.anything`` runs
``agentgym/__init__.py``, which registers the environments with gymnasium):
``agentgym.server.launchers`` puts this directory alone on the engine's ``PYTHONPATH``.
tests/server/test_engines.py imports it with agentgym and its dependencies blocked.
"""

from __future__ import annotations

import inspect
import json
import mmap
import os
import struct
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """One safetensors file as tensors viewing a private memory map of it (the format: a
    little-endian u64 header length, a JSON header, then the raw data)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        mapped = (
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if os.fstat(f.fileno()).st_size > 8 + length else None
        )
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if end == begin or mapped is None:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=end - begin, offset=8 + length + begin)
        tensors[name] = flat.view(dtype).view(info["shape"])
    return tensors


def read_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A safetensors file, or every ``*.safetensors`` file of a model directory."""
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no safetensors weights at {p}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(read_safetensors(f))
    return state


class VLLMWorkerWeights:
    """Mixed by vLLM into every worker, so ``self.model_runner`` is the worker's.
    ``collective_rpc`` passes only strings: ``agentgym_load_weights(path)``."""

    def agentgym_load_weights(self, path: str) -> int:
        state = read_weights(path)
        runner = self.model_runner  # type: ignore[attr-defined]
        tied = getattr(getattr(runner.model_config, "hf_config", None), "tie_word_embeddings", False)
        if tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
            # vLLM's CPU backend keeps a repacked lm_head apart from the embedding it is tied to:
            # reloading only the embedding would leave the output layer on the old weights
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        reload = getattr(runner, "reload_weights", None)
        if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
            # vLLM >= 0.12: in-place layerwise reload that redoes kernel-format processing (repacking)
            reload(weights_iterator=iter(state.items()), is_checkpoint_format=True)
            return len(state)
        model = runner.model
        model.load_weights(weights=iter(state.items()))
        try:  # re-run post-load processing (quantization, repacking) where this vLLM has it
            from vllm.model_executor.model_loader.utils import process_weights_after_loading

            device = next(model.parameters()).device
            process_weights_after_loading(model, runner.model_config, device)
        except (ImportError, TypeError, AttributeError):
            pass
        return len(state)
