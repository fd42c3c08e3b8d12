"""``agentgym config --from verl|roll|chatlearn|claw-r1 THEIR.yaml [-o agentgym.yaml]``, and their files and
keys given straight to ``agentgym train``.

Translates their config file into agentgym's, prints where every key went (mapped, no effect,
not honoured, each with its reason), and writes the agentgym config (``-o``; else to stdout, with the
report on stderr). The written config is loaded once with ``load_config`` before the command ends, so
a translation that would not run says so here.

``resolve_command_line`` does the same for ``agentgym train``'s own command line: Hydra's
``--config-path``/``--config-name`` (or ROLL's ``--config_path``/``--config_name``), a ROLL, ChatLearn,
Claw-R1 or Hydra-composed veRL file given as ``--config``, and their keys among the overrides are
translated first (the report printed), so a launch script runs with only the command name changed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.config import ConfigError, hydra_config_file, named_configs, read_yaml

SYSTEMS = ("verl", "roll", "chatlearn", "claw-r1")
VERL_BASES = {
    "ppo_trainer": "veRL's ppo_trainer.yaml is agentgym's configs/train.yaml",
    "_generated_ppo_trainer": "veRL's ppo_trainer.yaml is agentgym's configs/train.yaml",
    "ppo_megatron_trainer": "veRL's ppo_megatron_trainer.yaml is agentgym's configs/train.yaml (agentgym "
    "trains with FSDP2, not Megatron)",
    "sft_trainer": "veRL's sft_trainer.yaml is agentgym's configs/sft.yaml",
    "generation": "veRL's generation.yaml is agentgym's configs/generation.yaml",
    "evaluation": "veRL's evaluation.yaml is agentgym's configs/evaluation.yaml",
}


def translate_file(system: str, path: str, overrides: Sequence[str] = ()) -> Any:
    """The ``Translation`` of the file at ``path`` from ``system`` (``overrides``: their command-line keys,
    applied to the file first as Hydra would)."""
    from agentgym.compat.command_line import merge_overrides
    from agentgym.compat.systems import schema
    from agentgym.compat.translate import load_their_yaml

    keep = (lambda key: key in schema()) if system in ("verl", "claw-r1") else None
    data = merge_overrides(load_their_yaml(path, keep_interpolations_to=keep), overrides)
    return translate_data(system, data)


def translate_data(system: str, data: dict[str, Any]) -> Any:
    from agentgym.compat.roll import translate_roll
    from agentgym.compat.systems import TRANSLATORS

    return translate_roll(data) if system == "roll" else TRANSLATORS[system](data)


@dataclass
class CommandLine:
    """What ``agentgym train`` composes once another system's files and keys are translated."""

    config_file: str | None
    overrides: list[str]
    config_name: str | None  # an agentgym named config (configs/<name>.yaml)
    notes: list[str] = field(default_factory=list)  # printed before the run
    temp_file: str | None = None  # a translation written for this run; delete() removes it

    def delete(self) -> None:
        if self.temp_file:
            Path(self.temp_file).unlink(missing_ok=True)


def ours(key: str) -> bool:
    """Whether ``key`` is agentgym's (``train.yaml``, an open section, a veRL key agentgym understands)."""
    from agentgym.compat.systems import _open, schema
    from agentgym.compat.verl import verl_key_policy

    known = schema()
    return (
        key in known
        or _open(key)
        or any(k.startswith(key + ".") for k in known)
        or verl_key_policy(key, None) is not None
    )


def resolve_command_line(
    config_file: str | None, overrides: Sequence[str], config_path: str | None = None, config_name: str | None = None
) -> CommandLine:
    """``agentgym train``'s files and overrides with every other system's part translated (see the module
    docstring). Raises ``ConfigError`` naming what to change."""
    from agentgym.compat.command_line import split_overrides, system_of

    notes: list[str] = []
    named = None
    if config_path is not None or (
        config_name and config_name not in named_configs() and config_name not in VERL_BASES
    ):
        if config_file is not None:
            raise ConfigError("give the config once: --config FILE, or --config-path DIR --config-name NAME")
        if config_path is None:
            raise ConfigError(
                f"--config-name {config_name}: no such agentgym config (named configs: "
                f"{', '.join(named_configs())}); for a file of your own add --config-path DIR "
                f"(Hydra's form) or pass --config FILE"
            )
        config_file = str(hydra_config_file(config_path, config_name))
    elif config_name in VERL_BASES:
        notes.append(f"--config-name {config_name}: {VERL_BASES[config_name]}")
    elif config_name:
        named = config_name
    system = system_of(read_yaml(Path(config_file))) if config_file else None
    system, theirs, mine = split_overrides(list(overrides), system, ours)
    if system is None:
        return CommandLine(config_file, mine, named, notes)
    if config_file is None:
        translation = translate_data(system, _from_overrides(theirs))
    else:
        translation = translate_file(system, config_file, theirs)
    where = config_file or "the command line"
    notes.append(
        f"{where} holds {system}'s keys: translated as `agentgym config --from {system}` does (it prints "
        f"where each key went)\n" + translation.summary()
    )
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"agentgym-from-{system}-", delete=False) as f:
        f.write(translation.yaml())
    return CommandLine(f.name, mine, named, notes, temp_file=f.name)


def _from_overrides(items: Sequence[str]) -> dict[str, Any]:
    from agentgym.compat.command_line import merge_overrides

    return merge_overrides({}, items)


def check_loads(text: str) -> None:
    """Raise ``ConfigError`` if the translated config does not load."""
    from agentgym.trainer.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        load_config(config_file=f.name, warn=False)
    finally:
        Path(f.name).unlink(missing_ok=True)


def hydra_arguments(parser: argparse.ArgumentParser, name_help: str) -> None:
    """Hydra's ``--config-path DIR --config-name NAME`` (also ``=`` forms, and ROLL's ``--config_path``)."""
    parser.add_argument(
        "--config-path",
        "--config_path",
        "-cp",
        dest="config_path",
        default=None,
        metavar="DIR",
        help="Hydra's config directory (relative to the working directory)",
    )
    parser.add_argument(
        "--config-name", "--config_name", "-cn", dest="config_name", default=None, metavar="NAME", help=name_help
    )


def config_file_of(args: argparse.Namespace, base: str) -> str | None:
    """``--config FILE``, or Hydra's ``--config-path DIR --config-name NAME`` (``NAME`` = ``base``: the default)."""
    if args.config_path or (args.config_name and args.config_name != base):
        if args.config:
            raise ConfigError("give the config once: --config FILE, or --config-path DIR --config-name NAME")
        return str(hydra_config_file(args.config_path, args.config_name))
    return args.config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="from_system", default=None, choices=list(SYSTEMS))
    parser.add_argument(
        "--show", action="store_true", help="print the composed training config with each value's origin"
    )
    parser.add_argument("--env", default=None, help="--show: the env preset to compose (as agentgym train --env)")
    parser.add_argument(
        "file", nargs="?", default=None, help="their YAML config (or --config-path DIR --config-name NAME)"
    )
    hydra_arguments(parser, "with --config-path: their file DIR/NAME.yaml (Hydra's form)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="their keys, applied to the file first")
    parser.add_argument("-o", "--output", default=None, help="write the agentgym config here (default: stdout)")


def show_config(
    env: str | None = None,
    config_file: str | None = None,
    overrides: Sequence[str] = (),
    config_path: str | None = None,
    config_name: str | None = None,
) -> str:
    """``agentgym train``'s config for these arguments, one ``key: value  # origin`` line per key: where each
    value came from (default, a group file, a named config, --config FILE, the command line, or derived by
    ``load_config``). Another system's file or keys are translated first, as ``agentgym train`` does."""
    from agentgym.config import flatten
    from agentgym.config_schema.render import scalar
    from agentgym.trainer.config import compose_training

    line = resolve_command_line(config_file, overrides, config_path, config_name)
    try:
        composition = compose_training(env, line.config_file, line.overrides, config_name=line.config_name)
    finally:
        line.delete()
    values = flatten(composition.cfg)
    width = max(len(f"{key}: {scalar(value)}") for key, value in values.items()) + 2
    header = [f"# {note}" for text in line.notes for note in text.splitlines()]
    header += [f"# {note}" for note in composition.notes]
    header.append(
        "# agentgym train's config"
        + (f" for --env {env}" if env else "")
        + ", each value with its origin"
        + (
            f" (group files: {', '.join(f'{g}={c}' for g, c in composition.groups.items())})"
            if composition.groups
            else ""
        )
    )
    body = [
        f"{key}: {scalar(value)}".ljust(min(width, 72)) + f"  # {composition.origin(key)}"
        for key, value in values.items()
        if key not in composition.added
    ]
    for key, value in composition.added.items():
        body.append(f"{key}: {scalar(value)}  # command line (+key: read by nothing in agentgym)")
    return "\n".join(header + body) + "\n"


def show_command(args: argparse.Namespace) -> int:
    """``agentgym config --show [--env NAME] [FILE.yaml] [KEY=VALUE ...]``."""
    items = list(args.overrides)
    config_file = None
    if args.file:  # the positional FILE: a config file when it names one, else the first override
        if "=" not in args.file and args.file.endswith((".yaml", ".yml")):
            config_file = args.file
        else:
            items.insert(0, args.file)
    try:
        text = show_config(args.env, config_file, items, args.config_path, args.config_name)
    except (ConfigError, OSError) as exc:
        print(f"agentgym config: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def run(args: argparse.Namespace) -> int:
    """``agentgym config --from SYSTEM FILE [KEY=VALUE ...] [-o OUT]``, or ``agentgym config --show ...``."""
    if args.show:
        return show_command(args)
    system, path = args.from_system, args.file
    if system is None:
        print(
            "agentgym config: give --from SYSTEM THEIR.yaml (translate another system's config) or --show "
            "(print agentgym's composed config with each value's origin)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.config_path or args.config_name:
            if path:
                raise ConfigError("give their file once: FILE, or --config-path DIR --config-name NAME")
            path = str(hydra_config_file(args.config_path, args.config_name))
    except ConfigError as exc:
        print(f"agentgym config: {exc}", file=sys.stderr)
        return 2
    if not path or not Path(path).is_file():
        print(
            f"agentgym config: {path or 'no file given'} is not a file (give FILE or --config-path DIR "
            f"--config-name NAME)",
            file=sys.stderr,
        )
        return 2
    try:
        translation = translate_file(system, path, list(args.overrides or ()))
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
