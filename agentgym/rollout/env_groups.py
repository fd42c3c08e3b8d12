"""Several envs in one run (ROLL's env managers): ``env.custom_envs`` maps a tag to an env and its
arguments, ``env.tags`` / ``env.n_groups`` say how many of each step's task groups each tag gets
(``data.train_batch_size`` groups of ``rollout.n`` episodes in all), and ``env.val_tags`` /
``env.val_n_groups`` the same for validation.

    env:
      custom_envs:
        SimpleSokoban: {env: sokoban, kwargs: {dim_room: [6, 6], num_boxes: 1}}
        LargerSokoban: {env: sokoban, kwargs: {dim_room: [8, 8], num_boxes: 2}}
      tags: [SimpleSokoban, LargerSokoban]
      n_groups: [6, 2]            # 8 groups per step = data.train_batch_size

``check_env_groups`` holds a config to that shape at load; ``MultiEnvSource`` (``multi_env_source.py``)
runs it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError


def env_table(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """``env.custom_envs`` as plain ``{tag: {"env": name, "kwargs": {...}}}``."""
    table = OmegaConf.to_container(cfg.env.custom_envs, resolve=True) if cfg.env.custom_envs else {}
    return {str(tag): dict(spec or {}) for tag, spec in (table or {}).items()}


def tag_shares(tags: list[str], n_groups: list[int], total: int, which: str) -> list[int]:
    """Groups per tag: ``n_groups`` as given (it must add up to ``total``), or ``total`` split
    evenly (the first tags get the remainder) when ``n_groups`` is empty, as ROLL does."""
    if not n_groups:
        base, rest = divmod(total, len(tags))
        return [base + (1 if i < rest else 0) for i in range(len(tags))]
    if len(n_groups) != len(tags):
        raise ConfigError(
            f"env.{which}n_groups has {len(n_groups)} entries for {len(tags)} env.{which}tags; give one count per tag"
        )
    if sum(n_groups) != total:
        what = "data.train_batch_size" if not which else "data.val_batch_size"
        raise ConfigError(
            f"env.{which}n_groups adds up to {sum(n_groups)}, but {what}={total} groups run per "
            f"{'step' if not which else 'validation'}; make them equal"
        )
    return [int(n) for n in n_groups]


def check_env_groups(cfg: DictConfig) -> None:
    """Tags name entries of ``env.custom_envs``, each with an ``env``; counts add up."""
    tags = list(cfg.env.tags or [])
    val_tags = list(cfg.env.val_tags or [])
    if not tags and not val_tags:
        if cfg.env.custom_envs:
            raise ConfigError("env.custom_envs is set but env.tags is empty: list the tags to train on")
        return
    table = env_table(cfg)
    for tag in tags + val_tags:
        if tag not in table:
            known = ", ".join(sorted(table)) or "none"
            raise ConfigError(
                f"env tag {tag!r} has no entry in env.custom_envs (known: {known}); add env.custom_envs.{tag}.env=NAME"
            )
        if not table[tag].get("env"):
            raise ConfigError(
                f"env.custom_envs.{tag} names no env: set env.custom_envs.{tag}.env=NAME (see `agentgym envs`)"
            )
    if 0 <= cfg.env.max_traj_per_env < 1:
        raise ConfigError(
            f"env.max_traj_per_env={cfg.env.max_traj_per_env}: every env instance runs at least one "
            "episode per step (-1: as many as needed)"
        )
    if tags:
        tag_shares(tags, list(cfg.env.n_groups or []), cfg.data.train_batch_size, "")
    if val_tags:
        tag_shares(val_tags, list(cfg.env.val_n_groups or []), cfg.data.val_batch_size, "val_")
    elif cfg.env.val_n_groups:
        raise ConfigError("env.val_n_groups is set but env.val_tags is empty")
