"""The workload-cycle service: queue, plans and reservations, bind barrier, status."""

from .dispatch import Dispatcher
from .metrics import CycleMetrics
from .service import BindError, FilterAnswer, Plan, PlanState, WorkloadCycle, barrier_capacity

__all__ = ["BindError", "CycleMetrics", "Dispatcher", "FilterAnswer", "Plan", "PlanState", "WorkloadCycle",
           "barrier_capacity"]
