"""A finished run on disk: its saved config, and the model to load from it.

``find_run(PATH)`` takes a run directory (``trainer.default_local_dir`` of ``agentgym train``, which
holds ``config.yaml``) or any directory inside one — ``huggingface/``, a checkpoint ``global_step_N``
(or its ``actor/``), the warm start's SFT model — and returns the run's config with the model PATH
stands for:

* the run directory: its final model ``huggingface/`` (else its latest checkpoint's model);
* a model directory (``config.json``, or a LoRA run's ``adapter_config.json``): that model;
* a checkpoint: its ``actor/huggingface`` when the checkpoint holds one (``hf_model`` in
  ``actor.checkpoint.save_contents``), else its ``actor/model.pt`` written out as a model directory
  (on the run's start model; a LoRA checkpoint's adapters merged in) in a temporary directory.

Paths in the config are as the run's working directory saw them; one that is not found from here is
looked up from that directory (found from ``trainer.default_local_dir``, when that was relative).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

CONFIG_FILE = "config.yaml"


class RunError(ValueError):
    """A path that is not (inside) a run, or a run without a model; the message says what to pass."""


@dataclass
class Run:
    directory: Path  # the run directory (holds config.yaml)
    cfg: DictConfig  # the config the run saved
    model: str  # the model directory PATH stands for
    model_source: str  # how it was chosen, for the printout
    root: Path | None  # the run's working directory, when it can be told

    def path(self, value: str) -> str:
        """``value`` as seen from here: unchanged when it exists from here (or is absolute), else under
        the run's working directory when it exists there."""
        if not value or Path(value).is_absolute() or Path(value).exists() or self.root is None:
            return value
        there = self.root / value
        return str(there) if there.exists() else value


def is_train_config(cfg: Any) -> bool:
    return isinstance(cfg, DictConfig) and "actor_rollout_ref" in cfg and "env" in cfg and "trainer" in cfg


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def find_run(path: str | Path) -> Run:
    given = Path(path).expanduser()
    if not given.exists():
        raise RunError(
            f"{path} does not exist: pass a run directory (trainer.default_local_dir of `agentgym train`, "
            f"holding {CONFIG_FILE}) or a checkpoint or model directory inside one"
        )
    given = given.resolve()
    for directory in [given, *given.parents]:
        file = directory / CONFIG_FILE
        if file.is_file():
            try:
                cfg = OmegaConf.load(file)
            except Exception as exc:  # noqa: BLE001 - a YAML error of any kind: say which file
                raise RunError(f"{file} is not a readable config ({type(exc).__name__}: {exc})") from None
            if is_train_config(cfg):  # an SFT run's config (the warm start's) sits inside the run: go on up
                break
    else:
        raise RunError(
            f"no {CONFIG_FILE} of an `agentgym train` run in {path} or above it: pass the run directory "
            "(trainer.default_local_dir; the summary's `run dir:`) or a directory inside it"
        )
    cfg = over_defaults(cfg)
    root = _working_directory(directory, cfg.trainer.default_local_dir)
    run = Run(directory, cfg, "", "", root)
    run.model, run.model_source = _model(run, given)
    return run


def over_defaults(saved: DictConfig) -> DictConfig:
    """A run's saved config over today's training defaults: a key added since the run was saved reads
    as its default, so the saved config is read like a loaded one."""
    from agentgym.trainer.config import load_config

    defaults = load_config(warn=False)
    OmegaConf.set_struct(defaults, False)  # a key the run saved and today's schema lacks is kept
    return OmegaConf.merge(defaults, saved)


def _working_directory(run_dir: Path, configured: str) -> Path | None:
    """The directory ``agentgym train`` ran in, when ``trainer.default_local_dir`` was relative."""
    if Path(configured).is_absolute():
        return None
    parts = Path(configured).parts
    if run_dir.parts[-len(parts) :] != parts:
        return None
    return Path(*run_dir.parts[: -len(parts)])


def _model(run: Run, given: Path) -> tuple[str, str]:
    if is_model_dir(given):
        return str(given), "the model directory given"
    step = next((p for p in (given, given.parent) if p.name.startswith("global_step_")), None)
    if step is not None:
        return checkpoint_model(run, step), f"checkpoint {step.name}"
    if given != run.directory:
        if is_model_dir(given / "huggingface"):
            return str(given / "huggingface"), "its huggingface/"
        raise RunError(
            f"{given} holds no model: pass the run directory {run.directory}, a global_step_N checkpoint "
            "or a model directory (config.json) inside it"
        )
    if is_model_dir(run.directory / "huggingface"):
        return str(run.directory / "huggingface"), "the run's final model"
    from agentgym.trainer.checkpoint import CheckpointError, latest_checkpoint

    try:
        latest = latest_checkpoint(run.directory)
    except CheckpointError as exc:
        raise RunError(str(exc)) from None
    if latest is None:
        raise RunError(
            f"the run {run.directory} has no final model (huggingface/: the run did not finish, or "
            "trainer.save_hf_model=false) and no checkpoint: train it to the end, or pass a model with "
            "--model"
        )
    return checkpoint_model(run, latest), f"its latest checkpoint {latest.name} (no final model)"


def checkpoint_model(run: Run, step_dir: Path) -> str:
    """The model of a ``global_step_N`` checkpoint: its ``actor/huggingface``, or its ``actor/model.pt``
    written out as a model directory (removed when this process ends)."""
    actor = step_dir / "actor"
    if is_model_dir(actor / "huggingface"):
        return str(actor / "huggingface")
    weights = actor / "model.pt"
    if not weights.is_file():
        raise RunError(
            f"checkpoint {step_dir} holds no actor weights (actor/model.pt): its "
            "actor.checkpoint.save_contents had no 'model'; pass another checkpoint"
        )
    target = Path(tempfile.mkdtemp(prefix=f"agentgym-{step_dir.name}-"))
    atexit.register(shutil.rmtree, target, True)
    export_checkpoint(weights, run.cfg, target, run.path(str(run.cfg.actor_rollout_ref.model.path)))
    return str(target)


def export_checkpoint(weights: Path, cfg: DictConfig, target: Path, start_model: str) -> None:
    """``actor/model.pt`` (the whole policy, or a LoRA run's adapters) on ``start_model`` -> a model
    directory with the start model's tokenizer."""
    import torch

    from agentgym.model import load_causal_lm, load_tokenizer, lora

    state = torch.load(weights, map_location="cpu", weights_only=True)
    model = load_causal_lm(start_model, dtype="float32")
    settings = lora.settings(OmegaConf.to_container(cfg.actor_rollout_ref.model, resolve=True))
    if settings is not None:
        wrapped = lora.wrap(model, settings)
        wrapped.load_state_dict(state)
        model = lora.merged_model(wrapped)
    else:
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:  # a tied head is not saved twice
            raise RunError(
                f"{weights} does not fit the run's start model {start_model} (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]})"
            )
    model.save_pretrained(target)
    load_tokenizer(start_model).save_pretrained(target)
