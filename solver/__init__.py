"""phalanx's placement engine: pure functions over an immutable cluster snapshot.

No I/O, no Kubernetes objects, no web framework. Callers build a :class:`Snapshot` from
:class:`Node` and :class:`Pod` records (``cluster/`` converts API objects into them) and ask
:func:`place` or :func:`place_batch` where a :class:`PodGroup` goes.
"""

from .errors import InvalidInput, PlacementInvalid, SolverError
from .explain import DomainShortfall, Explanation
from .model import (
    PODS,
    DisruptionMode,
    Node,
    NodeAffinity,
    Pod,
    PodGroup,
    PodSpec,
    Policy,
    Requirement,
    Taint,
    TaintEffect,
    Toleration,
    effective_requests,
)
from .objective import Objective, evaluate
from .placement import BatchResult, Placement, SolveOptions, place, place_batch
from .snapshot import Snapshot
from .validate import assert_placement_valid

__all__ = [
    "PODS", "BatchResult", "DisruptionMode", "DomainShortfall", "Explanation", "InvalidInput",
    "Node", "NodeAffinity", "Objective", "Placement", "PlacementInvalid", "Pod", "PodGroup",
    "PodSpec", "Policy", "Requirement", "SolveOptions", "SolverError", "Snapshot", "Taint",
    "TaintEffect", "Toleration", "assert_placement_valid", "effective_requests", "evaluate",
    "place", "place_batch",
]
