"""Crash safety: a sweep killed midway resumes without recomputing a finished run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd

import orcasim
from orcasim.experiments.runner import sweep

GRID = {"workload.arrival.rate": [10.0, 30.0, 60.0]}
SET = {"workload.num_requests": 600}


def _stamps(runs):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in runs.iterdir()}


def test_killed_sweep_resumes_and_recomputes_nothing(tmp_path):
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "orcasim", "sweep", "--no-progress", "--jobs", "1",
           "--seeds", "4", "--out", str(out), "--grid", "workload.arrival.rate=10,30,60",
           "--set", "workload.num_requests=600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runs = out / "runs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if runs.is_dir() and len(list(runs.glob("*.json"))) >= 3:
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    done = {p.stem for p in runs.glob("*.json")}
    assert 3 <= len(done) < 24, "the sweep should have been killed midway"
    # a torn write cannot be a done run: only whole files were renamed into place
    for p in runs.glob("*.json"):
        assert p.read_text().endswith("}\n")
    # simulate what a crash during a write would leave: a temp file, and a corrupt run file
    (runs / f".{next(iter(done))}.json.999.tmp").write_text('{"status": "o')
    victim = sorted(done)[0]
    (runs / f"{victim}.json").write_text('{"status": "ok", "metr')
    before = _stamps(runs)
    sc = orcasim.load_scenario().override(SET)
    df = sweep(sc, GRID, seeds=4, out=out, progress=False, n_jobs=1)
    info = df.attrs["sweep"]
    assert info["computed"] == 24 - len(done) + 1  # the rest, and the corrupt one
    assert info["reused"] == len(done) - 1
    after = _stamps(runs)
    for name, stamp in before.items():
        if name.startswith(".") or name.startswith(victim):
            continue
        assert after[name] == stamp, f"{name} was rewritten"
    assert not [p for p in runs.iterdir() if p.name.endswith(".tmp")]
    assert len(df) == 24 and (df["status"] == "ok").all()
    # resuming gives exactly what one uninterrupted sweep gives
    fresh = sweep(sc, GRID, seeds=4, progress=False, n_jobs=1)
    pd.testing.assert_frame_equal(df.drop(columns="wall_s"), fresh.drop(columns="wall_s"))
    # and once complete, the same command runs nothing
    again = sweep(sc, GRID, seeds=4, out=out, progress=False, n_jobs=1)
    assert again.attrs["sweep"]["computed"] == 0 and _stamps(runs) == after
