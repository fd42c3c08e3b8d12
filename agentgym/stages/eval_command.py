"""``agentgym eval``: score a policy on an env (success rate, pass@k, per-source breakdown), or, without
``--env`` and ``--run``, a file of responses as veRL's main_eval does (``agentgym.stages.offline.scoring``)."""

from __future__ import annotations

import argparse
import sys

from agentgym.stages.rollout_command import against_servers, episode_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgym.stages.config_command import hydra_arguments

    episode_arguments(parser, "eval")
    p = parser
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
    hydra_arguments(p, "scoring a file: with --config-path, the file DIR/NAME.yaml (Hydra's form)")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="score a file of responses, veRL's main_eval keys (configs/evaluation.yaml): "
        "data.path=FILE [data.response_key=...] [custom_reward_function.path=...]",
    )


def run(args: argparse.Namespace) -> int:
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
    return against_servers(args, "eval", after)
