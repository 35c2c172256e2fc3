"""Every run conserves requests and satisfies Little's law; the checks catch violations."""

from __future__ import annotations

import numpy as np
import pytest

import orcasim
from orcasim.experiments.checks import check_run, littles_law
from orcasim.request import RequestState

FIN, REJ = int(RequestState.FINISHED), int(RequestState.REJECTED)


def cols(arrival, finish, state=None, sched=None, tok=None):
    n = len(arrival)
    arrival = np.asarray(arrival, float)
    finish = np.asarray(finish, float)
    return {
        "id": np.arange(n),
        "arrival": arrival,
        "first_scheduled": np.asarray(sched if sched is not None else arrival, float),
        "first_token": np.asarray(tok if tok is not None else finish, float),
        "finish": finish,
        "state": np.asarray(state if state is not None else [FIN] * n),
    }


def test_littles_law_by_hand():
    c = cols([0.0, 1.0], [2.0, 4.0])
    # whole run [0, 4]: N(t) = 1 on [0,1), 2 on [1,2), 1 on [2,4): L = 5/4; lambda = 2/4, W = 2.5
    assert littles_law(c) == (1.25, 1.25, (0.0, 4.0))
    # window [0, 2]: L = (1 + 2) / 2 = 1.5; both arrive inside: lambda = 1, W = 2.5
    assert littles_law(c, (0.0, 2.0)) == (1.5, 2.5, (0.0, 2.0))
    r = check_run(c, 2)
    assert r.ok and r.little_rel_err == 0.0 and r.warnings() == []


def test_a_rejected_request_leaves_on_arrival():
    c = cols([0.0, 1.0], [2.0, np.nan], state=[FIN, REJ], tok=[1.0, np.nan], sched=[0.0, np.nan])
    assert littles_law(c) == (1.0, 1.0, (0.0, 2.0))
    assert check_run(c, 2).ok


def test_violations_are_reported():
    r = check_run(cols([0.0, 1.0], [2.0, 4.0]), 3)
    assert not r.conservation_ok and r.little_ok
    assert r.warnings() == ["conservation: 3 requests generated but 2 recorded"]
    # a finish before the arrival: the sojourn is negative, the occupancy cannot be
    bad = cols([0.0, 3.0], [2.0, 1.0], sched=[0.0, 3.0], tok=[1.0, 3.0])
    r = check_run(bad, 2)
    assert r.conservation_error == "request 1 has timestamps out of order"
    assert r.little_L == pytest.approx(2 / 3) and r.little_lambda_W == 0.0
    assert not r.little_ok and r.as_row()["check_little"] is False
    assert r.warnings()[1] == ("Little's law: L = 0.666667 but lambda*W = 0 (off by 100.0%) "
                               "over [0, 3] s")
    no_finish = cols([0.0], [np.nan])
    assert check_run(no_finish, 1).conservation_error == (
        "finished request 0 has no first-scheduled/first-token/finish time")
    twice = cols([0.0, 0.0], [1.0, 1.0])
    twice["id"] = np.array([5, 5])
    assert check_run(twice, 2).conservation_error == "a request was recorded more than once"


@pytest.mark.parametrize("name", orcasim.builtin_scenarios())
def test_every_shipped_scenario_passes_both_checks(name):
    res = orcasim.simulate(name)
    for variant, v in res.items():
        r = check_run(v.columns, v.summary["num_requests"], warmup=v.config.metrics.warmup,
                      cooldown=v.config.metrics.cooldown)
        assert r.conservation_ok, (variant, r.conservation_error)
        assert r.little_ok, (variant, r.warnings())
        s = v.summary
        assert s["num_finished"] + s["num_rejected"] + s["num_aborted"] == s["num_requests"]


def test_steady_state_window_agrees_with_littles_law_only_when_stable():
    # 0.5 req/s is well under the ~1.3 req/s the batch of 32 sustains: steady state
    stable = orcasim.load_scenario().override({"workload.arrival.rate": 0.5,
                                               "workload.num_requests": 1000,
                                               "metrics.warmup": 0.1, "metrics.cooldown": 0.1})
    for _, v in orcasim.simulate(stable, seed=1).items():
        r = check_run(v.columns, 1000, warmup=0.1, cooldown=0.1)
        assert r.ok, r.warnings()
        assert r.little_rel_err < 0.001
        assert r.window == (v.summary["window_start_s"], v.summary["window_end_s"])
    # the seed study (30 req/s) only ever grows its queue: no steady state to measure
    over = orcasim.load_scenario().override({"metrics.warmup": 0.1, "metrics.cooldown": 0.1})
    v = orcasim.simulate(over)["continuous"]
    r = check_run(v.columns, 500, warmup=0.1, cooldown=0.1)
    assert r.conservation_ok and not r.little_ok
    assert r.little_rel_err > 0.5
