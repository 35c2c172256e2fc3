"""Vidur's compute profiles (``mlp.csv`` and ``attention.csv`` of one GPU and model).

Vidur (microsoft/vidur) publishes per-operator times under
``data/profiling/compute/<gpu>/<org>/<model>/``, in milliseconds, one row per
measured shape and TP degree (``num_tensor_parallel_workers``):

- ``mlp.csv``: ``num_tokens`` against ``time_stats.<op>.median`` for the
  operators of one decoder layer (``input_layernorm``, ``attn_pre_proj``,
  ``attn_rope``, ``attn_post_proj``, ``post_attention_layernorm``,
  ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj``, ``add``) and the
  embedding (``emb``, once per step);
- ``attention.csv``: prefill rows (``prefill_chunk_size`` > 0, one request
  with ``kv_cache_size`` cached tokens) timed as
  ``time_stats.attn_prefill.median``, decode rows (``prefill_chunk_size`` 0,
  ``batch_size`` requests of ``kv_cache_size`` context) as
  ``time_stats.attn_decode.median``, and ``time_stats.attn_kv_cache_save.median``
  (writing the step's keys and values into the cache; optional, as in Vidur).

A step's attention is the prefill time at its chunk and cached context plus
the decode time at its decodes and their mean context plus the KV write of
its tokens, per layer. Vidur's profiles hold no lm_head or sampler (Vidur
counts the sampler as CPU overhead), so those add nothing; ``emb`` is read as
``embedding``, a per-step operator. Rows are kept for the scenario's TP
degree; attention rows also for one KV ``block_size`` when the file has
several.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orcasim.errors import ScenarioError
from orcasim.latency.profile_tables import Curve, Node, build_nested

TP = "num_tensor_parallel_workers"
#: the operators of mlp.csv: (Vidur's name, the name in a composed profile)
OPS = (("emb", "embedding"), ("input_layernorm", "input_layernorm"),
       ("attn_pre_proj", "attn_pre_proj"), ("attn_rope", "attn_rope"),
       ("attn_post_proj", "attn_post_proj"),
       ("post_attention_layernorm", "post_attention_layernorm"),
       ("mlp_up_proj", "mlp_up_proj"), ("mlp_act", "mlp_act"),
       ("mlp_down_proj", "mlp_down_proj"), ("add", "add"))
#: operators Vidur itself treats as absent (zero) when a file lacks them
OPTIONAL = {"emb", "input_layernorm", "post_attention_layernorm", "add"}
#: the model-shape columns a Vidur file may mix several models under
SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")


def is_vidur(directory: Path) -> bool:
    """Whether ``directory`` looks like a Vidur compute-profile folder."""
    return (directory / "mlp.csv").is_file() and (directory / "attention.csv").is_file()


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    if not path.is_file():
        raise ScenarioError("engine.latency.dir", "Vidur profile file not found", str(path))
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = [h.strip() for h in reader.fieldnames or []]
    return header, [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in rows]


def _number(path: Path, rows: list[dict[str, str]], name: str,
            lines: list[int], blank: float | None = None) -> np.ndarray:
    """Column ``name`` of ``rows`` as floats (a blank cell is ``blank`` when given)."""
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        cell = r.get(name, "")
        if not cell and blank is not None:
            out[i] = blank
            continue
        try:
            v = float(cell)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v >= 0):
            raise ScenarioError(name, f"line {lines[i]}: {cell!r} is not a number >= 0",
                                str(path))
        out[i] = v
    return out


def _select(path: Path, tp: int, block_size: int | None = None
            ) -> tuple[list[str], list[dict[str, str]], list[int]]:
    """The rows of ``path`` at TP degree ``tp`` (and ``block_size``), with their line numbers."""
    header, rows = _rows(path)
    if TP not in header:
        raise ScenarioError(TP, "column missing from the Vidur profile file", str(path))
    keep = [(i + 2, r) for i, r in enumerate(rows) if _is_int(r.get(TP), tp)]
    if block_size is not None and "block_size" in header:
        sizes = sorted({r.get("block_size", "") for _, r in keep})
        if len(sizes) > 1:
            keep = [(n, r) for n, r in keep if _is_int(r.get("block_size"), block_size)]
    if not keep:
        raise ScenarioError(TP, f"no rows for tensor-parallel degree {tp}", str(path))
    shapes = {tuple(r.get(c, "") for c in SHAPE if c in header) for _, r in keep}
    if len(shapes) > 1:
        raise ScenarioError("engine.latency.dir", f"rows of {len(shapes)} model shapes "
                            f"({', '.join(c for c in SHAPE if c in header)}) at tp {tp}: keep "
                            "one model per folder", str(path))
    return header, [r for _, r in keep], [n for n, _ in keep]


def _is_int(cell: str | None, value: int) -> bool:
    try:
        return float(cell or "nan") == value
    except ValueError:
        return False


@dataclass(frozen=True)
class VidurTables:
    """A Vidur profile at one TP degree, as curves and trees in seconds."""

    ops: dict[str, Curve]
    prefill: Node | float
    decode: Node | float
    kv_save: Curve | None


def load_vidur(directory: Path, tp: int, block_size: int, clamp: bool) -> VidurTables:
    """Read ``mlp.csv`` and ``attention.csv`` of ``directory`` at ``tp``."""
    path = directory / "mlp.csv"
    header, rows, lines = _select(path, tp)
    if "num_tokens" not in header:
        raise ScenarioError("num_tokens", "column missing from the Vidur profile file",
                            str(path))
    tokens = _number(path, rows, "num_tokens", lines)
    ops: dict[str, Curve] = {}
    for vidur_name, name in OPS:
        col = f"time_stats.{vidur_name}.median"
        if col not in header:
            if vidur_name in OPTIONAL:
                continue
            raise ScenarioError(col, "column missing from the Vidur profile file", str(path))
        ops[name] = Curve(tokens, _number(path, rows, col, lines) * 1e-3, clamp)
    path = directory / "attention.csv"
    header, rows, lines = _select(path, tp, block_size)
    for c in ("batch_size", "prefill_chunk_size", "kv_cache_size"):
        if c not in header:
            raise ScenarioError(c, "column missing from the Vidur profile file", str(path))
    pc = _number(path, rows, "prefill_chunk_size", lines)
    kv = _number(path, rows, "kv_cache_size", lines)
    bs = _number(path, rows, "batch_size", lines)
    is_prefill = pc > 0
    trees: list[Node | float] = []
    for mask, col, axis in ((is_prefill, "attn_prefill", pc), (~is_prefill, "attn_decode", bs)):
        name = f"time_stats.{col}.median"
        idx = np.flatnonzero(mask)
        if not len(idx):
            raise ScenarioError(name, f"no {col.removeprefix('attn_')} rows at tp {tp}",
                                str(path))
        if name not in header:
            raise ScenarioError(name, "column missing from the Vidur profile file", str(path))
        sub = [rows[i] for i in idx]
        times = _number(path, sub, name, [lines[i] for i in idx]) * 1e-3
        trees.append(build_nested(np.column_stack([axis[idx], kv[idx]]), times))
    kv_save = None
    name = "time_stats.attn_kv_cache_save.median"
    if name in header:
        step_tokens = np.maximum(pc, bs)
        kv_save = Curve(step_tokens, _number(path, rows, name, lines, 0.0) * 1e-3, clamp)
    return VidurTables(ops, trees[0], trees[1], kv_save)
