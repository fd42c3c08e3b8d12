"""``python -m agentgym.config_schema [--check]``: write the base configs (``configs/train.yaml``, ``sft.yaml``,
``generation.yaml``, ``evaluation.yaml``) from the schemas (``--check``: exit 1 when a file in ``configs/``
differs from what would be written)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym.config_schema import evaluation, generation, sft, train
from agentgym.config_schema.render import to_yaml

CHECKOUT_CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # a checkout's (a wheel copies it in)


def generated(module: str) -> str:
    return f"Written by `python -m agentgym.config_schema` from agentgym/config_schema/{module}.py: edit there."


def files() -> dict[str, str]:
    """File name in ``configs/`` -> its text."""
    return {
        "train.yaml": to_yaml(train.TrainConfig, f"{generated('train')}\n\n{train.HEADER}", train.GroupDefaults),
        "sft.yaml": to_yaml(sft.SFTConfig, f"{generated('sft')}\n\n{sft.HEADER}"),
        "generation.yaml": to_yaml(generation.GenerationConfig, f"{generated('generation')}\n\n{generation.HEADER}"),
        "evaluation.yaml": to_yaml(evaluation.EvaluationConfig, f"{generated('evaluation')}\n\n{evaluation.HEADER}"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentgym.config_schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a file is out of date")
    parser.add_argument("--configs", default=None, help="the configs/ directory (default: the checkout's)")
    args = parser.parse_args(argv)
    directory = Path(args.configs or CHECKOUT_CONFIGS)
    stale = []
    for name, text in files().items():
        path = directory / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m agentgym.config_schema", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
