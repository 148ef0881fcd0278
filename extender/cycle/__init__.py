"""The workload-cycle service: queue, plans and reservations, bind barrier, status."""

from .metrics import CycleMetrics
from .service import BindError, FilterAnswer, Plan, WorkloadCycle

__all__ = ["BindError", "CycleMetrics", "FilterAnswer", "Plan", "WorkloadCycle"]
