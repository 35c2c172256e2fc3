"""The ``orcasim`` command line.

    orcasim run [SCENARIO] [--out DIR] [--seed N] [--steps] [--set FIELD=VALUE ...]
    orcasim validate SCENARIO
    orcasim scenarios
    orcasim policies
    orcasim calibrate MEASUREMENTS.csv [--model linear|roofline]

Each subcommand lives in its own module under :mod:`orcasim.commands`. A user
mistake prints one line, ``orcasim: error: ...``, and exits non-zero (2 for a
bad scenario); it never prints a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from orcasim.commands import COMMANDS
from orcasim.errors import OrcasimError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="orcasim", description="Discrete-event simulation of LLM inference serving."
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orcasim`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    import orcasim  # noqa: F401  (registers the built-in components)

    try:
        return int(args.handler(args))
    except OrcasimError as err:
        print(f"orcasim: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("orcasim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
