"""Run and report figures: titles, units, log scales, Gantt labels; plotting stays lazy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from orcasim.experiments import report_plots
from orcasim.metrics import plots
from orcasim.scenario import load_scenario
from orcasim.simulation import simulate

pytest.importorskip("matplotlib")


def _run(name: str, overrides: dict[str, object] | None = None,  # type: ignore[no-untyped-def]
         variants: list[str] | None = None):
    sc = load_scenario(f"scenarios/{name}.yaml")
    return simulate(sc.override(overrides) if overrides else sc, 0, variants=variants)


@pytest.fixture(scope="module")
def seed():  # type: ignore[no-untyped-def]
    return _run("seed_orca", {"workload.num_requests": 100})


@pytest.fixture(scope="module")
def two_slots():  # type: ignore[no-untyped-def]
    return _run("article_two_slots")


@pytest.fixture(scope="module")
def classes():  # type: ignore[no-untyped-def]
    return _run("priority_classes", {"workload.num_requests": 60}, ["fcfs", "strict"])


def _close(fig) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_every_run_figure_names_scenario_variants_and_requests(seed, tmp_path):
    for make in (plots.gantt, plots.latency_cdfs, plots.timeline):
        fig = make(seed)
        title = fig.get_suptitle()
        assert title.startswith("seed_orca: static (static, max_batch=32) vs continuous")
        assert "100 requests, seed 0" in title
        for ax in fig.axes:
            if ax.get_xlabel():
                assert ax.get_xlabel().endswith(("(s)", "(steps)"))
            if ax.get_ylabel():
                assert "(" in ax.get_ylabel() or ax.get_ylabel().startswith(("request", "frac"))
        _close(fig)
    assert [p.name for p in plots.write_all(seed, tmp_path)] == \
        ["gantt.png", "latency_cdf.png", "timeline.png"]


def test_latency_axes_are_log_only_when_the_data_span_two_decades(seed):
    fig = plots.latency_cdfs(seed)
    df = seed.requests
    df = df[df["state"] == "finished"]
    for ax, col in zip(fig.axes, ("ttft", "tpot", "e2e"), strict=True):
        expected = plots.wants_log(df[col])
        assert (ax.get_xscale() == "log") == expected, col
    assert [ax.get_xscale() for ax in fig.axes] == ["log", "linear", "log"]
    _close(fig)
    assert plots.wants_log([0.01, 0.5, 2.0]) and not plots.wants_log([0.06, 0.2, 5.0])


def test_two_slot_gantt_uses_request_names_and_steps(two_slots):
    fig = plots.gantt(two_slots)
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "C", "D"]
        lo, hi = ax.get_xlim()
        assert lo == 0 and hi >= 7
    assert fig.axes[-1].get_xlabel() == "time (steps)"
    assert "all 4 requests" in fig.get_suptitle()
    _close(fig)
    fig = plots.timeline(two_slots)
    ticks = fig.axes[0].get_yticks()
    assert np.allclose(ticks, np.round(ticks))
    _close(fig)


def test_gantt_says_when_it_shows_part_of_the_run(seed):
    fig = plots.gantt(seed, num_requests=30)
    assert "first 30 of 100 requests" in fig.get_suptitle()
    finish = seed["static"].requests.sort_values("id").head(30)["finish"].max()
    assert fig.axes[0].get_xlim()[1] >= finish
    assert fig.axes[0].get_xlabel() == "" and fig.axes[-1].get_xlabel() == "time (s)"
    _close(fig)


def test_class_workloads_get_a_row_of_cdf_panels_per_class(classes):
    fig = plots.latency_cdfs(classes)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["class interactive"] * 3 + ["class batch"] * 3
    assert "priority_classes" in fig.get_suptitle() and "60 requests" in fig.get_suptitle()
    assert not any("queue" in ax.get_xlabel() for ax in fig.axes)
    _close(fig)


def test_report_axis_labels_units_and_log_scale():
    assert report_plots.param_label("workload.arrival.rate") == "arrival rate (req/s)"
    assert report_plots.param_label("policy.some_knob") == "some knob"
    rows = [(v, rate, m, mean) for v, m, vals in [
        ("static", "ttft_p99", [0.5, 200]), ("continuous", "ttft_p99", [0.06, 0.2]),
        ("static", "throughput_tok_s", [100, 200]), ("continuous", "throughput_tok_s", [150, 300])]
        for rate, mean in zip([1.0, 2.0], vals, strict=True)]
    agg = pd.DataFrame(rows, columns=["variant", "workload.arrival.rate", "metric", "mean"])
    agg["low"], agg["high"] = agg["mean"], agg["mean"]
    fig = report_plots.metric_vs_param(agg, "workload.arrival.rate",
                                       ["ttft_p99", "throughput_tok_s"])
    ttft, tput = fig.axes[:2]
    assert ttft.get_xlabel() == "arrival rate (req/s)"
    assert ttft.get_yscale() == "log" and tput.get_yscale() == "linear"
    _close(fig)


def test_report_alt_text_has_no_markdown():
    import matplotlib.pyplot as plt

    from orcasim.experiments.report import Doc

    doc = Doc("t")
    doc.figure("f", plt.figure(), "Mean against `workload.arrival.rate`.")
    assert "alt='Mean against workload.arrival.rate.'" in doc.html()
    assert "![Mean against workload.arrival.rate.](img/f.png)" in doc.markdown("img")


def test_import_orcasim_does_not_import_plotting_libraries():
    code = ("import orcasim, orcasim.metrics.plots, sys; "
            "print('seaborn' in sys.modules, 'matplotlib' in sys.modules, 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False", "False"]
