"""Scenario validation: every mistake is one line naming the file and field."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import orcasim
from orcasim.errors import ScenarioError
from orcasim.overrides import expand_dotted, merge

BASE = """\
name: t
workload:
  type: synthetic
  num_requests: 10
  arrival: {type: poisson, rate: 2.0}
  prompt_len: {type: fixed, value: 4}
  output_len: {type: uniform, low: 1, high: 5}
policy: {type: continuous, max_batch: 4}
"""


def write(tmp_path, text: str):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize(
    "edit,field,message",
    [
        (("rate: 2.0", "rate: -1"), "workload.arrival.rate", "greater than 0"),
        (("rate: 2.0", "rate: fast"), "workload.arrival.rate", "valid number"),
        (("rate: 2.0", "rate: 2.0, burst: 3"), "workload.arrival.burst", "unknown field"),
        (("type: poisson", "type: poison"), "workload.arrival.type", "unknown arrival process"),
        (("max_batch: 4", "max_batch: 0"), "policy.max_batch", "greater than 0"),
        (("type: continuous", "type: nope"), "policy.type", "unknown policy 'nope'"),
        (("num_requests: 10", "num_requests: ten"), "workload.num_requests", "valid integer"),
        (("low: 1, high: 5", "low: 6, high: 5"), "workload.output_len", "low (6) must be <= high"),
        (("name: t", "name: t\nbogus: 1"), "bogus", "unknown field"),
        (("  prompt_len: {type: fixed, value: 4}\n", ""), "workload.prompt_len",
         "required field is missing"),
    ],
)
def test_bad_fields_are_named(tmp_path, edit, field, message):
    p = write(tmp_path, BASE.replace(*edit))
    with pytest.raises(ScenarioError) as exc:
        orcasim.load_scenario(p)
    err = exc.value
    assert err.field == field
    assert message in err.message
    assert str(err).startswith(f"{p}: {field}: ")
    assert "\n" not in str(err)


def test_yaml_syntax_error_names_the_line(tmp_path):
    p = write(tmp_path, BASE.replace("policy: {type: continuous, max_batch: 4}",
                                     "policy: {type: continuous, max_batch: 4"))
    with pytest.raises(ScenarioError, match=r"line \d+: invalid YAML"):
        orcasim.load_scenario(p)


def test_variant_errors_name_the_variant(tmp_path):
    p = write(tmp_path, BASE + "variants:\n  small:\n    policy.max_batch: -2\n")
    with pytest.raises(ScenarioError) as exc:
        orcasim.load_scenario(p)
    assert exc.value.field == "variants.small: policy.max_batch"


def test_missing_file_and_unknown_builtin(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        orcasim.load_scenario(tmp_path / "none.yaml")
    with pytest.raises(ScenarioError, match=r"\(built-in: article_two_slots, .*seed_orca\)"):
        orcasim.load_scenario("no_such_scenario")


@pytest.mark.parametrize("edit", [("rate: 2.0", "rate: -1"), ("max_batch: 4", "max_batch: x")])
def test_cli_exit_code_2_one_line_no_traceback(tmp_path, edit):
    p = write(tmp_path, BASE.replace(*edit))
    r = subprocess.run([sys.executable, "-m", "orcasim.cli", "run", str(p), "--out",
                        str(tmp_path / "o"), "--no-plots"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orcasim: error: ")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_cli_bad_override_is_a_scenario_error(tmp_path, capsys):
    from orcasim.cli import main

    rc = main(["run", "--set", "policy.max_batch=-3", "--out", str(tmp_path), "--no-plots"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "orcasim: error: seed_orca.yaml: variants.static: policy.max_batch: "
        "Input should be greater than 0 (got -3)"
    )


def test_overrides_and_merge_rules():
    sc = orcasim.load_scenario("seed_orca")
    sc2 = sc.override(["workload.arrival.rate=5", "variants.static.policy.max_batch=8"], seed=4)
    assert sc2.seed == 4
    assert sc2.variant("static").workload.params.arrival.params.rate == 5.0
    assert sc2.variant("static").policy.params.max_batch == 8
    assert sc2.variant("continuous").policy.params.max_batch == 32
    assert sc.variant("static").policy.params.max_batch == 32  # original untouched
    # a changed component type replaces the section instead of merging into it
    assert merge({"type": "a", "x": 1}, {"type": "b"}) == {"type": "b"}
    assert merge({"type": "a", "x": 1}, {"y": 2}) == {"type": "a", "x": 1, "y": 2}
    assert expand_dotted({"a.b": 1, "a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}


def test_scenario_without_variants_runs_its_policy(tmp_path):
    sc = orcasim.load_scenario(write(tmp_path, BASE))
    assert sc.variant_names == ["continuous"]
    res = orcasim.simulate(sc)
    assert res.summary["continuous"]["num_finished"] == 10


def test_an_override_never_changes_the_scenario_it_came_from():
    sc = orcasim.load_scenario("seed_orca").override({"variants": {
        "a": {"policy": {"type": "fcfs"}}, "b": {"policy": {"type": "sjf"}}}})
    other = sc.override({"variants.a.policy": {"type": "srpt"}})
    assert [v.policy.type for v in other.variants] == ["srpt", "sjf"]
    assert [v.policy.type for v in sc.variants] == ["fcfs", "sjf"]
    assert [v.policy.type for v in sc.override({}).variants] == ["fcfs", "sjf"]


def test_samples_and_beams_are_refused_rather_than_ignored():
    wl = {"type": "synthetic", "num_requests": 4, "arrival": {"type": "poisson", "rate": 1},
          "prompt_len": {"type": "fixed", "value": 3}, "output_len": {"type": "fixed", "value": 3}}
    for field, what in (("n", "parallel sampling"), ("beam_width", "beam search")):
        with pytest.raises(ScenarioError, match=rf"workload.classes.0.{field}: .*{what}"):
            orcasim.Scenario({"workload": {**wl, "classes": [{"name": "a", field: 2}]},
                              "policy": "fcfs"})


@pytest.mark.parametrize("policy", ["static", "continuous", "fcfs", "sarathi", "priority",
                                    "vllm-v1"])
def test_max_num_seqs_is_the_batch_limit_under_either_name(policy):
    sc = orcasim.load_scenario().override({"workload.num_requests": 60})
    a = sc.override({"policy": {"type": policy, "max_num_seqs": 4}, "variants": None})
    b = sc.override({"policy": {"type": policy, "max_batch": 4}, "variants": None})
    sa = next(iter(orcasim.simulate(a).values())).summary
    sb = next(iter(orcasim.simulate(b).values())).summary
    assert sa == sb and sa["mean_batch_size"] <= 4
