"""Notebook displays of results, and small command-line fixes.

``Results``/``VariantResult`` reprs, the note when ``orcasim run`` overwrites
a previous run, ``orcasim validate --help``, ``run --variant``'s header,
``trace --block-tables --compare`` against a reference without block tables,
and the sweep report's wording for Little's law over a whole run.
"""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

import orcasim
from orcasim.cli import main
from orcasim.experiments.report import _little_text, write_report

GOLDEN = Path(__file__).resolve().parent / "golden" / "vllm_v1"
WHOLE_RUN = "Little's law holds by construction over a whole run; it checks timestamps only"


@pytest.fixture(scope="module")
def seed_results() -> orcasim.Results:
    return orcasim.simulate(seed=0)


def test_results_repr_names_scenario_seed_variants_and_headline(seed_results):
    text = repr(seed_results)
    first, *rows = text.splitlines()
    assert first == "Results(scenario 'seed_orca', seed 0, 2 variant(s): static, continuous)"
    assert len(rows) == 2
    assert rows[1].split() == [
        "continuous:", "500", "requests,", "500", "finished;", "throughput_tok_s", "198.496,",
        "ttft_p99", "275.185,", "e2e_p99", f"{seed_results['continuous'].summary['e2e_p99']:.6g}"]


def test_variant_repr_counts_rejections_and_aborts():
    res = orcasim.simulate("priority_classes", seed=0, variants=["fcfs"])
    text = repr(res["fcfs"])
    assert text.startswith("VariantResult('fcfs': 1200 requests, 750 finished, 35 rejected, "
                           "415 aborted; throughput_tok_s 186.297, ttft_p99 ")


def test_results_html_is_the_run_table(seed_results):
    html = seed_results._repr_html_()
    assert "<b>seed_orca</b>, seed 0, variants: static, continuous" in html
    (table,) = html_tables(html)
    assert table[0] == ["metric", "static", "continuous"]
    rows = {r[0]: r[2] for r in table[1:]}
    assert rows["num_requests"] == "500" and rows["throughput_tok_s"] == "198.496"
    assert [r[0] for r in table[1:]] == seed_results.default_metrics()
    assert "slot_utilisation" in rows and "ttft_p99" in rows


def test_variant_html_and_class_tables():
    res = orcasim.simulate("priority_classes", seed=0, variants=["strict"])
    html = res["strict"]._repr_html_()
    assert "<p>per class:</p>" in html
    tables = html_tables(html)
    assert tables[0][0] == ["metric", "strict"]
    assert "class.interactive.ttft_p99" in {r[0] for r in tables[1]}


class _Tables(HTMLParser):
    """Collects every ``<table>`` as a list of rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_tables(text: str) -> list[list[list[str]]]:
    """The tables of an HTML fragment, each a list of rows of cell texts."""
    parser = _Tables()
    parser.feed(text)
    return parser.tables


def test_second_run_into_the_same_out_notes_the_overwrite(tmp_path, capsys):
    args = ["run", "--out", str(tmp_path), "--no-plots", "--variant", "continuous"]
    assert main(args) == 0
    assert "note: overwriting" not in capsys.readouterr().err
    assert main(args) == 0
    err = capsys.readouterr().err
    n = len(list(tmp_path.iterdir()))
    assert err.splitlines() == [f"note: overwriting {n} files in {tmp_path}"]
    assert json.loads((tmp_path / "summary.json").read_text())["seed"] == 0


def test_validate_help_describes_its_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "scenario scenario YAML file or built-in name" in out
    assert "--set FIELD=VALUE override a scenario field" in out


def test_run_header_lists_only_the_chosen_variants(tmp_path, capsys):
    assert main(["run", "--variant", "continuous", "--out", str(tmp_path), "--no-plots"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "scenario seed_orca (seed_orca.yaml), seed 0, variants: continuous"


def test_trace_block_tables_against_a_reference_without_them(tmp_path, capsys):
    ref = GOLDEN / "tiny.trace.jsonl"
    assert '"blocks"' not in ref.read_text()
    out = tmp_path / "t.jsonl"
    rc = main(["trace", str(GOLDEN / "tiny.json"), "--out", str(out), "--block-tables",
               "--compare", str(ref)])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert lines[1:] == ["block tables not compared: the reference has none",
                         f"6/6 steps identical to {ref}"]
    assert '"blocks"' in out.read_text()  # the written trace keeps its block tables


def test_trace_block_tables_still_compared_when_the_reference_has_them(tmp_path, capsys):
    ref = GOLDEN / "watermark_alone.trace.jsonl"
    rc = main(["trace", str(GOLDEN / "watermark_alone.json"), "--out", str(tmp_path / "t.jsonl"),
               "--block-tables", "--compare", str(ref)])
    out = capsys.readouterr().out
    assert rc == 0 and "not compared" not in out and "steps identical" in out


def _ok_runs(windows: list[float | None]) -> pd.DataFrame:
    return pd.DataFrame({
        "status": ["ok"] * len(windows),
        "window_start_s": [math.nan if w is None else w for w in windows],
        "little_rel_err": [0.01 * (i + 1) for i in range(len(windows))],
    })


def test_little_text_without_a_window_is_not_a_validation():
    assert _little_text(_ok_runs([None, None])) == WHOLE_RUN + "."
    assert _little_text(_ok_runs([]).drop(columns="window_start_s")) == WHOLE_RUN + "."


def test_little_text_with_windows():
    text = _little_text(_ok_runs([1.0, 2.0]))
    assert text == ("Over their steady-state window, 2 run(s) satisfy Little's law "
                    "(L = λW within 5%; largest gap 0.02).")
    mixed = _little_text(_ok_runs([1.0, None]))
    assert mixed.endswith(f"For the 1 run(s) without a window: {WHOLE_RUN}.")


def test_sweep_report_wording_over_whole_runs(tmp_path):
    sc = orcasim.load_scenario().override({"workload.num_requests": 40})
    orcasim.sweep(sc, seeds=1, out=tmp_path, n_jobs=1, progress=False)
    md = write_report(tmp_path)["markdown"].read_text()
    assert WHOLE_RUN in md
    assert "satisfy Little's law" not in md
