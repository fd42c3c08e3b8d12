"""One registry for environments, interactions, tools and reward functions.

Built-ins and third-party packages arrive the same way: entry points in the groups
``agentgym.envs``, ``agentgym.interactions``, ``agentgym.tools`` and ``agentgym.reward_fns``.
Entry points are listed without importing them; an object is imported the first time it is asked
for. An ``agentgym.envs`` entry point names a ``TextEnv`` subclass or an ``EnvSpec``; an
``agentgym.reward_fns`` one a function ``(messages, task) -> reward`` that a gateway session's task
names (``{"reward_fn": "gsm8k"}``, see ``agentgym.gateway.rewards``); the other groups name a class.

A family of envs whose names are only known once a package is imported (``rg/<task>`` for
every reasoning-gym dataset) is one entry point named ``<prefix>/*`` that names an
``EnvFamily``: ``agentgym envs`` shows it as one row without importing the package, and
``make("rg/chain_sum")`` asks the family for that member's ``EnvSpec``.

Every env is also registered with Gymnasium as ``agentgym/<Name>-v0`` (a family member when
it is first resolved).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.metadata
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

GROUPS = {
    "env": "agentgym.envs",
    "interaction": "agentgym.interactions",
    "tool": "agentgym.tools",
    "reward_fn": "agentgym.reward_fns",
}


@dataclass(frozen=True)
class EnvSpec:
    """The whole truth about a registered environment.

    ``entry_point`` is a class/factory or a ``"module:attr"`` string; ``kwargs`` are the
    defaults passed to it (a preset is a spec with the same entry point and other kwargs).
    """

    name: str
    entry_point: str | Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    package: str = ""

    @property
    def gym_id(self) -> str:
        return f"agentgym/{gym_name(self.name)}-v0"

    def load(self) -> Callable[..., Any]:
        return import_object(self.entry_point) if isinstance(self.entry_point, str) else self.entry_point

    def make(self, **kwargs: Any) -> Any:
        return self.load()(**{**self.kwargs, **kwargs})


class EnvFamily:
    """Env names under one prefix that a package defines at import time (``rg/<task>``).

    Registered as an ``agentgym.envs`` entry point named ``<prefix>/*``. Subclasses implement
    ``members()`` (the member names; may import the package, so it is called only when a
    member is asked for or listed) and ``member_spec(member)`` (the ``EnvSpec`` of one).
    ``requires`` is the distribution that provides the members and ``extra`` the agentgym
    extra that installs it; ``installed()`` checks the former without importing anything.
    ``open_ended``: members that ``members()`` does not list are still tried (``vf/<module>``
    takes any importable module).
    """

    prefix: str = ""
    member_label: str = "name"
    description: str = ""
    requires: str = ""
    extra: str = ""
    open_ended: bool = False

    def members(self) -> list[str]:
        raise NotImplementedError

    def member_spec(self, member: str) -> EnvSpec:
        raise NotImplementedError

    def installed_version(self) -> str | None:
        if not self.requires:
            return ""
        try:
            return importlib.metadata.version(self.requires)
        except importlib.metadata.PackageNotFoundError:
            return None

    def install_hint(self) -> str:
        return f"pip install 'agentgym[{self.extra}]'" if self.extra else f"pip install {self.requires}"

    def summary(self) -> str:
        """One line for ``agentgym envs``: what the family holds and whether it is installed."""
        version = self.installed_version()
        if version is None:
            state = f"{self.requires} not installed: {self.install_hint()}"
        else:
            state = (
                f"{self.requires} {version}; " if self.requires else ""
            ) + f"`agentgym envs {self.prefix}/` lists them"
        return f"{self.description} ({state})"

    def spec(self, member: str) -> EnvSpec:
        """The member's spec; an unknown member gets the closest names (``UnknownNameError``)."""
        if self.installed_version() is None:
            raise ImportError(f"env {self.prefix}/{member} needs {self.requires}: {self.install_hint()}")
        if not self.open_ended:
            known = self.members()
            if member not in known:
                close = difflib.get_close_matches(member, known, n=3, cutoff=0.5)
                hint = f" Did you mean {', '.join(f'{self.prefix}/{c}' for c in close)}?" if close else ""
                raise UnknownNameError(
                    f"unknown env '{self.prefix}/{member}'.{hint} `agentgym envs {self.prefix}/` "
                    f"lists the {len(known)} {self.prefix}/ envs."
                )
        return self.member_spec(member)


def family_key(name: str) -> str | None:
    """``"rg/chain_sum"`` -> ``"rg/*"`` (the entry-point name of its family); None for a plain name."""
    prefix, sep, member = name.partition("/")
    return f"{prefix}/*" if sep and member and member != "*" else None


@dataclass
class _Entry:
    """A registered name: ``value`` once loaded, else the loader that produces it."""

    name: str
    package: str
    loader: Callable[[], Any] | None = None
    value: Any = None


class UnknownNameError(KeyError):
    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


def gym_name(name: str) -> str:
    """``gsm8k_tool`` -> ``Gsm8kTool``; ``sokoban-6x6-2`` -> ``Sokoban-6x6-2``; ``rg/chain_sum`` -> ``RgChainSum``."""
    parts = [p for p in re.split(r"[_/]+", name) if p]
    return "".join(p[:1].upper() + p[1:] for p in parts)


def import_object(target: str) -> Any:
    """``"package.module:Name"`` (``Name`` may be dotted) -> the object. Raises ``ValueError`` for
    another shape, ``ImportError`` / ``AttributeError`` when it is not there."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"entry point {target!r} must look like 'package.module:Name'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def source_tree_entry_points(group: str) -> dict[str, str]:
    """The entry points of ``group`` that the ``pyproject.toml`` beside this package declares, when the
    package runs from a source tree nobody installed (``PYTHONPATH=checkout``, as on a GPU image
    with its own Python): the installed metadata that normally lists the built-in envs is missing."""
    path = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        import tomllib
    except ImportError:  # Python 3.10: install the package (pip install -e .) to get its entry points
        return {}
    try:
        project = tomllib.loads(path.read_text()).get("project", {})
    except (OSError, ValueError):
        return {}
    if project.get("name") != "agentgym":
        return {}
    return dict(project.get("entry-points", {}).get(group, {}))


class Registry:
    """Names to objects for one kind (``env``, ``interaction`` or ``tool``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.group = GROUPS[kind]
        self._entries: dict[str, _Entry] = {}
        self._members: dict[str, _Entry] = {}  # family members resolved so far (not listed by names())
        self._discovered = False
        self._lock = threading.RLock()

    def discover(self, force: bool = False) -> None:
        """Read the entry points of every installed distribution (no imports happen here)."""
        with self._lock:
            if self._discovered and not force:
                return
            own = False
            for ep in entry_points(group=self.group):
                if ep.name in self._entries and self._entries[ep.name].loader is None:
                    continue  # registered in code: that wins over an installed entry point
                package = ep.dist.name if ep.dist is not None else ""
                own = own or package == "agentgym"
                self._entries[ep.name] = _Entry(ep.name, package, loader=ep.load)
            if not own:  # a source tree on sys.path, never installed: its pyproject.toml declares the built-ins
                for name, target in source_tree_entry_points(self.group).items():
                    if name not in self._entries:
                        self._entries[name] = _Entry(name, "agentgym", loader=functools.partial(import_object, target))
            self._discovered = True
            if self.kind == "env":
                for name in self._entries:
                    if not name.endswith("/*"):
                        _register_with_gymnasium(name)

    def register(self, name: str, value: Any, package: str = "") -> None:
        with self._lock:
            self._entries[name] = _Entry(name, package or _package_of(value), value=value)
            if self.kind == "env" and not name.endswith("/*"):
                _register_with_gymnasium(name)

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._entries)

    def package(self, name: str) -> str:
        return self._entry(name).package

    def get(self, name: str) -> Any:
        entry = self._entry(name)
        with self._lock:
            if entry.loader is not None:
                try:
                    entry.value = entry.loader()
                except Exception as exc:
                    raise ImportError(
                        f"{self.kind} {name!r} (from package {entry.package or '?'}) failed to load: {exc}"
                    ) from exc
                entry.loader = None
            return entry.value

    def _entry(self, name: str) -> _Entry:
        self.discover()
        entry = self._entries.get(name) or self._members.get(name)
        if entry is not None:
            return entry
        key = family_key(name)
        if key is not None and key in self._entries:
            family = self.get(key)
            spec = family.spec(name.partition("/")[2])
            with self._lock:
                entry = self._members[name] = _Entry(name, self._entries[key].package, value=spec)
            _register_with_gymnasium(name)
            return entry
        raise UnknownNameError(self._unknown_message(name))

    def _unknown_message(self, name: str) -> str:
        known = sorted(self._entries)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return (
            f"unknown {self.kind} {name!r}.{hint} Registered {self.kind}s: {', '.join(known) or '(none)'}. "
            f"Register one with agentgym.register(...) or an {self.group!r} entry point."
        )


def _package_of(value: Any) -> str:
    module = getattr(value, "__module__", None) or type(value).__module__
    return module.split(".")[0]


ENVS = Registry("env")
INTERACTIONS = Registry("interaction")
TOOLS = Registry("tool")
REWARD_FNS = Registry("reward_fn")
_REGISTRIES = {"env": ENVS, "interaction": INTERACTIONS, "tool": TOOLS, "reward_fn": REWARD_FNS}


def env_spec(name: str) -> EnvSpec:
    """The ``EnvSpec`` for a registered env name (a class entry point gets a plain spec)."""
    value = ENVS.get(name)
    package = ENVS.package(name)
    if isinstance(value, EnvSpec):
        return replace(value, name=name, package=value.package or package)
    doc = (getattr(value, "__doc__", None) or "").strip().splitlines()
    return EnvSpec(name=name, entry_point=value, description=doc[0] if doc else "", package=package)


def make(name: str, **kwargs: Any) -> Any:
    """Build a registered environment: ``agentgym.make("sokoban", dim_room=(8, 8))``."""
    spec = env_spec(name)
    env = spec.make(**kwargs)
    with contextlib.suppress(AttributeError):  # a plain gym.Env may forbid new attributes
        env.spec_name = name
    return env


def register(
    name: str, entry_point: Any, *, kind: str = "env", kwargs: dict[str, Any] | None = None, description: str = ""
) -> None:
    """Register an env (class, factory, ``"module:attr"`` or ``EnvSpec``), an interaction, a tool or a
    reward function (``kind="reward_fn"``: ``fn(messages, task) -> float``)."""
    registry = _REGISTRIES.get(kind)
    if registry is None:
        raise ValueError(f"kind must be one of {sorted(_REGISTRIES)}, got {kind!r}")
    if (
        kind == "env"
        and not isinstance(entry_point, EnvSpec)
        and (kwargs or description or isinstance(entry_point, str))
    ):
        entry_point = EnvSpec(name=name, entry_point=entry_point, kwargs=dict(kwargs or {}), description=description)
    elif isinstance(entry_point, str):
        entry_point = import_object(entry_point)
    registry.register(name, entry_point)


def registered(kind: str = "env") -> list[str]:
    """Sorted names registered for ``kind`` (``env``, ``interaction``, ``tool`` or ``reward_fn``); a family
    appears once, as ``<prefix>/*`` (``env_family(prefix).members()`` lists it)."""
    return _REGISTRIES[kind].names()


def env_family(prefix: str) -> EnvFamily:
    """The family registered as ``<prefix>/*`` (``"rg"``, ``"rg/"`` and ``"rg/*"`` all work)."""
    key = prefix.rstrip("/*") + "/*"
    family = ENVS.get(key)
    if not isinstance(family, EnvFamily):
        raise TypeError(f"{key} names {family!r}, not an agentgym.registry.EnvFamily")
    return family


def _register_with_gymnasium(name: str) -> None:
    import gymnasium

    gym_id = f"agentgym/{gym_name(name)}-v0"
    if gym_id in gymnasium.registry:
        return

    def _factory(**kwargs: Any) -> Any:
        return make(name, **kwargs)

    gymnasium.register(id=gym_id, entry_point=_factory, disable_env_checker=True)


# Gymnasium has no plugin discovery of its own, so every installed env is registered with it
# on import: `import agentgym; gymnasium.make("agentgym/Sokoban-v0")` works. This reads
# entry-point metadata only; no env module is imported.
ENVS.discover()
