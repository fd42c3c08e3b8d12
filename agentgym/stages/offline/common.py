"""What the offline commands share: composing their veRL-shaped configs, reading and writing rows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agentgym.compat.rules import Rule, apply_rules
from agentgym.config import ConfigError, compose

OFFLINE_RULES = [
    Rule("*._target_", "ignore", "Hydra's instantiation target"),
    Rule("trainer.*", "ignore", "the command uses one policy server (rollout.server_urls for more)"),
    Rule("actor.*", "ignore", "generation trains nothing"),
    Rule("ray_kwargs.*", "ignore", "the offline commands do not use Ray"),
    Rule("model.external_lib", "ignore", "agentgym imports no model library", (None,)),
    Rule("model.trust_remote_code", "ignore", "models are loaded with transformers' own classes"),
    Rule("rollout.mode", "ignore", "requests are always asynchronous"),
    Rule("rollout.n", "ignore", "set data.n_samples (responses per prompt)", (1,)),
    Rule("rollout.ignore_eos", "ignore", "generation always stops at EOS", (False,)),
    Rule("rollout.log_prob_micro_batch_size*", "ignore", "generation computes no log-probs"),
    Rule("rollout.calculate_log_probs", "ignore", "the servers always report logprobs"),
    Rule("rollout.max_model_len", "ignore", "prompt_length + response_length"),
    Rule("rollout.disable_log_stats", "ignore", "a GPU performance setting"),
    Rule("rollout.data_parallel_size", "ignore", "one server (rollout.server_urls for more)", (1,)),
    Rule("data.use_shm", "ignore", "a GPU performance setting"),
    Rule("data.trust_remote_code", "ignore", "models are loaded with transformers' own classes"),
]


def offline_policy(key: str, value: Any) -> tuple[str, str] | None:
    if key.startswith("ray_kwargs.ray_init."):
        return ("ignore", "the offline commands do not use Ray")
    return apply_rules(OFFLINE_RULES, key, value)


def load_offline_config(
    base_file: str, overrides: Sequence[str], config_file: str | None = None
) -> tuple[DictConfig, dict[str, str]]:
    """``configs/<base_file>`` (a structured ``GenerationConfig`` / ``EvaluationConfig``), ``config_file`` and
    dotted overrides (veRL keys it lacks: ignored with a reason or refused)."""
    composition = compose(config_file=config_file, overrides=overrides, base_file=base_file, key_policy=offline_policy)
    return composition.cfg, composition.ignored


def read_table(path: str) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` / ``.jsonl`` / ``.json`` file (a clear error when it is missing)."""
    from agentgym.envs.data import DataError, read_rows

    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"data.path={path} is not a file; pass data.path=ROWS.parquet (or .jsonl)")
    try:
        return read_rows(file)
    except DataError as exc:
        raise ConfigError(str(exc)) from None


def write_table(rows: list[dict[str, Any]], path: str) -> Path:
    """``rows`` to ``path``: Parquet for ``.parquet``, else JSON lines."""
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), target)
    else:
        with open(target, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return target
