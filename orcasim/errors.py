"""Errors that reach the user as one line.

Anything a user can get wrong (a scenario field, a trace row, an impossible
configuration) raises a subclass of :class:`OrcasimError`. The command line
prints ``str(error)`` and exits non-zero; it never shows a traceback for these.
"""

from __future__ import annotations


class OrcasimError(Exception):
    """Base class for errors caused by user input; ``str()`` is the one-line message."""

    exit_code = 1


class ScenarioError(OrcasimError):
    """A scenario file or override is malformed: names the file and the field."""

    exit_code = 2

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
    """The model reached a state it cannot leave (a stalled policy, no progress)."""

    exit_code = 3
