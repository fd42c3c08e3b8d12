"""Starting policy servers: ``agentgym serve``, and the functions that return a running server's
``PolicyServerHandle`` (``agentgym.server.handles``).

* ``start_embedded_server(model="tiny", port=0)`` runs the embedded server in this process
  (uvicorn in a background thread; weight pushes then skip serialization entirely) or, with
  ``in_process=False``, as ``agentgym serve`` in a child process.
* ``start_policy_server(engine, model, ...)`` does the same for ``vllm`` and ``sglang``
  (``agentgym.server.launchers``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from agentgym.server.handles import (
    EmbeddedServerHandle,
    PolicyServerHandle,
    SubprocessServerHandle,
    ensure_port_free,
    free_port,
)
from agentgym.server.limits import ADMIN_KEY_ENV, ServerLimits, admin_key_from_env, new_admin_key


# ---- the embedded server, in this process ------------------------------------------------------
def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def set_cpu_threads(threads: int | None, device: str) -> int:
    """Torch's intra-op threads for a server process of its own on a CPU (``--threads``; None or 0 keeps
    torch's default, one per core). Fewer threads cost less CPU per token (on 2 cores, 1 thread: 15-40%
    less for SmolLM2), but on a machine shared with other work a process with fewer threads also gets a
    smaller share of it, so it can be slower in wall-clock time (docs/results.md). Returns the
    number in use. Never called for an engine inside a trainer's process (the setting is global)."""
    import torch

    if device == "cpu" and threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def create_engine(
    model: str = "tiny",
    *,
    device: str | None = None,
    dtype: str | None = None,
    max_batch_size: int = 32,
    max_model_len: int | None = None,
    served_model_name: str | None = None,
    kv_cache_memory_bytes: int | str | None = None,
) -> Any:
    """Load ``model`` and start an ``Engine`` thread on it (fp32 on CPU, bf16 on a GPU by default);
    ``kv_cache_memory_bytes``: its KV cache's budget (``Engine``; ``4G`` and the like as vLLM reads them)."""
    from agentgym.model import load_causal_lm, load_tokenizer
    from agentgym.server.engine import Engine
    from agentgym.server.kv_cache import parse_bytes

    device = device or default_device()
    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    tokenizer = load_tokenizer(str(model))
    lm = load_causal_lm(str(model), dtype=dtype, device=device)
    engine = Engine(
        lm,
        tokenizer,
        model_name=served_model_name or str(model),
        max_batch_size=max_batch_size,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=None if kv_cache_memory_bytes is None else parse_bytes(kv_cache_memory_bytes),
    )
    return engine.start()


def start_embedded_server(
    model: str = "tiny",
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    in_process: bool = True,
    device: str | None = None,
    dtype: str | None = None,
    max_batch_size: int = 32,
    max_model_len: int | None = None,
    served_model_name: str | None = None,
    timeout: float = 120.0,
    admin_key: str | None = None,
    limits: ServerLimits | None = None,
    kv_cache_memory_bytes: int | str | None = None,
) -> PolicyServerHandle:
    """Start the embedded server on ``model``; ``port=0`` picks a free port (see ``.url``).

    ``in_process=True`` (default): a thread in this process. ``False``: ``agentgym serve`` in a
    child process (its own process group), returned once ``/health`` answers. ``admin_key``
    guards its control routes (default: a new random key; the handle's ``.admin_key``, handed to
    a child process through ``$AGENTGYM_SERVER_ADMIN_KEY``); ``limits``: its ``ServerLimits``;
    ``kv_cache_memory_bytes``: its KV cache's budget (default: ``Engine``'s, from the memory available).
    """
    if in_process:
        engine = create_engine(
            model,
            device=device,
            dtype=dtype,
            max_batch_size=max_batch_size,
            max_model_len=max_model_len,
            served_model_name=served_model_name,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
        )
        try:
            return EmbeddedServerHandle(engine, host=host, port=port, admin_key=admin_key, limits=limits)
        except BaseException:
            engine.stop()
            raise
    if port:
        ensure_port_free(host, port)
    port = port or free_port(host)
    admin_key = admin_key or new_admin_key()
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "serve",
        "--engine",
        "embedded",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        "--max-batch-size",
        str(max_batch_size),
    ]
    if device:
        command += ["--device", device]
    if dtype:
        command += ["--dtype", dtype]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    if kv_cache_memory_bytes is not None:
        command += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    command += limit_flags(limits or ServerLimits())
    from agentgym.client.weights import EmbeddedWeights
    from agentgym.model import resolve_model_path

    handle = SubprocessServerHandle(
        command,
        f"http://{host}:{port}",
        "embedded",
        served_model_name or str(model),
        EmbeddedWeights(model_dir=resolve_model_path(model), admin_key=admin_key),
        env={ADMIN_KEY_ENV: admin_key},
        admin_key=admin_key,
    )
    handle.wait_ready(timeout)
    return handle


def limit_flags(limits: ServerLimits) -> list[str]:
    """``agentgym serve`` flags that give a child server ``limits``."""
    flags = ["--max-body-bytes", str(limits.max_body_bytes), "--max-pause-s", str(limits.max_pause_s)]
    if limits.max_prompt_chars:
        flags += ["--max-prompt-chars", str(limits.max_prompt_chars)]
    if limits.allow_client_chat_template:
        flags.append("--allow-client-chat-template")
    return flags


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_prompt_chars=args.max_prompt_chars,
        allow_client_chat_template=args.allow_client_chat_template,
        max_pause_s=args.max_pause_s,
    )


def start_policy_server(
    engine: str = "embedded", model: str = "tiny", port: int = 0, **kwargs: Any
) -> PolicyServerHandle:
    """One door to every engine: ``embedded`` (kwargs of ``start_embedded_server``), ``vllm`` or
    ``sglang`` (kwargs of ``agentgym.server.launchers.start_engine_server``)."""
    if engine == "embedded":
        return start_embedded_server(model, port, **kwargs)
    from agentgym.server.launchers import start_engine_server

    return start_engine_server(engine, model, port=port, **kwargs)


# ---- agentgym serve --------------------------------------------------------------------------------
def serve_command(args: argparse.Namespace) -> int:
    """``agentgym serve`` (its flags: ``agentgym.stages.serve_command``): run a policy server in the foreground
    until Ctrl-C or SIGTERM (a vLLM or SGLang server goes down with it, its whole process group)."""
    dtype = args.dtype
    if args.engine != "embedded":
        from agentgym.server.launchers import start_engine_server

        print(f"starting {args.engine} on {args.model} (waits for /health) ...", flush=True)
        try:
            handle = start_engine_server(
                args.engine,
                args.model,
                host=args.host,
                port=args.port,
                tensor_parallel_size=args.tensor_parallel_size,
                gpu_memory_utilization=args.gpu_memory_utilization,
                max_model_len=args.max_model_len,
                tool_call_parser=args.tool_call_parser,
                log_path=None,
                served_model_name=args.served_model_name,
                dtype=dtype,
                kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                extra_args=args.engine_arg,
            )
        except (RuntimeError, TimeoutError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        try:
            print(f"{args.engine} server ready at {handle.url} (log: {handle.log_path}); Ctrl-C stops it", flush=True)
            while handle.process.poll() is None:
                time.sleep(1.0)
            print(
                f"{args.engine} server exited with code {handle.process.returncode}; last lines:\n{handle.log_tail()}",
                file=sys.stderr,
            )
            return handle.process.returncode or 1
        finally:
            handle.stop()

    import uvicorn

    from agentgym.server.app import build_app
    from agentgym.server.http_timeouts import timed_protocol

    admin_key = args.admin_key or admin_key_from_env()
    generated = admin_key is None
    admin_key = admin_key or new_admin_key()
    limits = limits_from_args(args)
    print(f"loading {args.model} ...", flush=True)
    threads = set_cpu_threads(args.threads, args.device or default_device())
    engine = create_engine(
        args.model,
        device=args.device,
        dtype=dtype,
        max_batch_size=args.max_batch_size,
        max_model_len=args.max_model_len,
        served_model_name=args.served_model_name,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )
    app = build_app(engine, admin_key=admin_key, limits=limits)
    print(
        f"agentgym embedded server: model {engine.model_name!r} on {engine.device}, "
        f"max_model_len {engine.max_model_len}, max batch {engine.max_batch_size}, "
        f"KV cache budget {engine.kv.budget / 2**30:.2f} GiB ({engine.kv.columns} tokens)"
        f"{f', {threads} torch threads' if engine.device.type == 'cpu' else ''}; "
        f"http://{args.host}:{args.port}/v1",
        flush=True,
    )
    if generated:  # a key the operator gave is never echoed
        print(
            f"admin key (weight updates, pause/resume; set one with --admin-key or ${ADMIN_KEY_ENV}): {admin_key}",
            flush=True,
        )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, http=timed_protocol())
    finally:
        engine.stop()
    return 0
