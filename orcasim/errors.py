"""Errors that reach the user as one line, and the exit status each one gives.

Anything a user can get wrong (a scenario field, a trace row, an impossible
configuration) raises a subclass of :class:`OrcasimError`. The command line
prints ``orcasim: error: <str(error)>`` and exits with the error's
``exit_code``; it never shows a traceback for these. The policy of every
``orcasim`` subcommand:

- 0: done;
- 1: a run failed (:class:`SimulationError`, a sweep with failed runs, a
  step trace that differs from its reference);
- 2: a usage or input error (:class:`UsageError`, :class:`ScenarioError`):
  bad arguments, a missing or unreadable file, a malformed scenario or
  trace, an output location that cannot be written.
"""

from __future__ import annotations

#: exit status of a run that failed
EXIT_FAILED = 1
#: exit status of a usage or input error
EXIT_USAGE = 2


class OrcasimError(Exception):
    """Base class for errors caused by user input; ``str()`` is the one-line message."""

    exit_code = EXIT_FAILED


class UsageError(OrcasimError):
    """Bad arguments, or an input or output path that cannot be used: nothing was run."""

    exit_code = EXIT_USAGE


class ScenarioError(UsageError):
    """A scenario file or override is malformed: names the file and the field."""

    def __init__(self, field: str, message: str, source: str | None = None) -> None:
        super().__init__(field, message, source)
        self.field = field
        self.message = message
        self.source = source

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        at = f"{self.field}: " if self.field else ""
        return f"{where}{at}{self.message}"


class SimulationError(OrcasimError):
    """The model reached a state it cannot leave (a stalled policy, no progress): a failed run."""

    exit_code = EXIT_FAILED


class FailedRunsWarning(UserWarning):
    """Some runs of a sweep failed; their rows hold the error and no metrics."""


def as_usage_error(err: OrcasimError) -> OrcasimError:
    """``err`` as a :class:`UsageError` (same message), unless it is a failed run.

    For errors raised while reading inputs by code that does not say which
    kind of error it raises (a plain :class:`OrcasimError`).
    """
    if isinstance(err, (UsageError, SimulationError)) or err.exit_code == EXIT_USAGE:
        return err
    return UsageError(str(err))
