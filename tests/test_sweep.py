"""Sweeps: grid planning, seeds, the results table, failures, parallel and cluster runs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest
from conftest import SCENARIOS

import orcasim
from orcasim.errors import FailedRunsWarning, OrcasimError
from orcasim.experiments.grid import derive_seed, expand, parse_grid_arg
from orcasim.experiments.runner import sweep
from orcasim.latency.base import LatencyModel
from orcasim.params import ComponentParams
from orcasim.registry import latency_models

SMALL = {"workload.num_requests": 30}


def small(**over):
    return orcasim.load_scenario().override({**SMALL, **over})


def without_timing(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["wall_s"]).reset_index(drop=True)


def test_parse_grid_arg():
    assert parse_grid_arg("workload.arrival.rate=1,2.5,4") == ("workload.arrival.rate",
                                                                [1, 2.5, 4])
    assert parse_grid_arg("variant=static,continuous") == ("variant", ["static", "continuous"])
    assert parse_grid_arg("x=[[1, 2], [3]]") == ("x", [[1, 2], [3]])
    assert parse_grid_arg(" policy.max_batch = 8 ") == ("policy.max_batch", [8])
    with pytest.raises(OrcasimError, match="expected FIELD=VALUE1,VALUE2"):
        parse_grid_arg("workload.arrival.rate")
    with pytest.raises(OrcasimError, match="field name is empty"):
        parse_grid_arg("=1,2")


def test_expand_adds_every_variant_last_and_ids_are_stable():
    pts = expand({"a": [1, 2]}, ["static", "continuous"])
    assert [p.params for p in pts] == [
        {"a": 1, "variant": "static"}, {"a": 1, "variant": "continuous"},
        {"a": 2, "variant": "static"}, {"a": 2, "variant": "continuous"}]
    assert len({p.point_id for p in pts}) == 4
    again = expand({"a": [2, 1]}, ["continuous"])
    assert again[0].point_id == pts[3].point_id  # an id depends on the values, not the order


def test_seeds_derive_from_base_point_and_rep_only():
    s = derive_seed(0, {"a": 1, "variant": "static"}, 0)
    assert s == derive_seed(0, {"variant": "continuous", "a": 1}, 0)  # variants share requests
    key = int(hashlib.sha1(b'{"a":1}').hexdigest()[:15], 16)
    hi, lo = np.random.SeedSequence([0, key, 0]).generate_state(2, np.uint32)
    assert s == (int(hi) << 31) ^ int(lo) == 2345559018952433498
    others = {derive_seed(0, {"a": 1}, 1), derive_seed(0, {"a": 2}, 0), derive_seed(1, {"a": 1}, 0)}
    assert s not in others and len(others) == 3
    assert 0 <= s < 2**63


def test_each_row_reproduces_a_plain_run():
    df = sweep(small(), {"workload.arrival.rate": [5.0, 20.0]}, seeds=2, progress=False,
               n_jobs=1)
    assert list(df.columns[:9]) == ["run_id", "point_id", "seed", "rep", "workload.arrival.rate",
                                    "variant", "status", "error", "wall_s"]
    assert len(df) == 8 and (df["status"] == "ok").all()
    assert df["variant"].tolist() == ["static"] * 2 + ["continuous"] * 2 + ["static"] * 2 + [
        "continuous"] * 2
    assert df["rep"].tolist() == [0, 1] * 4
    for row in df.itertuples(index=False):
        rate, variant = row[4], row.variant
        ref = orcasim.simulate(small(**{"workload.arrival.rate": rate}), seed=row.seed,
                               variants=[variant]).summary[variant]
        got = df.loc[df["run_id"] == row.run_id].iloc[0]
        for k, v in ref.items():
            assert got[k] == v or (np.isnan(v) and np.isnan(got[k])), k
    # static and continuous of one point and seed ran on the same requests
    assert (df[df.variant == "static"]["seed"].to_numpy()
            == df[df.variant == "continuous"]["seed"].to_numpy()).all()
    assert df.attrs["sweep"]["computed"] == 8


def test_invalid_points_are_refused_before_anything_runs(tmp_path):
    out = tmp_path / "sw"
    with pytest.raises(orcasim.ScenarioError) as err:
        sweep(small(), {"policy.max_batch": [4, 0], "variant": ["continuous"]}, seeds=2,
              out=out, progress=False, n_jobs=1)
    assert str(err.value) == ("seed_orca.yaml: grid policy.max_batch=0: variants.static: "
                              "policy.max_batch: Input should be greater than 0 (got 0)")
    assert not out.exists()
    with pytest.raises(orcasim.ScenarioError) as err:
        sweep(small(), {"variant": ["nope"]}, seeds=1, progress=False, n_jobs=1)
    assert str(err.value) == ("seed_orca.yaml: grid variant='nope': no variant 'nope' "
                              "(have: static, continuous)")


@latency_models.register("test-fragile")
class Fragile(LatencyModel):
    """A constant step time that raises after ``fail_after`` steps (0: never)."""

    class Params(ComponentParams):
        fail_after: int = 0

    def __init__(self, params):
        self.params = params
        self.steps = 0

    def step_time(self, plan):
        self.steps += 1
        if self.params.fail_after and self.steps > self.params.fail_after:
            raise ZeroDivisionError("cannot time this step")
        return 0.01


def test_a_crashing_run_is_recorded_with_its_error(tmp_path):
    sc = small(**{"engine.latency": {"type": "test-fragile"}})
    with pytest.warns(FailedRunsWarning, match=r"^2 of 4 runs failed, e\.g\. run \w+: "
                      "ZeroDivisionError: cannot time this step"):
        df = sweep(sc, {"engine.latency.fail_after": [0, 5]}, seeds=1, out=tmp_path,
                   progress=False, n_jobs=1)
    assert df["status"].tolist() == ["ok", "ok", "error", "error"]
    assert df["error"].iloc[2].startswith("ZeroDivisionError: cannot time this step (")
    assert df["throughput_tok_s"].iloc[:2].notna().all()
    assert df["throughput_tok_s"].iloc[2:].isna().all()
    with pytest.warns(FailedRunsWarning):
        again = sweep(sc, {"engine.latency.fail_after": [0, 5]}, seeds=1, out=tmp_path,
                      progress=False, n_jobs=1)
    assert again.attrs["sweep"]["computed"] == 0  # failures are results too
    with pytest.warns(FailedRunsWarning):
        retried = sweep(sc, {"engine.latency.fail_after": [0, 5]}, seeds=1, out=tmp_path,
                        progress=False, n_jobs=1, retry_failed=True)
    assert retried.attrs["sweep"]["computed"] == 2


def test_worker_count_does_not_change_results(tmp_path):
    grid = {"workload.arrival.rate": [5.0, 20.0]}
    one = sweep(small(), grid, seeds=3, progress=False, n_jobs=1)
    two = sweep(small(), grid, seeds=3, out=tmp_path, progress=False, n_jobs=2)
    pd.testing.assert_frame_equal(without_timing(one), without_timing(two))
    stored = pd.read_parquet(tmp_path / "results.parquet")
    pd.testing.assert_frame_equal(without_timing(stored), without_timing(two))
    csv = pd.read_csv(tmp_path / "results.csv")
    assert csv["run_id"].tolist() == two["run_id"].tolist()
    manifest = json.loads((tmp_path / "sweep.json").read_text())
    assert manifest["params"] == ["workload.arrival.rate", "variant"]
    assert manifest["num_runs"] == 12 and len(manifest["points"]) == 4
    # the first replication of every point keeps its requests, the others do not
    kept = sorted(p.name for p in (tmp_path / "runs").glob("*.requests.parquet"))
    assert kept == sorted(f"{r}.requests.parquet" for r in two[two.rep == 0]["run_id"])


def test_sweep_section_of_a_scenario_file(tmp_path):
    text = (SCENARIOS / "seed_orca.yaml").read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text + "sweep:\n  grid:\n    workload.num_requests: [20, 30]\n"
                    "    variant: [continuous]\n  seeds: 2\n  seed: 7\n  keep_requests: 0\n")
    df = sweep(str(path), progress=False, n_jobs=1)
    assert df["workload.num_requests"].tolist() == [20, 20, 30, 30]
    assert df["num_requests"].tolist() == [20, 20, 30, 30]
    assert df["seed"].iloc[0] == derive_seed(7, {"workload.num_requests": 20}, 0)
    # arguments win over the file, key by key
    df = sweep(str(path), {"workload.num_requests": [25]}, seeds=1, progress=False, n_jobs=1)
    assert df["num_requests"].tolist() == [25]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "sweep:\n  grid:\n    workload.num_requests: []\n")
    with pytest.raises(orcasim.ScenarioError) as err:
        orcasim.load_scenario(bad)
    assert str(err.value) == (f"{bad}: sweep.grid: workload.num_requests: "
                              "needs at least one value")


def test_dask_backend_on_a_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    grid = {"workload.arrival.rate": [5.0, 20.0]}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        df = sweep(small(), grid, seeds=2, out=tmp_path, backend="dask",
                   scheduler=cluster.scheduler_address, progress=False)
    assert df.attrs["sweep"]["computed"] == 8
    ref = sweep(small(), grid, seeds=2, progress=False, n_jobs=1)
    pd.testing.assert_frame_equal(without_timing(df), without_timing(ref))
    assert len(list((tmp_path / "runs").glob("*.requests.parquet"))) == 4


def test_unreachable_cluster_is_a_one_line_error():
    pytest.importorskip("distributed")
    with pytest.raises(OrcasimError, match="the dask backend needs --scheduler"):
        sweep(small(), seeds=1, backend="dask", progress=False)
    with pytest.raises(OrcasimError, match=r"grid seed: .* \(use --seeds and --seed for seeds\)"):
        sweep(small(), {"seed": [1, 2]}, progress=False)
    with pytest.raises(OrcasimError, match="unknown backend 'mpi'"):
        sweep(small(), seeds=1, backend="mpi", progress=False)


def test_backends_that_cannot_stream_get_chunks(tmp_path):
    # joblib's Ray backend returns lists only; a threading backend that says so stands in
    import joblib
    from joblib._parallel_backends import ThreadingBackend

    from orcasim.experiments.grid import plan
    from orcasim.experiments.runner import _execute

    calls = []

    class ListOnly(ThreadingBackend):
        supports_return_generator = False

        def configure(self, *args, **kw):
            calls.append(1)
            return super().configure(*args, **kw)

    joblib.register_parallel_backend("test-list-only", ListOnly)
    _, tasks = plan(small(), {"workload.arrival.rate": [5.0, 20.0, 40.0]}, 3, 0, 0)
    got = list(_execute(tasks, 2, "test-list-only", None, None))
    assert [r for r, _, _ in got] == [t.run_id for t in tasks]  # lists come in order
    assert len(calls) == 3  # 18 runs in chunks of 4 per worker: 8, 8, 2
    ref = {r: row["metrics"] for r, row, _ in _execute(tasks, 1, "loky", None, None)}
    assert all(row["metrics"] == ref[r] for r, row, _ in got)
