"""The extender's verbs from a decoded request to the workload cycle's typed calls.

The request's pod is read here once (:func:`cluster.convert.read_pod`); the cycle only ever sees the
typed pod. A pod phalanx cannot read is answered with the reason, never an exception: at filter
every candidate is unresolvable with it, at preempt kube-scheduler's own choice stands.
"""

from __future__ import annotations

from typing import Any, Mapping

from cluster.convert import pod_group_name, pod_uid, read_pod
from cycle import FilterAnswer, WorkloadCycle
from solver import InvalidInput

from .http.wire import victim_uids


def filter(cycle: WorkloadCycle, pod_json: Any, candidates: list[str]) -> FilterAnswer:
    """Filter (scheduling cycle, after the in-tree filters)."""
    pod = read_pod(pod_json)
    if isinstance(pod, str):
        return FilterAnswer.refused(pod, candidates)
    return cycle.filter(pod, candidates)


def prioritize(cycle: WorkloadCycle, pod_json: Any, candidates: list[str]) -> dict[str, int]:
    """Prioritize (scoring): only the pod's uid is needed."""
    return cycle.prioritize(pod_uid(pod_json), candidates)


def preempt(cycle: WorkloadCycle, pod_json: Any, victims: Mapping[str, Mapping[str, Any]]
            ) -> dict[str, Mapping[str, Any]]:
    """Preempt (PostFilter): a group member gets group preemption and no per-pod victims; a pod
    without a group gets kube-scheduler's candidates, less those that break a whole unit."""
    try:
        group = pod_group_name(pod_json)
    except InvalidInput:  # a pod phalanx cannot read: kube-scheduler's own choice stands
        return dict(victims)
    if group:
        pod = read_pod(pod_json)
        if not isinstance(pod, str):
            cycle.preempt_for_group(pod)  # group preemption is phalanx's own job
        return {}
    proposed = victim_uids(victims)
    if proposed is None:  # unreadable: kube-scheduler's own choice stands
        return dict(victims) if isinstance(victims, Mapping) else {}
    kept = cycle.preempt_candidates(proposed)
    return {node: v for node, v in victims.items() if node in kept}
