"""The ``agentgym`` command line.

Each subcommand parses its arguments here and hands them to the part that owns the work,
imported lazily so ``agentgym envs`` stays fast and never loads torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _cmd_envs(args: argparse.Namespace) -> int:
    from agentgym.envs.base import has_expert
    from agentgym.registry import env_spec, registered

    names = registered("env")
    rows = []
    for name in names:
        try:
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

    return play(args.env, seed=args.seed, env_kwargs=_parse_kv(args.env_arg))


def _cmd_demos(args: argparse.Namespace) -> int:
    from agentgym.envs.demos import demos_command

    return demos_command(args)


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentgym.server.launch import serve_command

    return serve_command(args)


def _cmd_rollout(args: argparse.Namespace) -> int:
    from agentgym.rollout.commands import rollout_command

    return rollout_command(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentgym.rollout.commands import eval_command

    return eval_command(args)


def _cmd_train(args: argparse.Namespace) -> int:
    from agentgym.trainer.main import train_command

    return train_command(args)


def _cmd_gateway(args: argparse.Namespace) -> int:
    from agentgym.server.gateway import gateway_command

    return gateway_command(args)


def _parse_kv(pairs: Sequence[str] | None) -> dict[str, object]:
    """``["dim_room=[8,8]", "num_boxes=2"]`` -> kwargs, values parsed as YAML scalars/lists."""
    import yaml

    out: dict[str, object] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env-arg expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgym", description="Environment-first agentic RL gym.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("envs", help="list registered environments, the package of each and whether it has an expert")
    p.add_argument("--all", action="store_true", help="also list interactions and tools")
    p.set_defaults(func=_cmd_envs)

    p = sub.add_parser("play", help="play a text env in the terminal")
    p.add_argument("--env", required=True, help="registered env name (see `agentgym envs`)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.set_defaults(func=_cmd_play)

    p = sub.add_parser("demos", help="write expert demonstrations (chat JSONL) of an env that has an expert")
    p.add_argument("--env", required=True, help="registered env with an expert (see `agentgym envs`)")
    p.add_argument("--n", type=int, required=True, help="episodes to play (tasks seed .. seed+n-1)")
    p.add_argument("-o", "--out", required=True, help="output JSONL file")
    p.add_argument("--seed", type=int, default=0, help="first seed (keep held-out seeds out of the range)")
    p.add_argument("--env-arg", action="append", metavar="KEY=VALUE", help="env constructor argument")
    p.add_argument("--max-turns", type=int, default=None,
                   help="turns per episode: the same limit the policy is trained and evaluated with")
    p.add_argument("--keep-failures", action="store_true", help="also write episodes the expert did not solve")
    p.set_defaults(func=_cmd_demos)

    p = sub.add_parser("serve", help="run a policy server (embedded, vllm or sglang)")
    p.add_argument("--model", default="tiny", help="'tiny', an HF model directory or a hub name")
    p.add_argument("--engine", choices=["embedded", "vllm", "sglang"], default="embedded")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tool-call-parser", default="hermes")
    p.add_argument("--max-batch-size", type=int, default=32, help="embedded: most sequences decoded together")
    p.add_argument("--device", default=None, help="embedded: cpu or cuda (default: cuda if available)")
    p.add_argument("--served-model-name", default=None,
                   help="the name the OpenAI API answers to, as in vLLM (default: --model)")
    p.set_defaults(func=_cmd_serve)

    for name, func, helptext in (
        ("rollout", _cmd_rollout, "run episodes against a policy and save token-exact trajectories"),
        ("eval", _cmd_eval, "evaluate a policy on an env: success rate, pass@k, per-source breakdown"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--env", required=True)
        p.add_argument("--model", default="tiny")
        p.add_argument("--server", action="append", metavar="URL",
                       help="policy server base URL (repeatable); default: start an embedded server")
        p.add_argument("-n", "--n", type=int, default=1 if name == "eval" else 8, help="episodes per task")
        p.add_argument("--tasks", type=int, default=None, help="number of tasks (seeds or dataset rows)")
        p.add_argument("--seed", type=int, default=0, help="first seed")
        p.add_argument("--concurrency", type=int, default=64)
        p.add_argument("--max-turns", type=int, default=None)
        p.add_argument("--max-tokens", type=int, default=256, help="max new tokens per turn")
        p.add_argument("--temperature", type=float, default=1.0 if name == "rollout" else 0.0)
        p.add_argument("--env-arg", action="append", metavar="KEY=VALUE")
        p.add_argument("--out", default=None, help="trajectory file (.jsonl or .parquet)")
        p.add_argument("--backend", choices=["embedded", "vllm", "sglang"], default="embedded",
                       help="the API of the --server URLs")
        p.add_argument("--env-executor", choices=["thread", "process", "inline"], default="thread",
                       help="where env steps run (inline: on the event loop, for cheap envs)")
        p.set_defaults(func=func)

    p = sub.add_parser("train", help="train a policy with PPO/GRPO on an env or an agent program")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--env", help="registered env name; picks configs/env/<name>.yaml when present")
    target.add_argument("--agent", metavar="MODULE:FUNCTION",
                        help="train an OpenAI-client agent through the gateway")
    p.add_argument("--config", default=None, help="a YAML config to start from (default: configs/train.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, veRL names")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("gateway", help="serve the OpenAI API for black-box agents and record trajectories")
    p.add_argument("--server", action="append", metavar="URL", help="policy server URL (repeatable)")
    p.add_argument("--model", default="tiny", help="tokenizer/chat template to render with")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--backend", choices=["embedded", "vllm", "sglang"], default=None,
                   help="dialect of the --server URLs (default: embedded, or $AGENTGYM_GATEWAY_BACKEND)")
    p.add_argument("--admin-key", default=None,
                   help="key required by the admin endpoints (default: $AGENTGYM_GATEWAY_ADMIN_KEY; none: open)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes (each owns its sessions; agents talk to their own worker's port)")
    p.set_defaults(func=_cmd_gateway)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
