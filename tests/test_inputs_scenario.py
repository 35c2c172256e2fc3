"""Malformed scenario inputs: each is one line naming the file and field, exit 2, and quick.

Covers what a YAML file can do beyond a wrong value (alias bombs, recursive
aliases, duplicate keys, foreign encodings, deep nesting, huge files), type
mistakes the validators must not trip over, misspelt fields and variants, and
scenario names that would escape the output folder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

import orcasim
from orcasim.cli import main
from orcasim.errors import ScenarioError
from orcasim.scenario import load_scenario
from orcasim.spec import short_repr
from orcasim.yaml_input import MAX_TEXT_BYTES, parse_yaml

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
POLICY = "policy: {type: continuous, max_batch: 4}"
VARIANTS = "variants:\n  static: {policy: {type: static}}\n  continuous: {}\n"
SECONDS = 5.0


def _bomb(levels: int = 9) -> str:
    """Anchors ``a0..a8``, each a list of nine references to the previous one: 9**9 leaves."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _flow_bomb() -> str:
    """:func:`_bomb` as one flow sequence, for a ``--set`` value."""
    items = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    items += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "[" + ", ".join(items) + "]"


def _nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


@dataclass(frozen=True)
class Case:
    """A scenario (text, or bytes to write verbatim), ``--set`` overrides, expected substrings."""

    id: str
    content: str | bytes
    expect: tuple[str, ...]
    overrides: tuple[str, ...] = ()


CASES = [
    Case("alias-bomb", _bomb() + BASE.replace("name: t", "name: *a8"),
         ("line 7: the document expands to more than 1,000,000 nodes",)),
    Case("alias-bomb-in-variants", BASE + _bomb() + "variants: {a: {x: *a8}}\n",
         ("expands to more than 1,000,000 nodes",)),
    Case("recursive-alias", BASE + "variants: &v {a: {x: *v}}\n",
         ("line 9: a YAML alias refers to itself",)),
    Case("duplicate-key", BASE + "policy: {type: fcfs}\n",
         ("s.yaml: line 9: duplicate key 'policy'",)),
    Case("duplicate-nested-key", BASE.replace("rate: 2.0", "rate: 2.0, rate: 3.0"),
         ("line 5: duplicate key 'rate'",)),
    Case("duplicate-beside-merge-key",
         BASE.replace(POLICY, "policy: &p {type: continuous, max_batch: 4}")
         + "variants:\n  a: {policy: {<<: *p, max_batch: 8, max_batch: 9}}\n",
         ("line 10: duplicate key 'max_batch'",)),
    Case("utf-16", BASE.encode("utf-16"), ("s.yaml: cannot read: not UTF-8 text",)),
    Case("utf-16-without-bom", BASE.encode("utf-16-le"), ("cannot read: not UTF-8 text",)),
    Case("latin-1", BASE.replace("name: t", "description: caf\xe9").encode("latin-1"),
         ("cannot read: not UTF-8 text",)),
    Case("too-large", BASE + "description: " + "x" * MAX_TEXT_BYTES + "\n",
         ("cannot read: larger than 20 MB",)),
    Case("20000-brackets", BASE.replace("name: t", "name: " + _nested(20_000)),
         ("s.yaml: line 1: ", "nest")),
    Case("500-brackets", BASE.replace("name: t", "name: " + _nested(500)),
         ("line 1: nested deeper than 100 levels",)),
    Case("deep-through-aliases",
         "a: &a " + _nested(60) + "\n" + BASE.replace("name: t", "name: " + _nested(60, "*a")),
         ("nested deeper than 100 levels",)),
    Case("deep-through-dotted-keys",
         BASE + "variants:\n  v: {" + ".".join(["a"] * 500) + ": 1}\n",
         ("variants.v: 'a.a.a", "nested deeper than 100 levels")),
    Case("override-path-too-long", BASE, ("more than 50 dotted parts",),
         (".".join(["a"] * 60) + "=1",)),
    Case("empty", "", ("a scenario must be a YAML mapping",)),
    Case("policy-type-list", BASE.replace(POLICY, "policy: {type: [continuous]}"),
         ("policy.type: must be a string naming a registered component",)),
    Case("latency-type-number", BASE + "engine: {latency: {type: 3}}\n",
         ("engine.latency.type: must be a string naming a registered component",)),
    Case("misspelt-required-field", BASE.replace("num_requests:", "num_requets:"),
         ("workload.num_requets: unknown field (did you mean 'num_requests'?); "
          "workload.num_requests: required field is missing",)),
    Case("misspelt-top-level-field", BASE.replace("policy:", "polcy:"),
         ("polcy: unknown field (did you mean 'policy'?); policy: required field is missing",)),
    Case("all-errors-of-a-section",
         BASE.replace("max_batch: 4", "max_batch: 0, max_btch: 3, token_budgt: 9"),
         ("policy.max_btch: unknown field (did you mean 'max_batch'?); policy.token_budgt: "
          "unknown field", "policy.max_batch: Input should be greater than 0 (got 0)")),
    Case("errors-capped",
         BASE.replace("num_requests: 10", "num_requests: 10\n"
                      + "".join(f"  extra{i}: {i}\n" for i in range(8))),
         ("workload.extra0: unknown field; ", "workload.extra4: unknown field; (and 3 more)")),
    Case("unknown-variant-override", BASE + VARIANTS,
         ("variants.contnuous: no such variant (have: static, continuous); "
          "did you mean 'continuous'?",), ("variants.contnuous.policy.max_batch=16",)),
    Case("variant-override-without-variants", BASE, ("variants.x: no such variant (have: none)",),
         ("variants.x.seed=1",)),
    Case("alias-bomb-in-override", BASE, ("name: value: the document expands",),
         ("name=" + _flow_bomb(),)),
    Case("name-parent-dir", BASE.replace("name: t", "name: ../../etc"),
         ("s.yaml: name: must be 1-100 characters", "(got '../../etc')")),
    Case("name-separator", BASE.replace("name: t", "name: a/b"), ("name: must be",)),
    Case("name-absolute", BASE.replace("name: t", "name: /tmp/x"), ("name: must be",)),
    Case("name-space", BASE.replace("name: t", "name: my run"), ("name: must be",)),
    Case("name-dots", BASE.replace("name: t", "name: '..'"), ("name: must be",)),
    Case("name-empty", BASE.replace("name: t", "name: ''"), ("name: must be",)),
    Case("name-override", BASE, ("name: must be",), ("name=../out",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_scenario_is_one_line_exit_2(tmp_path, capsys, case):
    p = tmp_path / "s.yaml"
    if isinstance(case.content, bytes):
        p.write_bytes(case.content)
    else:
        p.write_text(case.content, encoding="utf-8")
    argv = ["validate", str(p)] + [a for o in case.overrides for a in ("--set", o)]
    start = time.perf_counter()
    rc = main(argv)
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err[:2000]
    assert lines[0].startswith(f"orcasim: error: {p}: ")
    for text in case.expect:
        assert text in lines[0]
    assert len(lines[0]) < 1000
    assert elapsed < SECONDS


def _write(tmp_path, text: str):
    p = tmp_path / "s.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_api_raises_scenario_errors(tmp_path):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_write(tmp_path, _bomb() + BASE.replace("name: t", "name: *a8")))
    assert exc.value.field == "line 7" and exc.value.source == str(tmp_path / "s.yaml")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(_write(tmp_path, BASE + "policy: {type: fcfs}\n"))
    assert (exc.value.field, exc.value.message) == ("line 9", "duplicate key 'policy'")
    with pytest.raises(ScenarioError, match=r"<s>: line 2: duplicate key 'a'"):
        parse_yaml("a: 1\na: 2\n", "<s>")


def test_override_into_an_unknown_variant_is_refused():
    sc = orcasim.load_scenario("seed_orca")
    with pytest.raises(ScenarioError) as exc:
        sc.override({"variants.nosuch.x": 1})
    assert str(exc.value) == ("seed_orca.yaml: variants.nosuch: no such variant "
                              "(have: static, continuous)")
    added = sc.override({"variants.fcfs": {"policy": {"type": "fcfs"}}})
    assert added.variant_names == ["static", "continuous", "fcfs"]
    assert added.override({"variants.fcfs.policy.max_batch": 3}).variant(
        "fcfs").policy.params.max_batch == 3


def test_a_bom_and_windows_line_ends_are_accepted(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(b"\xef\xbb\xbf" + BASE.replace("\n", "\r\n").encode())
    assert load_scenario(p).name == "t"


def test_plain_names_are_accepted(tmp_path):
    sc = load_scenario(_write(tmp_path, BASE.replace("name: t", "name: A-1.b_2+c")))
    assert sc.name == "A-1.b_2+c"


def test_merge_keys_still_merge_and_explicit_keys_win():
    sc = orcasim.load_scenario("priority_kv_pressure")
    strict = sc.variant("strict-preempt").policy
    assert strict.type == "priority"
    assert (strict.params.max_batch, strict.params.token_budget) == (256, 2048)
    assert strict.params.watermark == 0.01 and strict.params.preempt is True
    assert sc.variant("fcfs").policy.type == "fcfs"
    share = sc.variant("share-4+kv_fit")
    assert share.policy.type == "class-share" and share.policy.params.max_batch == 256
    assert [a.type for a in share.admission] == ["kv_fit"]


@pytest.mark.parametrize("name", orcasim.builtin_scenarios())
def test_every_builtin_scenario_still_validates(name, capsys):
    start = time.perf_counter()
    assert main(["validate", name]) == 0
    assert time.perf_counter() - start < SECONDS
    assert ": ok, " in capsys.readouterr().out


def test_messages_never_expand_a_shared_input():
    leaf = ["x"] * 9
    for _ in range(8):
        leaf = [leaf] * 9
    start = time.perf_counter()
    text = short_repr(leaf)
    assert len(text) < 300 and time.perf_counter() - start < 0.1
