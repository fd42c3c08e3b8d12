"""``agentgym envs [PREFIX/] [--all]``: the registered envs, the package of each and whether it has an expert."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--all", action="store_true", help="also list interactions and tools")
    parser.add_argument(
        "family", nargs="?", metavar="PREFIX/", help="list the members of one family of envs (e.g. rg/, ta/, vf/)"
    )


def run(args: argparse.Namespace) -> int:
    from agentgym.envs.base import has_expert
    from agentgym.registry import ENVS, env_family, env_spec, registered

    if args.family:  # `agentgym envs rg/`: the members of one family (imports its package)
        family = env_family(args.family)
        if family.installed_version() is None:
            print(f"error: {family.summary()}", file=sys.stderr)
            return 2
        names = [f"{family.prefix}/{m}" for m in family.members()]
    else:
        names = registered("env")
    rows = []
    for name in names:
        try:
            if name.endswith("/*"):  # a family: one row, its package not imported
                family = env_family(name)
                rows.append((f"{family.prefix}/<{family.member_label}>", ENVS.package(name), "?", family.summary()))
                continue
            spec = env_spec(name)
            expert = {True: "yes", False: "no", None: "?"}[has_expert(spec.load())]
            rows.append((name, spec.package, expert, spec.description))
        except Exception as exc:  # a broken plugin must not hide the others
            rows.append((name, "?", "?", f"failed to load: {exc}"))
    width = max((len(r[0]) for r in rows), default=4)
    pwidth = max((len(r[1]) for r in rows), default=7)
    print(f"{'name':<{width}}  {'package':<{pwidth}}  expert  description")
    for name, package, expert, description in rows:
        print(f"{name:<{width}}  {package:<{pwidth}}  {expert:<6}  {description}")
    if args.all:
        for kind in ("interaction", "tool"):
            print(f"\n{kind}s: {', '.join(registered(kind)) or '(none)'}")
    return 0
