"""Plugins without packaging: the tutorial's policy from a file, by --import, scenario and sweep."""

from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest
import yaml
from conftest import ROOT

import orcasim
from orcasim import plugins
from orcasim.cli import main
from orcasim.errors import UsageError
from orcasim.experiments.runner import execute_run
from orcasim.plugins import load_plugins, loaded_plugins, module_name

TUTORIAL = ROOT / "docs" / "policy-tutorial.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
WORKLOAD = {
    "type": "synthetic",
    "num_requests": 50,
    "arrival": {"type": "poisson", "rate": 30.0},
    "output_len": {"type": "lognormal", "mu": 4.6, "sigma": 0.9, "min": 10, "max": 200},
    "prompt_len": {"type": "lognormal", "mu": 4.0, "sigma": 0.7, "min": 5, "max": 200},
}
METRICS = ["num_finished", "throughput_tok_s", "ttft_p50", "ttft_p99", "e2e_p99"]
#: appended to a plugin: leaves a file named after the importing process's id
MARKER = """
import os as _os
from pathlib import Path as _Path

_Path({!r}, str(_os.getpid())).touch()
"""


@pytest.fixture(autouse=True)
def _own_plugin_list(monkeypatch):
    """Plugins loaded by a test are not shipped to the workers of later tests' sweeps."""
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))


def tutorial_blocks(lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(TUTORIAL.read_text()) if kind == lang]


def write_plugin(folder, name, marker_dir=None):
    """The tutorial's short-first policy, registered as ``name``, in ``folder/<name>.py``."""
    code = tutorial_blocks("python")[0]
    assert '@register_policy("short-first")' in code
    code = code.replace('@register_policy("short-first")', f'@register_policy("{name}")')
    if marker_dir is not None:
        marker_dir.mkdir()
        code += MARKER.format(str(marker_dir))
    path = folder / f"{name.replace('-', '_')}.py"
    path.write_text(code)
    return path


def write_scenario(folder, policy, plugin_list=None, name="plugin-test"):
    raw = {"name": name, "seed": 0, "workload": WORKLOAD, "policy": policy}
    if plugin_list is not None:
        raw["plugins"] = plugin_list
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_summary(out):
    return json.loads((out / "summary.json").read_text())["variants"]


def assert_same_metrics(got, expected):
    for m in METRICS:
        assert got[m] == pytest.approx(expected[m], rel=1e-12), m


def test_run_with_import_option(tmp_path, capsys):
    plugin = write_plugin(tmp_path, "plugin-short-first-import")
    sc = write_scenario(tmp_path, {"type": "plugin-short-first-import", "max_batch": 8})
    assert main(["run", str(sc), "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    assert "unknown policy 'plugin-short-first-import'" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["run", str(sc), "--import", str(plugin), "--out", str(out), "--no-plots"]) == 0
    direct = orcasim.simulate(orcasim.load_scenario(sc), seed=0)
    summary = run_summary(out)["plugin-short-first-import"]
    assert_same_metrics(summary, direct.summary["plugin-short-first-import"])
    assert summary["num_finished"] == 50


def test_import_option_before_the_command_and_a_module_name(tmp_path, monkeypatch, capsys):
    write_plugin(tmp_path, "plugin-short-first-module")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--import", "plugin_short_first_module", "policies"]) == 0
    assert "plugin-short-first-module" in capsys.readouterr().out
    assert "plugin_short_first_module" in loaded_plugins()


def test_run_with_plugins_in_the_scenario(tmp_path, monkeypatch):
    sub = tmp_path / "policies"
    sub.mkdir()
    write_plugin(sub, "plugin-short-first-yaml")
    sc = write_scenario(tmp_path, "plugin-short-first-yaml",
                        ["policies/plugin_short_first_yaml.py"])
    monkeypatch.chdir(sub)  # relative to the scenario file, not the current directory
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--no-plots"]) == 0
    direct = orcasim.simulate(orcasim.load_scenario(sc), seed=0)
    assert_same_metrics(run_summary(out)["plugin-short-first-yaml"],
                        direct.summary["plugin-short-first-yaml"])


def test_the_tutorial_scenario_runs_with_its_plugin(tmp_path):
    (policy_file,) = re.findall(r"plugins: \[(\S+)\]", tutorial_blocks("yaml")[-1])
    write_plugin(tmp_path, "plugin-short-first-doc").rename(tmp_path / policy_file)
    text = tutorial_blocks("yaml")[-1].replace("policy: short-first",
                                               "policy: plugin-short-first-doc")
    sc = tmp_path / "short_first.yaml"
    sc.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(sc), "--set", "workload.num_requests=50", "--out", str(out),
                 "--no-plots"]) == 0
    assert set(run_summary(out)) == {"fcfs", "short-first"}


@pytest.mark.parametrize("how", ["scenario", "import"])
def test_sweep_workers_import_the_plugin(tmp_path, how):
    name = f"plugin-short-first-sweep-{how}"
    markers = tmp_path / "imported-by"
    plugin = write_plugin(tmp_path, name, markers)
    sc = write_scenario(tmp_path, name, [plugin.name] if how == "scenario" else None)
    out = tmp_path / "sweep"
    extra = ["--import", str(plugin)] if how == "import" else []
    assert main(["sweep", str(sc), "--seeds", "2", "--jobs", "2", "--no-progress",
                 "--out", str(out), *extra]) == 0
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 2 and (df["status"] == "ok").all()
    workers = {int(p.name) for p in markers.iterdir()} - {os.getpid()}
    assert workers, "no worker process imported the plugin"
    cfg = orcasim.load_scenario(sc).variants[0]
    for _, row in df.iterrows():
        _, direct, _ = execute_run(cfg, int(row["seed"]), False, "")
        assert direct["status"] == "ok"
        assert_same_metrics(row, direct["metrics"])


def test_a_file_is_imported_once_under_a_stable_name(tmp_path, monkeypatch):
    plugin = write_plugin(tmp_path, "plugin-short-first-once")
    monkeypatch.chdir(tmp_path)
    first = load_plugins([plugin.name])
    assert first == [str(plugin.resolve())]
    assert load_plugins([str(plugin)], base_dir=tmp_path / "elsewhere") == first
    assert loaded_plugins()[-1] == first[0]
    name = module_name(plugin.resolve())
    assert name == module_name(plugin.resolve()) and name.startswith("orcasim_plugin_")
    cls = orcasim.policy_registry.get("plugin-short-first-once")
    assert cls.__module__ == name


BROKEN = {
    "syntax.py": ("def f(:\n", "SyntaxError", "syntax.py:1"),
    "raises.py": ("import os\n\n\ndef f():\n    raise ValueError('no GPU here')\n\n\nf()\n",
                  "ValueError: no GPU here", "raises.py:5"),
    "needs_dep.py": ("import orcasim\nimport not_installed_anywhere\n",
                     "ModuleNotFoundError: No module named 'not_installed_anywhere'",
                     "needs_dep.py:2"),
}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("file", sorted(BROKEN))
def test_a_broken_plugin_is_one_line(tmp_path, capsys, file):
    code, problem, where = BROKEN[file]
    (tmp_path / file).write_text(code)
    sc = write_scenario(tmp_path, "fcfs")
    assert main(["validate", str(sc), "--import", str(tmp_path / file)]) == 2
    err = one_error_line(capsys)
    assert file in err and problem in err and f"({where})" in err
    assert str(tmp_path / file) not in loaded_plugins()


@pytest.mark.parametrize(("spec", "problem"), [
    ("missing.py", "missing.py: no such file"),
    ("no_such_plugin_module", "no module named 'no_such_plugin_module'"),
    ("notes.txt", "notes.txt: not a .py file"),
])
def test_a_plugin_that_cannot_be_found_is_one_line(tmp_path, monkeypatch, capsys, spec, problem):
    (tmp_path / "notes.txt").write_text("not python\n")
    monkeypatch.chdir(tmp_path)
    assert main(["policies", "--import", spec]) == 2
    assert problem in one_error_line(capsys)
    with pytest.raises(UsageError, match=re.escape(problem)):
        load_plugins([spec])


def test_a_scenario_plugin_error_names_the_field_and_file(tmp_path, capsys):
    (tmp_path / "raises.py").write_text(BROKEN["raises.py"][0])
    sc = write_scenario(tmp_path, "fcfs", ["raises.py"])
    assert main(["validate", str(sc)]) == 2
    err = one_error_line(capsys)
    assert f"{sc}: plugins.0: plugin raises.py: ValueError: no GPU here (raises.py:5)" in err
    missing = write_scenario(tmp_path, "fcfs", ["gone.py"], name="missing")
    assert main(["run", str(missing), "--out", str(tmp_path / "out")]) == 2
    err = one_error_line(capsys)
    assert "plugins.0: plugin gone.py: no such file" in err and str(tmp_path / "gone.py") in err
    assert not (tmp_path / "out").exists()
