"""The parts of an inference-perf config file (kubernetes-sigs/inference-perf) a simulation uses.

Read from inference-perf's own schema (``inference_perf/config/``, v0.6.1 and
its main branch of August 2026): ``data`` (``shared_prefix``, ``random``,
``synthetic``), ``load`` (``constant`` or ``poisson`` stages of ``rate`` and
``duration``, ``interval``, ``request_timeout``, the worker pool),
``server.ignore_eos``, ``api.type`` and ``report.request_lifecycle.percentiles``.
Sections that only concern the real client (``metrics``, ``storage``,
``tokenizer``, ``circuit_breakers``, the rest of ``server``) are accepted and
ignored. Unknown keys where the simulation reads, and features it does not
simulate, are refused with the key named.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

DEFAULT_PERCENTILES = (0.1, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Distribution(_Strict):
    """inference-perf's ``Distribution``: a length drawn, clamped to ``[min, max]``, rounded."""

    min: int = 10
    max: int = 1024
    mean: float = 512
    std_dev: float = 200
    total_count: int | None = Field(None, gt=0)
    type: Literal["normal", "skew_normal", "lognormal", "uniform", "poisson", "fixed"] = "normal"
    variance: float | None = None
    skew: float = 0.0

    @model_validator(mode="after")
    def _valid(self) -> Distribution:
        if self.variance is not None and self.std_dev > 0 and "std_dev" in self.model_fields_set:
            raise ValueError("specify either 'std_dev' or 'variance', not both")
        if self.variance is not None and self.variance < 0:
            raise ValueError("variance cannot be negative")
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) cannot be greater than max ({self.max})")
        if self.min < 0:
            raise ValueError(f"min ({self.min}) must be >= 0 (a token count)")
        if self.std_dev < 0:
            raise ValueError("std_dev cannot be negative")
        return self

    @property
    def sd(self) -> float:
        return float(np.sqrt(self.variance)) if self.variance is not None else self.std_dev

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """inference-perf's ``sample_from_distribution`` (shared_prefix lengths)."""
        t, lo, hi = self.type, self.min, self.max
        if t == "fixed":
            return np.full(n, int(self.mean), dtype=np.int64)
        if t == "normal":
            x = rng.normal(self.mean, self.sd, n)
        elif t == "skew_normal":  # Azzalini's two-normal construction
            delta = self.skew / np.sqrt(1.0 + self.skew**2)
            u0, v = rng.standard_normal(n), rng.standard_normal(n)
            u1 = delta * u0 + np.sqrt(1.0 - delta**2) * v
            x = self.mean + self.sd * np.where(u0 >= 0, u1, -u1)
        elif t == "lognormal":
            if self.mean <= 0:
                raise ValueError("lognormal distribution requires mean > 0")
            if self.sd <= 0:
                x = np.full(n, self.mean)
            else:
                s2 = np.log(1.0 + (self.sd / self.mean) ** 2)
                x = rng.lognormal(np.log(self.mean) - s2 / 2.0, np.sqrt(s2), n)
        elif t == "uniform":
            x = rng.uniform(lo, hi + 1, n)
        else:  # poisson
            x = rng.poisson(self.mean if self.mean > 0 else 1.0, n).astype(np.float64)
        return np.clip(np.round(np.clip(x, lo, hi)), lo, hi).astype(np.int64)

    def generate(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """inference-perf's ``generate_distribution`` (random and synthetic lengths)."""
        t, lo, hi = self.type, self.min, self.max
        if t == "fixed":
            return np.full(n, int(self.mean), dtype=np.int64)
        if t == "uniform":
            x = rng.uniform(lo, hi, n)
        elif t == "lognormal":
            shifted = self.mean - lo if self.mean - lo > 0 else 1.0
            s2 = np.log(1 + (self.sd / shifted) ** 2)
            x = rng.lognormal(np.log(shifted) - s2 / 2, np.sqrt(s2), n) + lo
        elif t == "normal":
            if not lo <= self.mean <= hi:
                raise ValueError("mean cannot be outside min and max range")
            x = rng.normal(self.mean, self.sd, n)
        else:
            raise ValueError(f"type {t!r} is not supported by the random and synthetic data "
                             "types (normal, lognormal, uniform, fixed)")
        return np.clip(np.round(np.clip(x, lo, hi)), lo, hi).astype(np.int64)


def as_distribution(v: int | Distribution) -> Distribution:
    """A fixed length as a distribution (inference-perf's ``_resolve_distribution``)."""
    if isinstance(v, Distribution):
        return v
    return Distribution(mean=float(v), min=v, max=v, std_dev=0.0, type="fixed")


class SharedPrefix(_Strict):
    num_groups: int = Field(10, gt=0, validation_alias=AliasChoices(
        "num_unique_system_prompts", "num_groups"))
    num_prompts_per_group: int = Field(10, gt=0, validation_alias=AliasChoices(
        "num_users_per_system_prompt", "num_prompts_per_group"))
    system_prompt_len: int | Distribution = Field(100, description="tokens")
    question_len: int | Distribution = 50
    output_len: int | Distribution = 50
    seed: int | None = None
    question_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    enable_multi_turn_chat: bool = False
    multimodal: Any = None

    @model_validator(mode="after")
    def _valid(self) -> SharedPrefix:
        for name in ("system_prompt_len", "question_len", "output_len"):
            v = getattr(self, name)
            if isinstance(v, int) and v < 0:
                raise ValueError(f"{name} must be >= 0")
        if isinstance(self.question_len, Distribution) and self.question_distribution:
            raise ValueError("cannot specify both an inline distribution on 'question_len' and "
                             "'question_distribution'")
        if isinstance(self.output_len, Distribution) and self.output_distribution:
            raise ValueError("cannot specify both an inline distribution on 'output_len' and "
                             "'output_distribution'")
        if self.multimodal is not None:
            raise ValueError("multimodal prompts are not simulated")
        return self

    def dists(self) -> tuple[Distribution, Distribution, Distribution]:
        """System prompt, question and output length distributions."""
        q = self.question_len if isinstance(self.question_len, Distribution) else \
            self.question_distribution or as_distribution(self.question_len)
        o = self.output_len if isinstance(self.output_len, Distribution) else \
            self.output_distribution or as_distribution(self.output_len)
        return as_distribution(self.system_prompt_len), q, o


_UNSIMULATED_DATA = ("path", "corpus_file_path", "multimodal", "trace", "otel_trace_replay",
                     "weka_trace_replay", "conversation_replay", "visionarena")


class Data(_Strict):
    type: str = "mock"
    shared_prefix: SharedPrefix | None = None
    input_distribution: Distribution | None = None
    output_distribution: Distribution | None = None
    use_chat_template: bool = False
    path: Any = None
    corpus_file_path: Any = None
    multimodal: Any = None
    trace: Any = None
    otel_trace_replay: Any = None
    weka_trace_replay: Any = None
    conversation_replay: Any = None
    visionarena: Any = None

    @model_validator(mode="after")
    def _valid(self) -> Data:
        if self.type not in ("shared_prefix", "random", "synthetic"):
            raise ValueError(f"type {self.type!r} is not simulated (shared_prefix, random, "
                             "synthetic)")
        if self.type == "shared_prefix" and self.shared_prefix is None:
            raise ValueError("type shared_prefix needs a 'shared_prefix' section")
        if self.type != "shared_prefix" and (self.input_distribution is None
                                              or self.output_distribution is None):
            raise ValueError(f"type {self.type} needs input_distribution and "
                             "output_distribution")
        for key in ("trace", "multimodal"):
            if getattr(self, key) is not None:
                raise ValueError(f"'{key}' is not simulated")
        return self


class Stage(_Strict):
    rate: float = Field(gt=0, le=1e6, allow_inf_nan=False, description="requests per second")
    duration: int = Field(gt=0, le=10**7, description="seconds")
    num_requests: None = None
    concurrency_level: None = None


class Sweep(BaseModel):
    model_config = ConfigDict(extra="allow")


class Load(_Strict):
    type: Literal["constant", "poisson"] = "constant"
    interval: float = Field(1.0, ge=0, le=1e6, allow_inf_nan=False)
    stages: list[Stage] = Field(min_length=1)
    sweep: Sweep | None = None
    num_workers: int | None = Field(None, gt=0)
    worker_max_concurrency: int = Field(100, gt=0)
    worker_max_tcp_connections: int = 2500
    trace: Any = None
    circuit_breakers: list[str] = []
    request_timeout: float | None = Field(None, gt=0, le=1e9, allow_inf_nan=False)
    lora_traffic_split: Any = None
    base_seed: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> Load:
        if self.sweep is not None:
            raise ValueError("'sweep' (stages found by probing the server) is not simulated: "
                             "write the stages out")
        return self


class Api(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal["completion", "chat"] = "completion"
    streaming: bool = False


class Server(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    ignore_eos: bool = True


class Lifecycle(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    percentiles: list[float] = Field(list(DEFAULT_PERCENTILES))


class Report(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    request_lifecycle: Lifecycle = Lifecycle()


class IPConfig(_Strict):
    """An inference-perf config: what is simulated, validated; the rest accepted."""

    api: Api = Api()
    data: Data
    load: Load
    server: Server | None = None
    report: Report = Report()
    metrics: Any = None
    storage: Any = None
    tokenizer: Any = None
    circuit_breakers: Any = None

    @property
    def ignore_eos(self) -> bool:
        return self.server.ignore_eos if self.server is not None else True
