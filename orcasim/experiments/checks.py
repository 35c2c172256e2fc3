"""Sanity checks every run makes on its own output: conservation and Little's law.

Conservation: every request that was generated arrived and ended in exactly
one final state, ``arrived = finished + rejected + aborted``, with timestamps
in order (arrival <= first scheduled <= first token <= finish).

Little's law: the time-average number of requests in the system, L, equals
the arrival rate lambda times the mean time in the system W. L is computed
exactly from the requests' arrival and end times: the integral of N(t) over a
window is the sum of each request's overlap with the window. A rejected
request leaves at its arrival (it never ran), an aborted one at its abort.

- Over the whole run (no warm-up or cool-down), the run starts and ends
  empty, so the law holds exactly; the check then catches inconsistent
  timestamps (a finish before an arrival, a finished request without a finish).
- Over a steady-state window ``[t0, t1]`` (``metrics.warmup``/``cooldown``),
  L counts everyone present in the window, lambda the arrivals in it and W
  their mean time in system. The law holds within a few per cent when the
  system is in steady state; a larger gap means a queue still growing or
  draining, so the window's latencies do not describe a steady state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from orcasim.metrics.summary import steady_state_window
from orcasim.request import RequestState

#: relative tolerance of the Little's law check
LITTLE_TOLERANCE = 0.05


@dataclass(frozen=True)
class CheckResult:
    """The outcome of both checks on one run."""

    conservation_ok: bool
    conservation_error: str
    little_L: float
    little_lambda_W: float
    little_rel_err: float
    little_ok: bool
    window: tuple[float, float]

    @property
    def ok(self) -> bool:
        return self.conservation_ok and self.little_ok

    def warnings(self) -> list[str]:
        """One line per violated check (empty when both hold)."""
        out = []
        if not self.conservation_ok:
            out.append(f"conservation: {self.conservation_error}")
        if not self.little_ok:
            out.append(
                f"Little's law: L = {self.little_L:.6g} but lambda*W = {self.little_lambda_W:.6g} "
                f"(off by {self.little_rel_err:.1%}) over [{self.window[0]:.6g}, "
                f"{self.window[1]:.6g}] s"
            )
        return out

    def as_row(self) -> dict[str, Any]:
        """Columns for a sweep's results table."""
        return {
            "check_conservation": self.conservation_ok,
            "check_little": self.little_ok,
            "little_L": self.little_L,
            "little_lambda_W": self.little_lambda_W,
            "little_rel_err": self.little_rel_err,
            "check_warnings": "; ".join(self.warnings()),
        }


def conservation_error(cols: dict[str, Any], num_generated: int) -> str:
    """Why the per-request columns break conservation, or ``""`` when they do not."""
    state = cols["state"]
    n = int(state.size)
    fin = int((state == int(RequestState.FINISHED)).sum())
    rej = int((state == int(RequestState.REJECTED)).sum())
    abo = int((state == int(RequestState.ABORTED)).sum())
    if n != num_generated:
        return f"{num_generated} requests generated but {n} recorded"
    if fin + rej + abo != n:
        return f"{n} arrived != {fin} finished + {rej} rejected + {abo} aborted"
    ids = cols["id"]
    if np.unique(ids).size != n:
        return "a request was recorded more than once"
    finished = state == int(RequestState.FINISHED)
    arr, sch, tok, end = (cols[c] for c in ("arrival", "first_scheduled", "first_token", "finish"))
    f = finished
    bad = f & ~(np.isfinite(end) & np.isfinite(tok) & np.isfinite(sch))
    if bad.any():
        return f"finished request {int(ids[bad][0])} has no first-scheduled/first-token/finish time"
    with np.errstate(invalid="ignore"):
        bad = f & ~((arr <= sch) & (sch <= tok) & (tok <= end))
        aborted = state == int(RequestState.ABORTED)
        bad |= aborted & ~(end >= arr)
    if bad.any():
        return f"request {int(ids[bad][0])} has timestamps out of order"
    return ""


def time_in_system(cols: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each request's ``(arrival, departure)``; a request without a finish leaves on arrival."""
    arr = cols["arrival"]
    end = cols["finish"]
    return arr, np.where(np.isfinite(end), end, arr)


def littles_law(
    cols: dict[str, Any], window: tuple[float, float] | None = None
) -> tuple[float, float, tuple[float, float]]:
    """``(L, lambda * W, (t0, t1))`` over ``window`` (default: the whole run from t = 0)."""
    arr, dep = time_in_system(cols)
    if window is None:
        window = (0.0, float(max(dep.max(), arr.max())) if dep.size else 0.0)
    t0, t1 = window
    span = t1 - t0
    if not span > 0:
        return float("nan"), float("nan"), window
    overlap = np.clip(np.minimum(dep, t1) - np.maximum(arr, t0), 0.0, None)
    L = float(overlap.sum()) / span
    inside = (arr >= t0) & (arr <= t1)
    n = int(inside.sum())
    lam = n / span
    W = float((dep[inside] - arr[inside]).mean()) if n else 0.0
    return L, lam * W, window


def check_run(
    cols: dict[str, Any],
    num_generated: int,
    *,
    warmup: float = 0.0,
    cooldown: float = 0.0,
    tolerance: float = LITTLE_TOLERANCE,
) -> CheckResult:
    """Check conservation and Little's law on one run's per-request columns."""
    err = conservation_error(cols, num_generated)
    window = steady_state_window(cols["arrival"], warmup, cooldown)
    L, lw, used = littles_law(cols, window)
    denom = max(abs(L), abs(lw))
    rel = abs(L - lw) / denom if denom > 0 else 0.0
    if not np.isfinite(L):  # an empty window (every arrival at one instant): nothing to check
        rel = float("nan")
    return CheckResult(
        conservation_ok=not err,
        conservation_error=err,
        little_L=L,
        little_lambda_W=lw,
        little_rel_err=rel,
        little_ok=bool(rel <= tolerance) or bool(np.isnan(rel)),
        window=used,
    )
