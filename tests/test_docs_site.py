"""The documentation site: the generated scenario reference and the navigation hook."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
from conftest import ROOT

import orcasim
from orcasim import registry
from orcasim.reference import SECTIONS, builtin_scenarios_page, scenario_reference
from orcasim.scenario import ScenarioModel


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "tools" /
                                                  "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reference_lists_every_component_and_field():
    text = scenario_reference()
    for name in ScenarioModel.model_fields:
        assert f"| `{name}` |" in text
    for _, _, reg, _ in SECTIONS:
        for name, cls in reg:
            assert f"### `{name}`" in text
            for field in cls.Params.model_fields:
                assert f"| `{field}` |" in text, (name, field)
    assert len(SECTIONS) == 7  # every registry orcasim has
    assert {id(r) for _, _, r, _ in SECTIONS} == {id(r) for r in (
        registry.policies, registry.latency_models, registry.workloads, registry.arrivals,
        registry.lengths, registry.admission, registry.routers)}


def test_reference_rows_carry_types_defaults_and_constraints():
    text = scenario_reference()
    assert "| `rate` | float | **required** | > 0 | requests per second |" in text
    assert ("| `warmup` | float | `0.0` | >= 0, < 1 | leave requests arriving in this first "
            "fraction of the arrival span out of the latency metrics (steady state) |") in text
    assert "| `latency` | [latency model](#latency-models) | `{type: linear}` |" in text
    assert "| `arrival` | [arrival process](#arrival-processes) | **required** |" in text
    assert "#### `metrics.slo`" in text and "#### `workload.requests`" in text
    assert "| `draw_order` | list of `arrival` \\| `prompt_len` \\| `output_len` | " \
           "`[arrival, output_len, prompt_len]` |" in text


def test_builtin_scenarios_page_links_tutorials():
    page = builtin_scenarios_page({"seed_orca": "../seed-study.md"})
    for name in orcasim.builtin_scenarios():
        assert f"## `{name}`" in page and f"`orcasim run {name}`" in page
    assert "Tutorial: [seed_orca](../seed-study.md)." in page
    assert "name: article_two_slots" in page  # the file itself


def test_nav_drops_missing_pages_and_appends_unlisted_ones(tmp_path):
    hooks = _hooks()
    for p in ("index.md", "a.md", "sub/b.md", "new.md", "tutorials/x.md"):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text("# t\n")
    config = SimpleNamespace(docs_dir=str(tmp_path), extra={}, nav=[
        {"Home": "index.md"}, {"Guide": [{"A": "a.md"}, {"Later": "later.md"}]},
        {"Empty": [{"Gone": "gone.md"}]}, {"Ref": "reference/scenario-file.md"},
        "sub/b.md", {"Site": "https://example.org/"}])
    hooks.on_config(config)
    assert config.nav == [
        {"Home": "index.md"}, {"Guide": [{"A": "a.md"}]}, {"Ref": "reference/scenario-file.md"},
        "sub/b.md", {"Site": "https://example.org/"}, {"More": ["new.md", "tutorials/x.md"]}]


def test_site_config_lists_the_tutorials_that_exist():
    hooks = _hooks()
    yaml = pytest.importorskip("yaml")
    conf = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    cfg = SimpleNamespace(docs_dir=str(ROOT / "docs"), extra=conf["extra"])
    got = hooks.tutorials(cfg)
    assert got["seed_orca"] == "../seed-study.md"
    assert got["article_two_slots"] == "../tutorials/article_two_slots.md"
    assert conf["hooks"] == ["tools/mkdocs_hooks.py"] and conf["strict"] is True
