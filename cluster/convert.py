"""Kubernetes JSON (Node, Pod, PodGroup v1beta1) to the solver's small records.

Raw dicts in, immutable solver records out; nothing here decides anything. Malformed objects
raise :class:`solver.InvalidInput` with the object's name and the field at fault, so the caller
(the watch cache) can skip it with a warning instead of crashing.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

from solver import (
    DisruptionBudget,
    DisruptionMode,
    InvalidInput,
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

from . import names
from .quantity import parse_quantity

JSON = Mapping[str, Any]


def _name(obj: JSON, kind: str) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise InvalidInput(f"{kind}: metadata.name is missing")
    return str(meta["name"])


def _quantities(values: Any, where: str) -> dict[str, int]:
    if values is None:
        return {}
    if not isinstance(values, dict) and not isinstance(values, Mapping):  # dict first: fast
        raise InvalidInput(f"{where}: expected a map of quantities")
    return {str(r): parse_quantity(q, r) for r, q in values.items()}


def node_from_json(obj: JSON) -> Node:
    name = _name(obj, "node")
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    try:
        taints = tuple(
            Taint(t["key"], t.get("value", "") or "", TaintEffect(t["effect"])) for t in spec.get("taints") or ()
        )
    except (KeyError, ValueError, TypeError) as err:
        raise InvalidInput(f"node {name}: malformed taint ({err})") from None
    return Node(
        name=name,
        allocatable=_quantities(allocatable, f"node {name}: allocatable"),
        labels=dict((obj.get("metadata") or {}).get("labels") or {}),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def _requirement(expr: JSON, where: str) -> Requirement:
    try:
        return Requirement(expr["key"], expr["operator"], tuple(str(v) for v in expr.get("values") or ()))
    except (KeyError, TypeError) as err:
        raise InvalidInput(f"{where}: malformed node selector requirement ({err})") from None


def _affinity(spec: JSON, where: str) -> NodeAffinity:
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = []
    for term in required.get("nodeSelectorTerms") or ():
        # matchFields (metadata.name) is enforced by kube-scheduler's own filter before phalanx
        # sees the candidate nodes, so only matchExpressions is modelled here.
        terms.append(tuple(_requirement(e, where) for e in term.get("matchExpressions") or ()))
    return NodeAffinity(tuple(terms))


def pod_requests(spec: JSON, where: str) -> dict[str, int]:
    """Effective requests of a pod spec, the Kubernetes way (see solver.effective_requests)."""
    def requests(container: JSON) -> dict[str, int]:
        resources = container.get("resources") or {}
        # a limit without a request defaults the request to the limit
        return _quantities((resources.get("limits") or {}) | (resources.get("requests") or {}), where)

    containers = [requests(c) for c in spec.get("containers") or ()]
    inits = [(requests(c), c.get("restartPolicy") == "Always") for c in spec.get("initContainers") or ()]
    return effective_requests(containers, inits, _quantities(spec.get("overhead"), where))


def pod_group_name(obj: JSON) -> str:
    """The PodGroup a pod belongs to: the built-in field, else phalanx's CRD-flavor label."""
    spec = obj.get("spec") or {}
    field = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if field:
        return str(field)
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(names.LABEL_POD_GROUP, ""))


def pod_from_json(obj: JSON) -> Pod:
    name = _name(obj, "pod")
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    where = f"pod {namespace}/{name}"
    spec = obj.get("spec") or {}
    try:
        tolerations = tuple(
            Toleration(t.get("key", "") or "", t.get("operator", "Equal") or "Equal", t.get("value", "") or "",
                       t.get("effect", "") or "")
            for t in spec.get("tolerations") or ()
        )
    except (AttributeError, TypeError) as err:
        raise InvalidInput(f"{where}: malformed toleration ({err})") from None
    priority = spec.get("priority") or 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput(f"{where}: spec.priority must be an integer")
    group = pod_group_name(obj)
    return Pod(
        uid=str(meta.get("uid") or f"{namespace}/{name}"),
        name=name,
        namespace=namespace,
        node=str(spec.get("nodeName") or ""),
        group=f"{namespace}/{group}" if group else "",
        spec=PodSpec(
            requests=pod_requests(spec, where),
            node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            affinity=_affinity(spec, where),
            tolerations=tolerations,
            priority=priority,
        ),
    )


def preferred_keys(meta: JSON) -> tuple[str, ...]:
    """``scheduling.phalanx.dev/preferred-topology``: comma-separated keys or a JSON list."""
    raw = ((meta.get("annotations") or {}).get(names.ANNOTATION_PREFERRED_TOPOLOGY) or "").strip()
    if not raw:
        return ()
    if raw.startswith("["):
        try:
            keys = json.loads(raw)
        except ValueError:
            raise InvalidInput(f"{names.ANNOTATION_PREFERRED_TOPOLOGY}: not a JSON list: {raw!r}") from None
    else:
        keys = raw.split(",")
    out = tuple(str(k).strip() for k in keys if str(k).strip())
    return tuple(dict.fromkeys(out))


def podgroup_from_json(obj: JSON, members: tuple[Pod, ...] = (),
                       priority_classes: Mapping[str, int] | None = None) -> PodGroup:
    """A PodGroup (built-in or CRD flavor, same v1beta1 schema) with its member pods. The priority
    is the value of ``spec.priorityClassName``, else ``spec.priority``, else the members' highest."""
    name = _name(obj, "podgroup")
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    where = f"podgroup {namespace}/{name}"
    spec = obj.get("spec") or {}
    policy_spec = spec.get("schedulingPolicy") or {}
    if "gang" in policy_spec and "basic" in policy_spec:
        raise InvalidInput(f"{where}: schedulingPolicy sets both basic and gang")
    if "gang" in policy_spec:
        policy = Policy.GANG
        min_count = (policy_spec.get("gang") or {}).get("minCount", 1)
    else:
        policy, min_count = Policy.BASIC, 1
    topology = (spec.get("schedulingConstraints") or {}).get("topology") or []
    if len(topology) > 1:
        raise InvalidInput(f"{where}: at most one topology constraint is supported, got {len(topology)}")
    key = str(topology[0].get("key", "")) if topology else ""
    mode = DisruptionMode.ALL if "all" in (spec.get("disruptionMode") or {}) else DisruptionMode.SINGLE
    # the class wins when it resolves: the API server defaults spec.priority to 0 even when a
    # priorityClassName is set, as pods' spec.priority is only filled in by admission
    priority = (priority_classes or {}).get(str(spec.get("priorityClassName") or ""))
    if priority is None:
        priority = spec.get("priority")
    if priority is None:
        priority = max((p.spec.priority for p in members), default=0)
    preferred = tuple(k for k in preferred_keys(meta) if k != key)
    return PodGroup(
        namespace=namespace,
        name=name,
        members=members,
        policy=policy,
        min_count=min_count,
        topology_key=key,
        preferred_keys=preferred,
        disruption_mode=mode,
        priority=int(priority),
        created=_timestamp(meta.get("creationTimestamp")),
        preemption_policy=spec.get("preemptionPolicy") or "PreemptLowerPriority",
    )


def selector_matches(selector: JSON | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels. An empty selector matches everything; a missing
    one (None) matches nothing, as for PodDisruptionBudgets."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def disruption_budget(pdb: JSON, pods: list[tuple[str, str, Mapping[str, str]]]) -> DisruptionBudget:
    """A PodDisruptionBudget as the preemption planner sees it: the uids it protects (from
    ``pods`` as (uid, namespace, labels)) and how many disruptions it still allows."""
    meta = pdb.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    selector = (pdb.get("spec") or {}).get("selector")
    covered = frozenset(uid for uid, ns, labels in pods if ns == namespace and selector_matches(selector, labels))
    allowed = (pdb.get("status") or {}).get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise InvalidInput(f"poddisruptionbudget {namespace}/{meta.get('name')}: status.disruptionsAllowed must be an integer")
    return DisruptionBudget(f"{namespace}/{meta.get('name')}", covered, max(0, allowed))


def _timestamp(text: Any) -> float:
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
