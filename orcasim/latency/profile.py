"""``profile``: a step's time composed from per-operator GPU profile tables.

A profile directory (one model and dtype, e.g. ``.../Llama-3.1-8B/bf16``) holds
``meta.yaml`` and one folder per tensor-parallel degree (``tp1``, ``tp2``) with
the times of one decoder layer's operators, measured on the GPU:

- ``dense.csv`` (layer, tokens, time_us): each non-attention operator against
  the tokens in the step;
- ``attention.csv`` (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us):
  one layer's attention for a prefill chunk over ``kv_prefill`` cached tokens
  plus ``n_decode`` decodes of ``kv_decode`` context each;
- ``per_sequence.csv`` (layer, sequences, time_us): once-per-step work that
  scales with the sequences (lm_head, sampler).

A step takes::

    num_layers * (sum of per-layer dense ops(tokens) + attention(step))
      + sum of per-step dense ops(tokens) + sum of per-sequence ops(num_seqs)
      + overhead_s + 2 * num_layers * all-reduce(tokens)   (tp > 1)

where the per-step dense operators (``embedding`` and ``final_layernorm`` by
default) run once per forward pass, not once per layer, and ``layernorm``
runs twice per layer. ``skew_fit.csv`` corrects decode batches with skewed
context lengths (:mod:`orcasim.latency.skew`). A profile with ``moe.csv`` (a
mixture-of-experts model) is refused: the number of experts a step activates
is not known from the plan.

Interpolation is linear between grid points in every dimension, and linear
from the last two grid points beyond the grid (``extrapolate: clamp`` holds the
edge value instead). The attention table is not a full grid (the measured
``kv_prefill`` values depend on the chunk size), so it is interpolated axis by
axis in the order prefill_chunk, kv_prefill, n_decode, kv_decode: between the
two measured values of an axis that bracket the step, each inside the rows
that match the values already chosen for the earlier axes. On a full grid this
is exactly multilinear interpolation.

Files are read once per profile directory and TP degree, and shared by every
model instance built from them.
"""

from __future__ import annotations

import csv
import functools
import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union

import numpy as np
import yaml
from pydantic import Field

from orcasim.errors import OrcasimError, ScenarioError
from orcasim.latency.base import Coefficient, LatencyModel
from orcasim.latency.skew import SkewFit, load_skew_fit
from orcasim.params import ComponentParams
from orcasim.plan import StepPlan
from orcasim.registry import latency_models

#: columns of each profile table: (text columns, numeric columns)
DENSE = (("layer",), ("tokens", "time_us"))
PER_SEQUENCE = (("layer",), ("sequences", "time_us"))
ATTENTION = ((), ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))


def read_table(path: Path, text: tuple[str, ...], numeric: tuple[str, ...]
               ) -> dict[str, np.ndarray]:
    """The named columns of CSV ``path``: text columns as strings, the others as floats.

    Raises a one-line :class:`ScenarioError` naming the file and the column
    for a missing file, a missing column or a cell that is not a finite number.
    """
    cols = (*text, *numeric)
    if not path.is_file():
        raise ScenarioError(", ".join(cols), "profile file not found", str(path))
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]] if rows else []
    for c in cols:
        if c not in header:
            raise ScenarioError(c, "column missing from the profile file", str(path))
    out: dict[str, np.ndarray] = {}
    for c in text:
        j = header.index(c)
        out[c] = np.array([r[j].strip() if j < len(r) else "" for r in rows[1:]])
    for c in numeric:
        out[c] = _numeric_column(path, c, header.index(c), rows[1:])
    return out


def _numeric_column(path: Path, name: str, j: int, rows: list[list[str]]) -> np.ndarray:
    """Column ``j`` of ``rows`` as floats; a blank, non-numeric or negative cell is an error."""
    values = np.empty(len(rows))
    for i, r in enumerate(rows):
        cell = r[j].strip() if j < len(r) else ""
        try:
            v = float(cell)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(name, f"line {i + 2}: {cell!r} is not a number >= 0", str(path))
        values[i] = v
    if not len(rows):
        raise ScenarioError(name, "the profile file has no rows", str(path))
    return values


class Curve:
    """Piecewise-linear function of one input, from measured points (repeats averaged)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, clamp: bool) -> None:
        xs, inverse = np.unique(x, return_inverse=True)
        ys = np.bincount(inverse, weights=y) / np.bincount(inverse)
        self.xs: list[float] = xs.tolist()
        self.ys: list[float] = ys.tolist()
        self.clamp = clamp

    def __call__(self, v: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect_right(xs, v) - 1, 0), len(xs) - 2)
        f = (v - xs[i]) / (xs[i + 1] - xs[i])
        if self.clamp:
            f = min(max(f, 0.0), 1.0)
        return ys[i] + f * (ys[i + 1] - ys[i])


#: a node of the nested attention table: (sorted axis values, one child per value)
Node = tuple[list[float], list[Union["Node", float]]]


def build_nested(keys: np.ndarray, y: np.ndarray) -> Node | float:
    """A tree over the columns of ``keys``: one level per column, leaves the mean of ``y``."""
    if keys.shape[1] == 0:
        return float(y.mean())
    order = np.argsort(keys[:, 0], kind="stable")
    keys, y = keys[order], y[order]
    values, starts = np.unique(keys[:, 0], return_index=True)
    ends = [*starts[1:].tolist(), len(y)]
    children = [build_nested(keys[s:e, 1:], y[s:e]) for s, e in zip(starts, ends, strict=True)]
    return values.tolist(), children


def eval_nested(node: Node | float, point: tuple[float, ...], clamp: bool) -> float:
    """Axis-by-axis linear interpolation of a :func:`build_nested` tree at ``point``."""
    if not isinstance(node, tuple):
        return node
    xs, children = node
    rest = point[1:]
    if len(xs) == 1:
        return eval_nested(children[0], rest, clamp)
    v = point[0]
    i = min(max(bisect_right(xs, v) - 1, 0), len(xs) - 2)
    f = (v - xs[i]) / (xs[i + 1] - xs[i])
    if clamp:
        f = min(max(f, 0.0), 1.0)
    a = eval_nested(children[i], rest, clamp) if f != 1.0 else 0.0
    b = eval_nested(children[i + 1], rest, clamp) if f != 0.0 else 0.0
    return a + f * (b - a)


@dataclass(frozen=True)
class Profile:
    """One TP folder's tables, read and checked."""

    folder: Path
    meta: dict
    dense: dict[str, np.ndarray]
    per_sequence: dict[str, np.ndarray]
    attention: dict[str, np.ndarray]
    skew: SkewFit | None = None


#: profiles shipped with orcasim (see orcasim/data/profiles/README.md)
BUILTIN_PROFILES = Path(__file__).resolve().parent.parent / "data" / "profiles"


def find_profile(name: str) -> Path:
    """A profile directory: ``name`` as a path, else a built-in profile of that name."""
    directory = Path(name).expanduser()
    if directory.is_dir():
        return directory.resolve()
    builtin = BUILTIN_PROFILES / name
    if builtin.is_dir() and (builtin / "meta.yaml").is_file():
        return builtin.resolve()
    known = sorted(str(m.parent.relative_to(BUILTIN_PROFILES))
                   for m in BUILTIN_PROFILES.glob("**/meta.yaml"))
    raise ScenarioError("engine.latency.dir", "profile directory not found (built-in: "
                        f"{', '.join(known) or 'none'})", name)


def read_meta(directory: Path) -> dict:
    """``meta.yaml`` of a profile directory, or ``{}`` when there is none."""
    path = directory / "meta.yaml"
    if not path.is_file():
        return {}
    try:
        meta = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ScenarioError("", f"not valid YAML ({err.__class__.__name__})", str(path)) from None
    return meta if isinstance(meta, dict) else {}


@functools.lru_cache(maxsize=16)
def load_profile(directory: Path, tp: int) -> Profile:
    """The profile of ``directory`` at TP degree ``tp`` (cached per resolved path)."""
    folder = directory / f"tp{tp}"
    if not folder.is_dir():
        raise ScenarioError("engine.latency.tp", f"no profile folder tp{tp}", str(directory))
    if (folder / "moe.csv").is_file():
        raise ScenarioError("engine.latency.dir", "mixture-of-experts profiles (moe.csv) "
                            "are not supported", str(folder))
    meta = read_meta(directory)
    return Profile(folder, meta,
                   read_table(folder / "dense.csv", *DENSE),
                   read_table(folder / "per_sequence.csv", *PER_SEQUENCE),
                   read_table(folder / "attention.csv", *ATTENTION),
                   load_skew_fit(meta, folder, tp))


def summed_curves(table: dict[str, np.ndarray], x: str, names: list[str], clamp: bool,
                  counts: dict[str, int] | None = None) -> list[Curve]:
    """One :class:`Curve` per operator in ``names`` (time in seconds against column ``x``).

    An operator that runs ``counts[name]`` times (default once) has its
    times multiplied by that count.
    """
    curves = []
    for name in names:
        rows = table["layer"] == name
        k = (counts or {}).get(name, 1)
        curves.append(Curve(table[x][rows], table["time_us"][rows] * (k * 1e-6), clamp))
    return curves


@latency_models.register("profile")
class ProfileLatency(LatencyModel):
    """Step times composed from per-operator GPU profiles (dense, attention, per-sequence)."""

    class Params(ComponentParams):
        dir: str = Field(description="profile directory of one model and dtype (holds meta.yaml "
                         "and tp<N>/ folders), relative to the current directory, or a "
                         "built-in profile (rtx-pro-6000/llama-3.1-8b/bf16)")
        tp: int = Field(1, ge=1, le=64, description="tensor-parallel degree: the tp<N> folder")
        num_layers: int | None = Field(None, ge=1, le=10_000, description="decoder layers; "
                                       "default: num_layers in meta.yaml")
        overhead_s: Coefficient = Field(0.0, description="fixed CPU time per step, s")
        per_step_ops: list[str] = Field(["embedding", "final_layernorm"], description=
                                        "dense operators that run once per step, not per layer")
        op_counts: dict[str, int] = Field({"layernorm": 2}, description="dense operators that "
                                          "run more than once per layer, and how often (a "
                                          "decoder layer has two RMSNorms)")
        skew_correction: bool = Field(True, description="apply the profile's skew fit "
                                      "(skew_fit.csv) to decode batches of uneven contexts")
        extrapolate: Literal["linear", "clamp"] = Field(
            "linear", description="beyond the grid: extend the edge segment, or hold its value")
        hidden_size: int | None = Field(None, ge=1, le=1_000_000, description="the model's "
                                        "hidden size: the all-reduced activations (tp > 1)")
        dtype_bytes: int = Field(2, ge=1, le=8, description="bytes per activation element")
        allreduce_bandwidth: float | None = Field(
            None, gt=1e6, allow_inf_nan=False, description="all-reduce bus bandwidth between "
            "the GPUs, bytes/s (tp > 1)")
        allreduce_latency: Coefficient = Field(0.0, description="fixed time per all-reduce, s")

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        directory = find_profile(params.dir)
        prof = load_profile(directory, params.tp)
        self.source = str(prof.folder)
        self.num_layers = self._layers(params, prof.meta, directory)
        clamp = params.extrapolate == "clamp"
        ops = list(dict.fromkeys(prof.dense["layer"].tolist()))
        self.per_layer = summed_curves(prof.dense, "tokens",
                                       [o for o in ops if o not in params.per_step_ops], clamp,
                                       params.op_counts)
        self.per_step = summed_curves(prof.dense, "tokens",
                                      [o for o in ops if o in params.per_step_ops], clamp)
        seq_ops = list(dict.fromkeys(prof.per_sequence["layer"].tolist()))
        self.per_seq = summed_curves(prof.per_sequence, "sequences", seq_ops, clamp)
        att = prof.attention
        keys = np.column_stack([att[c] for c in ATTENTION[1][:4]])
        self.attention_tree = build_nested(keys, att["time_us"] * 1e-6)
        self.clamp = clamp
        self.overhead = params.overhead_s
        self.skew = prof.skew if params.skew_correction else None
        self.comm_fixed, self.comm_per_token = self._allreduce(params)

    def _allreduce(self, params: Params) -> tuple[float, float]:
        """(fixed, per-token) time of the step's all-reduces, s: two per layer at tp > 1.

        A tp<N> folder holds one GPU's share of each operator (the profiler
        divides the model's dimensions); the GPUs then all-reduce the
        attention and MLP outputs of every layer, ``tokens x hidden_size x
        dtype_bytes`` each, as a ring moving ``2 (tp - 1) / tp`` of it.
        """
        if params.tp == 1:
            return 0.0, 0.0
        if params.hidden_size is None or params.allreduce_bandwidth is None:
            raise ScenarioError("engine.latency", f"tp {params.tp} needs hidden_size and "
                                "allreduce_bandwidth: the profile holds one GPU's operators, "
                                "not the all-reduces between the GPUs")
        n = 2 * self.num_layers
        ring = 2 * (params.tp - 1) / params.tp
        per_token = ring * params.hidden_size * params.dtype_bytes / params.allreduce_bandwidth
        return n * params.allreduce_latency, n * per_token

    @staticmethod
    def _layers(params: Params, meta: dict, directory: Path) -> int:
        """The decoder layer count: the parameter, else ``num_layers`` in meta.yaml."""
        if params.num_layers is not None:
            return params.num_layers
        n = meta.get("num_layers")
        if isinstance(n, int) and n >= 1:
            return n
        raise ScenarioError("engine.latency.num_layers", "required: meta.yaml does not give "
                            "num_layers", str(directory))

    def attention_inputs(self, plan: StepPlan) -> tuple[float, float, float, float]:
        """(prefill_chunk, kv_prefill, n_decode, kv_decode) of the step.

        A scheduled request computing one token is a decode (vLLM's attention
        backends split the batch the same way, by query length); its context is
        the tokens it had computed before the step (``plan.contexts``). All
        prefill chunks form one chunk whose context is their token-weighted
        mean (so chunk x context, the cross term of the attention work, is
        preserved); decodes give their count and mean context. Without the
        scheduled requests, prefills have no cached context and decodes share
        the plan's KV tokens equally.
        """
        return self._inputs(plan)[:4]

    @staticmethod
    def _inputs(plan: StepPlan) -> tuple[float, float, float, float, float, float]:
        """:meth:`attention_inputs` plus the shortest and longest decode context."""
        if plan.scheduled is None:
            kd = plan.num_kv_tokens / plan.num_seqs if plan.num_seqs else 0.0
            return float(plan.num_prefill_tokens), 0.0, float(plan.num_decode_tokens), kd, kd, kd
        contexts = plan.contexts
        if contexts is None:
            contexts = [req.num_computed_tokens for req, _ in plan.scheduled]
        pc = kp = nd = kd = 0
        lo, hi = math.inf, 0
        for (_, n), c in zip(plan.scheduled, contexts, strict=True):
            if n == 1:
                nd += 1
                kd += c
                if c < lo:
                    lo = c
                if c > hi:
                    hi = c
            else:
                pc += n
                kp += n * c
        mean = kd / nd if nd else 0.0
        return (float(pc), kp / pc if pc else 0.0, float(nd), mean,
                float(lo) if nd else 0.0, float(hi))

    def attention_time(self, plan: StepPlan) -> float:
        """One layer's attention for the step, s, with the skew correction when it applies."""
        pc, kp, nd, kd, lo, hi = self._inputs(plan)
        tree, clamp = self.attention_tree, self.clamp
        t = eval_nested(tree, (pc, kp, nd, kd), clamp)
        skew = self.skew
        if skew is not None and nd > 1 and hi > kd:
            alpha = skew.alpha(pc, int(nd), kd, lo, hi, kp)
            if alpha:
                t_max = eval_nested(tree, (pc, kp, nd, hi), clamp)
                if t_max > t:
                    t += alpha * (t_max - t)
        return t

    def step_time(self, plan: StepPlan) -> float:
        tokens = float(plan.num_prefill_tokens + plan.num_decode_tokens)
        attention = self.attention_time(plan) if tokens else 0.0
        layer = sum(c(tokens) for c in self.per_layer) + attention
        t = (self.num_layers * layer + sum(c(tokens) for c in self.per_step)
             + sum(c(float(plan.num_seqs)) for c in self.per_seq) + self.overhead
             + self.comm_fixed + self.comm_per_token * tokens)
        if not (t > 0 and math.isfinite(t)):
            raise OrcasimError(
                f"{self.source}: the profile gives {t:.6g} s for a step with {plan.num_seqs} "
                f"sequences, {tokens:.0f} tokens and attention inputs "
                f"{self.attention_inputs(plan)} (extrapolated "
                "past the profile; use extrapolate: clamp)")
        return t
