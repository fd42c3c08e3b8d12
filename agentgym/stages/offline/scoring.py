"""``agentgym eval data.path=FILE``: veRL's ``main_eval`` (keys of ``configs/evaluation.yaml``).

    agentgym eval data.path=out.parquet                                   # built-in rules by data_source
    agentgym eval data.path=out.parquet custom_reward_function.path=my_reward.py

Each row's responses (``data.response_key``: a list, or one string) are scored with the row's reward:
``compute_score(data_source, response, ground_truth)`` from ``custom_reward_function``, else the
built-in rule for its data source (``data.data_source_key``); ``ground_truth`` is
``row[data.reward_model_key]["ground_truth"]``. A row's score is the mean over its responses; the
command prints the mean per data source as ``test_score/<source>`` (veRL's names), and the whole
result as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

from omegaconf import DictConfig

from agentgym.config import ConfigError
from agentgym.stages.config_command import config_file_of
from agentgym.stages.offline.common import load_offline_config, read_table


def score_rows(cfg: DictConfig, rows: list[dict[str, Any]]) -> dict[str, float]:
    """``{"test_score/<source>": mean score}`` over ``rows``."""
    from agentgym.envs.rewards.by_source import RewardFunction, UnknownDataSource
    from agentgym.progress import progress_bar

    data = cfg.data
    crf = cfg.custom_reward_function
    reward = RewardFunction(crf.path, crf.name)
    try:
        reward.function()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    by_source: dict[str, list[float]] = defaultdict(list)
    for i, row in enumerate(progress_bar(rows, desc="score", unit="row")):
        for key in (data.response_key, data.data_source_key, data.reward_model_key):
            if key not in row:
                raise ConfigError(f"row {i} of {data.path} has no {key!r} column; columns: {', '.join(sorted(row))}")
        responses = row[data.response_key]
        responses = [responses] if isinstance(responses, str) else list(responses)
        truth = row[data.reward_model_key]
        ground_truth = truth.get("ground_truth") if isinstance(truth, dict) else truth
        source = str(row[data.data_source_key])
        try:
            scores = [reward(source, str(r), ground_truth)[0] for r in responses]
        except UnknownDataSource as exc:
            raise ConfigError(
                str(exc).replace("custom_reward_function.path=FILE.py", "custom_reward_function.path=FILE")
            ) from None
        by_source[source].append(sum(scores) / len(scores) if scores else 0.0)
    return {f"test_score/{source}": sum(v) / len(v) for source, v in sorted(by_source.items())}


def offline_eval_command(args: argparse.Namespace) -> int:
    """``agentgym eval`` with dotted overrides and no ``--env``: score a responses file."""
    try:
        cfg, ignored = load_offline_config(
            "evaluation.yaml", list(args.overrides or ()), config_file_of(args, "evaluation")
        )
        for key, reason in sorted(ignored.items()):
            print(f"agentgym eval: warning: {key}: no effect ({reason})", file=sys.stderr)
        if not cfg.data.path:
            raise ConfigError(
                "agentgym eval needs --env NAME (episodes against a policy) or data.path=FILE "
                "(score the responses in a file, as veRL's main_eval)"
            )
        result = score_rows(cfg, read_table(cfg.data.path))
    except ConfigError as exc:
        print(f"agentgym eval: {exc}", file=sys.stderr)
        return 2
    width = max((len(k) for k in result), default=10)
    for key, value in result.items():
        print(f"{key:<{width}}  {value:.4f}")
    print(json.dumps(result), flush=True)
    return 0
