"""``agentgym config --from verl|roll|chatlearn|claw-r1 THEIR.yaml [-o agentgym.yaml]``.

Translates their config file into agentgym's, prints where every key went (mapped, no effect,
not honoured, each with its reason), and writes the agentgym config (``-o``; else to stdout, with the
report on stderr). The written config is loaded once with ``load_config`` before the command ends, so
a translation that would not run says so here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentgym.config import ConfigError

SYSTEMS = ("verl", "roll", "chatlearn", "claw-r1")


def translate_file(system: str, path: str) -> Any:
    """The ``Translation`` of the file at ``path`` from ``system``."""
    from agentgym.compat.roll import translate_roll
    from agentgym.compat.systems import TRANSLATORS
    from agentgym.compat.translate import load_their_yaml

    data = load_their_yaml(path)
    return translate_roll(data) if system == "roll" else TRANSLATORS[system](data)


def check_loads(text: str) -> None:
    """Raise ``ConfigError`` if the translated config does not load."""
    from agentgym.trainer.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        load_config(config_file=f.name, warn=False)
    finally:
        Path(f.name).unlink(missing_ok=True)


def config_command(args: argparse.Namespace) -> int:
    system, path = args.from_system, args.file
    if not Path(path).is_file():
        print(f"agentgym config: {path} is not a file", file=sys.stderr)
        return 2
    try:
        translation = translate_file(system, path)
    except (ValueError, OSError) as exc:
        print(f"agentgym config: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    text = translation.yaml()
    report_stream = sys.stdout if args.output else sys.stderr
    print(translation.report(), file=report_stream, flush=True)
    try:
        check_loads(text)
    except ConfigError as exc:
        print(f"agentgym config: the translated config does not load: {exc}", file=sys.stderr)
        return 1
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}; run: agentgym train --config {args.output}", file=report_stream)
    else:
        sys.stdout.write(text)
    return 0
