"""``vtc``: fair sharing between tenants with the Virtual Token Counter.

Each tenant's counter adds ``w_input`` per prompt token and ``w_output`` per
output token served (defaults 1 and 2, the VTC paper's), divided by the
tenant's weight. The batch admits from the backlogged tenant with the
smallest counter, so a tenant sending many requests cannot crowd out the
others; an idle tenant's counter is lifted when it returns (see
:mod:`orcasim.policies.fair`). The run's summary reports Jain's fairness
index over the tenants' service (``jain_index``).
"""

from __future__ import annotations

from orcasim.policies.fair import FairParams, FairSharePolicy
from orcasim.registry import policies


@policies.register("vtc")
class VTC(FairSharePolicy):
    """Fair share between tenants: admit from the tenant with the least weighted service."""

    group_attr = "tenant"
    Params = FairParams
