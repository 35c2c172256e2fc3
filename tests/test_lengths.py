"""Length distributions from data: empirical columns and the ShareGPT / Alpaca presets."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.registry import lengths
from orcasim.spec import build_spec
from orcasim.workload.traces import load_trace


def dist(spec: dict):
    return build_spec(lengths, spec, "len").create()


def exact_mean(mu: float, sigma: float, hi: int) -> float:
    """Mean of clip(floor(lognormal(mu, sigma)), 1, hi), summed over the integers."""
    d = stats.lognorm(s=sigma, scale=np.exp(mu))
    k = np.arange(2, hi)
    return float(d.cdf(2) + (k * (d.cdf(k + 1) - d.cdf(k))).sum() + hi * d.sf(hi))


@pytest.mark.parametrize("name,column,mean", [
    ("sharegpt", "prompt", 161.31), ("sharegpt", "output", 337.99),
    ("alpaca", "prompt", 19.31), ("alpaca", "output", 58.45),
])
def test_presets_have_the_vllm_paper_means(name, column, mean):
    d = dist({"type": name, "column": column})
    mu, sigma, hi = d.SHAPES[column]
    assert exact_mean(mu, sigma, hi) == pytest.approx(mean, rel=2e-4)
    x = d.sample(np.random.default_rng(0), 400_000)
    assert x.min() >= 1 and x.max() <= hi
    assert x.mean() == pytest.approx(mean, rel=0.01)


def test_preset_needs_a_column():
    with pytest.raises(ScenarioError, match=r"len\.column: required field is missing"):
        build_spec(lengths, {"type": "sharegpt"}, "len")


def test_empirical_bootstrap_draws_the_columns_values():
    d = dist({"type": "empirical", "file": "arxiv_lengths", "column": "output"})
    col = load_trace("arxiv_lengths").output_len
    x = d.sample(np.random.default_rng(5), 1000)
    assert x.tolist() == col[np.random.default_rng(5).integers(0, 1000, size=1000)].tolist()


def test_empirical_in_order_and_inline_values():
    d = dist({"type": "empirical", "values": [5, 7, 9], "sample": "in_order"})
    assert d.sample(np.random.default_rng(0), 2).tolist() == [5, 7]
    with pytest.raises(OrcasimError, match="3 values, fewer than the 4 requests"):
        d.sample(np.random.default_rng(0), 4)
    d = dist({"type": "empirical", "values": [5, 700], "max": 100})
    assert set(d.sample(np.random.default_rng(0), 50).tolist()) == {5, 100}


@pytest.mark.parametrize("spec,msg", [
    ({"file": "arxiv_lengths"}, "column .* is required with file"),
    ({"file": "arxiv_lengths", "values": [1], "column": "prompt"}, "either file"),
    ({"values": []}, "non-empty list"),
])
def test_empirical_rejects_bad_params(spec, msg):
    with pytest.raises(ScenarioError, match=msg):
        build_spec(lengths, {"type": "empirical", **spec}, "len")
