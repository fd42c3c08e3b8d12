"""The ``agentgym`` command line: a table of subcommands.

Each command's module declares its own arguments (``add_arguments(parser)``) beside the code that runs it
(``run(args)``); the module is imported only when its command is the one run (or its help is asked for), so
``agentgym envs`` stays fast and never loads torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (module with add_arguments(parser) and run(args), the one-line help `agentgym --help` lists)
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": (
        "agentgym.envs.listing",
        "list registered environments, the package of each and whether it has an expert",
    ),
    "play": ("agentgym.envs.play", "play a text env in the terminal"),
    "demos": ("agentgym.envs.demos", "write expert demonstrations (chat JSONL) of an env that has an expert"),
    "serve": ("agentgym.stages.serve_command", "run a policy server (embedded, vllm or sglang)"),
    "rollout": (
        "agentgym.stages.rollout_command",
        "run episodes against a policy and save token-exact trajectories",
    ),
    "eval": (
        "agentgym.stages.eval_command",
        "evaluate a policy on an env: success rate, pass@k, per-source breakdown",
    ),
    "generate": ("agentgym.stages.offline.generate", "sample responses for a file of prompts (veRL's main_generation)"),
    "train": ("agentgym.stages.train_command", "train a policy with PPO/GRPO on an env or an agent program"),
    "config": (
        "agentgym.stages.config_command",
        "translate a veRL, ROLL, ChatLearn or Claw-R1 config into agentgym's; --show: print ours, with origins",
    ),
    "gateway": (
        "agentgym.gateway.command",
        "serve the OpenAI API for black-box agents and record trajectories",
    ),
    "sft": (
        "agentgym.stages.sft",
        "supervised fine-tuning on demos or chat data (veRL sft_trainer keys), in the format RL continues from",
    ),
    "plot": ("agentgym.plots", "draw a run's training curves (reward, success, length, KL, ...) as a PNG"),
    "compare": (
        "agentgym.stages.compare",
        "runs of different seeds or settings side by side: a table of their held-out success (± SE; paired SE "
        "where the held-out tasks match) and one PNG of their curves",
    ),
    "view": ("agentgym.rollout.viewer", "a self-contained HTML page to browse trajectories, token by token"),
    "env-serve": ("agentgym.envs.adapters.openenv_server", "serve a registered env over OpenEnv's HTTP/WebSocket API"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the arguments of that one command (the others listed by name)."""
    parser = argparse.ArgumentParser(prog="agentgym", description="Environment-first agentic RL gym.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, helptext) in COMMANDS.items():
        p = sub.add_parser(name, help=helptext, description=helptext)
        if only is None or name == only:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)  # `agentgym` itself takes no options but -h
    parser = build_parser(command if command in COMMANDS else "")
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
