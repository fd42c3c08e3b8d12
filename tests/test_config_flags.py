"""Flags that set what a config field sets take the field's type, choices, default and help (config_flag)."""

from __future__ import annotations

import argparse
import re

import pytest

from agentgym.cli import build_parser
from agentgym.config_schema import TrainConfig, leaves
from agentgym.config_schema.flags import config_flag


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def test_a_flag_takes_the_fields_choices_type_default_and_help() -> None:
    parser = argparse.ArgumentParser()
    executor = config_flag(parser, "--env-executor", key="env.executor")
    workers = config_flag(parser, "--concurrency", key="actor_rollout_ref.rollout.concurrency", default=3)
    fields = leaves(TrainConfig)
    assert executor.choices == list(fields["env.executor"].choices)
    assert executor.default == fields["env.executor"].default
    assert fields["env.executor"].help.split(":")[0] in executor.help
    assert workers.type is int and workers.default == 3  # a command's own default wins
    assert parser.parse_args(["--concurrency", "7"]).concurrency == 7
    with pytest.raises(SystemExit):
        parser.parse_args(["--env-executor", "threads"])


def test_a_flag_for_a_field_that_is_gone_fails_when_the_parser_is_built() -> None:
    with pytest.raises(KeyError, match="--temp"):
        config_flag(argparse.ArgumentParser(), "--temp", key="actor_rollout_ref.rollout.temprature")


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_rollout_and_eval_flags_agree_with_their_fields(command: str) -> None:
    fields = leaves(TrainConfig)
    mirrored = 0
    for action in _subparser(command)._actions:
        found = re.search(r"as ([\w.]+):", action.help or "")
        if not found:
            continue
        mirrored += 1
        leaf = fields[found.group(1)]
        if leaf.choices is not None:
            assert action.choices == [c for c in leaf.choices if c is not None], action.dest
        else:
            assert action.type is {"int": int, "float": float, "str": str}[leaf.kind], action.dest
    assert mirrored >= 7
    sampling = _subparser(command)
    temperature = next(a for a in sampling._actions if a.dest == "temperature")
    # eval samples as validation does, rollout as training does
    key = (
        "actor_rollout_ref.rollout.val_kwargs.temperature"
        if command == "eval"
        else "actor_rollout_ref.rollout.temperature"
    )
    assert temperature.default == fields[key].default
