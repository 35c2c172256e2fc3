"""The cluster page's Python example and YAML run as written."""

from __future__ import annotations

import re

import yaml
from conftest import ROOT

import orcasim

PAGE = ROOT / "docs" / "clusters.md"


def test_the_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (code,) = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    exec(compile(code, "clusters.md", "exec"), {"__name__": "docs"})


def test_the_yaml_examples_validate():
    first, faults, scaling, pd, _lockstep = re.findall(r"^```yaml\n(.*?)^```",
                                                       PAGE.read_text(), re.S | re.M)
    sc = orcasim.Scenario(yaml.safe_load(first))
    cluster = sc.variants[0].cluster
    assert [g.count for g in cluster.groups] == [4, 2] and cluster.staleness == 0.05
    raw = yaml.safe_load(first)
    raw["cluster"] = {**yaml.safe_load(faults)["cluster"]}
    f = orcasim.Scenario(raw).variants[0].cluster.faults
    assert f.events[0].replica == "r-1" and f.random.mttf == 3600
    raw["cluster"] = {**yaml.safe_load(scaling)["cluster"]}
    a = orcasim.Scenario(raw).variants[0].cluster.autoscaling
    assert (a.min, a.initial, a.metric, a.cold_start) == (1, 2, "ttft", 30)
    raw = {**yaml.safe_load(first), **yaml.safe_load(pd)}
    c = orcasim.Scenario(raw).variants[0].cluster
    assert [g.role for g in c.groups] == ["prefill", "decode"]
    assert c.bytes_per_token == 131072 and c.link.preset == "infiniband_400g"
