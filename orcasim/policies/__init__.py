"""Scheduling policies. Each lives in one file and registers itself with one decorator."""

from orcasim.policies import continuous, static, vllm_v1
from orcasim.policies.base import DecodeOnlyPolicy, Policy, PolicyParams, TokenPolicy

__all__ = [
    "DecodeOnlyPolicy",
    "Policy",
    "PolicyParams",
    "TokenPolicy",
    "continuous",
    "static",
    "vllm_v1",
]
