"""Checkpoints in veRL's layout, and finding the one to resume from.

::

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt   # "N": the newest complete checkpoint
        global_step_N/
            actor/   model.pt, optim.pt, extra.pt     (weights, AdamW state, lr schedule + RNG)
            critic/  (the same, for gae)
            trainer_state.pt                          (step, data order, KL controller, driver RNG)
        huggingface/                                  # the final policy, loadable by transformers (with
                                                      # LoRA: peft's adapter directory), and agentgym_run.json:
                                                      # how it was trained (trainer/training_record.py)

``model.pt`` and ``optim.pt`` hold the whole model and optimizer, unsharded and keyed by
parameter name, whatever the strategy (``fsdp2`` or ``dp``) and number of workers that wrote
them (``TrainState.save``): a run checkpointed under FSDP2 on GPUs resumes on a CPU, and back.
``latest_checkpointed_iteration.txt`` is written last, so a crash mid-save leaves the
previous checkpoint as the latest. ``resume_mode``: ``auto`` continues from the latest
when there is one, ``disable`` starts fresh, ``resume_path`` loads ``resume_from_path``.

Integrity: before ``latest`` points at a checkpoint, ``manifest.json`` in it records the size and
SHA-256 of every file; a resume checks them and refuses a checkpoint whose files changed (a flipped
bit in ``model.pt`` loaded silently before), and refuses a ``latest`` file that does not name a
checkpoint there (``abc``, or a step with no directory) instead of starting over from step 0.
Both errors say which checkpoints there are and how to resume from one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"

log = logging.getLogger("agentgym.trainer")


class CheckpointError(RuntimeError):
    """A checkpoint that must not be resumed from; the message says what to do instead."""


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint under ``root``, its files checked against its manifest; None
    when there is no ``latest`` file (a fresh run). A ``latest`` file that names no checkpoint, or a
    checkpoint whose files changed, raises ``CheckpointError``."""
    marker = Path(root) / LATEST_FILE
    if not marker.is_file():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker} holds {text[:40]!r}, not a step number. {_choices(root)}")
    path = step_dir(root, int(text))
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"{marker} names step {text}, but {path} holds no {STATE_FILE}. {_choices(root)}")
    verify_manifest(path)
    return path


def _choices(root: str | os.PathLike[str]) -> str:
    found = sorted((p for p in Path(root).glob("global_step_*") if (p / STATE_FILE).is_file()), key=step_of)
    where = (
        f"Checkpoints here: {', '.join(p.name for p in found)}; resume from one with "
        f"trainer.resume_mode=resume_path trainer.resume_from_path={found[-1]}"
        if found
        else "There is no complete checkpoint here"
    )
    return (
        f"{where}, or start over with trainer.resume_mode=disable (or another trainer.default_local_dir). "
        f"agentgym never silently restarts from step 0 over a run that has checkpoints."
    )


def write_manifest(directory: str | os.PathLike[str], expected: Iterable[str] = ()) -> Path:
    """``manifest.json``: the size and SHA-256 of every file in the checkpoint ``directory``.
    ``expected``: the files the workers report they wrote there; one this process cannot see (a worker
    on a node that does not share the run directory) refuses the checkpoint instead of sealing a part."""
    directory = Path(directory)
    missing = sorted(name for name in expected if not (directory / name).is_file())
    if missing:
        raise CheckpointError(
            f"checkpoint {directory} is split across nodes: the workers wrote {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}, which this driver does not see there. Put "
            "trainer.default_local_dir on storage every node mounts at the same path (see docs/cluster.md)"
        )
    files = {
        str(f.relative_to(directory)): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(directory.rglob("*"))
        if f.is_file() and f.name != MANIFEST_FILE
    }
    target = directory / MANIFEST_FILE
    tmp = target.with_name(MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps({"files": files}, indent=1))
    tmp.replace(target)
    return target


def verify_manifest(directory: str | os.PathLike[str]) -> None:
    """Raise ``CheckpointError`` if a file listed in ``manifest.json`` is missing or changed."""
    directory = Path(directory)
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        log.warning(
            "%s has no %s (written by an older agentgym): its files cannot be checked", directory, MANIFEST_FILE
        )
        return
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest} is unreadable ({exc}). {_choices(directory.parent)}") from None
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != expected["bytes"]:
            problem = f"is {path.stat().st_size} bytes, {expected['bytes']} when saved"
        elif _sha256(path) != expected["sha256"]:
            problem = "does not match the SHA-256 recorded when it was saved (the file is corrupt)"
        else:
            continue
        raise CheckpointError(
            f"checkpoint {directory} cannot be resumed: {name} {problem}. {_choices(directory.parent)}"
        )


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def resume_dir(root: str | os.PathLike[str], mode: str, path: str | None = None) -> Path | None:
    """The checkpoint to resume from for ``trainer.resume_mode`` (None: start fresh)."""
    if mode == "disable":
        return None
    if mode == "resume_path":
        if not path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        target = Path(path)
        if not (target / STATE_FILE).is_file():
            raise FileNotFoundError(
                f"trainer.resume_from_path={path} holds no {STATE_FILE}; point it at a global_step_N directory"
            )
        verify_manifest(target)
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


def mark_latest(root: str | os.PathLike[str], step: int, expected: Iterable[str] = ()) -> None:
    """Seal ``global_step_<step>`` (its ``manifest.json``, which must list ``expected``: the files the
    workers wrote), then make it the latest checkpoint."""
    write_manifest(step_dir(root, step), expected)
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
