"""Translating another system's config file into agentgym's: the engine every translator shares.

A translator is a table of ``KeyMap`` rows (their dotted key pattern -> what it becomes here) plus a
``derive`` function for the settings computed from several of their keys (batch sizes counted in
trajectories vs tasks, env tables). ``translate`` walks every leaf of their file, so each key is
either mapped (their key, agentgym key, value), dropped with the reason it has no effect, or
refused with the reason agentgym cannot honour it; nothing is silently lost. ``Translation.report``
prints that; ``Translation.yaml`` is a config for ``agentgym train --config``. The same tables
render the "coming from X" pages (``docs.py``).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from agentgym.config import flatten, number_or_value

ANY = object()


@dataclass(frozen=True)
class KeyMap:
    """One row of a translator's table.

    ``kind``: ``map`` (the value goes to ``target``, through ``convert``), ``derived`` (``target``
    is computed by the translator's ``derive`` from this and other keys; ``note`` says how),
    ``ignore`` (no effect here; ``note`` says why) or ``refuse`` (agentgym cannot honour it; ``note``
    says what to use). With ``unless``, an ``ignore`` row holds only for those values; any other is
    refused.
    """

    pattern: str
    target: str | None = None
    kind: str = "map"
    note: str = ""
    convert: Callable[[Any], Any] | None = None
    unless: Sequence[Any] | object = ANY

    def doc_target(self) -> str:
        if self.kind in ("map", "derived"):
            return f"`{self.target}`"
        return {"ignore": "no effect", "refuse": "refused"}[self.kind]


@dataclass
class Translation:
    """The result: agentgym's config and where every key of theirs went."""

    system: str
    config: dict[str, Any] = field(default_factory=dict)
    mapped: list[tuple[str, str, Any]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    derived: list[tuple[str, str, str]] = field(default_factory=list)  # their key, agentgym key, how
    notes: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, source: str | None = None) -> None:
        """Set agentgym ``key`` (dotted) to ``value``; ``source`` names their key(s) it came from."""
        node = self.config
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        if source is not None:
            self.mapped.append((source, key, value))

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def yaml(self) -> str:
        header = (
            f"# agentgym config translated from a {self.system} config by `agentgym config --from "
            f"{self.system}`.\n# Run: agentgym train --config THIS_FILE [overrides]\n"
        )
        return header + yaml.safe_dump(self.config, sort_keys=False, default_flow_style=None)

    def summary(self) -> str:
        """The report without the mapped and dropped lists: the counts, what is not honoured, the notes."""
        lines = self.report().splitlines()[:1]
        if self.refused:
            lines.append("NOT honoured (agentgym cannot do what these ask):")
            lines += [f"  {key}: {why}" for key, why in self.refused]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def report(self) -> str:
        lines = [
            f"{self.system} -> agentgym: {len(self.mapped)} setting(s) mapped, {len(self.dropped)} with no "
            f"effect, {len(self.refused)} not honoured"
        ]
        if self.mapped:
            lines.append("mapped:")
            width = max(len(m[0]) for m in self.mapped)
            lines += [f"  {theirs:<{width}} -> {ours} = {value!r}" for theirs, ours, value in self.mapped]
        if self.derived:
            lines.append("used to compute:")
            lines += [f"  {theirs} -> {ours} ({how})" for theirs, ours, how in self.derived]
        if self.dropped:
            lines.append("no effect in agentgym (dropped):")
            lines += [f"  {key}: {why}" for key, why in self.dropped]
        if self.refused:
            lines.append("NOT honoured (agentgym cannot do what these ask):")
            lines += [f"  {key}: {why}" for key, why in self.refused]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def first_match(table: Sequence[KeyMap], key: str) -> KeyMap | None:
    return next((row for row in table if fnmatch.fnmatchcase(key, row.pattern)), None)


def _harmless(value: Any, allowed: Any) -> bool:
    return any(value == v or (v == {} and value in ({}, None)) for v in allowed)


def _read(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping at the top level")
    return data


def load_their_yaml(path: str, keep_interpolations_to: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Their file as a plain mapping, ``${...}`` interpolations resolved where they can be. A Hydra
    ``defaults`` list naming files beside it (``../config/traj_envs@_here_``) is merged in first, as
    Hydra would; entries that are not files here are kept as data (the translator reports them).
    ``keep_interpolations_to``: an interpolation whose every target passes it stays as written, so an
    override of the target still reaches it when agentgym loads the result (veRL's keys are agentgym's)."""
    file = Path(path)
    data = _read(file)
    merged: dict[str, Any] = {}
    kept = []
    for entry in data.get("defaults") or []:
        name = str(entry).split("@")[0] if isinstance(entry, str) else None
        included = file.parent / f"{name}.yaml" if name else None
        if included is not None and included.is_file() and str(entry).endswith(("@_here_", name)):
            merged = OmegaConf.to_container(OmegaConf.merge(merged, _read(included)))
        elif entry != "_self_":
            kept.append(entry)
    data = {k: v for k, v in data.items() if k != "defaults"}
    if kept:
        data["defaults"] = kept
    conf = OmegaConf.merge(merged, data) if merged else OmegaConf.create(data)
    raw = OmegaConf.to_container(conf, resolve=False)
    out: dict[str, Any] = {}
    for key, value in flatten(raw).items():
        if isinstance(value, str) and "${" in value:
            targets = interpolation_targets(value)
            if keep_interpolations_to and targets and all(keep_interpolations_to(t) for t in targets):
                _put(out, key, value)
                continue
            try:
                value = OmegaConf.select(conf, key, throw_on_resolution_failure=True)
                value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            except Exception:  # noqa: BLE001 - an interpolation into a file we do not have: keep the raw text
                pass
        _put(out, key, value)
    return out


def interpolation_targets(text: str) -> list[str] | None:
    """The keys ``${a.b}`` and ``${oc.select:a.b,default}`` in ``text`` point at; None when it uses another
    resolver or a relative key (it can only be resolved where it is)."""
    targets = []
    for inner in re.findall(r"\$\{([^}]*)\}", text):
        key = inner.partition(":")[2].split(",")[0].strip() if inner.startswith("oc.select:") else inner.strip()
        if not key or key.startswith(".") or ":" in key or not re.fullmatch(r"[\w.]+", key):
            return None
        targets.append(key)
    return targets


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def translate(
    system: str,
    data: dict[str, Any],
    table: Sequence[KeyMap],
    derive: Callable[[Translation, dict[str, Any]], None] | None = None,
    skip: Sequence[str] = (),
) -> Translation:
    """Walk every leaf of ``data`` through ``table`` (see the module docstring). ``skip``: key
    prefixes whose leaves ``derive`` accounts for itself (env tables)."""
    tr = Translation(system)
    for key, value in flatten(data).items():
        if any(key == s or key.startswith(s + ".") for s in skip):
            continue
        row = first_match(table, key)
        if row is None:
            tr.refused.append((key, f"no agentgym equivalent known for this {system} key"))
        elif row.kind == "map":
            tr.set(str(row.target), row.convert(value) if row.convert else number_or_value(value), key)
        elif row.kind == "derived":  # derive() sets the value it computes from this and other keys
            tr.derived.append((key, str(row.target), row.note))
        elif row.kind == "ignore" and (row.unless is ANY or _harmless(value, row.unless)):
            tr.dropped.append((key, row.note))
        elif row.kind == "ignore":
            tr.refused.append((key, f"{value!r}: {row.note}"))
        else:
            tr.refused.append((key, row.note))
    if derive is not None:
        derive(tr, data)
    return tr


def engine_or_embedded(tr: Translation, engine: str | None, source: str) -> None:
    """Their rollout engine, or agentgym's embedded server when that engine is not installed here
    (the note says what to set on a GPU machine)."""
    import importlib.util

    if engine in ("vllm", "sglang") and importlib.util.find_spec(engine) is not None:
        tr.set("actor_rollout_ref.rollout.name", engine, source)
    elif engine in ("vllm", "sglang"):
        tr.set("actor_rollout_ref.rollout.name", "embedded", source)
        tr.notes.append(
            f"{engine} is not installed here: the config uses agentgym's embedded server; on a GPU "
            f"machine with {engine}, set actor_rollout_ref.rollout.name={engine}"
        )
    elif engine:
        tr.refused.append((source, f"{engine!r}: agentgym's rollout engines are embedded, vllm and sglang"))
