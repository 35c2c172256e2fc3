"""``orcasim scenarios``, ``policies`` and ``admission``: what is built in and registered."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("scenarios", help="list the built-in scenarios").set_defaults(handler=scenarios)
    sub.add_parser("policies", help="list the registered scheduling policies").set_defaults(
        handler=policies_)
    sub.add_parser("admission", help="list the registered admission controllers").set_defaults(
        handler=admission_)


def scenarios(args: argparse.Namespace) -> int:
    from orcasim.scenario import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        print(f"{name:<24} {load_scenario(name).model.description}")
    return 0


def policies_(args: argparse.Namespace) -> int:
    from orcasim.registry import policies

    return _list(policies)


def admission_(args: argparse.Namespace) -> int:
    from orcasim.registry import admission

    return _list(admission)


def _list(registry) -> int:
    for name, cls in registry:
        doc = (cls.__doc__ or "").strip().splitlines()
        print(f"{name:<16} {doc[0] if doc else ''}")
    return 0


