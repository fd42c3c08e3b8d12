"""vLLM and SGLang as policy servers: their command lines, start-up, and weight updates.

``start_engine_server("vllm" | "sglang", model, ...)`` builds the real command line, starts it
in its own process group with its output in a log file, waits for ``/health`` (a clear error
with the log's tail if it dies or times out) and returns a ``SubprocessServerHandle``: the
same ``PolicyServerHandle`` interface as the embedded server (``.url``, ``.backend``,
``.update_weights(path_or_state, version)``, ``.stop()``).

Weights reach these servers through the adapters in ``agentgym.client.weights``. For vLLM the
server is started with ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls
agentgym_vllm_extension.VLLMWorkerWeights``: each worker then reads the pushed safetensors
file(s) and calls the model's ``load_weights``. That module (``vllm_extension/``) imports
only the standard library, torch and vLLM, and its directory alone goes on the engine's
``PYTHONPATH``: vLLM's environment need not have agentgym or its dependencies. vLLM's newer
weight-transfer API (``/init_weight_transfer_engine``, ``/start_weight_update``, ...) changes
between releases; the worker-extension route works across them.

The engine runs in the model's own dtype (``torch_dtype`` in its ``config.json``) unless
``dtype`` says otherwise: vLLM would otherwise run a float32 checkpoint in 16 bits, and its
logprobs would no longer match a float32 trainer's. A port already in use is refused before
anything starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "sglang")
VLLM_EXTENSION_DIR = Path(__file__).resolve().parent / "vllm_extension"
VLLM_EXTENSION = "agentgym_vllm_extension.VLLMWorkerWeights"


# ---- command lines ---------------------------------------------------------------------------------
def vllm_command(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.85,
    max_model_len: int | None = None,
    tool_call_parser: str = "hermes",
    dtype: str | None = None,
    kv_cache_memory_bytes: int | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """vLLM's OpenAI server (``vllm serve`` checks its own version and fails on some builds;
    the module entry point does not). ``kv_cache_memory_bytes``: its KV cache's size (on a GPU it
    then ignores ``gpu_memory_utilization`` for the cache; on a CPU it replaces ``VLLM_CPU_KVCACHE_SPACE``)."""
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        served_model_name or model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
    ]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if dtype:
        cmd += ["--dtype", dtype]
    if kv_cache_memory_bytes is not None:
        cmd += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    if tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    cmd += ["--worker-extension-cls", VLLM_EXTENSION]
    return cmd + list(extra_args)


def sglang_command(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    served_model_name: str | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.85,
    max_model_len: int | None = None,
    tool_call_parser: str = "hermes",
    dtype: str | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """SGLang's server. Its Hermes-format parser is called ``qwen25`` (``hermes`` maps to it)."""
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_path,
        "--served-model-name",
        served_model_name or model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--tp",
        str(tensor_parallel_size),
        "--mem-fraction-static",
        str(gpu_memory_utilization),
    ]
    if max_model_len:
        cmd += ["--context-length", str(max_model_len)]
    if dtype:
        cmd += ["--dtype", dtype]
    if tool_call_parser:
        cmd += ["--tool-call-parser", "qwen25" if tool_call_parser == "hermes" else tool_call_parser]
    return cmd + list(extra_args)


COMMANDS: dict[str, Callable[..., list[str]]] = {"vllm": vllm_command, "sglang": sglang_command}
MODULES = {"vllm": "vllm", "sglang": "sglang"}


def engine_kv_cache_bytes(engine: str, value: int | str | None) -> int | None:
    """A KV cache size for ``engine`` in bytes (None: the engine's default). Only vLLM takes one;
    SGLang sizes its cache by the memory share (``gpu_memory_utilization``), so a size for it is refused."""
    if value is None:
        return None
    from agentgym.server.kv_cache import parse_bytes

    size = parse_bytes(value)
    if engine == "sglang":
        raise ValueError(
            "SGLang takes no KV cache size: it sizes its cache by its memory share; set gpu_memory_utilization "
            "(--mem-fraction-static) instead and leave kv_cache_memory_bytes null"
        )
    return size


def engine_environment(engine: str) -> dict[str, str]:
    """The environment variables the engine's process gets on top of this one's: vLLM's dev
    routes, and the worker extension's directory (only it) first on ``PYTHONPATH``."""
    if engine != "vllm":
        return {}
    path = os.pathsep.join(p for p in (str(VLLM_EXTENSION_DIR), os.environ.get("PYTHONPATH")) if p)
    return {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": path}


def model_dtype(model_path: str | os.PathLike[str]) -> str | None:
    """The dtype a Hugging Face model directory was saved in (``config.json``), or None."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else None


def engine_available(engine: str, python: str = sys.executable) -> bool:
    """Whether ``python`` can import the engine's package (checked without importing it here)."""
    if python == sys.executable:
        return importlib.util.find_spec(MODULES[engine]) is not None
    probe = subprocess.run(
        [python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({MODULES[engine]!r}) is None)"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


def engine_device(engine: str, python: str = sys.executable) -> str | None:
    """The device ``python``'s vLLM would run on (``cpu``, ``cuda``, ...; None when it cannot say, or for
    another engine). A child process asks ``vllm.platforms``: a few seconds, once per launch."""
    if engine != "vllm":
        return None
    try:
        probe = subprocess.run(
            [python, "-c", "from vllm.platforms import current_platform as p; print(p.device_type)"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = probe.stdout.split()
    return lines[-1] if probe.returncode == 0 and lines else None


def cpu_vllm_args(extra_args: Sequence[str]) -> list[str]:
    """vLLM on a CPU: chunked prefill off unless the flags say otherwise, since a request with a ``seed``
    whose prompt is prefilled in more than one step kills vLLM-CPU's engine (``agentgym.client.vllm_cpu``);
    without it vLLM raises ``--max-num-batched-tokens`` to the context length (when not given) so every
    prompt is prefilled in one step."""
    if any(a.split("=")[0] in ("--enable-chunked-prefill", "--no-enable-chunked-prefill") for a in extra_args):
        return list(extra_args)
    return [*extra_args, "--no-enable-chunked-prefill"]


def start_engine_server(
    engine: str,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    served_model_name: str | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.85,
    max_model_len: int | None = None,
    tool_call_parser: str = "hermes",
    dtype: str | None = None,
    kv_cache_memory_bytes: int | str | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    timeout: float = 900.0,
    python: str | None = None,
) -> Any:
    """Start vLLM or SGLang on ``model`` and return its handle once ``/health`` answers.

    ``python``: the interpreter that has the engine installed (default: this one, or
    ``$AGENTGYM_<ENGINE>_PYTHON``), so an engine can live in its own virtual environment.
    ``dtype``: default the model's own (see the module docstring). vLLM on a CPU runs without
    chunked prefill unless ``extra_args`` turn it on (``cpu_vllm_args``). ``kv_cache_memory_bytes``
    (``4G`` and the like, vLLM's ``--kv-cache-memory-bytes``): vLLM only; SGLang sizes its cache by
    ``gpu_memory_utilization`` and is refused one rather than have it dropped.
    """
    from agentgym.model import resolve_model_path
    from agentgym.server.handles import SubprocessServerHandle, ensure_port_free, free_port

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} (or 'embedded'), got {engine!r}")
    kv_bytes = engine_kv_cache_bytes(engine, kv_cache_memory_bytes)
    python = python or os.environ.get(f"AGENTGYM_{engine.upper()}_PYTHON") or sys.executable
    if not engine_available(engine, python):
        raise RuntimeError(
            f"{python} cannot import {MODULES[engine]!r}. Install it (pip install 'agentgym[{engine}]', on a "
            f"machine with a GPU) or point AGENTGYM_{engine.upper()}_PYTHON at an interpreter that has it; "
            "or use --engine embedded."
        )
    if port:
        ensure_port_free(host, port)
    port = port or free_port(host)
    model_path = resolve_model_path(model)
    dtype = dtype or model_dtype(model_path)
    name = served_model_name or str(model)
    if engine_device(engine, python) == "cpu":
        extra_args = cpu_vllm_args(extra_args)
    sizes = {"kv_cache_memory_bytes": kv_bytes} if kv_bytes is not None else {}
    command = COMMANDS[engine](
        model_path,
        host=host,
        port=port,
        served_model_name=name,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        tool_call_parser=tool_call_parser,
        dtype=dtype,
        extra_args=extra_args,
        python=python,
        **sizes,
    )
    from agentgym.client.weights import weights_adapter

    weights = weights_adapter(engine, model_dir=model_path)
    handle = SubprocessServerHandle(
        command,
        f"http://{host}:{port}",
        engine,
        name,
        weights,
        env={**engine_environment(engine), **(env or {})},
        log_path=log_path,
    )
    handle.wait_ready(timeout)
    return handle


# ---- a tiny model vLLM's CPU backend accepts ---------------------------------------------------------
def build_tiny_head64(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """The tiny model with one attention head of size 64 (vLLM's CPU attention refuses head
    size 16), same tokenizer and hidden size, fresh random weights. Returns ``directory``."""
    import torch
    from transformers import AutoConfig, Qwen2ForCausalLM

    from agentgym.model import resolve_model_path

    source = Path(resolve_model_path("tiny"))
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name != "config.json":
            shutil.copy(f, target / f.name)
    config = AutoConfig.from_pretrained(source)
    config.num_attention_heads = 1
    config.num_key_value_heads = 1
    config.head_dim = config.hidden_size
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(target)
    return target
