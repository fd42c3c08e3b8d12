"""``agentgym gateway``: serve the gateway from this process, or from ``--workers N`` processes."""

from __future__ import annotations

import argparse
import os

from agentgym.gateway.serve import _run, serve_gateway, tune_gc_for_serving
from agentgym.server.handles import bind_socket


def gateway_command(args: argparse.Namespace) -> int:
    """``agentgym gateway --server URL [--server URL ...] --model M --host H --port P [--workers N]
    [--store memory|sqlite:PATH]``.

    Without ``--server`` an embedded server is started on ``--model``. The admin key comes from
    ``--admin-key`` or ``$AGENTGYM_GATEWAY_ADMIN_KEY``, else a new one is made and printed; the server
    dialect from ``--backend`` or ``$AGENTGYM_GATEWAY_BACKEND`` (default ``embedded``). ``--workers N``
    (N > 1) serves from N processes (``agentgym.gateway.workers``); the limits (``--max-sessions``...)
    apply to each.
    """
    from agentgym.model import load_tokenizer
    from agentgym.server.limits import new_admin_key

    admin_key = getattr(args, "admin_key", None) or os.environ.get("AGENTGYM_GATEWAY_ADMIN_KEY") or None
    generated = admin_key is None
    admin_key = admin_key or new_admin_key()
    backend = getattr(args, "backend", None) or os.environ.get("AGENTGYM_GATEWAY_BACKEND", "embedded")
    servers = list(args.server or [])
    workers = int(getattr(args, "workers", 1) or 1)
    embedded = None
    if not servers:
        from agentgym.server.launch import start_embedded_server

        print(f"no --server given: starting an embedded server on {args.model} ...", flush=True)
        embedded = start_embedded_server(args.model)
        servers, backend = [embedded.url], "embedded"
    sock = bind_socket(args.host, args.port)
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    banner = (
        f"agentgym gateway on {url} -> {', '.join(servers)} ({backend}); "
        f"{f'{workers} worker processes; ' if workers > 1 else ''}"
        f"admin key {admin_key if generated else 'as given'}; "
        f"create sessions with POST {url}/sessions (Authorization: Bearer <admin key>)"
    )
    store = getattr(args, "store", None) or "memory"
    from agentgym.gateway.archive import open_archive

    open_archive(store)  # a bad --store fails here, before anything starts
    banner += f"; finished sessions kept {'in memory' if store == 'memory' else f'in {store}'}"
    options = {
        "model_name": str(args.model),
        "admin_key": admin_key,
        "max_model_len": getattr(args, "max_model_len", None),
        "store": store,
        **limit_options(args),
    }
    pool_name = getattr(args, "data_pool_name", None)
    wrap = None
    if pool_name:  # feed a named DataPool (agentgym.gateway.pool_feed)
        from agentgym.gateway.pool_feed import pool_feed

        if workers > 1:
            raise SystemExit("agentgym gateway: --data-pool-name serves from one process; drop --workers")
        prompt, response = getattr(args, "prompt_length", None), getattr(args, "response_length", None)
        if options["max_model_len"] is None and prompt and response:
            options["max_model_len"] = int(prompt) + int(response)
        wrap = pool_feed(pool_name, args.ray_namespace, args.ray_address)
        banner += f"; finished sessions go to DataPool {pool_name!r} (Ray namespace {args.ray_namespace!r})"
    try:
        if workers > 1:
            from agentgym.gateway.workers import serve_workers

            return serve_workers(sock, workers, servers, backend, str(args.model), banner, options)
        tokenizer = load_tokenizer(str(args.model))
        tune_gc_for_serving()
        _run(serve_gateway([sock], servers, backend, tokenizer, banner, wrap=wrap, **options))
    finally:
        sock.close()
        if embedded is not None:
            embedded.stop()
    return 0


LIMIT_FLAGS = {
    "max_sessions": int,
    "max_body_bytes": int,
    "max_task_bytes": int,
    "idle_timeout": float,
    "read_timeout": float,
    "write_timeout": float,
}


def limit_options(args: argparse.Namespace) -> dict:
    """The gateway limits given on the command line (``--max-sessions`` ...) and ``--reward-fn`` allowances."""
    options = {k: cast(getattr(args, k)) for k, cast in LIMIT_FLAGS.items() if getattr(args, k, None) is not None}
    if getattr(args, "reward_fn", None):
        options["allowed_reward_fns"] = list(args.reward_fn)
    return options
