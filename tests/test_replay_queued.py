"""Where a replay's predicted TTFT starts: when the simulated engine loop takes the request,
as vLLM stamps ``queued_ts``."""

from __future__ import annotations

import numpy as np
import pytest
from test_replay import make_run, read_csv

import orcasim
from orcasim.cli import main
from orcasim.replay.queued import engine_queued_times, simulated_queued


def test_a_request_arriving_mid_step_is_taken_when_the_step_ends():
    # one engine: steps [0, 1], [1, 3], [5, 6]; idle before 0, in (3, 5) and after 6
    starts, ends = np.array([0.0, 1.0, 5.0]), np.array([1.0, 3.0, 6.0])
    arrival = np.array([0.5, 1.0, 2.0, 4.0, 5.5, 7.0, -0.5, 5.0])
    got = engine_queued_times(arrival, np.zeros(8, dtype=int), starts, ends, np.zeros(3))
    # mid-step: the step's end; at a boundary or while idle: the arrival itself
    assert got.tolist() == [1.0, 1.0, 3.0, 4.0, 6.0, 7.0, -0.5, 5.0]


def test_only_the_requests_own_engine_holds_it_back():
    # engine 0 steps [0, 2]; engine 1 steps [1, 4]; a request at 1.5 on each
    got = engine_queued_times(np.array([1.5, 1.5, 0.5]), np.array([0, 1, 1]),
                              np.array([0.0, 1.0]), np.array([2.0, 4.0]), np.array([0, 1]))
    assert got.tolist() == [2.0, 4.0, 0.5]
    # an engine without steps (a rejected request's None) takes it at once
    assert engine_queued_times(np.array([1.5]), np.array([-1]), np.array([0.0]),
                               np.array([2.0]), np.array([0])).tolist() == [1.5]


def test_a_lockstep_group_takes_requests_between_the_groups_steps():
    # replica 0 runs [0, 2]; replica 1 is idle then (a dummy step in vLLM), runs [2, 3]
    columns = {"arrival": np.array([1.0, 2.5, 1.0]), "replica": ["dp-1", "dp-0", None]}
    series = {"t_start": np.array([0.0, 2.0]), "t_end": np.array([2.0, 3.0]),
              "num_steps": np.array([1, 1]), "replica": np.array([0, 1])}
    # in lockstep replica 1's dummy step [0, 2] holds its request back; replica 0 is idle
    # during [2, 3] but takes a dummy step with replica 1
    assert simulated_queued(columns, series, lockstep=True).tolist() == [2.0, 3.0, 1.0]
    # independent engines: each only waits for its own steps
    assert simulated_queued(columns, series, lockstep=False).tolist() == [1.0, 2.5, 1.0]
    # one engine, no replica column
    one = {"arrival": np.array([1.0])}
    assert simulated_queued(one, series, lockstep=False).tolist() == [2.0]
    # a time-binned series no longer holds each step's span
    binned = dict(series, num_steps=np.array([2, 1]))
    assert simulated_queued(columns, binned, lockstep=True) is None


def test_replay_counts_ttft_and_e2e_from_when_the_engine_took_the_request(tmp_path, capsys):
    run, workload, profile = make_run(tmp_path)
    out = tmp_path / "out"
    assert main(["replay-vllm", str(run), "--workload", str(workload), "--profiles",
                 str(profile), "--out", str(out), "--no-plots"]) == 0
    capsys.readouterr()
    res = orcasim.simulate(orcasim.load_scenario(out / "scenario.yaml"))
    v = next(iter(res.variants.values()))
    c = v.columns
    starts, ends = v.series["t_start"], v.series["t_end"]
    assert (v.series["num_steps"] == 1).all()
    # by hand: the end of the step running at each arrival, else the arrival
    queued = []
    for t in c["arrival"]:
        running = [e for s, e in zip(starts, ends, strict=True) if s < t < e]
        queued.append(running[0] if running else t)
    assert any(q > t for q, t in zip(queued, c["arrival"], strict=True))  # one waited
    rows = read_csv(out / "requests.csv")
    assert [float(r["predicted_ttft_ms"]) for r in rows] == pytest.approx(
        ((c["first_token"] - np.array(queued)) * 1e3).tolist(), rel=1e-5)
    assert [float(r["predicted_e2e_ms"]) for r in rows] == pytest.approx(
        ((c["finish"] - np.array(queued)) * 1e3).tolist(), rel=1e-5)
