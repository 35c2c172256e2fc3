"""``orcasim report DIR``: an HTML (self-contained) and Markdown report of a sweep."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="write an HTML and Markdown report of a sweep directory")
    r.add_argument("dir", type=Path, metavar="DIR", help="a directory written by orcasim sweep")
    r.add_argument("--out", type=Path, default=None,
                   help="where to write report.html and report.md (default: DIR)")
    r.add_argument("--metric", dest="metrics", action="append", default=None,
                   help="metric for the results table (repeatable)")
    r.set_defaults(handler=report)


def report(args: argparse.Namespace) -> int:
    from orcasim.experiments.report import write_report

    paths = write_report(args.dir, args.out, args.metrics)
    print(f"wrote {paths['html']} and {paths['markdown']}")
    return 0
