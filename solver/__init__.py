"""phalanx's placement engine: pure functions over an immutable cluster snapshot.

No I/O, no Kubernetes objects, no web framework. Callers build a :class:`Snapshot` from
:class:`Node` and :class:`Pod` records (``cluster/`` converts API objects into them) and ask
:func:`place` or :func:`place_batch` where a :class:`PodGroup` goes, and :func:`plan_preemption`
what to evict when it does not fit, and :func:`smallest_change` what would make it fit.
"""

from .errors import InvalidInput, PlacementInvalid, SolverError
from .explain import DomainShortfall, Explanation
from .model import (
    DO_NOT_SCHEDULE,
    PODS,
    SCHEDULE_ANYWAY,
    DisruptionMode,
    HostPort,
    LabelSelector,
    Node,
    NodeAffinity,
    PersistentVolume,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSpec,
    Policy,
    PreemptionPolicy,
    Requirement,
    SpreadConstraint,
    Taint,
    TaintEffect,
    Toleration,
    VolumeClaim,
    VolumeInventory,
    effective_requests,
)
from .objective import Objective
from .placement import BatchResult, Placement, SolveOptions, place, place_batch
from .preemption import (
    PREEMPTION_OPTIONS,
    DisruptionBudget,
    PodCandidate,
    PreemptionContext,
    PreemptionCost,
    PreemptionPlan,
    VictimInfo,
    VictimUnit,
    expand_victims_for_pod,
    first_plan,
    plan_preemption,
    rank_candidates,
    victim_cost,
    victim_units,
)
from .problem import evaluate
from .smallest import SmallestChange, smallest_change, smallest_composite_change
from .snapshot import Snapshot
from .validate import assert_placement_valid

__all__ = [
    "DO_NOT_SCHEDULE", "SCHEDULE_ANYWAY", "HostPort", "LabelSelector", "PersistentVolume", "PodAffinityTerm",
    "SpreadConstraint", "VolumeClaim", "VolumeInventory",
    "PODS", "PREEMPTION_OPTIONS", "BatchResult", "DisruptionBudget", "DisruptionMode", "DomainShortfall", "Explanation",
    "InvalidInput", "Node", "NodeAffinity", "Objective", "Placement", "PlacementInvalid", "Pod",
    "PodCandidate", "PodGroup", "PodSpec", "Policy", "PreemptionContext", "PreemptionCost",
    "PreemptionPlan", "PreemptionPolicy", "Requirement", "SolveOptions", "SolverError", "Snapshot",
    "Taint", "TaintEffect", "Toleration", "VictimInfo", "VictimUnit", "assert_placement_valid",
    "effective_requests", "evaluate", "expand_victims_for_pod", "first_plan", "place", "place_batch",
    "plan_preemption", "rank_candidates", "SmallestChange", "smallest_change",
    "smallest_composite_change", "victim_cost", "victim_units",
]
