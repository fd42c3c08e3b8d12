"""``agentgym gateway``: serve the gateway from this process, or from ``--workers N`` processes."""

from __future__ import annotations

import argparse
import os

from agentgym.gateway.serve import _run, serve_gateway, tune_gc_for_serving
from agentgym.server.handles import bind_socket


def add_arguments(parser: argparse.ArgumentParser) -> None:
    import inspect

    from agentgym.gateway.gateway import Gateway
    from agentgym.server.http_timeouts import READ_TIMEOUT_S, WRITE_TIMEOUT_S

    default = {name: p.default for name, p in inspect.signature(Gateway).parameters.items()}
    p = parser
    p.add_argument("--server", action="append", metavar="URL", help="policy server URL (repeatable)")
    p.add_argument("--model", default="tiny", help="tokenizer/chat template to render with")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument(
        "--backend",
        choices=["embedded", "vllm", "sglang"],
        default=None,
        help="dialect of the --server URLs (default: embedded, or $AGENTGYM_GATEWAY_BACKEND)",
    )
    p.add_argument(
        "--admin-key",
        default=None,
        help="key required by the admin endpoints "
        "(default: $AGENTGYM_GATEWAY_ADMIN_KEY, else a new one, printed at start)",
    )
    p.add_argument(
        "--max-sessions", type=int, default=default["max_sessions"], help="most sessions open at once (%(default)s)"
    )
    p.add_argument(
        "--max-body-bytes", type=int, default=default["max_body_bytes"], help="largest request body (%(default)s bytes)"
    )
    p.add_argument(
        "--max-task-bytes",
        type=int,
        default=default["max_task_bytes"],
        help="largest session task, as JSON (%(default)s bytes)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=default["idle_timeout"],
        help="seconds a session may go unused before it is finished as failed (%(default)g)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=READ_TIMEOUT_S,
        help="seconds a client has to send a whole request (%(default)g)",
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        default=WRITE_TIMEOUT_S,
        help="seconds a client may leave an answer unread before it is cut off (%(default)g)",
    )
    p.add_argument(
        "--reward-fn",
        action="append",
        metavar="MODULE:FUNCTION",
        help="allow sessions' tasks to name this reward function (repeatable; MODULE:* for a module)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (each owns its sessions; agents talk to their own worker's port)",
    )
    p.add_argument(
        "--store",
        default="memory",
        metavar="memory|sqlite:PATH",
        help="where finished sessions are kept: in memory, or in SQLite (they survive a crash or "
        "restart; with --workers N each worker keeps PATH's name with .w<k>)",
    )
    pool = p.add_argument_group("feeding a DataPool (asynchronous training; agentgym.gateway.pool_feed)")
    pool.add_argument("--data-pool-name", default=None, help="Ray actor name of the DataPool finished sessions go to")
    pool.add_argument("--ray-address", default=None, help="the Ray cluster to join (default: auto)")
    pool.add_argument("--ray-namespace", default="agentgym", help="Ray namespace of the DataPool")
    pool.add_argument("--prompt-length", type=int, default=None, help="tokens before the first sampled token")
    pool.add_argument(
        "--response-length",
        type=int,
        default=None,
        help="tokens after it; with --prompt-length: the context bound (max_model_len)",
    )


def run(args: argparse.Namespace) -> int:
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

    admin_key = args.admin_key or os.environ.get("AGENTGYM_GATEWAY_ADMIN_KEY") or None
    generated = admin_key is None
    admin_key = admin_key or new_admin_key()
    backend = args.backend or os.environ.get("AGENTGYM_GATEWAY_BACKEND", "embedded")
    servers = list(args.server or [])
    workers = args.workers
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
    store = args.store
    from agentgym.gateway.archive import open_archive

    open_archive(store)  # a bad --store fails here, before anything starts
    banner += f"; finished sessions kept {'in memory' if store == 'memory' else f'in {store}'}"
    options = {
        "model_name": str(args.model),
        "admin_key": admin_key,
        "max_model_len": None,
        "store": store,
        **limit_options(args),
    }
    pool_name = args.data_pool_name
    wrap = None
    if pool_name:  # feed a named DataPool (agentgym.gateway.pool_feed)
        from agentgym.gateway.pool_feed import pool_feed

        if workers > 1:
            raise SystemExit("agentgym gateway: --data-pool-name serves from one process; drop --workers")
        prompt, response = args.prompt_length, args.response_length
        if prompt and response:
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


def limit_options(args: argparse.Namespace) -> dict:
    """The gateway limits given on the command line (``--max-sessions`` ...) and ``--reward-fn`` allowances."""
    options: dict = {
        "max_sessions": args.max_sessions,
        "max_body_bytes": args.max_body_bytes,
        "max_task_bytes": args.max_task_bytes,
        "idle_timeout": args.idle_timeout,
        "read_timeout": args.read_timeout,
        "write_timeout": args.write_timeout,
    }
    if args.reward_fn:
        options["allowed_reward_fns"] = list(args.reward_fn)
    return options
