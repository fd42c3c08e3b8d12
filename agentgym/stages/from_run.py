"""Commands that take their settings from a finished run: ``agentgym eval --run DIR``,
``agentgym rollout --run DIR`` and ``agentgym serve --run DIR``.

    agentgym eval --run outputs/agentgym/sokoban-gigpo                 # the held-out table's greedy row again
    agentgym eval --run outputs/agentgym/sokoban-gigpo/global_step_40 --temperature 1
    agentgym serve --run outputs/agentgym/sokoban-gigpo

``DIR`` is a run directory or a directory inside one (``agentgym.stages.run_dir``). From the run's
``config.yaml`` come the env and its arguments (eval: ``env.kwargs`` with ``env.val_kwargs`` over them,
as validation and the held-out table use; rollout: ``env.kwargs``), the turn and token limits, the
chat-template variables, the prompt and response lengths, and the sampling (eval: ``rollout.val_kwargs``
with the held-out table's seeds, ``env.val_seed_start`` and ``held_out.num_tasks``, and its sampling seed
``trainer.seed``; rollout: ``actor_rollout_ref.rollout``). A flag given on the command line wins over
the run's value (``--env-arg`` key by key), and the command prints every setting with where it came from.

Without ``--run``, ``eval``/``rollout --model DIR`` read the ``agentgym_run.json`` an exported model
keeps (``agentgym.trainer.training_record``) and warn when the env or its arguments differ from the
ones it was trained and scored with.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from omegaconf import OmegaConf

from agentgym.stages.run_dir import Run, RunError, find_run

__all__ = ["Given", "RunError", "settle_rollout_args", "settle_serve_args", "trained_otherwise"]

HELD_OUT_EXECUTORS = ("thread", "inline", "process")  # what runs here without anything else (as held_out.py)


class Given(argparse.Action):
    """The action of a flag ``--run`` can supply: stores the value and adds the flag's dest to ``args.given``
    (give the parser ``set_defaults(given=frozenset())``), so that the run fills only the flags not given."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, _option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = namespace.given | {self.dest}


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def run_env_kwargs(run: Run, mode: str) -> dict[str, Any]:
    """eval: the validation env's arguments (``env.kwargs``, ``env.val_kwargs`` over them, ``data.val_files``
    as its data); rollout: the training env's. Relative paths found from the run's directory."""
    cfg = run.cfg
    kwargs = dict(_plain(cfg.env.kwargs) or {})
    files = cfg.data.train_files
    if mode == "eval":
        kwargs.update(_plain(cfg.env.val_kwargs) or {})
        files = cfg.data.val_files
    if files:
        kwargs["data_files"] = _plain(files)

    def found(value: Any) -> Any:
        if isinstance(value, str):
            return run.path(value)
        if isinstance(value, list):
            return [found(v) for v in value]
        return value

    return {k: found(v) for k, v in kwargs.items()}


def run_settings(run: Run, mode: str) -> dict[str, tuple[Any, str]]:
    """``{flag dest: (value, the config key it comes from)}`` for ``agentgym eval``/``rollout``."""
    cfg = run.cfg
    rollout = cfg.actor_rollout_ref.rollout
    where = "actor_rollout_ref.rollout.val_kwargs" if mode == "eval" else "actor_rollout_ref.rollout"
    sampling = rollout.val_kwargs if mode == "eval" else rollout
    greedy = not sampling.do_sample
    executor = cfg.env.executor
    out: dict[str, tuple[Any, str]] = {
        "model": (run.model, run.model_source),
        "env": (cfg.env.name, "env.name"),
        "n": (sampling.n, f"{where}.n"),
        "temperature": (
            0.0 if greedy else sampling.temperature,
            f"{where}.do_sample=false" if greedy else f"{where}.temperature",
        ),
        "top_p": (sampling.top_p, f"{where}.top_p"),
        "top_k": (sampling.top_k, f"{where}.top_k"),
        "max_turns": (
            rollout.multi_turn.max_assistant_turns,
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
        ),
        "max_tokens": (rollout.max_tokens_per_turn, "actor_rollout_ref.rollout.max_tokens_per_turn"),
        "context_policy": (rollout.multi_turn.context_policy, "actor_rollout_ref.rollout.multi_turn.context_policy"),
        "context_window": (rollout.multi_turn.context_window, "actor_rollout_ref.rollout.multi_turn.context_window"),
        "prompt_length": (cfg.data.max_prompt_length, "data.max_prompt_length"),
        "response_length": (cfg.data.max_response_length, "data.max_response_length"),
        "concurrency": (rollout.concurrency, "actor_rollout_ref.rollout.concurrency"),
        "device": (rollout.device, "actor_rollout_ref.rollout.device (null: cuda if available)"),
        "env_executor": (
            executor if executor in HELD_OUT_EXECUTORS else "thread",
            "env.executor" if executor in HELD_OUT_EXECUTORS else f"env.executor={executor} -> thread",
        ),
    }
    if mode == "eval":
        out["seed"] = (cfg.env.val_seed_start, "env.val_seed_start")
        out["sampling_seed"] = (cfg.trainer.seed, "trainer.seed, as the held-out table samples")
        if cfg.held_out.enable:
            out["tasks"] = (cfg.held_out.num_tasks, "held_out.num_tasks")
        elif cfg.data.val_batch_size is not None:
            out["tasks"] = (cfg.data.val_batch_size, "data.val_batch_size")
    else:
        out["seed"] = (cfg.env.train_seed_start, "env.train_seed_start")
        out["sampling_seed"] = (rollout.sampling_seed, "actor_rollout_ref.rollout.sampling_seed")
    return out


def settle_rollout_args(args: argparse.Namespace, mode: str) -> None:
    """Fill ``args`` of ``agentgym eval``/``rollout``: from ``--run`` under the flags given (a setting the run
    leaves null keeps the flag's default); prints what ``--run`` chose. Sets ``env_kwargs`` and
    ``max_model_len`` (the embedded server's context: ``--prompt-length`` + ``--response-length`` when both
    are known). Without ``--run``, warns when ``--model`` was trained with other env arguments. Raises
    ``RunError``."""
    from agentgym.rollout.commands import parse_env_args

    given_env_args = parse_env_args(args.env_arg)
    args.chat_template_kwargs = None
    if not args.run:
        if args.env is None:
            raise RunError(f"agentgym {mode} needs --env NAME (see `agentgym envs`) or --run DIR (a finished run)")
        args.env_kwargs = given_env_args
        args.max_model_len = _context(args)
        for line in trained_otherwise(args, given_env_args):
            print(f"warning: {line}", file=sys.stderr)
        return
    run = find_run(args.run)
    rows: list[tuple[str, str, str]] = []
    settings = run_settings(run, mode)
    other_env = args.env is not None and args.env != settings["env"][0]
    for dest, (value, source) in settings.items():
        if dest in args.given:
            rows.append((dest, _show(getattr(args, dest)), "flag"))
        elif value is None:  # the run leaves it to the default
            rows.append((dest, _show(getattr(args, dest)), f"default ({source}: null)"))
        else:
            setattr(args, dest, value)
            rows.append((dest, _show(value), f"run: {source}"))
    if args.env is None:
        raise RunError(
            f"the run {run.directory} trained no single env (env.name is null: several env tags or an "
            "agent); pass --env NAME"
        )
    kwargs = {} if other_env else run_env_kwargs(run, mode)
    args.env_kwargs = {**kwargs, **given_env_args}
    source = (
        "--env-arg only (another env than the run's)"
        if other_env
        else "run: env.kwargs"
        + (" + env.val_kwargs" if mode == "eval" else "")
        + (f"; --env-arg {', '.join(given_env_args)} over it" if given_env_args else "")
    )
    rows.insert(2, ("env kwargs", json.dumps(args.env_kwargs, default=str), source))
    args.chat_template_kwargs = _plain(run.cfg.data.apply_chat_template_kwargs) or {}
    rows.append(("chat template kwargs", json.dumps(args.chat_template_kwargs), "run: data.apply_chat_template_kwargs"))
    args.max_model_len = _context(args)
    _print_used(f"{mode} --run {run.directory}", rows)


def _context(args: argparse.Namespace) -> int | None:
    if args.prompt_length is None or args.response_length is None:
        return None
    return int(args.prompt_length) + int(args.response_length)


def _show(value: Any) -> str:
    return "null" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _print_used(title: str, rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    value_width = min(max(len(r[1]) for r in rows), 60)
    print(f"{title}: settings used", file=sys.stderr)
    for name, value, source in rows:
        print(f"  {name:<{width}}  {value:<{value_width}}  ({source})", file=sys.stderr)
    sys.stderr.flush()


def trained_otherwise(args: argparse.Namespace, given_env_args: dict[str, Any]) -> list[str]:
    """What differs between this command's env settings and those the ``--model`` directory was trained
    and scored with (its ``agentgym_run.json``): one warning, or none."""
    from pathlib import Path

    from agentgym.trainer.training_record import FILE, read_training_record

    model = args.model
    if not model or not Path(str(model)).is_dir():
        return []
    record = read_training_record(model)
    if record is None or not isinstance(record.get("env"), dict) or not record["env"].get("name"):
        return []
    env = record["env"]
    if args.env is not None and args.env != env["name"]:
        return [f"{model} was trained on {env['name']} ({FILE}), not {args.env}"]
    trained = env.get("eval_kwargs") or {}
    defaults = _constructor_defaults(env["name"])
    differ = []
    for key in sorted(set(trained) | set(given_env_args)):
        then = trained.get(key, defaults.get(key, _MISSING))
        now = given_env_args.get(key, defaults.get(key, _MISSING))
        if _comparable(then) != _comparable(now):
            differ.append(f"{key}={_yaml(then)} in training, {_yaml(now)} here")
    rollout = record.get("rollout") or {}
    for flag, now, key in (
        ("--max-turns", args.max_turns, "max_assistant_turns"),
        ("--max-tokens", args.max_tokens, "max_tokens_per_turn"),
    ):
        if rollout.get(key) is not None and now != rollout[key]:
            differ.append(f"{flag} {rollout[key]} in training, {'the env default' if now is None else now} here")
    if not differ:
        return []
    run_dir = record.get("run_dir")
    fix = (
        f"agentgym eval --run {run_dir}"
        if run_dir and Path(run_dir).is_dir()
        else " ".join(f"--env-arg {k}={_yaml(v)}" for k, v in trained.items())
    )
    return [
        f"{model} was trained and scored with other settings ({FILE}): "
        + "; ".join(differ)
        + f". To score it as its run did: {fix}"
    ]


class _Missing:
    def __repr__(self) -> str:
        return "the env default"


_MISSING = _Missing()


def _constructor_defaults(env: str) -> dict[str, Any]:
    """The default arguments of an env's constructor (empty when it cannot be told)."""
    import inspect

    try:
        from agentgym.registry import env_spec

        spec = env_spec(env)
        target = spec.load()
        signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    except Exception:  # noqa: BLE001 - a plugin that does not load: compare with what was given only
        return {}
    defaults = {name: p.default for name, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}
    return {**defaults, **spec.kwargs}  # a preset's own arguments


def _comparable(value: Any) -> str:
    return repr(value) if isinstance(value, _Missing) else json.dumps(value, sort_keys=True, default=str)


def _yaml(value: Any) -> str:
    if isinstance(value, _Missing):
        return repr(value)
    return "''" if value == "" else value if isinstance(value, str) else json.dumps(value, default=str)


def settle_serve_args(args: argparse.Namespace) -> None:
    """``agentgym serve --run DIR``: the run's model and context length (``data.max_prompt_length +
    data.max_response_length``) unless given; prints them. Raises ``RunError``."""
    if args.run:
        run = find_run(args.run)
        rows = []
        if "model" in args.given:
            rows.append(("model", args.model, "flag"))
        else:
            args.model = run.model
            rows.append(("model", run.model, run.model_source))
        if args.max_model_len is None:
            args.max_model_len = run.cfg.data.max_prompt_length + run.cfg.data.max_response_length
            rows.append(("max model len", str(args.max_model_len), "run: data.max_prompt_length + max_response_length"))
        else:
            rows.append(("max model len", str(args.max_model_len), "flag"))
        _print_used(f"serve --run {run.directory}", rows)
    if args.engine != "embedded":
        from agentgym.model.loading import adapter_base

        base = adapter_base(args.model)
        if base is not None:
            raise RunError(
                f"{args.model} holds LoRA adapters on {base}: --engine {args.engine} serves whole models. "
                "Serve it with --engine embedded (it merges them), or export merged weights "
                "(actor_rollout_ref.model.lora_export_merged=true)"
            )
