"""Experiments: parameter sweeps with replications, statistics, comparisons and reports.

- :func:`sweep` runs a grid of settings times several seeds (locally with
  joblib, or on a Dask or Ray cluster) and returns one row per run;
- :mod:`~orcasim.experiments.stats` gives means with confidence intervals;
- :mod:`~orcasim.experiments.checks` checks conservation and Little's law;
- :func:`compare` tests two sweeps against each other;
- :func:`write_report` turns a sweep directory into an HTML and Markdown report.

Nothing heavy (joblib, pandas, plotting) is imported until it is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compare", "load_sweep", "sweep", "write_report"]


def __getattr__(name: str) -> Any:
    if name == "sweep":
        from orcasim.experiments.runner import sweep

        return sweep
    if name == "load_sweep":
        from orcasim.experiments.store import load_sweep

        return load_sweep
    if name == "compare":
        from orcasim.experiments.comparison import compare

        return compare
    if name == "write_report":
        from orcasim.experiments.report import write_report

        return write_report
    raise AttributeError(f"module 'orcasim.experiments' has no attribute {name!r}")
