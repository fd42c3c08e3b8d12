"""Agent flows: what produces the trajectories, in the synchronous and the asynchronous trainer alike.

Claw-R1's keys, under ``actor_rollout_ref.rollout.agent``:

* ``default_agent_flow``: ``env`` (or null, or Claw-R1's ``single_step_single_turn_agent``) runs
  the TextEnv ``env.name`` (or the dataset rows) with the rollout runner (white box: token-exact
  episodes, partial rollout supported); a name defined in
  ``agent_flow_config_path``; or a target written inline, ``package.module:function``.
* ``agent_flow_config_path``: a YAML list of flows, each ``{name, _target_, ...}``. ``_target_``
  names a black-box agent, ``package.module:function`` or ``package.module.Name``: a function
  ``agent(base_url, api_key, task)`` or a class whose instances are such functions (built with
  the entry's other keys as keyword arguments). Black-box flows run through the gateway
  (``agentgym.gateway.agent_source``), recorded token by token.

``agentgym train --agent module:function`` is the same as ``default_agent_flow=module:function``.

    # flows.yaml
    - name: gsm8k_agent
      _target_: examples.gsm8k_agent:run
    - name: careful_agent
      _target_: my_agents.CarefulAgent      # CarefulAgent(max_turns=3)(base_url, api_key, task)
      max_turns: 3
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from agentgym.config import ConfigError

ENV_FLOW = "env"
ENV_FLOWS = (ENV_FLOW, "single_step_single_turn_agent")  # Claw-R1's default: a dataset row, one turn = the env flow


def load_flow_configs(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``agent_flow_config_path``'s flows by name."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"actor_rollout_ref.rollout.agent.agent_flow_config_path={path} does not exist")
    entries = yaml.safe_load(file.read_text()) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{path} must hold a YAML list of {{name: ..., _target_: ...}} entries")
    flows: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if "name" not in entry or "_target_" not in entry:
            raise ConfigError(f"{path}: every agent flow needs a name and a _target_, got {entry}")
        flows[str(entry["name"])] = dict(entry)
    return flows


def resolve_target(target: str, kwargs: dict[str, Any] | None = None) -> Any:
    """``package.module:function`` / ``package.module.Name`` -> the agent function (a class is
    instantiated with ``kwargs``; a function gets them as keyword arguments)."""
    from agentgym.gateway.agent_source import load_agent
    from agentgym.registry import import_object

    spec = target if ":" in target else ":".join(target.rsplit(".", 1))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = import_object(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"agent flow _target_ {target!r} could not be imported: {exc}") from None
    if inspect.isclass(obj):
        obj = obj(**(kwargs or {}))
    elif kwargs:
        obj = functools.partial(obj, **kwargs)
    return load_agent(obj)


def resolve_agent_flow(cfg: Any, agent: str | None = None) -> Any:
    """None for the env flow; else the black-box agent function the config (or ``--agent``) names."""
    if agent is not None:
        return agent
    section = cfg.actor_rollout_ref.rollout.agent
    name = section.default_agent_flow
    flows = load_flow_configs(section.agent_flow_config_path) if section.agent_flow_config_path else {}
    if name is None or name in ENV_FLOWS:
        return None
    if name in flows:
        entry = dict(flows[name])
        target = str(entry.pop("_target_"))
        entry.pop("name", None)
        return resolve_target(target, entry)
    if ":" in str(name):
        return resolve_target(str(name))
    known = [ENV_FLOW, *flows]
    raise ConfigError(
        f"actor_rollout_ref.rollout.agent.default_agent_flow={name!r} is not one of {', '.join(known)} "
        f"(flows come from agent_flow_config_path), nor a package.module:function"
    )
