"""``orcasim validate``: check a scenario and print its resolved variants."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("validate", help="check a scenario file and print its resolved variants")
    v.add_argument("scenario")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE")
    v.set_defaults(handler=validate)


def validate(args: argparse.Namespace) -> int:
    import json

    from orcasim.scenario import load_scenario

    sc = load_scenario(args.scenario, args.overrides or None)
    print(f"{sc.source}: ok, {len(sc.variants)} variant(s)")
    for v in sc.variants:
        print(f"--- {v.name}")
        print(json.dumps(v.to_dict(), indent=2))
    return 0


