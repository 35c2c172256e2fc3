"""The ``orcasim`` command line.

    orcasim run [SCENARIO] [--out DIR] [--seed N] [--steps] [--set FIELD=VALUE ...]
    orcasim validate SCENARIO
    orcasim scenarios
    orcasim policies
    orcasim calibrate MEASUREMENTS.csv [--model linear|roofline]

Each subcommand lives in its own module under :mod:`orcasim.commands`. A user
mistake prints one line, ``orcasim: error: ...``, and never a traceback. Every
subcommand exits with the same statuses (see :mod:`orcasim.errors`): 0 when
done, 1 when a run failed, 2 for a usage or input error (bad arguments, a
missing or malformed file, an output location that cannot be written), 130
when interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from orcasim.commands import COMMANDS
from orcasim.errors import EXIT_USAGE, OrcasimError, UsageError


class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes are a :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orcasim", description="Discrete-event simulation of LLM inference serving.")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orcasim`` command; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        import orcasim  # noqa: F401  (registers the built-in components)

        return int(args.handler(args))
    except OrcasimError as err:
        return _fail(str(err), err.exit_code)
    except KeyboardInterrupt:
        print("orcasim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`
        sys.stderr.close()
        return 0
    except OSError as err:  # a file that vanished or a disk that filled up after the checks
        if err.filename is None:
            raise
        return _fail(f"{err.filename}: {err.strerror or err}", EXIT_USAGE)


def _fail(message: str, status: int) -> int:
    print(f"orcasim: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
