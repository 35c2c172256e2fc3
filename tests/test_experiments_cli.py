"""`orcasim sweep`, `orcasim compare` and `orcasim report` from the command line."""

from __future__ import annotations

import base64
import json
import re

import pandas as pd
import pytest
from pydantic import Field

from orcasim.cli import main
from orcasim.policies.continuous import Continuous
from orcasim.registry import policies

SMALL = ["--set", "workload.num_requests=30", "--no-progress", "--jobs", "1"]


@policies.register("test-bouncer")
class Bouncer(Continuous):
    """Continuous batching that turns away prompts longer than ``max_prompt`` tokens."""

    class Params(Continuous.Params):
        max_prompt: int = Field(60, gt=0)

    def admit(self) -> None:
        waiting = self.ctx.waiting
        for req in [r for r in waiting if r.prompt_len > self.params.max_prompt]:
            waiting.remove(req)
            self.ctx.reject(req, "prompt too long")
        super().admit()


def test_sweep_command_prints_cis_and_writes_the_table(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", "--grid", "workload.arrival.rate=5,20", "--seeds", "3",
               "--out", str(out), *SMALL])
    assert rc == 0
    text = capsys.readouterr().out
    assert text.startswith("sweep seed_orca: 12 runs: 12 run now, 0 already done, 0 failed or "
                           "invalid;")
    assert "mean ± 95% CI over seeds:" in text
    header = text.splitlines()[2].split()
    assert header[:4] == ["workload.arrival.rate", "variant", "n", "throughput_tok_s"]
    assert re.search(r"^\s+5\s+static\s+3\s+\d+ ± \d+", text, re.M)
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 12 and set(df["variant"]) == {"static", "continuous"}
    assert main(["sweep", "--grid", "workload.arrival.rate=5,20", "--seeds", "3",
                 "--out", str(out), *SMALL]) == 0
    assert "0 run now, 12 already done" in capsys.readouterr().out


def test_sweep_command_with_a_bad_point_exits_2_and_names_it(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", "--grid", "policy.max_batch=8,-1", "--grid", "variant=continuous",
               "--out", str(out), *SMALL])
    assert rc == 2
    assert capsys.readouterr().err == (
        "orcasim: error: seed_orca.yaml: grid policy.max_batch=-1: variants.static: "
        "policy.max_batch: Input should be greater than 0 (got -1)\n")
    assert not out.exists()  # checked before anything is created or run
    assert main(["sweep", "--grid", "nonsense", "--out", str(tmp_path), *SMALL]) == 2
    assert capsys.readouterr().err == (
        "orcasim: error: --grid 'nonsense': expected FIELD=VALUE1,VALUE2,...\n")
    assert main(["sweep", "--scheduler", "tcp://x:1", "--out", str(tmp_path), *SMALL]) == 2
    assert "--scheduler goes with --backend dask" in capsys.readouterr().err


def test_compare_two_sweeps(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--grid", "workload.arrival.rate=5,20", "--seeds", "6", *SMALL]
    assert main(["sweep", "--grid", "variant=static", "--out", str(a), *common]) == 0
    assert main(["sweep", "--grid", "variant=continuous", "--out", str(b), *common]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--metric", "ttft_p99", "--metric",
                 "tpot_p50", "--csv", str(tmp_path / "cmp.csv")]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[4].split() == ["workload.arrival.rate", "metric", "test", "n", "A", "B", "B",
                                "-", "A", "change", "p", "p_holm", "effect", "p_rank", "sig"]
    cmp = pd.read_csv(tmp_path / "cmp.csv")
    assert cmp["workload.arrival.rate"].tolist() == [5.0, 5.0, 20.0, 20.0]
    # same requests (the seeds are shared): every run of A is paired with its run of B
    assert (cmp["test"] == "paired t").all() and (cmp["n_pairs"] == 6).all()
    # continuous batching cuts the TTFT of every run
    ttft = cmp[cmp.metric == "ttft_p99"]
    assert (ttft["diff"] < 0).all()
    assert (ttft["p_rank"] == 2 / 2**6).all()  # Wilcoxon: every one of the 6 pairs goes down
    assert (cmp["significant"] == (cmp["p_adj"] < 0.05)).all()
    assert f"{int(cmp['significant'].sum())} of 4 differences significant" in text
    assert main(["compare", str(a), str(tmp_path)]) == 2
    assert "not a sweep directory (no sweep.json)" in capsys.readouterr().err


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)",
                                                     html)]


def test_report_is_self_contained_and_says_what_is_missing(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--grid", "workload.arrival.rate=1,5,20", "--seeds", "2",
                 "--out", str(out), *SMALL]) == 0
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {out}/report.html and {out}/report.md\n")
    html = (out / "report.html").read_text()
    imgs = _images(html)
    assert len(imgs) == 4 and all(i.startswith(b"\x89PNG\r\n\x1a\n") for i in imgs)
    assert "src='http" not in html and "<link" not in html  # nothing fetched from elsewhere
    for h in ("Checks", "Results: mean ± 95% CI over seeds", "Metrics against "
              "workload.arrival.rate", "Latency distributions", "Request lifetimes",
              "Queue, batch and KV memory over time", "Rejections, aborts and preemptions"):
        assert f"<h2>{h}</h2>" in html
    assert "All 12 successful runs conserve requests" in html
    assert "record no KV-cache usage" in html
    assert "No request was rejected, aborted or preempted" in html
    md = (out / "report.md").read_text()
    refs = re.findall(r"\]\((report_files/[a-z_]+\.png)\)", md)
    assert len(refs) == 4 and all((out / r).exists() for r in refs)
    assert "| workload.arrival.rate | variant | n | throughput_tok_s |" in md


def test_report_shows_rejections_by_reason(tmp_path):
    out = tmp_path / "sw"
    assert main(["sweep", "--set", "policy={type: test-bouncer, max_prompt: 40}",
                 "--grid", "variant=continuous", "--grid", "policy.max_prompt=40,80",
                 "--out", str(out), *SMALL]) == 0
    df = pd.read_parquet(out / "results.parquet")
    assert (df["num_rejected"] > 0).all()
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "<td>rejected: prompt too long</td>" in html
    kept = sum(int(n) for n in df["num_rejected"])
    assert re.search(rf"<td>rejected: prompt too long</td>\s*<td>{kept}</td>", html)
    assert "Metrics against policy.max_prompt" in html


def test_report_of_an_unfinished_sweep_without_kept_requests(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", "--grid", "variant=static,continuous", "--keep-requests", "0",
                 "--out", str(out), *SMALL]) == 0
    manifest = json.loads((out / "sweep.json").read_text())
    manifest["num_runs"] = 3  # as if one run had not finished
    (out / "sweep.json").write_text(json.dumps(manifest))
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "1 of 3 runs have not run yet" in html
    assert "No per-request rows were kept" in html
    assert "<h2>Metrics by point</h2>" in html
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["sweep", "--help"], ["compare", "--help"],
                                  ["report", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0 and "usage: orcasim" in capsys.readouterr().out


def test_report_draws_latency_by_request_class(tmp_path):
    from orcasim.experiments import sweep, write_report

    reqs = [{"arrival": i * 0.5, "prompt_len": 0, "output_len": 2 + i % 5,
             "cls": "chat" if i % 2 else "batch"} for i in range(16)]
    sc = orcasim_scenario("article_two_slots", {"workload.requests": reqs})
    sweep(sc, {"policy.max_batch": [2, 3]}, seeds=1, out=tmp_path, progress=False, n_jobs=1)
    kept = pd.read_parquet(next((tmp_path / "runs").glob("*.requests.parquet")))
    assert sorted(kept["cls"].unique()) == ["batch", "chat"]
    paths = write_report(tmp_path)
    html = paths["html"].read_text()
    assert "line style by request class" in html
    assert "Metrics against policy.max_batch" in html


def orcasim_scenario(name, overrides):
    import orcasim

    return orcasim.load_scenario(name).override(overrides)
