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
    ``--admin-key`` or ``$AGENTGYM_GATEWAY_ADMIN_KEY``; the server dialect from ``--backend`` or
    ``$AGENTGYM_GATEWAY_BACKEND`` (default ``embedded``). ``--workers N`` (N > 1) serves from N
    processes (``agentgym.gateway.workers``).
    """
    from agentgym.model import load_tokenizer

    admin_key = getattr(args, "admin_key", None) or os.environ.get("AGENTGYM_GATEWAY_ADMIN_KEY") or None
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
    banner = (f"agentgym gateway on {url} -> {', '.join(servers)} ({backend}); "
              f"{f'{workers} worker processes; ' if workers > 1 else ''}"
              f"admin key {'set' if admin_key else 'not set (admin endpoints open)'}; "
              f"create sessions with POST {url}/sessions")
    store = getattr(args, "store", None) or "memory"
    from agentgym.gateway.archive import open_archive

    open_archive(store)  # a bad --store fails here, before anything starts
    banner += f"; finished sessions kept {'in memory' if store == 'memory' else f'in {store}'}"
    options = {"model_name": str(args.model), "admin_key": admin_key,
               "max_model_len": getattr(args, "max_model_len", None), "store": store}
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
