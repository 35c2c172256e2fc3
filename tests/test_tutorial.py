"""docs/policy-tutorial.md runs as written: every python block, each output block matched."""

from __future__ import annotations

import contextlib
import io
import re

from conftest import ROOT

FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(path):
    """``(python code, expected output or None)`` for each python block, in order."""
    found = FENCE.findall(path.read_text())
    out = []
    for i, (lang, body) in enumerate(found):
        if lang == "python":
            nxt = found[i + 1] if i + 1 < len(found) else None
            out.append((body, nxt[1] if nxt and nxt[0] == "text" else None))
    return out


def test_policy_tutorial_runs_and_prints_what_it_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "tutorial"}
    pairs = blocks(ROOT / "docs" / "policy-tutorial.md")
    assert len(pairs) >= 5
    for code, expected in pairs:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, "policy-tutorial.md", "exec"), ns)
        if expected is not None:
            assert buf.getvalue() == expected
    # the policy is about 30 lines, and it does what the page says
    policy_src = pairs[0][0]
    start = policy_src.index("@register_policy")
    assert len(policy_src[start:].strip().splitlines()) <= 32
    s = ns["res"].summary
    assert s["short-first"]["ttft_p50"] < s["fcfs"]["ttft_p50"] / 10
    assert s["short-first"]["ttft_p99"] > s["fcfs"]["ttft_p99"]
    assert (tmp_path / "tutorial_ttft_cdf.png").stat().st_size > 10_000
