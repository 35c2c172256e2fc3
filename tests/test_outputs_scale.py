"""Outputs that stay cheap at a million requests: Parquet rows, CSV on request, quantile CDFs."""

from __future__ import annotations

import io
import time

import numpy as np
import pandas as pd
import pytest

import orcasim
from orcasim.cli import main
from orcasim.metrics import plots
from orcasim.metrics import request_table as rt
from orcasim.metrics.request_table import request_table
from orcasim.progress import Progress


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal frames, up to how a file spells a missing string (None, NaN)."""
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            np.testing.assert_array_equal(x.astype(float), y.astype(float), err_msg=col)
        else:
            assert [None if pd.isna(v) else v for v in x] == \
                [None if pd.isna(v) else v for v in y], col


def test_parquet_rows_equal_the_requests_frame(tmp_path, monkeypatch):
    reqs = [{"arrival": 0.1 * i, "prompt_len": 5 + i, "output_len": 3 + i % 7,
             **({"name": f"r{i}"} if i % 3 else {})} for i in range(40)]
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": reqs},
        "engine": {"latency": {"type": "constant", "step_time": 0.05}},
        "policy": {"type": "continuous", "max_batch": 4},
        "events": [{"type": "hard_stop", "at": 3.0}],
        "variants": {"a": {}, "b": {"policy": {"max_batch": 2}}},
    })
    res = orcasim.simulate(sc)
    written = res.write(tmp_path, plots=False, requests_csv=True)
    names = {p.name for p in written}
    assert {"requests.parquet", "requests.csv"} <= names
    frame = res.requests
    assert frame["reason"].notna().any() and (frame["name"] != frame["id"].astype(str)).any()
    _same(pd.read_parquet(tmp_path / "requests.parquet"), frame)
    _same(pd.read_csv(tmp_path / "requests.csv"), frame)
    one = next(iter(res.values()))
    _same(request_table(one.columns).to_pandas(), one.requests)
    # the file is written a chunk of rows at a time: chunks of 7 rows give the same rows
    monkeypatch.setattr(rt, "ROWS_PER_CHUNK", 7)
    parts = list(rt.request_tables(one.columns, "a"))
    assert [len(t) for t in parts] == [7] * 5 + [5]
    res.write(tmp_path / "small", plots=False)
    import pyarrow.parquet as pq
    small = pq.ParquetFile(tmp_path / "small" / "requests.parquet")
    assert small.num_row_groups == 12  # two variants of 40 rows, 7 at a time
    _same(small.read().to_pandas(), frame)


def test_parquet_rows_keep_the_send_times_of_variants_with_the_api_server(tmp_path):
    """A column only some variants have (``sent``, with the front end) is null in the others."""
    reqs = [{"arrival": 0.1 * i, "prompt_len": 100, "output_len": 3} for i in range(6)]
    sc = orcasim.Scenario({
        "workload": {"type": "list", "requests": reqs},
        "engine": {"latency": {"type": "constant", "step_time": 0.05}},
        "policy": {"type": "continuous", "max_batch": 4},
        "variants": {"plain": {}, "served": {"engine": {"frontend": {
            "request_s": 0.001, "per_prompt_token_s": 1e-5, "per_output_s": 0.0}}}},
    })
    res = orcasim.simulate(sc)
    res.write(tmp_path, plots=False)
    table = pd.read_parquet(tmp_path / "requests.parquet")
    served = table[table["variant"] == "served"]
    assert served["sent"].tolist() == [0.1 * i for i in range(6)]
    assert (served["arrival"] - served["sent"]).tolist() == pytest.approx([0.002] * 6, abs=1e-12)
    assert table.loc[table["variant"] == "plain", "sent"].isna().all()
    _same(table[table["variant"] == "served"].drop(columns="variant").reset_index(drop=True),
          res["served"].requests)


def test_csv_flag_writes_requests_csv(tmp_path):
    assert main(["run", "--out", str(tmp_path), "--no-plots", "--csv",
                 "--variant", "continuous"]) == 0
    csv = pd.read_csv(tmp_path / "requests.csv")
    pq = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(csv) == len(pq) == 500
    np.testing.assert_array_equal(csv["e2e"].to_numpy(), pq["e2e"].to_numpy())


def test_a_long_cdf_is_drawn_through_its_quantiles():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(1)
    big = rng.lognormal(size=50_000)
    fig, ax = plt.subplots()
    plots.ecdf_panel(ax, {"a": big, "b": big[:100]}, {"a": "C0", "b": "C1"})
    long, short = ax.lines
    x, y = long.get_xdata(), long.get_ydata()
    assert len(x) <= plots.MAX_CDF_POINTS
    s = np.sort(big)
    assert x[0] == s[0] and x[-1] == s[-1] and y[-1] == 1.0
    k = np.searchsorted(s, x, side="right")  # every point is exactly on the full ECDF
    np.testing.assert_array_equal(y, k / s.size)
    assert len(short.get_xdata()) == 100
    plt.close(fig)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal_only():
    sc = orcasim.load_scenario("seed_orca").override({"workload.num_requests": 3000})
    tty = _Terminal()
    with Progress(tty, interval=0.001) as progress:
        res = orcasim.simulate(sc, variants=["continuous"], on_model=progress.watch)
        line = progress.line()
        for _ in range(400):  # the side thread writes within a few of its intervals
            if "requests done" in tty.getvalue():
                break
            time.sleep(0.005)
    assert line == "continuous: t={:,.1f} s, 3,000/3,000 requests done".format(
        res["continuous"].summary["makespan_s"])
    out = tty.getvalue()
    assert "requests done" in out and out.endswith("\r")  # the line is cleared at the end
    plain = io.StringIO()
    with Progress(plain, interval=0.001) as progress:
        orcasim.simulate(sc, variants=["continuous"], on_model=progress.watch)
    assert plain.getvalue() == "" and not progress.enabled
