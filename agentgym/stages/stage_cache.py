"""A stage's output reused when the same settings made it: ``stage.json`` beside the output holds a
key of the settings; a rerun with equal settings finds the key and skips the work.

Used by the warm start (demos, SFT) and the held-out scores of the model RL starts from, so that
running the same command again after a finished or killed run only redoes what changed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from agentgym.model.identity import file_key, model_key

__all__ = ["file_key", "is_cached", "model_key", "settings_key", "stamp"]


def settings_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_cached(directory: Path, settings: dict[str, Any], output: Path) -> bool:
    """``output`` exists and ``directory/stage.json`` was written for these settings."""
    stamp = directory / "stage.json"
    if not stamp.is_file() or not output.exists():
        return False
    try:
        return json.loads(stamp.read_text()).get("key") == settings_key(settings)
    except (json.JSONDecodeError, AttributeError):  # a stamp cut short by a kill: redo the stage
        return False


def stamp(directory: Path, settings: dict[str, Any], **facts: Any) -> None:
    """Mark the stage in ``directory`` done for these settings (write after its output)."""
    (directory / "stage.json").write_text(
        json.dumps({"key": settings_key(settings), "settings": settings, **facts}, indent=1, default=str)
    )
