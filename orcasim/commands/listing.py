"""``orcasim scenarios`` and ``orcasim policies``: what is built in and registered."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("scenarios", help="list the built-in scenarios").set_defaults(handler=scenarios)
    sub.add_parser("policies", help="list the registered scheduling policies").set_defaults(
        handler=policies_)


def scenarios(args: argparse.Namespace) -> int:
    from orcasim.scenario import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        print(f"{name:<24} {load_scenario(name).model.description}")
    return 0


def policies_(args: argparse.Namespace) -> int:
    from orcasim.registry import policies

    for name, cls in policies:
        doc = (cls.__doc__ or "").strip().splitlines()
        print(f"{name:<16} {doc[0] if doc else ''}")
    return 0


