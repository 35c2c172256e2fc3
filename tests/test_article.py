"""The article's worked 2-slot example, step by step."""

from __future__ import annotations

import pytest

import orcasim
from orcasim.cli import main

STATIC = [
    "step 1: A | B",
    "step 2: A | B",
    "step 3: empty | B",
    "step 4: empty | B",
    "step 5: empty | B",
    "step 6: C | D",
    "step 7: empty | D",
]
CONTINUOUS = [
    "step 1: A | B",
    "step 2: A | B",
    "step 3: C | B",
    "step 4: D | B",
    "step 5: D | B",
]


@pytest.fixture(scope="module")
def res():
    return orcasim.simulate("article_two_slots", trace_steps=True)


def test_static_schedule(res):
    v = res["static"]
    assert v.format_steps().splitlines() == STATIC
    assert v.summary["num_steps"] == 7
    assert v.summary["seq_steps"] == 10
    assert v.summary["slot_utilisation"] == pytest.approx(10 / 14)


def test_continuous_schedule(res):
    v = res["continuous"]
    assert v.format_steps().splitlines() == CONTINUOUS
    assert v.summary["num_steps"] == 5
    assert v.summary["slot_utilisation"] == 1.0


def test_start_steps(res):
    # unit step time: a request scheduled at time t starts at step t + 1
    for variant, starts in (("static", {"A": 1, "B": 1, "C": 6, "D": 6}),
                            ("continuous", {"A": 1, "B": 1, "C": 3, "D": 4})):
        df = res[variant].requests.set_index("name")
        assert {k: int(df.loc[k, "first_scheduled"]) + 1 for k in "ABCD"} == starts
        assert df["num_output_tokens"].to_dict() == {"A": 2, "B": 5, "C": 1, "D": 2}


def test_finish_times(res):
    assert res["static"].requests.set_index("name")["finish"].to_dict() == {
        "A": 2.0, "B": 5.0, "C": 6.0, "D": 7.0}
    assert res["continuous"].requests.set_index("name")["finish"].to_dict() == {
        "A": 2.0, "B": 5.0, "C": 3.0, "D": 5.0}


def test_cli_steps_table(tmp_path, capsys):
    path = orcasim.load_scenario("article_two_slots").source
    assert path == "article_two_slots.yaml"
    rc = main(["run", "article_two_slots", "--steps", "--out", str(tmp_path), "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "static: 7 steps, slot utilisation 10/14" in out
    assert "continuous: 5 steps, slot utilisation 10/10" in out
    lines = out.splitlines()
    i = lines.index("static: 7 steps, slot utilisation 10/14") + 1
    assert lines[i:i + len(STATIC)] == STATIC
    j = lines.index("continuous: 5 steps, slot utilisation 10/10") + 1
    assert lines[j:j + len(CONTINUOUS)] == CONTINUOUS
    steps = (tmp_path / "steps.csv").read_text().splitlines()
    assert steps[0] == "variant,step,t_start,t_end,batch_size,request_ids,slots"
    assert steps[3] == "static,3,2.0,3.0,1,B,empty | B"
    assert steps[10] == "continuous,3,2.0,3.0,2,C B,C | B"
