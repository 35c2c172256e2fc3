"""Admission control: which arriving requests enter the waiting queue.

Separate from the scheduling policy and composable with any of them: a
scenario's ``admission`` section lists controllers, checked in order on
every arrival; the first that objects rejects the request with its reason.
See :mod:`orcasim.admission.base`.
"""

from orcasim.admission import kv_fit, limits, shed, slo
from orcasim.admission.base import AdmissionController, Gate

__all__ = ["AdmissionController", "Gate", "kv_fit", "limits", "shed", "slo"]
