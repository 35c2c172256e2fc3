"""Scheduling policies. Each lives in one file and registers itself with one decorator."""

from orcasim.policies import (
    class_share,
    continuous,
    decode_first,
    edf,
    fcfs,
    prefill_first,
    priority,
    sarathi,
    sjf,
    srpt,
    static,
    vllm_v1,
    vtc,
)
from orcasim.policies.base import DecodeOnlyPolicy, Policy, PolicyParams, TokenPolicy

__all__ = [
    "DecodeOnlyPolicy",
    "Policy",
    "PolicyParams",
    "TokenPolicy",
    "class_share",
    "continuous",
    "decode_first",
    "edf",
    "fcfs",
    "prefill_first",
    "priority",
    "sarathi",
    "sjf",
    "srpt",
    "static",
    "vllm_v1",
    "vtc",
]
