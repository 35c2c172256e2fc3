"""A light ``import orcasim``, and plots drawn by a child process: same files as drawn here."""

import subprocess
import sys

import numpy as np
import pytest
from test_replay import make_run

from orcasim.cli import main
from orcasim.metrics import plot_process
from orcasim.metrics.plot_process import PlotProcess

HEAVY = ("pandas", "pyarrow", "matplotlib", "seaborn", "scipy", "simpy", "pydantic", "numpy")


def test_import_orcasim_loads_no_heavy_module_until_a_name_is_used():
    code = f"""
import sys
import orcasim
heavy = [m for m in {HEAVY!r} if m in sys.modules]
assert not heavy, heavy
assert "continuous" in orcasim.policy_registry.names()  # the built-ins register on first use
from orcasim import Results, simulate
assert orcasim.Results is Results and callable(simulate) and orcasim.policies.continuous
assert set(orcasim.__all__) <= set(dir(orcasim))
assert "pandas" not in sys.modules and "matplotlib" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_attribute_is_still_an_attribute_error():
    import orcasim

    with pytest.raises(AttributeError, match="no_such_name"):
        orcasim.no_such_name  # noqa: B018


def cdf_jobs(out):
    rng = np.random.default_rng(0)
    measured = {m: rng.lognormal(size=50) for m in ("ttft", "tpot", "e2e")}
    predicted = {m: v * 1.1 for m, v in measured.items()}
    return [("latency_cdfs", (out / "latency_cdf.png", measured, predicted, "a title"))]


@pytest.mark.parametrize("child", [True, False])
def test_the_child_draws_the_same_bytes_as_this_process(tmp_path, child):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    plot_process._run("orcasim.replay.plots", cdf_jobs(here))
    with PlotProcess("orcasim.replay.plots", child=child) as plotter:
        assert plotter.in_child is child
        for name, args in cdf_jobs(there):
            plotter.draw(name, *args)
        plotter.finish()
        assert plotter.drawn_in_child is child
    png = "latency_cdf.png"
    assert (there / png).read_bytes() == (here / png).read_bytes()


def test_a_failing_child_leaves_the_drawing_and_its_error_to_this_process(tmp_path):
    with PlotProcess("orcasim.replay.plots", child=True) as plotter:
        for name, args in cdf_jobs(tmp_path / "missing"):
            plotter.draw(name, *args)
        with pytest.raises(FileNotFoundError):
            plotter.finish()
        assert not plotter.drawn_in_child
    with PlotProcess("orcasim.replay.plots", child=True) as plotter:  # the child dies early
        plotter._proc.kill()
        for name, args in cdf_jobs(tmp_path):
            plotter.draw(name, *args)
        plotter.finish()
        assert not plotter.drawn_in_child
    assert (tmp_path / "latency_cdf.png").stat().st_size > 0


def test_closing_ends_the_child_without_drawing(tmp_path):
    plotter = PlotProcess("orcasim.replay.plots", child=True)
    proc = plotter._proc
    for name, args in cdf_jobs(tmp_path):
        plotter.draw(name, *args)
    plotter.close()
    assert proc.returncode is not None and not (tmp_path / "latency_cdf.png").exists()


def watch_finish(monkeypatch) -> list[bool]:
    """Whether each PlotProcess's child drew, in order."""
    drawn = []
    real_finish = PlotProcess.finish

    def finish(self):
        try:
            return real_finish(self)
        finally:
            drawn.append(self.drawn_in_child)

    monkeypatch.setattr(PlotProcess, "finish", finish)
    return drawn


def test_replay_plots_from_a_child_equal_those_drawn_here(tmp_path, monkeypatch, capsys):
    run, workload, profile = make_run(tmp_path)
    drawn = watch_finish(monkeypatch)
    outs = {}
    for child in (True, False):
        monkeypatch.setattr(plot_process, "worthwhile", lambda child=child: child)
        outs[child] = tmp_path / f"out-{child}"
        assert main(["replay-vllm", str(run), "--workload", str(workload), "--profiles",
                     str(profile), "--out", str(outs[child])]) == 0
    capsys.readouterr()
    assert drawn == [True, False]
    for name in ("latency_cdf.png", "running_waiting.png", "requests.csv", "comparison.csv"):
        assert (outs[True] / name).read_bytes() == (outs[False] / name).read_bytes(), name


@pytest.mark.parametrize("rows", ["held", "spilled", "many"])
def test_run_plots_from_a_child_equal_those_drawn_here(tmp_path, monkeypatch, capsys, rows):
    """``orcasim run``: the same files either way; rows spilled to this process's file, or
    too many to pickle cheaply, are drawn here."""
    from orcasim.metrics import row_spill

    if rows == "spilled":  # in blocks of 7 rows
        monkeypatch.setattr(row_spill, "STREAM_ABOVE", 0)
        monkeypatch.setattr(row_spill, "SPILL_ROWS", 7)
    if rows == "many":
        monkeypatch.setattr(plot_process, "MAX_CHILD_ROWS", 59)
    sent = []
    real_send = PlotProcess.send

    def send(self):
        sent.append(self.in_child)
        real_send(self)

    monkeypatch.setattr(PlotProcess, "send", send)
    drawn = watch_finish(monkeypatch)
    spawned = []
    real_spawn = PlotProcess._spawn

    def spawn(modules):
        spawned.append(modules)
        return real_spawn(modules)

    monkeypatch.setattr(PlotProcess, "_spawn", staticmethod(spawn))
    outs = {}
    for child in (True, False):
        monkeypatch.setattr(plot_process, "worthwhile", lambda child=child: child)
        outs[child] = tmp_path / f"out-{child}"
        assert main(["run", "--set", "workload.num_requests=60", "--out",
                     str(outs[child])]) == 0
    capsys.readouterr()
    assert len(spawned) == 1
    assert (True in sent) == (rows == "held")  # sent to a child only when it holds the rows
    assert drawn == ([True, False] if rows == "held" else [])
    names = sorted(p.name for p in outs[False].iterdir())
    assert "latency_cdf.png" in names and "gantt.png" in names
    assert sorted(p.name for p in outs[True].iterdir()) == names
    for name in names:
        assert (outs[True] / name).read_bytes() == (outs[False] / name).read_bytes(), name
