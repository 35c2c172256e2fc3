"""``inference_perf``: the request stream of an inference-perf config file.

inference-perf (kubernetes-sigs/inference-perf) is the load generator used
with vLLM and llm-d. This workload reads its config (:mod:`.ip_config`) and
produces the requests it would send, as its code (v0.6.1 and main of August
2026) does:

- ``shared_prefix``: ``num_groups`` system prompts (lengths drawn once per
  group) x ``num_prompts_per_group`` questions (question and output lengths
  drawn per group), shuffled once; request ``j`` of every stage sends prompt
  ``j mod N`` (``N`` = groups x prompts), so stages and wrap-arounds repeat
  the same prompts. A prompt is the group's system prompt followed by its
  question; its KV blocks carry ``hash_ids`` that make the group's system
  prompt and every repeated prompt real prefix-cache hits.
- ``enable_multi_turn_chat``: the ``N`` prompts are users, assigned round
  robin (request ``j`` is user ``j mod N``, round ``j div N``); a user sends
  a round only after the previous one ended, and the history accumulates:
  round ``r`` sends everything of round ``r - 1`` (prompt and answer) followed
  by the user's prompt again, so its prompt is ``(r + 1)(system + question) +
  r x output`` tokens (plus one more system prompt in front with
  ``session_start: system_prompt``, as inference-perf up to 0.4.x did: there
  a session started from its group's system prompt; from 0.5.0 on, the
  sessions the client uses start empty). Sessions start afresh in every
  stage.
- ``random`` and ``synthetic``: input and output lengths drawn once
  (``max requests of a stage + 1`` of each), request ``j`` of every stage
  taking row ``j``; prompts are unique.
- load stages of ``rate`` x ``duration`` requests: ``constant`` draws
  exponential gaps and rescales them to end exactly at ``duration``;
  ``poisson`` draws a Poisson count for each second and spreads it the same
  way over that second. A stage starts when the previous one has drained
  (:mod:`orcasim.staged_source`).
- ``load.request_timeout``: the client's limit on a whole request, the
  request's ``timeout`` (it ends ``aborted``, ``client_timeout``).
- at most ``num_workers x worker_max_concurrency`` requests in flight when
  the config gives ``num_workers`` (its default is the client machine's CPU
  count, unknown here: unlimited unless ``max_concurrency`` is given).

Every request is in class ``stage<k>``, so summaries are reported per stage.
inference-perf measures at the client, so the scenario's front end (the API
server, :mod:`orcasim.frontend`) is on unless ``engine.frontend`` is off, and
every request carries ``max_tokens``: vLLM's server refuses one whose prompt
plus ``max_tokens`` exceeds ``max_model_len`` (:mod:`orcasim.api_server`). A
multi-turn round that failed (rejected or aborted) stays out of its user's
history, as in inference-perf: the next round resends its prompt.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationError, model_validator

from orcasim.errors import ScenarioError
from orcasim.params import ComponentParams
from orcasim.registry import workloads
from orcasim.workload.base import MAX_REQUESTS_PER_RUN, TokenCount, Workload, WorkloadArrays
from orcasim.workload.ip_config import IPConfig

#: where configs shipped with orcasim live (``config: <name>``)
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "inference_perf"
#: a stage's end is noticed at the client's next once-a-second check
POLL_S = 1.0
#: a stage's requests are scheduled from one second after they are queued
LEAD_S = 1.0


def _format(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def load_config(config: str | dict[str, Any]) -> tuple[IPConfig, str]:
    """The validated config and where it came from; ScenarioError naming the key if bad."""
    if isinstance(config, dict):
        return _validate(config, "inline config"), "inline config"
    path = Path(config)
    if not path.is_file() and (SHIPPED / f"{config}.yaml").is_file():
        path = SHIPPED / f"{config}.yaml"
    if not path.is_file():
        raise ScenarioError("workload.config", f"inference-perf config {config!r} not found "
                            f"(a path, or one of: {', '.join(shipped_configs())})")
    return _read(str(path.resolve()), path.stat().st_mtime_ns, str(path)), str(path)


def shipped_configs() -> list[str]:
    """Names of the inference-perf configs shipped with orcasim."""
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


@functools.lru_cache(maxsize=16)
def _read(path: str, _stamp: int, shown: str) -> IPConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ScenarioError("workload.config", f"{shown}: not a YAML file ({first})") from None
    if not isinstance(raw, dict):
        raise ScenarioError("workload.config", f"{shown}: not a mapping")
    return _validate(raw, shown)


def _validate(raw: dict[str, Any], where: str) -> IPConfig:
    try:
        return IPConfig.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError("workload.config", f"{where}: {_format(e)}") from None


def stage_offsets(kind: str, rate: float, duration: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """Send times of one stage's ``int(rate x duration)`` requests, from the stage's start."""
    n = int(rate * duration)
    if n == 0:
        return np.zeros(0)
    if kind == "constant":
        gaps = rng.exponential(1.0 / rate, n)
        return np.cumsum(gaps * (duration / gaps.sum()))
    out: list[np.ndarray] = []
    got, start = 0, 0.0
    while got < n:
        c = int(rng.poisson(rate))
        if c >= 1:
            gaps = rng.exponential(1.0 / c, c)
            out.append(start + np.cumsum(gaps * (1.0 / gaps.sum())))
            got += c
        start += 1.0
    return np.concatenate(out)[:n]


class _Interner:
    """Consecutive integer ids for hashable content keys."""

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}

    def __call__(self, key: Any) -> int:
        return self.ids.setdefault(key, len(self.ids))


@workloads.register("inference_perf")
class InferencePerf(Workload):
    """The requests an inference-perf config sends (see the module docstring)."""

    #: measured at the client: the API server is modelled unless ``engine.frontend`` is off
    client_side: ClassVar[bool] = True
    #: every request carries ``max_tokens`` (its output length): the server checks it
    sends_max_tokens: ClassVar[bool] = True

    class Params(ComponentParams):
        config: str | dict[str, Any] = Field(description="inference-perf config: a YAML path, "
                                             "a shipped name, or the config inline")
        special_tokens: TokenCount = Field(1, description="tokens the server adds in front of "
                                           "each prompt (BOS)")
        hash_block_size: TokenCount = Field(16, gt=0, description="tokens per hash_ids entry "
                                            "(the policy's block size, or a divisor of it)")
        max_concurrency: int | None = Field(None, ge=0, description="requests in flight at "
                                            "most (0: no limit; default: num_workers x "
                                            "worker_max_concurrency when num_workers is set)")
        assume_max_tokens: bool = Field(False, description="simulate outputs of max_tokens "
                                        "even with ignore_eos: false")
        inference_perf_version: Literal["0.4", "0.5", "0.6"] = Field(
            "0.5", description="the inference-perf release whose streamed-token accounting the "
            "lifecycle files follow (0.4: one timestamp per message; 0.5: two per message; 0.6 "
            "and later: one per token)")
        session_start: Literal["empty", "system_prompt"] = Field(
            "empty", description="multi-turn: a session's first context (empty: inference-perf "
            "0.5.0 and later; system_prompt: up to 0.4.x)")

        @model_validator(mode="after")
        def _readable(self) -> InferencePerf.Params:
            cfg, src = load_config(self.config)
            if not cfg.ignore_eos and not self.assume_max_tokens:
                raise ValueError(f"{src}: server.ignore_eos is false, so real outputs end at "
                                 "EOS, shorter than max_tokens by an amount only a run shows; "
                                 "set assume_max_tokens: true to simulate max_tokens")
            total = sum(int(s.rate * s.duration) for s in cfg.load.stages)
            if total == 0:
                raise ValueError(f"{src}: the stages send no request (rate x duration < 1)")
            if total > MAX_REQUESTS_PER_RUN:
                raise ValueError(f"{src}: {total:,} requests, more than the limit of "
                                 f"{MAX_REQUESTS_PER_RUN:,} per run")
            return self

    def generate(self, rng: np.random.Generator) -> WorkloadArrays:
        p = self.params
        cfg, src = load_config(p.config)
        stages = cfg.load.stages
        counts = [int(s.rate * s.duration) for s in stages]
        try:
            rows = self._rows(cfg, counts, rng)
        except ValueError as e:
            raise ScenarioError("workload.config", f"{src}: data: {e}") from None
        prompt, output, prev, hash_ids, names, sessions = rows
        bad = np.flatnonzero(output < 1)
        if bad.size:
            raise ScenarioError("workload.config", f"{src}: request {bad[0]} has an output "
                                f"length of {output[bad[0]]}: output lengths must be >= 1")
        offsets = [stage_offsets(cfg.load.type, s.rate, s.duration, rng) for s in stages]
        stage = np.repeat(np.arange(len(stages)), counts)
        cap = p.max_concurrency
        if cap is None:
            cap = (cfg.load.num_workers or 0) * cfg.load.worker_max_concurrency
        from orcasim.staged_source import StagedRelease  # it imports the source: not at load

        release = StagedRelease(stage=stage, offset=np.concatenate(offsets),
                                prev=np.asarray(prev, dtype=np.int64), counts=tuple(counts),
                                interval=cfg.load.interval, lead=LEAD_S, poll=POLL_S,
                                max_concurrency=cap, resend_failed=sessions is not None)
        origins = release.nominal_origins()
        arrival = np.concatenate([origins[k] + o for k, o in enumerate(offsets)])
        out = WorkloadArrays(arrival=arrival, prompt_len=prompt + p.special_tokens,
                             output_len=output, release=release)
        out.attrs["name"] = names
        out.attrs["cls"] = [f"stage{k}" for k in stage.tolist()]
        if hash_ids is not None:
            out.attrs["hash_ids"] = hash_ids
            out.attrs["hash_block_size"] = [p.hash_block_size] * len(prompt)
        if sessions is not None:
            out.attrs["session"] = sessions
        if cfg.load.request_timeout is not None:
            out.attrs["timeout"] = [cfg.load.request_timeout] * len(prompt)
        return out

    def _rows(self, cfg: IPConfig, counts: list[int], rng: np.random.Generator
              ) -> tuple[Any, ...]:
        """Per request over all stages: prompt (without special tokens), output, prev,
        hash_ids, name, session."""
        if cfg.data.type != "shared_prefix":
            return self._random_rows(cfg, counts, rng)
        sp = cfg.data.shared_prefix
        assert sp is not None
        r = np.random.default_rng(sp.seed) if sp.seed is not None else rng
        g_n, p_n = sp.num_groups, sp.num_prompts_per_group
        s_dist, q_dist, o_dist = sp.dists()
        system = s_dist.sample(r, g_n)
        qs, outs = [], []
        for _ in range(g_n):
            qs.append(q_dist.sample(r, p_n))
            outs.append(o_dist.sample(r, p_n))
        perm = r.permutation(g_n * p_n)
        group = np.repeat(np.arange(g_n), p_n)[perm]
        question = np.concatenate(qs)[perm]
        answer = np.concatenate(outs)[perm]
        n = g_n * p_n
        multi = sp.enable_multi_turn_chat
        hb, special = self.params.hash_block_size, self.params.special_tokens
        intern = _Interner()
        prompt, output, prev, hashes, names, sessions = [], [], [], [], [], []
        start_with_system = multi and self.params.session_start == "system_prompt"
        lead = system if start_with_system else np.zeros_like(system)
        own: list[tuple[int, ...]] = []  # each prompt's block ids: group's, then its own
        for ii in range(n):
            g = int(group[ii])
            shared = special + int(lead[g]) + int(system[g])
            first = shared + int(question[ii])
            own.append(tuple(intern(("g", g, b)) if (b + 1) * hb <= shared
                             else intern(("p", ii, b)) for b in range(-(-first // hb))))
        base = 0
        for k, c in enumerate(counts):
            j = np.arange(c)
            i = j % n
            rnd = j // n if multi else np.zeros(c, dtype=np.int64)
            seg = system[group[i]] + question[i]
            total = lead[group[i]] + (rnd + 1) * seg + rnd * answer[i]
            prompt.append(total)
            output.append(answer[i])
            prev.append(np.where(rnd > 0, base + j - n, -1))
            for jj, ii, rr, tt in zip(j.tolist(), i.tolist(), rnd.tolist(), total.tolist(),
                                      strict=True):
                if rr == 0:
                    hashes.append(own[ii])  # the same prompt: the same blocks, in every stage
                else:  # the first round's whole blocks, then this stage's conversation
                    keep = (special + int(lead[group[ii]] + seg[jj])) // hb
                    hashes.append(own[ii][:keep] + tuple(
                        intern(("c", k, ii, b)) for b in range(keep, -(-(special + tt) // hb))))
                names.append(f"st{k}.u{ii}.t{rr}" if multi else f"st{k}.r{jj}")
                if multi:
                    sessions.append(f"st{k}.u{ii}")
            base += c
        return (np.concatenate(prompt).astype(np.int64), np.concatenate(output).astype(np.int64),
                np.concatenate(prev), hashes, names, sessions if multi else None)

    def _random_rows(self, cfg: IPConfig, counts: list[int], rng: np.random.Generator
                     ) -> tuple[Any, ...]:
        d = cfg.data
        assert d.input_distribution is not None and d.output_distribution is not None
        need = max(counts) + 1
        n_in = max(need, d.input_distribution.total_count or 0)
        n_out = max(need, d.output_distribution.total_count or 0)
        lengths_in = d.input_distribution.generate(rng, n_in)
        lengths_out = d.output_distribution.generate(rng, n_out)
        j = np.concatenate([np.arange(c) for c in counts])
        names = [f"st{k}.r{x}" for k, c in enumerate(counts) for x in range(c)]
        return (lengths_in[j], lengths_out[j], np.full(len(j), -1), None, names, None)
