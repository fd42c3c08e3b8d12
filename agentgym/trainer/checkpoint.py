"""Checkpoints in veRL's layout, and finding the one to resume from.

::

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt   # "N": the newest complete checkpoint
        global_step_N/
            actor/   model.pt, optim.pt, extra.pt     (weights, AdamW state, lr schedule + RNG)
            critic/  (the same, for gae)
            trainer_state.pt                          (step, data order, KL controller, driver RNG)
        huggingface/                                  # the final policy, loadable by transformers

``model.pt`` and ``optim.pt`` hold the whole model and optimizer, unsharded and keyed by
parameter name, whatever the strategy (``fsdp2`` or ``dp``) and number of workers that wrote
them (``TrainState.save``): a run checkpointed under FSDP2 on GPUs resumes on a CPU, and back.
``latest_checkpointed_iteration.txt`` is written last, so a crash mid-save leaves the
previous checkpoint as the latest. ``resume_mode``: ``auto`` continues from the latest
when there is one, ``disable`` starts fresh, ``resume_path`` loads ``resume_from_path``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    marker = Path(root) / LATEST_FILE
    if not marker.is_file():
        return None
    try:
        step = int(marker.read_text().strip())
    except ValueError:
        return None
    path = step_dir(root, step)
    return path if (path / STATE_FILE).is_file() else None


def resume_dir(root: str | os.PathLike[str], mode: str, path: str | None = None) -> Path | None:
    """The checkpoint to resume from for ``trainer.resume_mode`` (None: start fresh)."""
    if mode == "disable":
        return None
    if mode == "resume_path":
        if not path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        target = Path(path)
        if not (target / STATE_FILE).is_file():
            raise FileNotFoundError(f"trainer.resume_from_path={path} holds no {STATE_FILE}; "
                                    "point it at a global_step_N directory")
        return target
    return latest_checkpoint(root)


def step_of(path: str | os.PathLike[str]) -> int:
    name = Path(path).name
    if not name.startswith("global_step_"):
        raise ValueError(f"{path} is not a global_step_N directory")
    return int(name.removeprefix("global_step_"))


def save_trainer_state(directory: Path, state: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (STATE_FILE + ".tmp")
    torch.save(state, tmp)
    tmp.replace(directory / STATE_FILE)


def load_trainer_state(directory: Path) -> dict[str, Any]:
    return torch.load(Path(directory) / STATE_FILE, weights_only=False)


def mark_latest(root: str | os.PathLike[str], step: int) -> None:
    marker = Path(root) / LATEST_FILE
    tmp = marker.with_name(LATEST_FILE + ".tmp")
    tmp.write_text(str(step))
    tmp.replace(marker)


def prune(root: str | os.PathLike[str], keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns what was removed."""
    if not keep or keep <= 0:
        return []
    found = sorted((p for p in Path(root).glob("global_step_*") if p.is_dir()), key=step_of)
    removed = found[:-keep]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
