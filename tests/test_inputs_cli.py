"""One exit-status policy and one-line errors for every subcommand and the sweep API.

Each case is an argv (paths under ``tmp_path``: ``{d}`` is the test's directory,
``{out}`` an output path that must not be created for a usage error), the
expected exit status (2: usage or input error, 1: a run failed) and a
substring of the one stderr line.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import SCENARIOS

import orcasim
from orcasim.cli import main
from orcasim.errors import FailedRunsWarning, ScenarioError, SimulationError
from orcasim.latency.base import LatencyModel
from orcasim.params import ComponentParams
from orcasim.registry import latency_models

SMALL = ["--set", "workload.num_requests=20"]
FAST = [*SMALL, "--no-progress", "--jobs", "1"]
GOLDEN = Path(__file__).parent / "golden" / "vllm_v1"


@latency_models.register("test-inputs-failing")
class FailingLatency(LatencyModel):
    """10 ms steps; step ``fail_after + 1`` of a run raises a :class:`SimulationError`."""

    class Params(ComponentParams):
        fail_after: int = 2

    def __init__(self, params: Params) -> None:
        self.params = params
        self.steps = 0

    def step_time(self, plan) -> float:  # type: ignore[no-untyped-def]
        self.steps += 1
        if self.steps > self.params.fail_after:
            raise SimulationError("the test latency model gave up")
        return 0.01


FAILING = "--set 'engine.latency={type: test-inputs-failing}'"


def _files(d: Path) -> None:
    """The inputs the cases refer to."""
    (d / "file.txt").write_text("not a directory\n")
    (d / "bad.yaml").write_text("workload: [unclosed\n")
    (d / "w.json").write_text('{"requests": [')
    (d / "plain").mkdir()
    (d / "sweep.json").mkdir()  # a directory where a file is expected
    bad = d / "badsweep"
    bad.mkdir()
    (bad / "sweep.json").write_text("{not json")
    (d / "steps.csv").write_text("batch_size,prefill_tokens,decode_tokens,kv_tokens,seconds\n"
                                 "1,0,1,10,0.01\n")


CASES = [
    # bad arguments
    ("nosuch", 2, "invalid choice: 'nosuch'"),
    ("run --frobnicate", 2, "unrecognized arguments: --frobnicate"),
    ("run --seed -1 --out {out}", 2, "argument --seed: a seed must be an integer >= 0, got '-1'"),
    ("run --seed x --out {out}", 2, "argument --seed: expected a seed"),
    ("run --variant nosuch --out {out}", 2, "--variant nosuch: no variant 'nosuch'"),
    ("sweep --seed -1 --out {out}", 2, "argument --seed: a seed must be an integer >= 0"),
    ("sweep --seeds 0 --out {out}", 2, "argument --seeds: expected an integer >= 1, got '0'"),
    ("sweep --jobs 0 --out {out}", 2, "argument --jobs/-j: expected a number of workers"),
    ("sweep --keep-requests -1 --out {out}", 2, "argument --keep-requests: expected an integer"),
    ("sweep --scheduler tcp://x:1 --out {out}", 2, "--scheduler goes with --backend dask"),
    ("sweep --grid nonsense --out {out}", 2, "--grid 'nonsense': expected FIELD=VALUE1"),
    ("compare {d}/a {d}/b --alpha 2", 2, "--alpha must be between 0 and 1"),
    ("calibrate {d}/steps.csv --confidence 2", 2, "--confidence must be between 0 and 1"),
    ("calibrate {d}/steps.csv --model roofline --tp 0", 2, "argument --tp: expected an integer"),
    # missing, unreadable or malformed inputs
    ("run {d}/none.yaml --out {out}", 2, "none.yaml: cannot read"),
    ("run {d}/bad.yaml --out {out}", 2, "bad.yaml: line 2: invalid YAML"),
    ("run --set policy.max_batch=-3 --out {out}", 2, "policy.max_batch: Input should be greater"),
    ("validate {d}/none.yaml", 2, "none.yaml: cannot read"),
    ("trace {d}/none.json --out {out}/t.jsonl", 2, "none.json: cannot read: No such file"),
    ("trace {d}/plain --out {out}/t.jsonl", 2, "plain: cannot read: Is a directory"),
    ("trace " + str(GOLDEN / "tiny.json") + " --out {out}/t.jsonl --compare {d}/none.jsonl", 2,
     "none.jsonl: cannot read the reference trace"),
    ("calibrate {d}/none.csv", 2, "none.csv: cannot read"),
    ("report {d}/nosuchdir", 2, "nosuchdir: not a sweep directory (it does not exist)"),
    ("report {d}/file.txt", 2, "file.txt: not a sweep directory (not a directory)"),
    ("report {d}/plain", 2, "plain: not a sweep directory (no sweep.json)"),
    ("report {d}/badsweep", 2, "badsweep/sweep.json: cannot read"),
    ("compare {d}/plain {d}/nosuchdir", 2, "plain: not a sweep directory (no sweep.json)"),
    # bad output locations
    ("run --out {d}/file.txt", 2, "--out {d}/file.txt: exists and is not a directory"),
    ("run --out /dev/null", 2, "--out /dev/null: exists and is not a directory"),
    ("run --out {d}/file.txt/sub", 2, "--out {d}/file.txt/sub: {d}/file.txt is not a directory"),
    ("sweep --out {d}/file.txt", 2, "--out {d}/file.txt: exists and is not a directory"),
    ("trace " + str(GOLDEN / "tiny.json") + " --out {d}/file.txt/t.jsonl", 2,
     "{d}/file.txt is not a directory"),
    ("trace " + str(GOLDEN / "tiny.json") + " --out {d}/plain", 2, "--out {d}/plain: is a "
     "directory"),
    ("report {d}/plain --out {d}/file.txt", 2, "--out {d}/file.txt: exists and is not a dir"),
    ("compare {d}/plain {d}/plain --csv {d}/plain", 2, "--csv {d}/plain: is a directory"),
    # configurations `validate` accepts only if `run` does
    ("run --set admission='[{type: kv_fit}]' --out {out}", 2,
     "variants.static: admission.0: kv_fit needs a KV memory model"),
    ("validate seed_orca --set admission='[{type: kv_fit}]'", 2,
     "seed_orca.yaml: variants.static: admission.0: kv_fit needs a KV memory model"),
    # sweep grids, checked before --out is created or anything runs
    ("sweep --grid policy.aging=0,10,100 --seeds 3 --out {out}", 2,
     "seed_orca.yaml: grid policy.aging=0: variants.static: policy.aging: unknown field"),
    ("sweep --grid policy.max_batch=4,4.0 --out {out}", 2,
     "grid policy.max_batch: 4 and 4.0 are the same value"),
    ("sweep --grid policy.max_batch=4,8 --grid policy.max_batch=16 --out {out}", 2,
     "--grid policy.max_batch: given twice"),
    ("sweep --grid variant=static,nosuch --out {out}", 2,
     "grid variant='nosuch': no variant 'nosuch'"),
    ("sweep --grid seed=1,2 --out {out}", 2, "grid seed: the results table has a column"),
    ("sweep --grid policy.max_batch=8,-1 --out {out}", 2,
     "grid policy.max_batch=-1: variants.static: policy.max_batch: Input should be greater"),
    # runs that fail
    ("run --variant continuous " + FAILING + " --out {out}", 1,
     "the test latency model gave up"),
    ("sweep --grid variant=continuous " + FAILING + " --out {out}", 1,
     "1 of 1 runs failed"),
]


#: what every run and sweep case gets, to keep them small and quiet
EXTRA = {"run": [*SMALL, "--no-plots"], "sweep": FAST}


@pytest.mark.parametrize("command, status, message", CASES, ids=[c[0] for c in CASES])
def test_one_line_and_the_exit_status(tmp_path, capsys, command, status, message):
    _files(tmp_path)
    out = tmp_path / "out"
    argv = [a.replace("{d}", str(tmp_path)).replace("{out}", str(out))
            for a in shlex.split(command)]
    rc = main(argv + EXTRA.get(argv[0], []))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert rc == status, err
    assert len(lines) == 1 and lines[0].startswith("orcasim: error: "), err
    assert message.replace("{d}", str(tmp_path)) in lines[0]
    assert "Traceback" not in err
    if status == 2:
        assert not out.exists()


def test_a_valid_configuration_still_runs_and_validates(tmp_path, capsys):
    out = tmp_path / "missing" / "parents" / "out"
    assert main(["run", "--seed", "0", "--out", str(out), "--no-plots", *SMALL]) == 0
    assert (out / "summary.json").exists()  # missing parents are created
    assert main(["validate", str(SCENARIOS / "seed_orca.yaml"), *SMALL]) == 0
    assert capsys.readouterr().err == ""


def test_trace_creates_missing_parents(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "t.jsonl"
    assert main(["trace", str(GOLDEN / "tiny.json"), "--out", str(out)]) == 0
    assert out.exists() and capsys.readouterr().err == ""


def test_validate_builds_every_variant_like_run(capsys):
    memory = "memory={num_blocks: 100, allocator: max, max_model_len: 2048}"
    rc = main(["validate", "seed_orca", "--set", "policy=vllm-v1", "--set", "variants=null",
               "--set", memory])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("orcasim: error: seed_orca.yaml: memory.allocator: vllm-v1 "
                               "allocates paged blocks; 'max' is a contiguous reservation\n")


def test_sweep_api_refuses_a_bad_grid_before_creating_anything(tmp_path):
    out = tmp_path / "sw"
    sc = orcasim.load_scenario().override({"workload.num_requests": 20})
    with pytest.raises(ScenarioError, match=r"grid policy\.aging=0: .*policy\.aging"):
        orcasim.sweep(sc, {"policy.aging": [0, 10, 100]}, seeds=3, out=out, progress=False)
    with pytest.raises(ScenarioError, match=r"4 and 4\.0 are the same value"):
        orcasim.sweep(sc, {"policy.max_batch": [4, 4.0]}, out=out, progress=False)
    with pytest.raises(orcasim.OrcasimError, match="the base seed must be >= 0"):
        orcasim.sweep(sc, seed=-1, out=out, progress=False)
    (tmp_path / "f").write_text("a file")
    with pytest.raises(orcasim.OrcasimError, match=r"out .*/f: exists and is not a directory"):
        orcasim.sweep(sc, out=tmp_path / "f", progress=False)
    assert not out.exists()


def test_sweep_api_warns_when_runs_fail():
    sc = orcasim.load_scenario().override({"workload.num_requests": 20,
                                           "engine.latency": {"type": "test-inputs-failing"}})
    with pytest.warns(FailedRunsWarning, match="2 of 2 runs failed, e.g. run .*gave up"):
        df = orcasim.sweep(sc, seeds=1, progress=False, n_jobs=1)
    assert (df["status"] == "error").all()


def test_markdown_report_escapes_user_strings(tmp_path):
    from orcasim.experiments import write_report

    base = orcasim.load_scenario().override({"workload.num_requests": 20,
                                            "description": "<script>x</script> *bold*"})
    raw = {**base.raw, "variants": {"<b>v|1</b>": {}}}
    out = tmp_path / "sw"
    orcasim.sweep(orcasim.Scenario(raw), {"workload.arrival.rate": [5, 20]}, out=out,
                  progress=False, n_jobs=1, keep_requests=0)
    md = write_report(out)["markdown"].read_text()
    assert "\\<script\\>x\\</script\\> \\*bold\\*" in md
    assert "| 5 | \\<b\\>v\\|1\\</b\\> |" in md
    assert "<script>" not in md and "<b>" not in md
    html = (out / "report.html").read_text()
    assert "<script>" not in html and "&lt;b&gt;v|1&lt;/b&gt;" in html
