"""The tutorial notebook runs top to bottom and shows what its text claims.

CI has no Jupyter: the notebook's code cells are executed in order, in one
namespace, with the standard library's json and matplotlib's Agg backend.
"""

from __future__ import annotations

import json

import matplotlib
import pytest
from conftest import ROOT

NOTEBOOK = ROOT / "docs" / "notebooks" / "seed_to_priority.ipynb"


def _code_cells(path) -> list[str]:
    """The source of every code cell, in order."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.fixture(scope="module")
def namespace(tmp_path_factory) -> dict:
    """The notebook's variables after running every code cell in a temporary directory."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns: dict = {"__name__": "__main__"}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("notebook"))
        for i, source in enumerate(_code_cells(NOTEBOOK)):
            exec(compile(source, f"{NOTEBOOK.name}[{i}]", "exec"), ns)
    plt.close("all")
    return ns


def test_notebook_is_stored_clean():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


def test_seed_study_continuous_beats_static(namespace):
    s = namespace["seed_res"].summary
    assert s["continuous"]["throughput_tok_s"] == pytest.approx(198.49600095812394, rel=1e-9)
    assert s["static"]["throughput_tok_s"] == pytest.approx(178.805, rel=1e-5)
    means = namespace["seed_means"]
    assert means.loc["continuous", "throughput_tok_s"] > means.loc["static", "throughput_tok_s"]
    assert means.loc["continuous", "mean_batch_size"] > 3 * means.loc["static",
                                                                       "mean_batch_size"]
    assert namespace["gain"] > 1.05
    assert len(namespace["seed_runs"]) == 2 * len(namespace["SEEDS"])
    waits = namespace["waits"]
    assert waits.loc["static", "queue_delay"] > waits.loc["continuous", "queue_delay"]


def test_priority_trade_off(namespace):
    first = namespace["prio_res"].summary
    assert (first["strict"]["class.interactive.ttft_p99"]
            < first["fcfs"]["class.interactive.ttft_p99"] / 5)
    means = namespace["prio_means"]
    ttft = means["ttft_p99"]
    tput = means["throughput_tok_s"]
    assert ttft["strict", "interactive"] < ttft["share-4", "interactive"] < ttft[
        "fcfs", "interactive"]
    assert tput["strict", "batch"] < tput["fcfs", "batch"]
    assert ttft["strict", "batch"] > ttft["fcfs", "batch"]


def test_below_capacity_the_settings_coincide(namespace):
    assert namespace["light_gap"] == 0.0
    fig = namespace["fig"]
    assert fig.axes[0].get_ylabel() == "TTFT p99 (s)"
