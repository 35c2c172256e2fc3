"""Hostile numbers in workloads, latency models and traces: one clear line, never a hang.

Every case is a scenario (or a trace file) carrying one bad value and the
part of the message that must name it. Each must fail fast with a
:class:`ScenarioError` or :class:`TraceError` whose message is one line;
the property tests draw NaN, infinities, huge integers and floats,
negatives and zero into numeric fields and accept either such an error or a
run whose latencies are all finite.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orcasim
from orcasim.cli import main
from orcasim.errors import OrcasimError, ScenarioError
from orcasim.simulation import generate_workload
from orcasim.workload.base import MAX_REQUESTS_PER_RUN, MAX_TOKENS_PER_REQUEST
from orcasim.workload.traces import TraceError

NAN, INF = float("nan"), float("inf")
TIME_LIMIT_S = 5.0


def workload(**over: Any) -> dict[str, Any]:
    """A small synthetic workload with ``over`` replacing its fields."""
    wl = {"type": "synthetic", "num_requests": 3, "arrival": {"type": "poisson", "rate": 2.0},
          "prompt_len": {"type": "fixed", "value": 8},
          "output_len": {"type": "fixed", "value": 4}}
    return {**wl, **over}


def scenario(wl: dict[str, Any] | None = None, latency: Any = None) -> dict[str, Any]:
    """A scenario dict: ``wl`` (default :func:`workload`) and an optional latency model."""
    out: dict[str, Any] = {"policy": "fcfs", "workload": wl or workload()}
    if latency is not None:
        out["engine"] = {"latency": latency}
    return out


def run(raw: dict[str, Any]) -> None:
    """Load, generate and simulate ``raw`` as the API does."""
    sc = orcasim.Scenario(raw)
    generate_workload(sc.variants[0])
    orcasim.simulate(sc)


def fails_fast(raw: dict[str, Any], kind: type[OrcasimError] = ScenarioError) -> str:
    """The one-line message of the error ``raw`` raises, within :data:`TIME_LIMIT_S`."""
    start = time.perf_counter()
    with pytest.raises(kind) as exc:
        run(raw)
    assert time.perf_counter() - start < TIME_LIMIT_S
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 400, msg
    assert exc.value.exit_code == 2
    return msg


def lengths(**dist: Any) -> dict[str, Any]:
    return scenario(workload(output_len=dist))


SCENARIO_CASES = [
    # 1. sizes beyond the documented limits
    ("fixed-huge", lengths(type="fixed", value=2_000_000_000),
     "workload.output_len.value: Input should be less than or equal to 10000000"),
    ("prompt-huge", scenario(workload(prompt_len={"type": "fixed", "value": 10**7 + 1})),
     "workload.prompt_len.value: Input should be less than or equal to 10000000"),
    ("clip-max-huge", lengths(type="lognormal", mu=3, sigma=1, max=10**8),
     "workload.output_len.max: Input should be less than or equal to 10000000"),
    ("clip-min-huge", lengths(type="lognormal", mu=3, sigma=1, min=10**12),
     "workload.output_len.min"),
    ("empirical-values", lengths(type="empirical", values=[3, 10**9]),
     "workload.output_len.values.1: must be a finite number >= 0 and <= 1e+07"),
    ("list-output", scenario({"type": "list", "requests": [
        {"prompt_len": 3, "output_len": 10**8}]}),
     "workload.requests.0.output_len: Input should be less than or equal to 10000000"),
    ("list-prompt", scenario({"type": "list", "requests": [
        {"prompt_len": 10**30, "output_len": 1}]}),
     "workload.requests.0.prompt_len: Input should be less than or equal to 10000000"),
    ("num-requests", scenario(workload(num_requests=MAX_REQUESTS_PER_RUN + 1)),
     "workload.num_requests: Input should be less than or equal to 100000000"),
    ("closed-loop-total", scenario({
        "type": "closed_loop", "num_clients": 100_000, "requests_per_client": 100_000,
        "prompt_len": {"type": "fixed", "value": 4}, "output_len": {"type": "fixed", "value": 4}}),
     "workload.requests_per_client: num_clients x requests_per_client is 10,000,000,000"),
    ("lognormal-tail", lengths(type="lognormal", mu=40, sigma=1),
     "workload.output_len: drew"),
    # 2. integers beyond int64
    ("fixed-int64", lengths(type="fixed", value=10**30), "workload.output_len.value"),
    ("uniform-high", lengths(type="uniform", low=1, high=10**30), "workload.output_len.high"),
    ("num-requests-int64", scenario(workload(num_requests=10**30)), "workload.num_requests"),
    ("rate-bigint", scenario(workload(arrival={"type": "poisson", "rate": 10**400})),
     "workload.arrival.rate: Input should be a valid number"),
    # 3. non-finite or absurd floats
    ("mu-nan", lengths(type="lognormal", mu=NAN, sigma=1),
     "workload.output_len.mu: Input should be a finite number"),
    ("mu-inf", lengths(type="lognormal", mu=INF, sigma=1), "workload.output_len.mu"),
    ("mu-1e308", lengths(type="lognormal", mu=1e308, sigma=1),
     "workload.output_len.mu: Input should be less than or equal to 50"),
    ("sigma-inf", lengths(type="lognormal", mu=3, sigma=INF), "workload.output_len.sigma"),
    ("sigma-big", lengths(type="lognormal", mu=3, sigma=11),
     "workload.output_len.sigma: Input should be less than or equal to 10"),
    ("rate-inf", scenario(workload(arrival={"type": "poisson", "rate": INF})),
     "workload.arrival.rate: Input should be a finite number"),
    ("rate-tiny", scenario(workload(arrival={"type": "poisson", "rate": 1e-300})),
     "workload.arrival: arrival 1 of 3 falls at"),
    ("gamma-cv", scenario(workload(arrival={"type": "gamma", "rate": 1, "cv": 1e200})),
     "workload.arrival.cv: Input should be less than or equal to 100"),
    ("mmpp-rate-nan", scenario(workload(arrival={
        "type": "mmpp", "rates": [1, NAN], "mean_durations": [1, 1]})),
     "workload.arrival.rates.1: must be a finite number"),
    ("mmpp-hang", scenario(workload(arrival={
        "type": "mmpp", "rates": [1e-12], "mean_durations": [1e-3]})),
     "workload.arrival: 3 arrivals at 1e-15 per cycle"),
    ("diurnal-curve-inf", scenario(workload(arrival={
        "type": "diurnal", "curve": [[0, 1], [10, INF]]})),
     "workload.arrival.curve.1: must be a finite number"),
    ("think-inf", scenario({
        "type": "closed_loop", "num_clients": 2, "requests_per_client": 2, "think_time": INF,
        "prompt_len": {"type": "fixed", "value": 4}, "output_len": {"type": "fixed", "value": 4}}),
     "workload.think_time: Input should be a finite number"),
    ("class-weight-inf", scenario(workload(classes=[{"name": "a", "weight": INF}])),
     "workload.classes.0.weight"),
    ("deadline-inf", scenario({"type": "list", "requests": [
        {"prompt_len": 3, "output_len": 2, "deadline": INF}]}),
     "workload.requests.0.deadline"),
    # 4. latency models
    ("constant-inf", scenario(latency={"type": "constant", "step_time": INF}),
     "engine.latency.step_time: Input should be a finite number"),
    ("linear-1e308", scenario(latency={"type": "linear", "base": 1e308}),
     "engine.latency.base: Input should be less than or equal to 3600"),
    ("linear-nan", scenario(latency={"type": "linear", "per_token": NAN}),
     "engine.latency.per_token: Input should be a finite number"),
    ("linear-zero", scenario(latency={"type": "linear", "base": 0, "per_seq": 0,
                                      "per_token": 0, "per_prefill_token": 0}),
     "engine.latency: every coefficient is 0: steps would take no time"),
    ("roofline-efficiency", scenario(latency={"type": "roofline", "compute_efficiency": 1e-300}),
     "engine.latency.compute_efficiency: Input should be greater than or equal to 0.001"),
    ("roofline-bandwidth", scenario(latency={"type": "roofline", "allreduce_bandwidth": INF}),
     "engine.latency.allreduce_bandwidth"),
    # 6. an output of zero tokens
    ("fixed-zero", lengths(type="fixed", value=0),
     "workload.output_len.value: must be >= 1: every request generates at least one output"),
    ("uniform-zero", lengths(type="uniform", low=0, high=0),
     "workload.output_len.high: must be >= 1"),
    ("clip-zero", lengths(type="lognormal", mu=3, sigma=1, max=0),
     "workload.output_len.max: must be >= 1"),
]


@pytest.mark.parametrize("raw,expected", [c[1:] for c in SCENARIO_CASES],
                         ids=[c[0] for c in SCENARIO_CASES])
def test_hostile_scenario_values_are_one_clear_line(raw, expected):
    assert expected in fails_fast(raw)


def test_a_zero_prompt_is_still_allowed():
    run(scenario(workload(prompt_len={"type": "fixed", "value": 0})))


# -- traces -----------------------------------------------------------------------------------

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n" \
        "2023-11-16 18:15:46.6805900,374,44\n" \
        "2023-11-16 18:15:50.9951690,396,{out}\n"
MOON = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}


def moon(**second: Any) -> str:
    return json.dumps(MOON) + "\n" + json.dumps({**MOON, "timestamp": 1000, **second}) + "\n"


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


TRACE_CASES = [
    ("azure-huge", "az.csv", AZURE.format(out="1000000000000"),
     "az.csv:3: GeneratedTokens: 1000000000000 is more than the limit of 10,000,000 tokens"),
    ("azure-int64", "az.csv", AZURE.format(out="1" + "0" * 30),
     "az.csv:3: GeneratedTokens: 1000000000000000000000000000000 is more than the limit"),
    ("mooncake-output", "m.jsonl", moon(output_length=10**25),
     "m.jsonl:2: output_length: 10000000000000000000000000 is more than the limit"),
    ("mooncake-input-float", "m.jsonl", moon(input_length=1e30),
     "m.jsonl:2: input_length: 1e+30 is more than the limit"),
    ("mooncake-input-int", "m.jsonl", moon(input_length=10**25),
     "m.jsonl:2: input_length: 10000000000000000000000000 is more than the limit"),
    ("mooncake-timestamp", "m.jsonl", moon(timestamp=10**400),
     "m.jsonl:2: timestamp: a 401-digit number is not a finite number >= 0"),
    ("mooncake-timestamp-inf", "m.jsonl", moon(timestamp=INF),
     "m.jsonl:2: timestamp: inf is not a finite number >= 0"),
    ("mooncake-digits", "m.jsonl", json.dumps(MOON) + "\n" +
     json.dumps(MOON).replace('"timestamp": 0', '"timestamp": ' + "9" * 5000) + "\n",
     "m.jsonl:2: a number has too many digits"),
    ("mooncake-nested", "m.jsonl", json.dumps(MOON) + "\n" + deep(20_000) + "\n",
     "m.jsonl:2: nested too deeply"),
    ("sharegpt-nested", "s.json", deep(20_000), "s.json: nested too deeply"),
    ("empty-csv", "e.csv", "", "e.csv: the trace has no rows"),
    ("blank-jsonl", "e.jsonl", "\n\n", "e.jsonl: the trace has no rows"),
]


def trace_scenario(path: Path, **over: Any) -> dict[str, Any]:
    wl: dict[str, Any] = {"type": "trace", "file": str(path), **over}
    if path.suffix == ".json":
        wl["arrival"] = {"type": "poisson", "rate": 1.0}
    return scenario(wl)


@pytest.mark.parametrize("name,text,expected", [c[1:] for c in TRACE_CASES],
                         ids=[c[0] for c in TRACE_CASES])
def test_hostile_trace_values_name_file_line_and_column(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    msg = fails_fast(trace_scenario(path), TraceError)
    assert msg.startswith(str(tmp_path)) and expected in msg, msg


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_text("\ufeff" + AZURE.format(out="5"), encoding="utf-8")
    sc = orcasim.Scenario(trace_scenario(path))
    arrays = generate_workload(sc.variants[0])
    assert arrays.output_len.tolist() == [44, 5]


def test_an_empty_trace_window_names_the_window_fields(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(AZURE.format(out="5"), encoding="utf-8")
    msg = fails_fast(trace_scenario(path, start=100, end=200))
    assert "workload.start, workload.end: no trace rows between 100 s and 200 s" in msg
    msg = fails_fast(trace_scenario(path, start=1e300))
    assert "workload.start: no trace rows between" in msg


MEASURED = "batch_size,prefill_tokens,decode_tokens,kv_tokens,seconds\n" \
           "1,0,1,512,0.0071\n8,0,8,{kv},{seconds}\n"


@pytest.mark.parametrize("kv,seconds,expected", [
    ("4096", "1e308", "steps.csv:3: seconds: '1e308' is more than the limit of 3600 s"),
    ("4096", "nan", "steps.csv:3: seconds: 'nan' is not a finite number >= 0"),
    ("1e300", "0.0079", "steps.csv:3: kv_tokens: '1e300' is more than the limit of 1e+15"),
])
def test_hostile_measured_step_times(tmp_path, kv, seconds, expected):
    path = tmp_path / "steps.csv"
    path.write_text(MEASURED.format(kv=kv, seconds=seconds), encoding="utf-8")
    msg = fails_fast(scenario(latency={"type": "table", "file": str(path)}), TraceError)
    assert expected in msg, msg


# -- the command line -------------------------------------------------------------------------

@pytest.mark.parametrize("body,expected", [
    ("workload: {type: synthetic, num_requests: 1, arrival: {type: poisson, rate: 1.0},\n"
     "  prompt_len: {type: fixed, value: 5},\n"
     "  output_len: {type: fixed, value: 2000000000}}\n",
     "workload.output_len.value: Input should be less than or equal to 10000000"),
    ("workload: {type: synthetic, num_requests: 2, arrival: {type: poisson, rate: 1.0},\n"
     "  prompt_len: {type: fixed, value: 5}, output_len: {type: fixed, value: 3}}\n"
     "engine: {latency: {type: constant, step_time: .inf}}\n",
     "engine.latency.step_time: Input should be a finite number"),
    ("workload: {type: trace, file: TRACE}\n", "GeneratedTokens: 1000000000000 is more than"),
])
def test_cli_exits_2_with_one_line(tmp_path, capsys, body, expected):
    trace = tmp_path / "az.csv"
    trace.write_text(AZURE.format(out="1000000000000"), encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text("policy: fcfs\n" + body.replace("TRACE", str(trace)), encoding="utf-8")
    start = time.perf_counter()
    code = main(["run", str(path), "--out", str(tmp_path / "o"), "--no-plots"])
    assert time.perf_counter() - start < TIME_LIMIT_S
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("orcasim: error: ") and expected in err, err


# -- property tests ---------------------------------------------------------------------------

HOSTILE = st.sampled_from([NAN, INF, -INF, 0, 0.0, -1, -1e30, 1e30, 1e308, 10**30, 2**63,
                           -(2**63), 10**400, 1e-300, 5e-324])
NUMBER = st.one_of(HOSTILE, st.integers(-10, 10**8), st.floats(allow_nan=True,
                                                               allow_infinity=True))
SMALL_OK = st.sampled_from([1, 2, 3, 5, 0.5, 2.5])
#: total output tokens a drawn valid workload may have and still be simulated here
SIM_BUDGET_TOKENS = 2_000

LENGTH_FIELDS = {
    "fixed": ["value"],
    "uniform": ["low", "high"],
    "lognormal": ["mu", "sigma", "min", "max"],
}


def one_line(err: OrcasimError) -> None:
    msg = str(err)
    assert msg and "\n" not in msg and len(msg) < 400, msg


def outcome(raw: dict[str, Any]) -> None:
    """Either a one-line :class:`ScenarioError`, or finite arrays and finite latencies."""
    try:
        sc = orcasim.Scenario(raw)
        arrays = generate_workload(sc.variants[0])
    except ScenarioError as err:
        one_line(err)
        return
    assert np.isfinite(arrays.arrival).all()
    assert (arrays.output_len >= 1).all() and (arrays.output_len <= MAX_TOKENS_PER_REQUEST).all()
    assert (arrays.prompt_len >= 0).all() and (arrays.prompt_len <= MAX_TOKENS_PER_REQUEST).all()
    if int(arrays.output_len.sum()) > SIM_BUDGET_TOKENS or int(arrays.prompt_len.max()) > 10**5:
        return
    res = next(iter(orcasim.simulate(sc).values()))
    s = res.summary
    for key in ("e2e_mean", "e2e_p99", "ttft_mean", "makespan_s"):
        assert s[key] is not None and math.isfinite(s[key]), (key, s[key])


@st.composite
def length_dist(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(LENGTH_FIELDS)))
    base = {"fixed": {"value": 3}, "uniform": {"low": 1, "high": 4},
            "lognormal": {"mu": 1.0, "sigma": 0.5}}[kind]
    field = draw(st.sampled_from(LENGTH_FIELDS[kind]))
    return {"type": kind, **base, field: draw(NUMBER)}


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(dist=length_dist(), column=st.sampled_from(["prompt_len", "output_len"]),
       n=st.one_of(st.just(1), st.just(2), st.just(3), HOSTILE))
def test_hostile_length_parameters(dist, column, n):
    outcome(scenario(workload(**{column: dist}, num_requests=n)))


LATENCY_FIELDS = {
    "linear": ["base", "per_seq", "per_token", "per_prefill_token"],
    "constant": ["step_time"],
    "roofline": ["compute_efficiency", "bandwidth_efficiency", "overhead",
                 "allreduce_bandwidth", "allreduce_latency"],
}


@st.composite
def latency_model(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(LATENCY_FIELDS)))
    fields = draw(st.lists(st.sampled_from(LATENCY_FIELDS[kind]), min_size=1, max_size=3,
                           unique=True))
    out: dict[str, Any] = {"type": kind}
    if kind == "roofline":
        out["tp"] = 2
    for f in fields:
        out[f] = draw(NUMBER)
    return out


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(latency=latency_model())
def test_hostile_latency_coefficients(latency):
    outcome(scenario(latency=latency))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["poisson", "gamma", "at_once"]), value=NUMBER, extra=SMALL_OK)
def test_hostile_arrival_parameters(kind, value, extra):
    arrival = {"poisson": {"type": "poisson", "rate": value},
               "gamma": {"type": "gamma", "rate": extra, "cv": value},
               "at_once": {"type": "at_once", "time": value}}[kind]
    outcome(scenario(workload(arrival=arrival)))
