"""The ``orcasim`` command line.

    orcasim run [SCENARIO] [--out DIR] [--seed N] [--steps] [--set FIELD=VALUE ...]
    orcasim validate SCENARIO
    orcasim scenarios
    orcasim policies
    orcasim calibrate MEASUREMENTS.csv [--model linear|roofline]
    orcasim replay-vllm RUN_DIR --workload W.jsonl --profiles DIR --out OUT
    orcasim serve [SCENARIO] [--host 127.0.0.1] [--port 8000]

Every subcommand also takes ``--import FILE_OR_MODULE`` (repeatable): a
plugin, a ``.py`` file or an importable module whose decorators register
components (a policy written in a file), loaded before anything else.

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
from typing import Any, NoReturn

from orcasim.commands import COMMANDS
from orcasim.errors import EXIT_USAGE, OrcasimError, UsageError
from orcasim.plugins import load_plugins


class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes are a :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


IMPORT_HELP = ("a plugin to import first: a .py file or a module name whose decorators "
               "register components, e.g. a policy (repeatable)")


def _add_import_option(parser: argparse.ArgumentParser, dest: str) -> None:
    parser.add_argument("--import", dest=dest, action="append", default=[],
                        metavar="FILE_OR_MODULE", help=IMPORT_HELP)


class _CommandParser(_Parser):
    """The parser of a subcommand: every one takes the global ``--import`` option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_import_option(self, "imports")

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _Parser)  # ``--import`` once, on the command
        return super().add_subparsers(**kwargs)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="orcasim", description="Discrete-event simulation of LLM inference serving.")
    _add_import_option(p, "global_imports")  # before the subcommand: its own dest, not overwritten
    sub = p.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orcasim`` command; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        load_plugins([*args.global_imports, *args.imports])
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
