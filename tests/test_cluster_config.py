"""The ``cluster`` section: bad configurations are refused with one line and exit 2."""

from __future__ import annotations

import pytest
import yaml

from orcasim.cli import main

BASE = {"name": "c", "workload": {"type": "list", "requests": [
    {"arrival": 0, "prompt_len": 8, "output_len": 2}]},
    "policy": {"type": "continuous", "max_batch": 4}}


@pytest.mark.parametrize("cluster,extra,message", [
    ({"groups": []}, {}, "cluster.groups: List should have at least 1 item"),
    ({"groups": [{"count": 0}]}, {}, "cluster.groups.0.count: Input should be greater than"),
    ({"groups": [{"role": "decode"}]}, {},
     "cluster.groups: disaggregation needs a prefill group (groups have roles: decode)"),
    ({"groups": [{"count": 2}], "faults": {"events": [{"replica": "g0-7", "at": 3}]}}, {},
     "cluster.faults.events.0.replica: no replica 'g0-7' (replicas: g0-0, g0-1)"),
    ({"groups": [{"count": 1}], "faults": {"random": {"mttf": 0, "mttr": 1}}}, {},
     "cluster.faults.random.mttf: Input should be greater than 0"),
    ({"groups": [{"count": 1}], "link": {"preset": "nvlink"}}, {},
     "cluster.link: a link needs prefill and decode groups"),
    ({"groups": [{"role": "prefill", "policy": {"type": "vllm-v1"}},
                 {"name": "d", "role": "decode", "policy": {"type": "vllm-v1"}}],
      "link": {"preset": "roce_100g", "bytes_per_token": 1000}, "autoscaling": {"target": 1}},
     {}, "cluster.autoscaling: not supported with disaggregated prefill/decode yet"),
    ({"groups": [{"count": 1}], "router": "nearest"}, {},
     "cluster.router.type: unknown routing policy 'nearest'"),
    ({"groups": [{"count": 2}], "router": "kv_overlap"}, {},
     "cluster.router: routing policy 'kv_overlap' reads replicas' prefix caches; group "
     "'g0' runs policy 'continuous' without one"),
    ({"groups": [{"count": 1}], "admission": [{"type": "shed"}]}, {},
     "cluster.admission.0"),
    ({"groups": [{"count": 1}]}, {"admission": [{"type": "max_queue", "limit": 3}]},
     "admission: with a cluster section, admission control is cluster-level"),
    ({"groups": [{"name": "a"}, {"name": "a"}]}, {}, "cluster.groups.1.name: group name 'a'"),
    ({"groups": [{"count": 1}], "staleness": -1}, {}, "cluster.staleness: Input should be"),
    ({"groups": [{"count": 1}], "router": {"type": "weighted", "scorers": [
        {"type": "round_robin"}]}}, {},
     "cluster.router.scorers.0.type: routing policy 'round_robin' does not score replicas"),
    ({"groups": [{"count": 1, "policy": {"type": "fcfs", "max_batch": 0}}]}, {},
     "cluster.groups.0.policy.max_batch"),
])
def test_bad_cluster_is_one_line_and_exit_2(tmp_path, capsys, cluster, extra, message):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({**BASE, **extra, "cluster": cluster}))
    assert main(["run", str(p), "--out", str(tmp_path / "out"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert message in err


def test_cluster_run_writes_replica_columns_and_routing_log(tmp_path, capsys):
    import pandas as pd

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({**BASE, "cluster": {"routing_log": True,
                                                     "groups": [{"name": "r", "count": 2}]}}))
    assert main(["run", str(p), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "per replica:" in out and "replica.r-0.routed_share" in out
    req = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    assert req["replica"].tolist() == ["r-0"]
    log = pd.read_csv(tmp_path / "out" / "routing.csv")
    assert log[["variant", "id", "replica"]].values.tolist() == [["continuous", 0, "r-0"]]
    tidy = pd.read_csv(tmp_path / "out" / "summary_long.csv")
    rows = tidy[(tidy["group_kind"] == "replica") & (tidy["metric"] == "num_finished")]
    assert dict(zip(rows["group"], rows["value"], strict=True)) == {"r-0": 1.0, "r-1": 0.0}


def test_cluster_plots_sum_replicas_and_show_routing(tmp_path):
    from orcasim.scenario import Scenario
    from orcasim.simulation import simulate

    raw = {**BASE, "workload": {"type": "list", "requests": [
        {"arrival": 0, "prompt_len": 8, "output_len": 3} for _ in range(6)]},
        "cluster": {"groups": [{"name": "r", "count": 3}]}}
    res = simulate(Scenario(raw))
    from orcasim.metrics.plots import cluster_totals

    s = res.step_series.assign(t=lambda d: (d["t_start"] + d["t_end"]) / 2)
    tot = cluster_totals(s, bins=4)
    assert tot["batch_size"].max() == 6  # two requests on each of three replicas
    written = res.write(tmp_path)
    assert (tmp_path / "replicas.png").stat().st_size > 0 and len(written) >= 6
