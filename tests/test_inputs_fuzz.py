"""Random scenario documents with hostile values: one clean line or a valid run, never a crash.

Each document is a tree built from the scenario schema's own keys (top-level
sections, component types and their parameter names), with values drawn from
a hostile pool: NaN and infinities, huge and negative numbers, wrong types,
deep and empty containers, long and odd strings. Every document must either
validate, or fail with a :class:`ScenarioError` whose message is one line
naming the file; and it must do so quickly. Through the command line the
same holds with exit status 2 and one line on stderr.
"""

from __future__ import annotations

import math
import time

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orcasim
from orcasim.cli import main
from orcasim.errors import OrcasimError
from orcasim.registry import latency_models, lengths, workloads

HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 1, 10**30, -(10**30), 1e308, 1e-308,
                     2**63, True, None, "", "x" * 300, "continuous", "../..", [], {}, [[[[]]]]]),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)


def _params(registry) -> st.SearchStrategy[dict]:
    """``{type: a registered name, some of its parameters: hostile values}``."""
    names = [n for n in registry.names() if not n.startswith(("test-", "short-first", "greedy"))]

    @st.composite
    def draw(d) -> dict:
        name = d(st.sampled_from(names))
        fields = [*registry.get(name).Params.model_fields, "nosuch"]
        keys = d(st.lists(st.sampled_from(fields), max_size=4, unique=True))
        return {"type": name, **{k: d(HOSTILE) for k in keys}}

    return draw()


def _scenario() -> st.SearchStrategy[dict]:
    base = {"workload": {"type": "synthetic", "num_requests": 5,
                         "arrival": {"type": "poisson", "rate": 1.0},
                         "prompt_len": {"type": "fixed", "value": 4},
                         "output_len": {"type": "fixed", "value": 3}},
            "policy": {"type": "fcfs"}}

    @st.composite
    def draw(d) -> dict:
        doc = dict(base)
        section = d(st.sampled_from(["workload", "policy", "latency", "lengths", "top", "memory"]))
        if section == "workload":
            doc["workload"] = d(_params(workloads))
        elif section == "policy":
            doc["policy"] = d(_params(orcasim.policy_registry))
        elif section == "latency":
            doc["engine"] = {"latency": d(_params(latency_models))}
        elif section == "lengths":
            doc["workload"] = {**base["workload"], "output_len": d(_params(lengths))}
        elif section == "memory":
            doc["memory"] = {d(st.sampled_from(["num_blocks", "block_size", "allocator",
                                                "swap_space_gb", "model", "tp"])): d(HOSTILE)}
        else:
            doc[d(st.sampled_from(["name", "seed", "variants", "events", "admission",
                                   "clients", "metrics", "nosuch"]))] = d(HOSTILE)
        return doc

    return draw()


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_a_hostile_document_validates_or_fails_in_one_line(doc):
    t0 = time.perf_counter()
    try:
        sc = orcasim.Scenario(doc, source="fuzz.yaml")
    except OrcasimError as err:
        msg = str(err)
        assert msg.startswith("fuzz.yaml") and "\n" not in msg and len(msg) < 2000, msg
    else:
        assert sc.variants
    assert time.perf_counter() - t0 < 5.0


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_the_command_line_exits_0_or_2_with_one_line(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.yaml"
    try:
        text = yaml.safe_dump(doc)
    except yaml.YAMLError:
        return
    path.write_text(text, encoding="utf-8")
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["validate", str(path)])
    lines = err.getvalue().splitlines()
    if rc == 0:
        assert not lines
    else:
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("orcasim: error: "), lines
        assert "Traceback" not in err.getvalue()


TRACE_VALUE = st.one_of(HOSTILE.filter(lambda v: not isinstance(v, (list, dict))),
                        st.integers(min_value=0, max_value=10**7))


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(tokens=st.tuples(TRACE_VALUE, TRACE_VALUE), kind=st.sampled_from(["azure", "mooncake"]))
def test_a_hostile_trace_row_loads_or_fails_in_one_line(tmp_path, tokens, kind):
    import json

    if kind == "azure":
        path = tmp_path / "az.csv"
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                        "2023-11-16 18:15:46.6805900,374,44\n"
                        f"2023-11-16 18:15:50.9951690,{tokens[0]},{tokens[1]}\n", encoding="utf-8")
    else:
        path = tmp_path / "m.jsonl"
        rows = [{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
                {"timestamp": 10, "input_length": tokens[0], "output_length": tokens[1],
                 "hash_ids": [0]}]
        try:
            text = "\n".join(json.dumps(r) for r in rows) + "\n"
        except (TypeError, ValueError):
            return
        path.write_text(text, encoding="utf-8")
    t0 = time.perf_counter()
    try:
        sc = orcasim.Scenario({"workload": {"type": "trace", "file": str(path)},
                               "policy": "fcfs"})
        arrays = orcasim.generate_workload(sc.variants[0])
    except OrcasimError as err:
        msg = str(err)
        assert "\n" not in msg and str(path) in msg, msg
    else:
        assert len(arrays) == 2 and (arrays.output_len >= 1).all()
    assert time.perf_counter() - t0 < 5.0
