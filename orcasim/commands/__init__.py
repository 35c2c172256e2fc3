"""Subcommands of the ``orcasim`` command line, one module each.

A command module defines ``register(subparsers)``, which adds its parser and
sets ``handler`` to a function ``(args) -> exit status``. Add a module to
:data:`COMMANDS` to make it available.
"""

COMMANDS = [
    "orcasim.commands.run",
    "orcasim.commands.validate",
    "orcasim.commands.listing",
    "orcasim.commands.calibrate",
    "orcasim.commands.sweep",
    "orcasim.commands.compare",
    "orcasim.commands.report",
    "orcasim.commands.trace",
    "orcasim.commands.replay",
    "orcasim.commands.serve",
]
