"""The priority-under-KV-pressure study, end to end on a short run."""

from __future__ import annotations

import pandas as pd

from orcasim.studies import priority_pressure


def test_study_writes_table_runs_and_plot(tmp_path, capsys):
    assert priority_pressure.main(["--seeds", "2", "--num-requests", "300",
                                   "--out", str(tmp_path)]) == 0
    runs = pd.read_csv(tmp_path / "runs.csv")
    assert len(runs) == 2 * 10 and set(runs["seed"]) == {0, 1}
    by = runs.set_index(["setting", "seed"])
    for seed in (0, 1):
        # strict priority with preemption serves interactive requests first: a shorter
        # interactive tail than FCFS on the same requests
        fcfs, pre = by.loc[("fcfs", seed)], by.loc[("strict-preempt", seed)]
        assert pre["interactive_ttft_p99"] < fcfs["interactive_ttft_p99"]
        # swapping loses no computed tokens; recompute does, and kv_fit turns some away
        assert by.loc[("strict-swap", seed), "num_recomputed_tokens"] == 0
        assert pre["num_recomputed_tokens"] > 0
        assert by.loc[("fcfs", seed), "rejected_kv_full"] == 0
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n") == (2 + 10) + 1 + (2 + 9) and "| strict-swap+kv_fit | " in table
    assert (tmp_path / "tradeoff.png").stat().st_size > 20_000
    assert "wrote" in capsys.readouterr().out
