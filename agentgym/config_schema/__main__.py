"""``python -m agentgym.config_schema [--check]``: write ``configs/train.yaml`` from the schema (``--check``:
exit 1 when the file in ``configs/`` differs from what would be written)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.config_schema.render import to_yaml
from agentgym.config_schema.train import HEADER, GroupDefaults, TrainConfig

CHECKOUT_CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # a checkout's (a wheel copies it in)
GENERATED = "Written by `python -m agentgym.config_schema` from agentgym/config_schema/train.py: edit there."


def train_yaml() -> str:
    return to_yaml(TrainConfig, f"{GENERATED}\n\n{HEADER}", GroupDefaults)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentgym.config_schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is out of date")
    parser.add_argument("--configs", default=None, help="the configs/ directory (default: the checkout's)")
    args = parser.parse_args(argv)
    path = Path(args.configs or CHECKOUT_CONFIGS) / "train.yaml"
    text = train_yaml()
    if args.check:
        if path.read_text() != text:
            print(f"{path} is out of date: run python -m agentgym.config_schema", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
