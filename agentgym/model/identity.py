"""A model's identity for caches and checkpoints: which files a model directory holds.

A checkpoint records the model RL started from, and the stage cache (``agentgym.stages.stage_cache``)
keys a stage's output by it, so a run that starts from other files is never mistaken for this one.
"""

from __future__ import annotations

from pathlib import Path


def file_key(path: Path) -> str:
    """A file's identity for a settings key: where it is, its size and when it last changed."""
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def model_key(model: str) -> str:
    """A model's identity: the files of a model directory, or the name of a built-in model."""
    path = Path(model)
    if not path.is_dir():
        return model
    return ";".join(file_key(p) for p in sorted(path.iterdir()) if p.is_file())
