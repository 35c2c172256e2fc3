"""What several subcommands share: argument types and checks of output locations.

Output locations are checked before anything runs, so a mistake costs
nothing and leaves nothing behind. The rule for ``--out`` (and other output
paths): missing parent directories are created when the command writes, like
``mkdir -p``; so the path must not be an existing file of the wrong kind, and
its nearest existing ancestor must be a directory the user can write to.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from orcasim.errors import UsageError


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def seed_arg(text: str) -> int:
    """An argparse type: a seed, an integer >= 0 (what numpy's generators accept)."""
    value = _int(text, "a seed (an integer >= 0)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed must be an integer >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = _int(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def jobs_arg(text: str) -> int:
    """An argparse type: a number of parallel workers, >= 1, or -1 for every core."""
    value = _int(text, "a number of workers (>= 1, or -1 for every core)")
    if value < 1 and value != -1:
        raise argparse.ArgumentTypeError(
            f"expected a number of workers >= 1 (or -1 for every core), got {text!r}")
    return value


def _creatable(path: Path, what: str) -> None:
    """Raise unless the missing ``path`` can be created (its nearest existing ancestor is a
    writable directory)."""
    for parent in path.absolute().parents:
        if parent.is_symlink() and not parent.exists():
            raise UsageError(f"{what} {path}: {parent} is a broken link")
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{what} {path}: {parent} is not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError(f"{what} {path}: cannot create it in {parent} "
                                 "(permission denied)")
            return


def check_output_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """``path`` as a Path when it is a writable directory or can be created; else a
    :class:`UsageError` naming ``what`` (the option)."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise UsageError(f"{what} {p}: a broken link")
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{what} {p}: exists and is not a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UsageError(f"{what} {p}: the directory is not writable")
        return p
    _creatable(p, what)
    return p


def check_output_file(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """``path`` as a Path when a file can be written there (an existing file is replaced);
    else a :class:`UsageError` naming ``what`` (the option)."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {p}: is a directory")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise UsageError(f"{what} {p}: the file is not writable")
        return p
    if p.is_symlink():
        raise UsageError(f"{what} {p}: a broken link")
    _creatable(p, what)
    return p


def check_input_file(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path when it is a readable file; else a :class:`UsageError`
    ``PATH: cannot read: REASON``."""
    p = Path(path)
    if not p.exists():
        reason = "No such file or directory"
    elif p.is_dir():
        reason = "Is a directory"
    elif not os.access(p, os.R_OK):
        reason = "Permission denied"
    else:
        return p
    raise UsageError(f"{p}: cannot read: {reason}")


def make_parent(path: Path) -> None:
    """Create the missing directories above the output file ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
