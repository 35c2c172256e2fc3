"""Profile directories in LLMServingSim's layout: finding, reading and checking them.

A directory (one model and dtype) holds ``meta.yaml`` and ``tp<N>/`` folders
of CSV tables (see :mod:`orcasim.latency.profile`); a name that is not a
directory may be one of the profiles shipped with orcasim.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from orcasim.errors import ScenarioError
from orcasim.latency.profile_moe import moe_file
from orcasim.latency.profile_tables import read_table
from orcasim.latency.skew import SkewFit, load_skew_fit

#: columns of each profile table: (text columns, numeric columns)
DENSE = (("layer",), ("tokens", "time_us"))
PER_SEQUENCE = (("layer",), ("sequences", "time_us"))
ATTENTION = ((), ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))


@dataclass(frozen=True)
class Profile:
    """One TP folder's tables, read and checked."""

    folder: Path
    meta: dict
    dense: dict[str, np.ndarray]
    per_sequence: dict[str, np.ndarray]
    attention: dict[str, np.ndarray]
    skew: SkewFit | None = None
    moe: Path | None = None
    moe_scale: float = 1.0


#: profiles shipped with orcasim (see orcasim/data/profiles/README.md)
BUILTIN_PROFILES = Path(__file__).resolve().parent.parent / "data" / "profiles"


def find_profile(name: str) -> Path:
    """A profile directory: ``name`` as a path, else a built-in profile of that name."""
    directory = Path(name).expanduser()
    if _is_dir(directory):
        return directory.resolve()
    builtin = BUILTIN_PROFILES / name
    if _is_dir(builtin) and (builtin / "meta.yaml").is_file():
        return builtin.resolve()
    known = sorted(str(m.parent.relative_to(BUILTIN_PROFILES))
                   for m in BUILTIN_PROFILES.glob("**/meta.yaml"))
    raise ScenarioError("engine.latency.dir", "profile directory not found (built-in: "
                        f"{', '.join(known) or 'none'})", name)


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a directory; False for a name the system cannot look up (too long)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def read_meta(directory: Path) -> dict:
    """``meta.yaml`` of a profile directory, or ``{}`` when there is none."""
    path = directory / "meta.yaml"
    if not path.is_file():
        return {}
    try:
        meta = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ScenarioError("", f"not valid YAML ({err.__class__.__name__})", str(path)) from None
    return meta if isinstance(meta, dict) else {}


@functools.lru_cache(maxsize=16)
def load_profile(directory: Path, tp: int) -> Profile:
    """The profile of ``directory`` at TP degree ``tp`` (cached per resolved path)."""
    folder = directory / f"tp{tp}"
    if not folder.is_dir():
        raise ScenarioError("engine.latency.tp", f"no profile folder tp{tp}", str(directory))
    meta = read_meta(directory)
    moe, moe_scale = moe_file(directory, tp)
    return Profile(folder, meta,
                   read_table(folder / "dense.csv", *DENSE),
                   read_table(folder / "per_sequence.csv", *PER_SEQUENCE),
                   read_table(folder / "attention.csv", *ATTENTION),
                   load_skew_fit(meta, folder, tp), moe, moe_scale)
