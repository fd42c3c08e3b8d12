"""The warm start: expert demonstrations, then supervised fine-tuning, then RL from the result.

RL from random weights learns nothing on a multi-turn env like Sokoban; every peer starts RL
from a pretrained model, and the tiny model starts from demonstrations instead:

    warm_start:
      enable: true            # the sokoban preset turns it on
      demos: 10000            # expert episodes (agentgym demos), seeds demo_seed_start ..
      demo_seed_start: 2000000
      sft: {...}              # configs/sft.yaml keys (optim.lr, trainer.total_training_steps, ...)

Each stage writes under ``<trainer.default_local_dir>/warm_start/`` and is skipped when its
output is there from the same settings (``stage.json`` beside it): run the same command again
and only RL resumes. The SFT model becomes ``actor_rollout_ref.model.path``; the model the
config named is where SFT starts. To start RL from any model as it is: ``warm_start.enable=false
actor_rollout_ref.model.path=DIR``. To reuse demos of your own: ``warm_start.demos_file=FILE``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym.config import ConfigError
from agentgym.stages.stage_cache import file_key, is_cached, stamp


def warm_start_dir(cfg: DictConfig) -> Path:
    return Path(str(cfg.trainer.default_local_dir)) / "warm_start"


def demo_seeds(cfg: DictConfig) -> range | None:
    """The seeds the demonstrations are played on (None with a demos file of the user's)."""
    if not cfg.warm_start.enable or cfg.warm_start.demos_file:
        return None
    start = cfg.warm_start.demo_seed_start
    return range(start, start + cfg.warm_start.demos)


def check(cfg: DictConfig) -> None:
    """Bad settings, reported before any work starts."""
    ws = cfg.warm_start
    if not ws.enable:
        return
    from agentgym.envs.base import has_expert
    from agentgym.registry import env_spec

    if not cfg.env.name:
        raise ConfigError("warm_start needs an env with an expert (env.name); set warm_start.enable=false")
    if ws.demos_file:
        if not Path(str(ws.demos_file)).is_file():
            raise ConfigError(f"warm_start.demos_file={ws.demos_file} does not exist")
    elif has_expert(env_spec(str(cfg.env.name)).load()) is False:
        raise ConfigError(
            f"env {cfg.env.name!r} has no expert to write demonstrations: set warm_start.enable=false "
            "(RL from actor_rollout_ref.model.path as it is), or give warm_start.demos_file=FILE"
        )
    elif ws.demos < 1:
        raise ConfigError(f"warm_start.demos={ws.demos}: give a positive number of expert episodes")
    try:
        sft_config(cfg, Path("demos.jsonl"), str(cfg.actor_rollout_ref.model.path))
    except ConfigError as exc:
        raise ConfigError(f"warm_start.sft: {exc}") from None


def write_demos_stage(cfg: DictConfig, show_progress: bool = True) -> Path:
    """Stage 1: the expert's episodes as chat JSONL (cached)."""
    from agentgym.envs.demos import write_demos

    ws = cfg.warm_start
    if ws.demos_file:
        return Path(str(ws.demos_file))
    directory = warm_start_dir(cfg) / "demos"
    path = directory / "demos.jsonl"
    env_kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) or {}
    turns = cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns
    settings = {
        "env": str(cfg.env.name),
        "env_kwargs": env_kwargs,
        "n": ws.demos,
        "seed": ws.demo_seed_start,
        "max_turns": turns,
    }
    if is_cached(directory, settings, path):
        print(f"warm start: demos cached ({path})", flush=True)
        return path
    directory.mkdir(parents=True, exist_ok=True)
    stats = write_demos(
        str(cfg.env.name),
        ws.demos,
        path,
        seed=ws.demo_seed_start,
        env_kwargs=env_kwargs,
        max_turns=int(turns) if turns else None,
        progress=show_progress,
    )
    if not stats.written:
        raise ConfigError(
            f"the expert of {cfg.env.name} solved none of {stats.episodes} episodes within "
            f"{turns} turns: raise actor_rollout_ref.rollout.multi_turn.max_assistant_turns or the env's "
            "step budget (env.kwargs)"
        )
    print(
        f"warm start: {stats.written} demonstrations (expert solved {stats.solved} of {stats.episodes}) -> {path}",
        flush=True,
    )
    stamp(directory, settings, written=stats.written, solved=stats.solved)
    return path


def sft_config(cfg: DictConfig, demos: Path, base_model: str) -> DictConfig:
    """``configs/sft.yaml`` with ``warm_start.sft`` over it, on the demos, from the base model."""
    from agentgym.stages.sft import load_sft_config

    overrides = OmegaConf.to_container(cfg.warm_start.sft, resolve=True) or {}
    # the same Ray cluster as RL (with warm_start.sft.trainer.use_ray=true SFT runs on it); warm_start.sft wins
    ray_init = OmegaConf.to_container(cfg.ray_init, resolve=True) if "ray_init" in cfg else {}
    dotted = [f"ray_init.{k}={json.dumps(v)}" for k, v in (ray_init or {}).items()]
    dotted += [f"{k}={json.dumps(v)}" for k, v in _flatten(overrides).items()]
    dotted += [
        f"data.train_files={json.dumps(str(demos))}",
        f"model.partial_pretrain={json.dumps(base_model)}",
        f"trainer.default_local_dir={json.dumps(str(warm_start_dir(cfg) / 'sft'))}",
        f"trainer.cpu_threads_per_worker={json.dumps(cfg.trainer.cpu_threads_per_worker)}",
        f"trainer.seed={cfg.trainer.seed}",
        "trainer.logger=[jsonl]",
        # each demo reply on the context RL will show it (a history window, a summary)
        f"data.context_policy={cfg.actor_rollout_ref.rollout.multi_turn.context_policy}",
        f"data.context_window={cfg.actor_rollout_ref.rollout.multi_turn.context_window}",
    ]
    if not cfg.warm_start.demos_file:
        dotted.append(f"data.env={json.dumps(str(cfg.env.name))}")
    return load_sft_config(overrides=dotted)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def sft_stage(cfg: DictConfig, demos: Path, base_model: str, show_progress: bool = True) -> Path:
    """Stage 2: SFT on the demos (cached); returns the Hugging Face model RL starts from."""
    from agentgym.stages.sft import SFTTrainer

    sft_cfg = sft_config(cfg, demos, base_model)
    directory = Path(str(sft_cfg.trainer.default_local_dir))
    output = directory / "huggingface"
    sft_settings = OmegaConf.to_container(sft_cfg, resolve=True)
    sft_settings.pop("ray_init", None)  # which cluster SFT ran on does not change the model: still cached
    settings = {"sft": sft_settings, "demos": file_key(demos)}
    if is_cached(directory, settings, output):
        print(f"warm start: SFT model cached ({output})", flush=True)
        return output
    if directory.exists():  # a different or an unfinished SFT: start it over
        shutil.rmtree(directory)
    trainer = SFTTrainer(sft_cfg, show_progress=show_progress)
    print(
        f"warm start: SFT on {len(trainer.train_set)} demonstrations, {trainer.total_steps} steps of "
        f"{trainer.batch_size} from {base_model}",
        flush=True,
    )
    try:
        summary = trainer.fit()
    finally:
        trainer.shutdown()
    if not summary["hf_model"]:
        raise ConfigError("the warm start's SFT wrote no model: keep trainer.save_hf_model true in warm_start.sft")
    loss = summary["metrics"].get("sft/loss", float("nan"))
    print(f"warm start: SFT done in {summary['seconds']:.0f} s, loss {loss:.4f} -> {summary['hf_model']}", flush=True)
    stamp(directory, settings, loss=loss, seconds=summary["seconds"])
    return Path(summary["hf_model"])


def run_warm_start(cfg: DictConfig, show_progress: bool = True) -> Path:
    """Demos then SFT; points ``actor_rollout_ref.model.path`` at the SFT model and returns it."""
    base = str(cfg.actor_rollout_ref.model.path)
    demos = write_demos_stage(cfg, show_progress)
    model = sft_stage(cfg, demos, base, show_progress)
    cfg.actor_rollout_ref.model.path = str(model)
    return model
