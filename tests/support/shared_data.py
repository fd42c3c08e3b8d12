"""Where the shared GSM8K data is: ``$AGENTGYM_SHARED_DIR``, else ``shared/`` beside the repository
(CI's layout), else ``/work/shared``. Tests that need it skip when none of these has it."""

from __future__ import annotations

import os
from pathlib import Path

_CANDIDATES = [
    Path(os.environ["AGENTGYM_SHARED_DIR"]) if os.environ.get("AGENTGYM_SHARED_DIR") else None,
    Path(__file__).resolve().parents[3] / "shared",
    Path("/work/shared"),
]
SHARED_DIR = next(
    (p for p in _CANDIDATES if p is not None and (p / "data" / "gsm8k").is_dir()),
    Path(__file__).resolve().parents[3] / "shared",
)
GSM8K_DIR = SHARED_DIR / "data" / "gsm8k"
GSM8K_TEST = GSM8K_DIR / "test.jsonl"
GSM8K_TRAIN = GSM8K_DIR / "train.jsonl"
