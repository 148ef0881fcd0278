"""The workload-cycle service: plans whole PodGroups, holds their capacity, binds them as one.

What the entry points (the HTTP extender, the gRPC servicers, the dashboard, ``phalanx serve``)
may use; everything else is the package's own. One file per job: the plan book and its state
machine (plans), planning, barrier capacity, binding, status and events, requeue and cache events,
group preemption, queue policies (holds), per-namespace limits (tenants), plugin mode's verbs
(plugin_mode), what-if placement of a manifest's groups (whatif, read only), the solver worker
processes the long solves run in (workers).
"""

from .binding import BindError
from .capacity import barrier_capacity
from .dispatch import Dispatcher
from .metrics import CycleMetrics
from .plans import Plan, PlanBook, PlanState
from .service import CompositeOf, FilterAnswer, WorkloadCycle
from .tenants import NamespaceLimits
from .whatif import DOES_NOT_FIT, FITS, FITS_AFTER_PREEMPTION, Victim, WhatIfAnswer
from .workers import InProcess, SolverWorkers

__all__ = ["BindError", "CompositeOf", "CycleMetrics", "DOES_NOT_FIT", "Dispatcher", "FITS", "FITS_AFTER_PREEMPTION",
           "FilterAnswer", "InProcess", "NamespaceLimits", "Plan", "PlanBook", "PlanState", "SolverWorkers",
           "Victim", "WhatIfAnswer", "WorkloadCycle", "barrier_capacity"]
