"""The claims of docs/seed-study.md, checked on the study's own code."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def two_x():
    spec = importlib.util.spec_from_file_location("two_x", ROOT / "docs" / "studies" / "two_x.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ratio_depends_on_fixed_share_and_load(two_x):
    rows = two_x.study(requests=500, seed=0, bases=(0.0, 0.005, 0.1), loads=(0.5, 15.0))
    r = {(row["base_s"], row["load"]): row for row in rows}
    # no fixed cost: a step's price is proportional to its tokens, batching cannot matter
    assert r[(0.0, 15.0)]["ratio"] == pytest.approx(1.0, abs=1e-9)
    assert r[(0.0, 15.0)]["fixed_share"] == 0.0
    # the notebook's model: 1.11x, not 2x
    assert r[(0.005, 15.0)]["ratio"] == pytest.approx(1.11, abs=0.005)
    assert 0.03 < r[(0.005, 15.0)]["fixed_share"] < 0.05
    # a large fixed share under overload: past 2x
    assert r[(0.1, 15.0)]["ratio"] > 2.0
    # below capacity both keep up with arrivals
    assert r[(0.005, 0.5)]["ratio"] == pytest.approx(1.0, abs=0.01)
