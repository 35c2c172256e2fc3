"""Shared fixtures: the seed notebook's loop (the parity baseline) and the repo paths."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


def _load_notebook_loop():
    spec = importlib.util.spec_from_file_location("notebook_loop", ROOT / "benchmarks" /
                                                  "notebook_loop.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["notebook_loop"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def notebook_loop():
    """The seed notebook's simulator, transcribed (benchmarks/notebook_loop.py)."""
    return _load_notebook_loop()
