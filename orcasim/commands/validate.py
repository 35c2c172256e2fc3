"""``orcasim validate``: check a scenario as ``run`` would and print its resolved variants.

Short of simulating, it makes every check ``orcasim run`` makes (see
:mod:`orcasim.commands.preflight`): the scenario validates, and each
variant's KV memory, policy, clients, latency model and admission
controllers build, and its workload can be drawn.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("validate", help="check a scenario file and print its resolved variants")
    v.add_argument("scenario", help="scenario YAML file or built-in name (e.g. seed_orca)")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a scenario field before checking it, e.g. "
                   "--set policy.max_batch=16 (repeatable)")
    v.set_defaults(handler=validate)


def validate(args: argparse.Namespace) -> int:
    """Check every variant of the scenario; print ``ok`` and each resolved variant."""
    import json

    from orcasim.commands.preflight import check_scenario
    from orcasim.scenario import load_scenario

    sc = load_scenario(args.scenario, args.overrides or None)
    check_scenario(sc)
    print(f"{sc.source}: ok, {len(sc.variants)} variant(s)")
    for v in sc.variants:
        print(f"--- {v.name}")
        print(json.dumps(v.to_dict(), indent=2))
    return 0
