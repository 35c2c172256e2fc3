"""Length distributions from data: an empirical column of a trace, and dataset presets.

- ``empirical``: draws from the values of a trace column (or a list given
  inline), with replacement, or in file order;
- ``sharegpt`` and ``alpaca``: lognormal presets whose means are the vLLM
  paper's (Kwon et al., SOSP 2023, section 6.1): ShareGPT 161.31 input and
  337.99 output tokens, Alpaca 19.31 and 58.45.

How a preset is built: a lognormal draw, truncated to an integer and
clipped to ``[1, 1024]`` for prompts and ``[1, 2048]`` for outputs (the
vLLM benchmark's limits for these datasets). The spread ``sigma`` is our
choice, as the paper gives means only: 1.2 for ShareGPT prompts (short
questions with a long tail of pasted text), 0.8 for ShareGPT replies, 0.5
for Alpaca instructions and 0.8 for Alpaca replies. ``mu`` is then solved
so that the exact mean of the clipped integers equals the paper's mean
(``tests/test_lengths.py`` checks this by summing the distribution).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from orcasim.errors import OrcasimError
from orcasim.registry import lengths
from orcasim.workload.base import LIMITS_NOTE, MAX_TOKENS_PER_REQUEST, check_items
from orcasim.workload.distributions import LengthDist, _clip, _Clipped

Column = Literal["prompt", "output"]


@lengths.register("empirical")
class Empirical(LengthDist):
    """Token counts drawn from a trace column (``file`` + ``column``) or from ``values``.

    ``sample: bootstrap`` draws with replacement (each row equally likely);
    ``in_order`` takes the first ``n`` values in file order (an error if
    there are fewer). Drawing prompt and output lengths from two independent
    columns loses their correlation: to keep each row's pair, use the
    ``trace`` workload with an ``arrival`` process instead.
    """

    class Params(_Clipped):
        file: str | None = Field(None, description="trace file path or shipped slice name")
        format: Literal["auto", "azure", "mooncake", "lengths", "sharegpt", "tokens"] = "auto"
        column: Column | None = Field(None, description="prompt or output")
        values: list[int] | None = Field(None, description="the values, instead of a file "
                                         f"({LIMITS_NOTE})")
        sample: Literal["bootstrap", "in_order"] = "bootstrap"

        @model_validator(mode="after")
        def _source(self) -> Empirical.Params:
            if (self.file is None) == (self.values is None):
                raise ValueError("give either file (with column) or values")
            if self.file is not None and self.column is None:
                raise ValueError("column (prompt or output) is required with file")
            if self.values is not None and (not self.values or min(self.values) < 0):
                raise ValueError("values must be a non-empty list of counts >= 0")
            if self.values is not None:
                check_items(self.values, "values", 0, MAX_TOKENS_PER_REQUEST)
            return self

    def data(self) -> np.ndarray:
        """The values drawn from."""
        p = self.params
        if p.values is not None:
            return np.asarray(p.values, dtype=np.int64)
        from orcasim.workload.traces import load_trace

        trace = load_trace(p.file, p.format)
        return trace.prompt_len if p.column == "prompt" else trace.output_len

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        data = self.data()
        if self.params.sample == "in_order":
            if len(data) < n:
                raise OrcasimError(f"empirical lengths: {len(data)} values, fewer than the {n} "
                                   "requests asked for (use sample: bootstrap)")
            x = np.array(data[:n], dtype=np.int64)
        else:
            x = data[rng.integers(0, len(data), size=n)]
        return _clip(x, self.params)


class _Preset(LengthDist):
    """A lognormal preset: ``(mu, sigma, max)`` for prompts and for outputs."""

    SHAPES: ClassVar[dict[str, tuple[float, float, int]]] = {}

    class Params(_Clipped):
        column: Column = Field(description="prompt or output lengths")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu, sigma, hi = self.SHAPES[self.params.column]
        x = np.clip(rng.lognormal(mean=mu, sigma=sigma, size=n).astype(np.int64), 1, hi)
        return _clip(x, self.params)


@lengths.register("sharegpt")
class ShareGPT(_Preset):
    """ShareGPT-like lengths: mean 161.31 prompt and 337.99 output tokens (vLLM paper)."""

    SHAPES: ClassVar[dict[str, tuple[float, float, int]]] = {
        "prompt": (4.45, 1.2, 1024),
        "output": (5.5125, 0.8, 2048),
    }


@lengths.register("alpaca")
class Alpaca(_Preset):
    """Alpaca-like lengths: mean 19.31 prompt and 58.45 output tokens (vLLM paper)."""

    SHAPES: ClassVar[dict[str, tuple[float, float, int]]] = {
        "prompt": (2.8612, 0.5, 1024),
        "output": (3.7567, 0.8, 2048),
    }
