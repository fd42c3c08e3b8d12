"""vLLM and SGLang as policy servers: their command lines, start-up, and weight updates.

``start_engine_server("vllm" | "sglang", model, ...)`` builds the real command line, starts it
in its own process group with its output in a log file, waits for ``/health`` (a clear error
with the log's tail if it dies or times out) and returns a ``SubprocessServerHandle``: the
same ``PolicyServerHandle`` interface as the embedded server (``.url``, ``.backend``,
``.update_weights(path_or_state, version)``, ``.stop()``).

Weight updates, per engine (``*Weights`` adapters; each call is plain HTTP):

* **embedded** and **SGLang**: ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"}``.
  SGLang also has ``/update_weights_from_tensor`` (``serialized_named_tensors``, one per TP
  rank, made by ``sglang.srt.utils.MultiprocessingSerializer``) and the NCCL pair
  ``/init_weights_update_group`` + ``/update_weights_from_distributed`` (the trainer
  broadcasts the tensors while the second call is in flight). SGLang drains or aborts
  running requests itself around an update.
* **vLLM**: the server is started with ``VLLM_SERVER_DEV_MODE=1`` and
  ``--worker-extension-cls agentgym.server.engines.VLLMWorkerWeights``; an update is
  ``POST /pause?mode=wait`` (vLLM versions that have it, so no response mixes versions),
  ``POST /collective_rpc {"method": "agentgym_load_weights", "args": [path]}`` (each worker
  reads the safetensors file(s) and calls the model's ``load_weights``),
  ``POST /reset_prefix_cache``, ``POST /update_weight_version`` where offered, and
  ``POST /resume``. vLLM's newer weight-transfer API (``/init_weight_transfer_engine``,
  ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``, NCCL or IPC
  backends) changes between releases; the worker-extension route works across them.

A state dict (rather than a path) is written once to shared memory (``/dev/shm``) as a
model directory (safetensors + the served model's config files) that the server loads.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from agentgym.server.client import ssl_context

ENGINES = ("vllm", "sglang")


# ---- command lines ---------------------------------------------------------------------------------
def vllm_command(model_path: str, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
                 tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85, max_model_len: int | None = None,
                 tool_call_parser: str = "hermes", dtype: str | None = None, extra_args: Sequence[str] = (),
                 python: str = sys.executable) -> list[str]:
    """vLLM's OpenAI server (``vllm serve`` checks its own version and fails on some builds;
    the module entry point does not)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", served_model_name or model_path, "--host", host, "--port", str(port),
           "--tensor-parallel-size", str(tensor_parallel_size),
           "--gpu-memory-utilization", str(gpu_memory_utilization)]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if dtype:
        cmd += ["--dtype", dtype]
    if tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    cmd += ["--worker-extension-cls", f"{__name__}.VLLMWorkerWeights"]
    return cmd + list(extra_args)


def sglang_command(model_path: str, *, host: str = "127.0.0.1", port: int = 30000,
                   served_model_name: str | None = None, tensor_parallel_size: int = 1,
                   gpu_memory_utilization: float = 0.85, max_model_len: int | None = None,
                   tool_call_parser: str = "hermes", dtype: str | None = None, extra_args: Sequence[str] = (),
                   python: str = sys.executable) -> list[str]:
    """SGLang's server. Its Hermes-format parser is called ``qwen25`` (``hermes`` maps to it)."""
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model_path,
           "--served-model-name", served_model_name or model_path, "--host", host, "--port", str(port),
           "--tp", str(tensor_parallel_size), "--mem-fraction-static", str(gpu_memory_utilization)]
    if max_model_len:
        cmd += ["--context-length", str(max_model_len)]
    if dtype:
        cmd += ["--dtype", dtype]
    if tool_call_parser:
        cmd += ["--tool-call-parser", "qwen25" if tool_call_parser == "hermes" else tool_call_parser]
    return cmd + list(extra_args)


COMMANDS: dict[str, Callable[..., list[str]]] = {"vllm": vllm_command, "sglang": sglang_command}
ENVIRONMENTS: dict[str, dict[str, str]] = {"vllm": {"VLLM_SERVER_DEV_MODE": "1"}, "sglang": {}}
MODULES = {"vllm": "vllm", "sglang": "sglang"}


def engine_available(engine: str, python: str = sys.executable) -> bool:
    """Whether ``python`` can import the engine's package (checked without importing it here)."""
    if python == sys.executable:
        return importlib.util.find_spec(MODULES[engine]) is not None
    probe = subprocess.run([python, "-c", f"import importlib.util, sys; "
                            f"sys.exit(importlib.util.find_spec({MODULES[engine]!r}) is None)"],
                           capture_output=True, timeout=60)
    return probe.returncode == 0


def start_engine_server(engine: str, model: str, *, host: str = "127.0.0.1", port: int = 0,
                        served_model_name: str | None = None, tensor_parallel_size: int = 1,
                        gpu_memory_utilization: float = 0.85, max_model_len: int | None = None,
                        tool_call_parser: str = "hermes", dtype: str | None = None, extra_args: Sequence[str] = (),
                        env: dict[str, str] | None = None, log_path: str | os.PathLike[str] | None = None,
                        timeout: float = 900.0, python: str | None = None) -> Any:
    """Start vLLM or SGLang on ``model`` and return its handle once ``/health`` answers.

    ``python``: the interpreter that has the engine installed (default: this one, or
    ``$AGENTGYM_<ENGINE>_PYTHON``), so an engine can live in its own virtual environment.
    """
    from agentgym.model import resolve_model_path
    from agentgym.server.launch import SubprocessServerHandle, free_port

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES} (or 'embedded'), got {engine!r}")
    python = python or os.environ.get(f"AGENTGYM_{engine.upper()}_PYTHON") or sys.executable
    if not engine_available(engine, python):
        raise RuntimeError(
            f"{python} cannot import {MODULES[engine]!r}. Install it (pip install 'agentgym[{engine}]', on a "
            f"machine with a GPU) or point AGENTGYM_{engine.upper()}_PYTHON at an interpreter that has it; "
            "or use --engine embedded.")
    port = port or free_port(host)
    model_path = resolve_model_path(model)
    name = served_model_name or str(model)
    command = COMMANDS[engine](model_path, host=host, port=port, served_model_name=name,
                               tensor_parallel_size=tensor_parallel_size,
                               gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                               tool_call_parser=tool_call_parser, dtype=dtype, extra_args=extra_args, python=python)
    weights = {"vllm": VLLMWeights, "sglang": SGLangWeights}[engine](model_dir=model_path)
    environment = dict(ENVIRONMENTS[engine])
    if python != sys.executable:  # the engine's interpreter must find agentgym (vLLM's worker extension)
        root = str(Path(__file__).resolve().parents[2])
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    handle = SubprocessServerHandle(command, f"http://{host}:{port}", engine, name, weights,
                                    env={**environment, **(env or {})}, log_path=log_path)
    handle.wait_ready(timeout)
    return handle


# ---- weight updates ----------------------------------------------------------------------------------
class WeightUpdateError(RuntimeError):
    pass


class _Weights:
    """Shared HTTP plumbing of the weight adapters."""

    def __init__(self, model_dir: str | os.PathLike[str] | None = None, timeout: float = 1800.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir else None
        self.timeout = timeout
        self._transport = transport  # tests pass a stand-in app's transport

    def _post(self, url: str, path: str, json: Any = None, params: dict[str, Any] | None = None,
              optional: bool = False) -> Any:
        """POST and return the JSON body; ``optional``: a 404 (route missing in this version) returns None."""
        with httpx.Client(timeout=self.timeout, transport=self._transport, verify=ssl_context()) as client:
            response = client.post(url + path, json=json, params=params)
        if optional and response.status_code in (404, 405):
            return None
        if response.status_code >= 400:
            raise WeightUpdateError(f"{url}{path} answered {response.status_code}: {response.text[:500]}")
        try:
            body = response.json()
        except ValueError:
            return {}
        if isinstance(body, dict) and body.get("success") is False:
            raise WeightUpdateError(f"{url}{path} failed: {body.get('message', body)}")
        return body

    def update_from_disk(self, url: str, path: str, version: int) -> Any:
        raise NotImplementedError

    def update_from_state_dict(self, url: str, state: dict[str, Any], version: int) -> Any:
        """Write ``state`` to shared memory as a model directory, load it, remove it."""
        from agentgym.server.weights import push_dir, save_for_push

        directory = Path(tempfile.mkdtemp(prefix="agentgym-weights-", dir=push_dir()))
        try:
            save_for_push(state, directory / "model.safetensors")
            self._copy_config(directory)
            return self.update_from_disk(url, str(directory), version)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _copy_config(self, directory: Path) -> None:
        """The served model's config files, so ``directory`` is a loadable model directory."""
        if self.model_dir is not None:
            for f in self.model_dir.glob("*.json"):
                if not f.name.endswith(".index.json"):  # the served model's shard index would mislead
                    shutil.copy(f, directory / f.name)


class EmbeddedWeights(_Weights):
    """agentgym's embedded server (SGLang's route and fields)."""

    def update_from_disk(self, url: str, path: str, version: int) -> Any:
        return self._post(url, "/update_weights_from_disk", {"model_path": path, "weight_version": str(version)})

    def update_from_state_dict(self, url: str, state: dict[str, Any], version: int) -> Any:
        """One safetensors file in shared memory is all the embedded server needs."""
        from agentgym.server.weights import save_for_push

        path = save_for_push(state)
        try:
            return self.update_from_disk(url, str(path), version)
        finally:
            path.unlink(missing_ok=True)


class SGLangWeights(_Weights):
    """SGLang's weight routes (``sglang/srt/entrypoints/http_server.py``)."""

    def update_from_disk(self, url: str, path: str, version: int, abort_all_requests: bool = False) -> Any:
        """``path``: a model directory, or one safetensors file (SGLang loads directories only, so a
        file is linked into a temporary directory beside the served model's config files)."""
        if not Path(path).is_file():
            return self._post(url, "/update_weights_from_disk", {
                "model_path": path, "weight_version": str(version), "abort_all_requests": abort_all_requests})
        from agentgym.server.weights import push_dir

        directory = Path(tempfile.mkdtemp(prefix="agentgym-weights-", dir=push_dir()))
        try:
            (directory / "model.safetensors").symlink_to(Path(path).resolve())
            self._copy_config(directory)
            return self.update_from_disk(url, str(directory), version, abort_all_requests)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def update_from_tensors(self, url: str, named_tensors: dict[str, Any], version: int, tp_size: int = 1,
                            serialize: Callable[[list[tuple[str, Any]]], str] | None = None,
                            flush_cache: bool = True) -> Any:
        """Same-host tensors; ``serialize`` defaults to SGLang's ``MultiprocessingSerializer``
        (CUDA tensors travel as IPC handles, so the server reads the trainer's GPU memory)."""
        if serialize is None:
            from sglang.srt.utils import MultiprocessingSerializer  # type: ignore[import-not-found]

            def serialize(items: list[tuple[str, Any]]) -> str:
                return MultiprocessingSerializer.serialize(items, output_str=True)

        payload = serialize(list(named_tensors.items()))
        return self._post(url, "/update_weights_from_tensor", {
            "serialized_named_tensors": [payload] * tp_size, "load_format": None, "flush_cache": flush_cache,
            "weight_version": str(version)})

    def init_weights_update_group(self, url: str, master_address: str, master_port: int, rank_offset: int,
                                  world_size: int, group_name: str = "weight_update_group",
                                  backend: str = "nccl") -> Any:
        """Join the server's workers to a process group with the trainer (rank 0, the broadcaster)."""
        return self._post(url, "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    def update_from_distributed(self, url: str, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                version: int, group_name: str = "weight_update_group",
                                flush_cache: bool = True) -> Any:
        """Announce the tensors the trainer is about to broadcast in ``group_name``; returns once
        they are loaded, so call it from a thread while broadcasting."""
        return self._post(url, "/update_weights_from_distributed", {
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
            "flush_cache": flush_cache, "weight_version": str(version)})

    def pause(self, url: str, mode: str = "abort") -> Any:
        return self._post(url, "/pause_generation", {"mode": mode})

    def resume(self, url: str) -> Any:
        return self._post(url, "/continue_generation", {})


class VLLMWeights(_Weights):
    """vLLM, through its dev-mode ``/collective_rpc`` and ``VLLMWorkerWeights`` in every worker."""

    def update_from_disk(self, url: str, path: str, version: int) -> Any:
        paused = self._post(url, "/pause", params={"mode": "wait"}, optional=True) is not None
        try:
            result = self._post(url, "/collective_rpc", {"method": "agentgym_load_weights", "args": [path]})
            self._post(url, "/reset_prefix_cache", optional=True)
            self._post(url, "/update_weight_version", {"new_version": str(version)}, optional=True)
        finally:
            if paused:
                self._post(url, "/resume")
        return result


class VLLMWorkerWeights:
    """A vLLM worker extension (``--worker-extension-cls``): vLLM mixes it into every worker,
    so ``self.model_runner`` is the worker's. ``collective_rpc`` passes only strings."""

    def agentgym_load_weights(self, path: str) -> int:
        from agentgym.server.weights import load_weights

        state = load_weights(path)
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
