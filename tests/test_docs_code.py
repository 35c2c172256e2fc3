"""The Python shown on the documentation pages runs as written."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

import orcasim

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: str) -> list[str]:
    return FENCE.findall((ROOT / page).read_text())


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/getting-started.md"])
def test_the_api_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for code in python_blocks(page):
        exec(compile(code, page, "exec"), {"__name__": "docs"})


def test_the_architecture_page_policy_admits_the_shortest_prompt_first():
    (code,) = python_blocks("docs/architecture.md")
    exec(compile(code, "architecture.md", "exec"), {"__name__": "docs"})
    reqs = [{"name": "long", "prompt_len": 50, "output_len": 2},
            {"name": "short", "prompt_len": 5, "output_len": 2},
            {"name": "first", "arrival": 0.0, "prompt_len": 9, "output_len": 1}]
    sc = orcasim.Scenario({"workload": {"type": "list", "requests": reqs},
                           "engine": {"latency": {"type": "constant", "step_time": 1.0}},
                           "policy": {"type": "shortest-first", "max_batch": 1}})
    v = orcasim.simulate(sc)["shortest-first"]
    order = v.requests.sort_values("first_scheduled")["name"].tolist()
    assert order == ["short", "first", "long"]
