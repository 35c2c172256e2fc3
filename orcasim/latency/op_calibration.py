"""Roofline efficiencies measured on operators, never on served requests.

Two kinds of operator-level measurements give the roofline's efficiencies:

- a Vidur compute profile, ``mlp.csv`` of ``data/profiling/compute/<gpu>/<model>/``
  in microsoft/vidur (MIT): per-operator times (ms) of one decoder layer against
  ``num_tokens``, at each tensor-parallel degree. The four projections
  (``attn_pre_proj`` = QKV, ``attn_post_proj`` = O, ``mlp_up_proj`` = gate and
  up, ``mlp_down_proj``) are matrix multiplications whose FLOPs and weight
  bytes follow from the shape columns (``n_head``, ``n_kv_head``, ``n_embd``,
  ``n_expanded_embd``, ``use_gated_mlp``, ``num_tensor_parallel_workers``).
  :func:`gemm_efficiencies` takes ``achieved FLOP/s / peak`` at the largest
  token counts (compute-bound) as ``compute_efficiency``, and ``weight bytes /
  time / peak bandwidth`` at the smallest (memory-bound) as
  ``bandwidth_efficiency``;
- a Vidur network profile, ``data/profiling/network/<system>/all_reduce.csv``:
  all-reduce times (ms) against the message ``size`` (bytes) and
  ``num_workers``. :func:`allreduce_fit` fits ``t = latency + size ·
  2(w-1)/w / bus_bandwidth`` to the large messages.

- an LLMServingSim profile, ``dense.csv`` (``layer, tokens, time_us``) of
  ``<GPU>/<org>/<model>/<dtype>/tp<N>/`` (the format of shared operator
  profiles and of the ``profile`` latency model): the same four projections
  are ``qkv_proj``, ``o_proj``, ``gate_up_proj`` and ``down_proj``, whose
  shapes come from the model spec (:func:`dense_profile_efficiencies`; a
  mixture-of-experts model's experts are in ``moe.csv`` and left out).

``python -m orcasim.latency.op_calibration mlp.csv --gpu h100-sxm`` (or
``all_reduce.csv --workers 4``, or ``dense.csv --gpu rtx-pro-6000 --model
meta-llama/Llama-3.1-8B``) prints them.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orcasim.errors import EXIT_USAGE, OrcasimError, ScenarioError, UsageError
from orcasim.model_specs import resolve_gpu, resolve_model

#: the matrix multiplications of a Vidur mlp.csv row
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
         "num_tensor_parallel_workers")


@dataclass(frozen=True)
class GemmEfficiency:
    """Efficiencies read from a compute profile, with the rows they come from."""

    compute_efficiency: float
    bandwidth_efficiency: float
    compute_rows: int
    memory_rows: int


def _rows(path: Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise ScenarioError(", ".join(needed), "profile file not found", str(path))
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        for c in needed:
            if c not in header:
                raise ScenarioError(c, "missing column", str(path))
        return list(reader)


def _number(row: dict[str, str], col: str, path: Path, line: int) -> float:
    try:
        v = float(row[col])
    except (TypeError, ValueError):
        raise ScenarioError(col, f"line {line}: {row[col]!r} is not a number", str(path)
                            ) from None
    if not np.isfinite(v) or v < 0:
        raise ScenarioError(col, f"line {line}: {row[col]!r} is not a finite number >= 0",
                            str(path))
    return v


def gemm_efficiencies(path: str | Path, gpu: str, *, dtype_bytes: int = 2, tp: int = 1,
                      compute_min_tokens: int = 2048, memory_max_tokens: int = 8
                      ) -> GemmEfficiency:
    """Median compute and bandwidth efficiencies of the projections of a Vidur ``mlp.csv``.

    Rows at tensor-parallel degree ``tp`` with at least ``compute_min_tokens``
    tokens give the compute efficiency (FLOPs ``2 · tokens · weights`` over
    the summed median times and the GPU's peak); rows with at most
    ``memory_max_tokens`` tokens give the bandwidth efficiency (the weight
    bytes over the time and the GPU's peak bandwidth).
    """
    p = Path(path)
    cols = (*SHAPE, *(f"time_stats.{g}.median" for g in GEMMS))
    g = resolve_gpu(gpu)
    comp: list[float] = []
    mem: list[float] = []
    for line, row in enumerate(_rows(p, cols), start=2):
        if int(_number(row, "num_tensor_parallel_workers", p, line)) != tp:
            continue
        heads, kv, h, inter, n = (_number(row, c, p, line) for c in (*SHAPE[:4], "num_tokens"))
        gated = row["use_gated_mlp"].strip().lower() in ("true", "1")
        d = h / heads
        weights = (h * (heads + 2 * kv) * d + heads * d * h
                   + (2 if gated else 1) * h * inter + inter * h) / tp
        seconds = sum(_number(row, f"time_stats.{x}.median", p, line) for x in GEMMS) * 1e-3
        if seconds <= 0:
            continue
        if n >= compute_min_tokens:
            comp.append(2 * n * weights / seconds / g.peak_flops)
        if n <= memory_max_tokens:
            mem.append(weights * dtype_bytes / seconds / g.hbm_bandwidth)
    if not comp or not mem:
        raise UsageError(f"{p}: no rows at tp={tp} with >= {compute_min_tokens} tokens and "
                         f"with <= {memory_max_tokens} tokens")
    return GemmEfficiency(float(np.median(comp)), float(np.median(mem)), len(comp), len(mem))


def dense_profile_efficiencies(path: str | Path, model: str, gpu: str, *, tp: int = 1,
                               compute_min_tokens: int = 1024, memory_max_tokens: int = 8
                               ) -> GemmEfficiency:
    """Compute and bandwidth efficiencies of the projections in an LLMServingSim ``dense.csv``.

    As :func:`gemm_efficiencies`, with the weights of each operator from
    ``model``'s shape split over ``tp`` GPUs: ``qkv_proj`` ``h·(H + 2·KV)·d``,
    ``o_proj`` ``H·d·h``, ``gate_up_proj`` ``2·h·I``, ``down_proj`` ``I·h``.
    The medians are over the token counts present for every operator.
    """
    p = Path(path)
    m = resolve_model(model)
    g = resolve_gpu(gpu)
    h, d = m.hidden_size, m.head_dim
    weights = {"qkv_proj": h * (m.num_heads + 2 * m.num_kv_heads) * d,
               "o_proj": m.num_heads * d * h}
    if not m.is_moe:
        weights.update(gate_up_proj=2 * h * m.intermediate_size,
                       down_proj=m.intermediate_size * h)
    times: dict[float, dict[str, list[float]]] = {}
    for line, row in enumerate(_rows(p, ("layer", "tokens", "time_us")), start=2):
        op = row["layer"].strip()
        if op in weights:
            n = _number(row, "tokens", p, line)
            times.setdefault(n, {}).setdefault(op, []).append(
                _number(row, "time_us", p, line) * 1e-6)
    comp: list[float] = []
    mem: list[float] = []
    total = sum(weights.values()) / tp
    for n, ops in times.items():
        if len(ops) < len(weights):
            continue
        seconds = sum(float(np.mean(v)) for v in ops.values())
        if seconds <= 0:
            continue
        if n >= compute_min_tokens:
            comp.append(2 * n * total / seconds / g.peak_flops)
        if n <= memory_max_tokens:
            mem.append(total * m.dtype_bytes / seconds / g.hbm_bandwidth)
    if not comp or not mem:
        raise UsageError(f"{p}: no token counts >= {compute_min_tokens} and <= "
                         f"{memory_max_tokens} with all of {', '.join(weights)}")
    return GemmEfficiency(float(np.median(comp)), float(np.median(mem)), len(comp), len(mem))


def allreduce_fit(path: str | Path, workers: int, *, min_bytes: int = 8 * 2**20
                  ) -> tuple[float, float]:
    """``(latency s, bus bandwidth bytes/s)`` of ``workers``-GPU all-reduces of a Vidur file.

    Least squares of ``t = latency + size · 2(w-1)/w / bandwidth`` on the
    median times of messages of at least ``min_bytes`` bytes.
    """
    p = Path(path)
    cols = ("num_workers", "size", "time_stats.all_reduce.median")
    xs: list[float] = []
    ys: list[float] = []
    for line, row in enumerate(_rows(p, cols), start=2):
        if int(_number(row, "num_workers", p, line)) != workers:
            continue
        size = _number(row, "size", p, line)
        if size >= min_bytes:
            xs.append(size * 2 * (workers - 1) / workers)
            ys.append(_number(row, "time_stats.all_reduce.median", p, line) * 1e-3)
    if len(set(xs)) < 2:
        raise UsageError(f"{p}: fewer than two message sizes of >= {min_bytes} bytes for "
                         f"{workers} workers")
    a = np.column_stack([np.ones(len(xs)), xs])
    (lat, per_byte), *_ = np.linalg.lstsq(a, np.asarray(ys), rcond=None)
    return float(lat), float(1.0 / per_byte)


def main(argv: list[str] | None = None) -> int:
    """Print the efficiencies of a Vidur compute or network profile."""
    ap = argparse.ArgumentParser(prog="python -m orcasim.latency.op_calibration",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("file", help="Vidur mlp.csv or all_reduce.csv")
    ap.add_argument("--gpu", default="h100-sxm", help="GPU preset the profile was taken on")
    ap.add_argument("--tp", type=int, default=1, help="mlp.csv: tensor-parallel rows to use")
    ap.add_argument("--workers", type=int, default=4, help="all_reduce.csv: GPUs")
    ap.add_argument("--model", default=None, help="dense.csv: the profiled model (preset, "
                    "Hugging Face id or config.json)")
    args = ap.parse_args(argv)
    try:
        with open(args.file, newline="") as f:
            header = next(csv.reader(f), [])
    except OSError as e:
        print(f"orcasim: error: {args.file}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if "time_us" in header and "layer" in header:
            if args.model is None:
                raise UsageError("a dense.csv profile needs --model")
            e = dense_profile_efficiencies(args.file, args.model, args.gpu, tp=args.tp)
            print(f"{args.gpu} tp={args.tp}: compute_efficiency {e.compute_efficiency:.3f} "
                  f"({e.compute_rows} token counts), bandwidth_efficiency "
                  f"{e.bandwidth_efficiency:.3f} ({e.memory_rows} token counts)")
        elif "time_stats.all_reduce.median" in header:
            lat, bw = allreduce_fit(args.file, args.workers)
            link = resolve_gpu(args.gpu).interconnect_bandwidth
            print(f"all-reduce, {args.workers} GPUs: latency {lat * 1e6:.1f} us, bus bandwidth "
                  f"{bw / 1e9:.1f} GB/s = {bw / link:.3f} of {args.gpu}'s {link / 1e9:g} GB/s "
                  "link")
        else:
            e = gemm_efficiencies(args.file, args.gpu, tp=args.tp)
            print(f"{args.gpu} tp={args.tp}: compute_efficiency {e.compute_efficiency:.3f} "
                  f"({e.compute_rows} rows), bandwidth_efficiency "
                  f"{e.bandwidth_efficiency:.3f} ({e.memory_rows} rows)")
    except (OrcasimError, ValueError) as e:
        print(f"orcasim: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
