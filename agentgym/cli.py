"""The ``agentgym`` command line.

Each subcommand parses its arguments here and hands them to the part that owns the work,
imported lazily so ``agentgym envs`` stays fast and never loads torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

RUN_HELP = {
    "eval": "With --run DIR it scores a finished run's model as the run's held-out table did: the run's env with "
    "env.kwargs + env.val_kwargs, its turn and token limits, prompt/response lengths, chat-template "
    "variables, validation sampling (greedy), seeds from env.val_seed_start and held_out.num_tasks tasks; "
    "it prints each setting and where it came from, and any flag given wins.",
    "rollout": "With --run DIR it rolls out a finished run's model with the run's training settings: env.kwargs, "
    "turn and token limits, lengths, chat-template variables, actor_rollout_ref.rollout sampling; "
    "it prints each setting and where it came from, and any flag given wins.",
}
ENV_ARG_HELP = (
    "env constructor argument (repeatable); VALUE is YAML: 20, [6,6], false, null (None: the env's "
    "default); KEY= with nothing after '=' is the empty string (agentgym/envs/env_args.py)"
)


def _cmd_envs(args: argparse.Namespace) -> int:
    from agentgym.envs.base import has_expert
    from agentgym.registry import ENVS, env_family, env_spec, registered

    if args.family:  # `agentgym envs rg/`: the members of one family (imports its package)
        family = env_family(args.family)
        if family.installed_version() is None:
            print(f"error: {family.summary()}", file=sys.stderr)
            return 2
        names = [f"{family.prefix}/{m}" for m in family.members()]
    else:
        names = registered("env")
    rows = []
    for name in names:
        try:
            if name.endswith("/*"):  # a family: one row, its package not imported
                family = env_family(name)
                rows.append((f"{family.prefix}/<{family.member_label}>", ENVS.package(name), "?", family.summary()))
                continue
            spec = env_spec(name)
            expert = {True: "yes", False: "no", None: "?"}[has_expert(spec.load())]
            rows.append((name, spec.package, expert, spec.description))
        except Exception as exc:  # a broken plugin must not hide the others
            rows.append((name, "?", "?", f"failed to load: {exc}"))
    width = max((len(r[0]) for r in rows), default=4)
    pwidth = max((len(r[1]) for r in rows), default=7)
    print(f"{'name':<{width}}  {'package':<{pwidth}}  expert  description")
    for name, package, expert, description in rows:
        print(f"{name:<{width}}  {package:<{pwidth}}  {expert:<6}  {description}")
    if args.all:
        for kind in ("interaction", "tool"):
            print(f"\n{kind}s: {', '.join(registered(kind)) or '(none)'}")
    return 0


def _cmd_play(args: argparse.Namespace) -> int:
    from agentgym.envs.play import play
    from agentgym.rollout.commands import parse_env_args

    return play(args.env, seed=args.seed, env_kwargs=parse_env_args(args.env_arg))


def _cmd_demos(args: argparse.Namespace) -> int:
    from agentgym.envs.demos import demos_command

    return demos_command(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentgym.server.launch import serve_command
    from agentgym.stages.from_run import RunError, settle_serve_args

    try:
        settle_serve_args(args)  # --run: the run's model and context length
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return serve_command(args)


def _cmd_rollout(args: argparse.Namespace) -> int:
    return _against_servers(args, "rollout")


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.env is None and not args.run:  # veRL's main_eval: score a file of responses
        from agentgym.stages.offline.scoring import offline_eval_command

        return offline_eval_command(args)
    if args.overrides:
        print(
            "agentgym eval: key=value overrides score a file (data.path=FILE); with --env use the options "
            f"(--tasks, -n, ...), got {' '.join(args.overrides)}",
            file=sys.stderr,
        )
        return 2
    after = None
    if args.judge_url:
        from agentgym.rewards.judge import eval_judge

        after = eval_judge(
            args.judge_url, args.judge_mode, args.judge_model, args.judge_api_key_env, args.judge_template
        )
    return _against_servers(args, "eval", after)


def _cmd_generate(args: argparse.Namespace) -> int:
    from agentgym.stages.offline.generate import generate_command

    return generate_command(args)


def _against_servers(args: argparse.Namespace, mode: str, after: Any = None) -> int:
    """``rollout``/``eval``: against ``--server`` URLs, or an embedded server started here on ``--model``."""
    from agentgym.rollout.commands import check_env, run_command
    from agentgym.stages.from_run import RunError, settle_rollout_args

    try:
        settle_rollout_args(args, mode)  # --run: the run's settings under the flags given
    except (RunError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.server:
        return run_command(args, mode, list(args.server), args.backend, after)
    error = check_env(args.env)  # before the server start, which takes seconds
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import time

    from agentgym.server.launch import start_embedded_server

    print(f"starting an embedded policy server on {args.model} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    # --run: batches as wide as the held-out scoring's (its server batches rollout.concurrency episodes)
    server = start_embedded_server(
        model=args.model,
        port=0,
        max_batch_size=args.concurrency if args.run else 32,
        max_model_len=getattr(args, "max_model_len", None),
        device=args.device,
    )
    print(f"server ready at {server.url} ({time.perf_counter() - started:.1f}s)", file=sys.stderr)
    try:
        return run_command(args, mode, [server.url], "embedded", after)
    finally:
        server.stop()


def _cmd_train(args: argparse.Namespace) -> int:
    from agentgym.stages.train_command import train_command

    return train_command(args)


def _cmd_config(args: argparse.Namespace) -> int:
    from agentgym.stages.config_command import config_command

    return config_command(args)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from agentgym.gateway.command import gateway_command

    return gateway_command(args)


def _cmd_sft(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from agentgym.stages.sft import sft_command

    return sft_command(args)


def _cmd_plot(args: argparse.Namespace) -> int:
    from agentgym.plots import plot_command

    return plot_command(args)


def _cmd_compare(args: argparse.Namespace) -> int:
    from agentgym.stages.compare import compare_command

    return compare_command(args)


def _cmd_view(args: argparse.Namespace) -> int:
    from agentgym.rollout.viewer import view_command

    return view_command(args)


def _cmd_env_serve(args: argparse.Namespace) -> int:
    from agentgym.envs.adapters.openenv_server import env_serve_command

    return env_serve_command(args)


def _hydra_arguments(p: argparse.ArgumentParser, name_help: str) -> None:
    """Hydra's ``--config-path DIR --config-name NAME`` (also ``=`` forms, and ROLL's ``--config_path``)."""
    p.add_argument(
        "--config-path",
        "--config_path",
        "-cp",
        dest="config_path",
        default=None,
        metavar="DIR",
        help="Hydra's config directory (relative to the working directory)",
    )
    p.add_argument(
        "--config-name", "--config_name", "-cn", dest="config_name", default=None, metavar="NAME", help=name_help
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgym", description="Environment-first agentic RL gym.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("envs", help="list registered environments, the package of each and whether it has an expert")
    p.add_argument("--all", action="store_true", help="also list interactions and tools")
    p.add_argument(
        "family", nargs="?", metavar="PREFIX/", help="list the members of one family of envs (e.g. rg/, ta/, vf/)"
    )
    p.set_defaults(func=_cmd_envs)

    p = sub.add_parser("play", help="play a text env in the terminal")
    p.add_argument("--env", required=True, help="registered env name (see `agentgym envs`)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=ENV_ARG_HELP)
    p.set_defaults(func=_cmd_play)

    p = sub.add_parser("demos", help="write expert demonstrations (chat JSONL) of an env that has an expert")
    p.add_argument("--env", required=True, help="registered env with an expert (see `agentgym envs`)")
    p.add_argument("--n", type=int, required=True, help="episodes to play (tasks seed .. seed+n-1)")
    p.add_argument("-o", "--out", required=True, help="output JSONL file")
    p.add_argument("--seed", type=int, default=0, help="first seed (keep held-out seeds out of the range)")
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=ENV_ARG_HELP)
    p.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="turns per episode: the same limit the policy is trained and evaluated with",
    )
    p.add_argument("--keep-failures", action="store_true", help="also write episodes the expert did not solve")
    p.set_defaults(func=_cmd_demos)

    p = sub.add_parser("serve", help="run a policy server (embedded, vllm or sglang)")
    p.add_argument(
        "--model",
        default=None,
        help="'tiny' (default), an HF model directory (a LoRA run's adapter "
        "directory too: embedded merges it into its base) or a hub name",
    )
    p.add_argument(
        "--run",
        default=None,
        metavar="DIR",
        help="serve a finished run's final model (or the checkpoint DIR names) with its context length "
        "(data.max_prompt_length + data.max_response_length); flags given win",
    )
    p.add_argument("--engine", choices=["embedded", "vllm", "sglang"], default="embedded")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tool-call-parser", default="hermes")
    p.add_argument("--max-batch-size", type=int, default=32, help="embedded: most sequences decoded together")
    p.add_argument("--device", default=None, help="embedded: cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="weights and compute dtype (default: vllm/sglang the model's own; embedded float32 on CPU, "
        "bfloat16 on a GPU)",
    )
    p.add_argument(
        "--served-model-name", default=None, help="the name the OpenAI API answers to, as in vLLM (default: --model)"
    )
    p.add_argument(
        "--admin-key",
        default=None,
        help="embedded: key for the weight/pause routes "
        "(default: $AGENTGYM_SERVER_ADMIN_KEY, else a new one, printed at start)",
    )
    p.add_argument("--max-body-bytes", type=int, default=None, help="embedded: largest request body (16 MiB)")
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        help="embedded: longest prompt text (default: 32 characters per token of the context)",
    )
    p.add_argument(
        "--allow-client-chat-template",
        action="store_true",
        help="embedded: accept a Jinja template in chat_template_kwargs.chat_template (off)",
    )
    p.add_argument(
        "--max-pause-s", type=float, default=None, help="embedded: a pause nobody resumes ends after this long (300 s)"
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="vllm/sglang: one more argument for the engine's own command line (repeatable; "
        "write --engine-arg=--enforce-eager)",
    )
    p.set_defaults(func=_cmd_serve)

    for name, func, helptext in (
        ("rollout", _cmd_rollout, "run episodes against a policy and save token-exact trajectories"),
        ("eval", _cmd_eval, "evaluate a policy on an env: success rate, pass@k, per-source breakdown"),
    ):
        defaults = {"n": 1, "temperature": 0.0} if name == "eval" else {"n": 8, "temperature": 1.0}  # FLAG_DEFAULTS
        p = sub.add_parser(name, help=helptext, description=helptext + ". " + RUN_HELP[name])
        p.add_argument(
            "--env",
            required=False,
            help="registered env name"
            + ("; without it (and --run), eval scores a file: data.path=FILE" if name == "eval" else ""),
        )
        p.add_argument(
            "--run",
            default=None,
            metavar="DIR",
            help="take the settings from a finished run (a run directory, or a checkpoint or model "
            "directory inside it): its model, env and env kwargs, limits, lengths, sampling"
            + (", held-out seeds and tasks" if name == "eval" else "")
            + "; flags given win",
        )
        p.add_argument(
            "--model",
            default=None,
            help="'tiny' (default), an HF model directory (a LoRA run's adapter directory too) or a hub name",
        )
        p.add_argument(
            "--server",
            action="append",
            metavar="URL",
            help="policy server base URL (repeatable); default: start an embedded server",
        )
        p.add_argument("-n", "--n", type=int, default=None, help=f"episodes per task ({defaults['n']})")
        p.add_argument("--tasks", type=int, default=None, help="number of tasks (seeds or dataset rows)")
        p.add_argument("--seed", type=int, default=None, help="first seed (0)")
        p.add_argument("--concurrency", type=int, default=None, help="episodes in flight (64)")
        p.add_argument("--max-turns", type=int, default=None, help="most model turns (the env's own)")
        p.add_argument("--max-tokens", type=int, default=None, help="max new tokens per turn (256)")
        p.add_argument("--temperature", type=float, default=None, help=f"({defaults['temperature']:g})")
        p.add_argument("--top-p", type=float, default=None, help="(1.0)")
        p.add_argument("--top-k", type=int, default=None, help="(-1: off)")
        p.add_argument(
            "--sampling-seed",
            type=int,
            default=None,
            help="seed every request from (this, task seed, sample, turn): reproducible sampling (off)",
        )
        p.add_argument(
            "--prompt-length",
            type=int,
            default=None,
            help="most tokens in the first prompt (data.max_prompt_length; 4096)",
        )
        p.add_argument(
            "--response-length",
            type=int,
            default=None,
            help="most tokens after it, all turns (data.max_response_length; 4096)",
        )
        p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=ENV_ARG_HELP)
        p.add_argument(
            "--device", default=None, help="the embedded server's device: cpu or cuda (default: cuda if available)"
        )
        p.add_argument("--out", default=None, help="trajectory file (.jsonl or .parquet)")
        p.add_argument(
            "--backend", choices=["embedded", "vllm", "sglang"], default="embedded", help="the API of the --server URLs"
        )
        p.add_argument(
            "--env-executor",
            choices=["thread", "process", "inline", "openenv", "workers", "ray"],
            default=None,
            help="where env steps run (thread; inline: on the event loop, for cheap envs; "
            "workers/ray: whole episodes in worker processes / Ray actors)",
        )
        p.add_argument("--env-workers", type=int, default=None, help="processes / actors for the executor")
        p.add_argument("--env-url", action="append", metavar="URL", help="--env-executor openenv: an env server")
        if name == "eval":
            p.add_argument(
                "--judge-url",
                default=None,
                metavar="URL",
                help="also score every episode with an LLM judge at this OpenAI-compatible URL "
                "(agentgym serve, vLLM, a hosted API): docs/rewards.md",
            )
            p.add_argument("--judge-mode", choices=["pointwise", "group"], default="pointwise")
            p.add_argument("--judge-model", default=None, help="the judge's model name (default: the endpoint's first)")
            p.add_argument("--judge-api-key-env", default=None, metavar="VAR", help="environment variable with its key")
            p.add_argument("--judge-template", default=None, metavar="FILE", help="a prompt template of your own")
            p.add_argument(
                "--config",
                "--config-file",
                default=None,
                help="scoring a file: a YAML config (default: configs/evaluation.yaml)",
            )
            _hydra_arguments(p, "scoring a file: with --config-path, the file DIR/NAME.yaml (Hydra's form)")
            p.add_argument(
                "overrides",
                nargs="*",
                metavar="KEY=VALUE",
                help="score a file of responses, veRL's main_eval keys (configs/evaluation.yaml): "
                "data.path=FILE [data.response_key=...] [custom_reward_function.path=...]",
            )
        p.set_defaults(func=func)

    p = sub.add_parser("generate", help="sample responses for a file of prompts (veRL's main_generation)")
    p.add_argument("--config", "--config-file", default=None, help="a YAML config (default: configs/generation.yaml)")
    _hydra_arguments(p, "with --config-path: the file DIR/NAME.yaml (Hydra's form)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="configs/generation.yaml keys: data.path=FILE data.output_path=OUT data.n_samples=N ...",
    )
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("train", help="train a policy with PPO/GRPO on an env or an agent program")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--env", help="registered env name; picks configs/env/<name>.yaml when present")
    target.add_argument("--agent", metavar="MODULE:FUNCTION", help="train an OpenAI-client agent through the gateway")
    p.add_argument(
        "--config",
        "--config-file",
        default=None,
        help="a YAML config to start from (default: configs/train.yaml); a ROLL, ChatLearn, Claw-R1 or "
        "Hydra-composed veRL file is translated first (as `agentgym config --from`)",
    )
    _hydra_arguments(
        p,
        "a named config beside configs/train.yaml (e.g. async_ppo_trainer); with --config-path, "
        "the file DIR/NAME.yaml (Hydra's form)",
    )
    p.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="asynchronous training: rollout and training overlap (--config-name async_ppo_trainer)",
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, veRL names")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "config",
        help="translate a veRL, ROLL, ChatLearn or Claw-R1 config into agentgym's; --show: print ours, with origins",
    )
    p.add_argument("--from", dest="from_system", default=None, choices=["verl", "roll", "chatlearn", "claw-r1"])
    p.add_argument("--show", action="store_true", help="print the composed training config with each value's origin")
    p.add_argument("--env", default=None, help="--show: the env preset to compose (as agentgym train --env)")
    p.add_argument("file", nargs="?", default=None, help="their YAML config (or --config-path DIR --config-name NAME)")
    _hydra_arguments(p, "with --config-path: their file DIR/NAME.yaml (Hydra's form)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="their keys, applied to the file first")
    p.add_argument("-o", "--output", default=None, help="write the agentgym config here (default: stdout)")
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("gateway", help="serve the OpenAI API for black-box agents and record trajectories")
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
    p.add_argument("--max-sessions", type=int, default=None, help="most sessions open at once (8192)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="largest request body (16 MiB)")
    p.add_argument("--max-task-bytes", type=int, default=None, help="largest session task, as JSON (1 MiB)")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="seconds a session may go unused before it is finished as failed (3600)",
    )
    p.add_argument("--read-timeout", type=float, default=None, help="seconds a client has to send a whole request (30)")
    p.add_argument(
        "--write-timeout",
        type=float,
        default=None,
        help="seconds a client may leave an answer unread before it is cut off (60)",
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
    p.set_defaults(func=_cmd_gateway)

    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning on demos or chat data (veRL sft_trainer keys), in the format RL continues from",
    )
    p.add_argument(
        "--config", "--config-file", default=None, help="a YAML config to start from (default: configs/sft.yaml)"
    )
    _hydra_arguments(p, "with --config-path: the file DIR/NAME.yaml (Hydra's form); sft_trainer: configs/sft.yaml")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted config overrides (veRL's sft_trainer keys), e.g. data.train_files=demos.jsonl "
        "model.partial_pretrain=tiny",
    )
    p.set_defaults(func=_cmd_sft)

    p = sub.add_parser("plot", help="draw a run's training curves (reward, success, length, KL, ...) as a PNG")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holding metrics.jsonl) or a metrics file")
    p.add_argument(
        "-m",
        "--metric",
        action="append",
        metavar="METRIC",
        help="a metric to plot (repeatable; its val/ twin is drawn too); default: the usual panels",
    )
    p.add_argument("-o", "--output", default=None, help="PNG to write (default: RUN_DIR/curves.png)")
    p.set_defaults(func=_cmd_plot)

    p = sub.add_parser(
        "compare",
        help="runs of different seeds or settings side by side: a table of their held-out "
        "success (± SE; paired SE where the held-out tasks match) and one PNG of "
        "their curves",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (holding held_out.json, metrics.jsonl)")
    p.add_argument(
        "-m",
        "--metric",
        action="append",
        metavar="METRIC",
        help="a metric to plot (repeatable; its val/ twin is drawn too); default: the usual panels",
    )
    p.add_argument("-o", "--output", default="compare.png", help="PNG to write (default: compare.png)")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("view", help="a self-contained HTML page to browse trajectories, token by token")
    p.add_argument(
        "path",
        metavar="TRAJECTORIES",
        help=".jsonl/.parquet trajectories (agentgym rollout --out, a run's samples.jsonl)",
    )
    p.add_argument("-o", "--output", default=None, help="HTML file to write (default: beside the input)")
    p.add_argument("--model", default="tiny", help="the tokenizer that made the token ids (default: tiny)")
    p.add_argument("--limit", type=int, default=2000, help="at most this many episodes (default 2000)")
    p.set_defaults(func=_cmd_view)

    p = sub.add_parser("env-serve", help="serve a registered env over OpenEnv's HTTP/WebSocket API")
    p.add_argument("--env", required=True, help="registered env name (see `agentgym envs`)")
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help=ENV_ARG_HELP)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    p.add_argument("--max-sessions", type=int, default=1024, help="most env instances alive at once")
    p.set_defaults(func=_cmd_env_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # KEY=VALUE items after an option (`config --from X FILE -o OUT key=value`): still overrides
        if hasattr(args, "overrides") and not any(e.startswith("-") for e in extra):
            args.overrides = list(args.overrides or ()) + extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
