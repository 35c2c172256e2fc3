"""Produce golden traces with vLLM's own scheduler, through the oracle harness (not run in CI).

Run it with the harness's Python (vLLM installed by shared/oracle/setup.sh)::

    ~/.cache/vllm-oracle-venv/bin/python tests/golden/run_harness.py \\
        --harness ../shared/oracle/harness.py tests/golden/vllm_v1/*.json

For each ``NAME.json`` it writes ``NAME.trace.jsonl`` beside it (``--out-dir``
elsewhere). vLLM is imported once for all workloads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="+", type=Path)
    ap.add_argument("--harness", type=Path, default=Path("../shared/oracle/harness.py"))
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--block-tables", action="store_true")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("harness", a.harness)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    for path in a.workloads:
        wl = json.loads(path.read_text())
        cfg = dict(harness.DEFAULT_CONFIG)
        if isinstance(wl, dict):
            cfg.update(wl.get("config", {}))
            wl = wl["requests"]
        out_dir = a.out_dir or path.parent
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / (path.name.removesuffix(".json") + ".trace.jsonl")
        s = harness.run(wl, cfg, str(out), a.block_tables, True)
        print(f"{path.name}: {s['last_step'] + 1} steps, {s['num_preemptions']} preemptions, "
              f"{s['ms_per_step']} ms/step")


if __name__ == "__main__":
    main()
