"""``orcasim report DIR``: an HTML (self-contained) and Markdown report of a sweep.

Exit status 2 when DIR is not a sweep directory or ``--out`` cannot be a
directory (missing parents are created).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="write an HTML and Markdown report of a sweep directory")
    r.add_argument("dir", type=Path, metavar="DIR", help="a directory written by orcasim sweep")
    r.add_argument("--out", type=Path, default=None,
                   help="where to write report.html and report.md (default: DIR; created "
                   "with its parents if missing)")
    r.add_argument("--metric", dest="metrics", action="append", default=None,
                   help="metric for the results table (repeatable)")
    r.set_defaults(handler=report)


def report(args: argparse.Namespace) -> int:
    """Check ``--out``, then write the report of the sweep in DIR."""
    from orcasim.commands.common import check_output_dir
    from orcasim.experiments.report import write_report

    if args.out is not None:
        check_output_dir(args.out)
    paths = write_report(args.dir, args.out, args.metrics)
    print(f"wrote {paths['html']} and {paths['markdown']}")
    return 0
