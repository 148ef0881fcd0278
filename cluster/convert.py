"""Kubernetes JSON (Node, Pod, PodGroup v1beta1, storage objects, Namespace) to small records.

Raw dicts in, immutable solver records out; nothing here decides anything. Malformed objects
raise :class:`solver.InvalidInput` with the object's name and the field at fault, so the caller
(the watch cache) can skip it with a warning instead of crashing. Every field is read as
kube-scheduler (v1.37) reads it: pod (anti-)affinity with namespaces resolved and
``matchLabelKeys``/``mismatchLabelKeys`` merged into the selector as the API server merges them,
topology spread with its defaults, host ports of containers and restartable init containers, and
the PersistentVolumeClaims a pod mounts (resolved against claims, PVs and StorageClasses in
:mod:`cluster.volumes`). This module and :mod:`cluster.kinds` (the controller's view of the
objects it manages) are the only ones that parse Kubernetes JSON.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, NamedTuple, TypeVar, cast

from solver import (
    DisruptionBudget,
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
    effective_requests,
)
from solver import InvalidInput as InvalidInput  # re-exported: the controller catches it from here
from solver.model import DEFAULT_PREFERENCES, HONOR, IGNORE, LABEL_SELECTOR_OPERATORS, SELECTOR_OPERATORS, WILDCARD_IP

from . import fields, names
from .quantity import parse_quantity

JSON = Mapping[str, Any]
_Record = TypeVar("_Record")


def _name(obj: JSON, kind: str) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise InvalidInput(f"{kind}: metadata.name is missing")
    return str(meta["name"])


# -- type-checked reads: every wrong type becomes InvalidInput naming the field (cluster.fields) ---
_mapping, _list, _text, _string_map = fields.mapping, fields.items, fields.text, fields.string_map


INT32_MAX = 2**31 - 1


def _integer(value: Any, where: str, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{where} must be an integer, got {value!r}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    return tuple(_text(v, f"{where}[{i}]", required=True) for i, v in enumerate(_list(value, where)))


def _items(value: Any, where: str) -> list[tuple[str, Mapping[str, Any]]]:
    """A list of objects as (path, object) pairs, each path naming its index."""
    return [(f"{where}[{i}]", _mapping(item, f"{where}[{i}]")) for i, item in enumerate(_list(value, where))]


def _checked(where: str, build: Callable[..., _Record], *args: Any) -> _Record:
    """A solver record built from ``args``; its own validation error is prefixed with ``where``."""
    try:
        return build(*args)
    except InvalidInput as err:
        raise InvalidInput(f"{where}: {err}") from None


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
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise InvalidInput(f"node {name}: malformed taint ({err})") from None
    return Node(
        name=name,
        allocatable=_quantities(allocatable, f"node {name}: allocatable"),
        labels=_string_map((obj.get("metadata") or {}).get("labels"), f"node {name}: metadata.labels"),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable", False)),
    )


# -- selectors ---------------------------------------------------------------------------------------
def _requirement(expr: Any, where: str, operators: tuple[str, ...] = SELECTOR_OPERATORS) -> Requirement:
    expr = _mapping(expr, where)
    operator = _text(expr.get("operator"), f"{where}.operator", required=True)
    if operator not in operators:
        raise InvalidInput(f"{where}.operator must be one of {', '.join(operators)}, got {operator!r}")
    values = _strings(expr.get("values"), f"{where}.values")
    return _checked(where, Requirement, _text(expr.get("key"), f"{where}.key", required=True), operator, values)


def node_selector_terms(terms: Any, where: str) -> NodeAffinity:
    """``nodeSelectorTerms`` (a node affinity, a PV's node affinity): OR of ANDed expressions.
    ``matchFields`` (metadata.name) is enforced by kube-scheduler's own filter before phalanx sees
    the candidate nodes, so only ``matchExpressions`` is modelled."""
    return NodeAffinity(tuple(
        tuple(_requirement(e, path) for path, e in _items(term.get("matchExpressions"), f"{at}.matchExpressions"))
        for at, term in _items(terms, where)))


def _affinity(spec: JSON, where: str) -> NodeAffinity:
    affinity = _mapping(spec.get("affinity"), f"{where}: spec.affinity")
    node = _mapping(affinity.get("nodeAffinity"), f"{where}: spec.affinity.nodeAffinity")
    path = f"{where}: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _mapping(node.get("requiredDuringSchedulingIgnoredDuringExecution"), path)
    return node_selector_terms(required.get("nodeSelectorTerms"), f"{path}.nodeSelectorTerms")


def label_selector(raw: Any, where: str) -> LabelSelector | None:
    """A metav1.LabelSelector; None when not set (a term without a selector matches nothing),
    an empty selector matches everything."""
    if raw is None:
        return None
    selector = _mapping(raw, where)
    labels = _string_map(selector.get("matchLabels"), f"{where}.matchLabels")
    expressions = tuple(_requirement(e, path, LABEL_SELECTOR_OPERATORS)
                        for path, e in _items(selector.get("matchExpressions"), f"{where}.matchExpressions"))
    return _checked(where, LabelSelector, tuple(labels.items()), expressions)


def _merge_label_keys(selector: LabelSelector | None, labels: Mapping[str, str],
                      match_keys: tuple[str, ...], mismatch_keys: tuple[str, ...] = ()) -> LabelSelector | None:
    """``matchLabelKeys`` / ``mismatchLabelKeys`` merged into ``selector`` as the API server does:
    ``key In [value]`` / ``key NotIn [value]`` from the pod's own labels, keys it lacks ignored. A
    missing selector stays missing; a requirement already merged (by the API server) is not repeated."""
    if selector is None:
        return None
    extra = [Requirement(k, "In", (labels[k],)) for k in match_keys if k in labels]
    extra += [Requirement(k, "NotIn", (labels[k],)) for k in mismatch_keys if k in labels]
    new = tuple(r for r in dict.fromkeys(extra) if r not in selector.match_expressions)
    if not new:
        return selector
    return LabelSelector(selector.match_labels, selector.match_expressions + new)


# -- pods ------------------------------------------------------------------------------------------
def _containers(spec: JSON, where: str, restartable_only: bool = False) -> list[tuple[str, Mapping[str, Any]]]:
    """``spec.containers``, or ``spec.initContainers`` (only the restartable sidecars when asked)."""
    if not restartable_only:
        return _items(spec.get("containers"), f"{where}: spec.containers")
    return [(path, c) for path, c in _items(spec.get("initContainers"), f"{where}: spec.initContainers")
            if c.get("restartPolicy") == "Always"]


def pod_requests(spec: JSON, where: str) -> dict[str, int]:
    """Effective requests of a pod spec, the Kubernetes way (see solver.effective_requests)."""
    def requests(path: str, container: JSON) -> dict[str, int]:
        resources = _mapping(container.get("resources"), f"{path}.resources")
        # a limit without a request defaults the request to the limit
        merged = dict(_mapping(resources.get("limits"), f"{path}.resources.limits"))
        merged.update(_mapping(resources.get("requests"), f"{path}.resources.requests"))
        return _quantities(merged, where)

    containers = [requests(p, c) for p, c in _containers(spec, where)]
    inits = [(requests(p, c), c.get("restartPolicy") == "Always")
             for p, c in _items(spec.get("initContainers"), f"{where}: spec.initContainers")]
    return effective_requests(containers, inits, _quantities(spec.get("overhead"), where))


#: A PodGroup's name, as the API server validates ``podGroupName`` (a DNS subdomain): no "/", so a
#: pod can only name a PodGroup of its own namespace.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def pod_group_name(obj: JSON) -> str:
    """The PodGroup a pod belongs to, in the pod's own namespace: the built-in field, else phalanx's
    CRD-flavor label. Raises InvalidInput when the pod is not an object, those fields have the
    wrong type, or the name is not a PodGroup name — ``other-namespace/group`` included: nothing
    resolves a group across namespaces."""
    obj = _mapping(obj, "pod")
    spec = _mapping(obj.get("spec"), "pod: spec")
    named = _mapping(spec.get("schedulingGroup"), "pod: spec.schedulingGroup").get("podGroupName")
    where = "spec.schedulingGroup.podGroupName"
    if not named:
        labels = _mapping(_mapping(obj.get("metadata"), "pod: metadata").get("labels"), "pod: metadata.labels")
        named, where = labels.get(names.LABEL_POD_GROUP, ""), f"label {names.LABEL_POD_GROUP}"
    name = str(named or "")
    if name and (len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name)):
        hint = " (a pod names a PodGroup of its own namespace only)" if "/" in name else ""
        raise InvalidInput(f"pod: {where} {name[:64]!r} is not a PodGroup name{hint}")
    return name


def pod_uid(obj: Any) -> str:
    """A pod's uid, or "" — never raises, even on a malformed object."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return str(meta.get("uid") or "") if isinstance(meta, Mapping) else ""


def pod_group_key(obj: Any) -> str:
    """``namespace/group`` of a pod, or "" — never raises, even on a malformed object (so a pod that
    fails to convert can still be reported on its PodGroup)."""
    try:
        group = pod_group_name(obj)
        return f"{(obj.get('metadata') or {}).get('namespace') or 'default'}/{group}" if group else ""
    except (AttributeError, TypeError):
        return ""


def _affinity_term(raw: Any, where: str, namespace: str, labels: Mapping[str, str], weight: int = 0) -> PodAffinityTerm:
    """One PodAffinityTerm: no namespaces and no namespaceSelector mean the pod's own namespace;
    ``namespaceSelector: {}`` means every namespace."""
    term = _mapping(raw, where)
    selector = _merge_label_keys(label_selector(term.get("labelSelector"), f"{where}.labelSelector"), labels,
                                 _strings(term.get("matchLabelKeys"), f"{where}.matchLabelKeys"),
                                 _strings(term.get("mismatchLabelKeys"), f"{where}.mismatchLabelKeys"))
    namespaces = frozenset(_strings(term.get("namespaces"), f"{where}.namespaces"))
    namespace_selector = label_selector(term.get("namespaceSelector"), f"{where}.namespaceSelector")
    if not namespaces and namespace_selector is None:
        namespaces = frozenset((namespace,))
    topology_key = _text(term.get("topologyKey"), f"{where}.topologyKey", required=True)
    return _checked(where, PodAffinityTerm, topology_key, selector, namespaces, namespace_selector, weight)


def _weighted_term(raw: Any, where: str, namespace: str, labels: Mapping[str, str]) -> PodAffinityTerm:
    """One WeightedPodAffinityTerm (a preferred term): weight 1-100 and its podAffinityTerm."""
    weighted = _mapping(raw, where)
    weight = _integer(weighted.get("weight"), f"{where}.weight")
    if not 1 <= weight <= 100:
        raise InvalidInput(f"{where}.weight must be 1-100, got {weight}")
    return _affinity_term(weighted.get("podAffinityTerm"), f"{where}.podAffinityTerm", namespace, labels, weight)


def _pod_affinity(spec: JSON, kind: str, where: str, namespace: str,
                  labels: Mapping[str, str]) -> tuple[tuple[PodAffinityTerm, ...], tuple[PodAffinityTerm, ...]]:
    """The required and the preferred terms of ``spec.affinity.<kind>`` (podAffinity or podAntiAffinity)."""
    path = f"{where}: spec.affinity.{kind}"
    rules = _mapping(_mapping(spec.get("affinity"), f"{where}: spec.affinity").get(kind), path)
    hard, soft = (f"{path}.{w}DuringSchedulingIgnoredDuringExecution" for w in ("required", "preferred"))
    required = tuple(_affinity_term(t, f"{hard}[{i}]", namespace, labels)
                     for i, t in enumerate(_list(rules.get("requiredDuringSchedulingIgnoredDuringExecution"), hard)))
    preferred = tuple(_weighted_term(t, f"{soft}[{i}]", namespace, labels)
                      for i, t in enumerate(_list(rules.get("preferredDuringSchedulingIgnoredDuringExecution"), soft)))
    return required, preferred


def _spread_constraint(raw: Any, where: str, labels: Mapping[str, str]) -> SpreadConstraint:
    """One topologySpreadConstraints entry with kube-scheduler's defaults: minDomains 1,
    nodeAffinityPolicy Honor, nodeTaintsPolicy Ignore; ``matchLabelKeys`` merged into the selector."""
    c = _mapping(raw, where)
    selector = _merge_label_keys(label_selector(c.get("labelSelector"), f"{where}.labelSelector"), labels,
                                 _strings(c.get("matchLabelKeys"), f"{where}.matchLabelKeys"))
    return _checked(where, SpreadConstraint,
                    _integer(c.get("maxSkew"), f"{where}.maxSkew"),
                    _text(c.get("topologyKey"), f"{where}.topologyKey", required=True),
                    _text(c.get("whenUnsatisfiable"), f"{where}.whenUnsatisfiable", required=True),
                    selector,
                    _integer(c.get("minDomains"), f"{where}.minDomains", default=1),
                    _text(c.get("nodeAffinityPolicy"), f"{where}.nodeAffinityPolicy") or HONOR,
                    _text(c.get("nodeTaintsPolicy"), f"{where}.nodeTaintsPolicy") or IGNORE)


def _spread(spec: JSON, where: str, labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    items = _items(spec.get("topologySpreadConstraints"), f"{where}: spec.topologySpreadConstraints")
    return tuple(_spread_constraint(c, path, labels) for path, c in items)


def _host_ports(spec: JSON, where: str) -> tuple[HostPort, ...]:
    """Ports with a hostPort of the containers and of restartable init containers (sidecars), as
    kube-scheduler's NodePorts counts them. With ``hostNetwork`` every containerPort is a host port
    (the API server defaults hostPort to containerPort there). Protocol defaults to TCP, hostIP to
    the wildcard."""
    host_network = spec.get("hostNetwork") is True
    ports: dict[HostPort, None] = {}
    for path, container in _containers(spec, where) + _containers(spec, where, restartable_only=True):
        for at, port in _items(container.get("ports"), f"{path}.ports"):
            number = _integer(port.get("hostPort"), f"{at}.hostPort", default=0)
            if not number and host_network:
                number = _integer(port.get("containerPort"), f"{at}.containerPort", default=0)
            if number < 0 or number > 65535:
                raise InvalidInput(f"{at}.hostPort must be 1-65535, got {number}")
            if number:
                ports[_checked(at, HostPort, number, _text(port.get("protocol"), f"{at}.protocol") or "TCP",
                               _text(port.get("hostIP"), f"{at}.hostIP") or WILDCARD_IP)] = None
    return tuple(ports)


class ClaimRef(NamedTuple):
    """A PersistentVolumeClaim a pod mounts: ``namespace/claim``, and whether it is the claim of a
    generic ephemeral volume (``<pod>-<volume>``, which must be owned by the pod)."""

    name: str
    ephemeral: bool = False


def pod_claims(obj: JSON) -> tuple[ClaimRef, ...]:
    """The claims of ``spec.volumes``: persistentVolumeClaim.claimName, and the claim each generic
    ephemeral volume gets."""
    name = _name(obj, "pod")
    meta = _mapping(obj.get("metadata"), "pod: metadata")
    namespace = meta.get("namespace") or "default"
    where = f"pod {namespace}/{name}: spec.volumes"
    refs: dict[ClaimRef, None] = {}
    for path, volume in _items(_mapping(obj.get("spec"), f"pod {namespace}/{name}: spec").get("volumes"), where):
        if volume.get("persistentVolumeClaim") is not None:
            claim = _mapping(volume["persistentVolumeClaim"], f"{path}.persistentVolumeClaim")
            claim_name = _text(claim.get("claimName"), f"{path}.persistentVolumeClaim.claimName", True)
            refs[ClaimRef(f"{namespace}/{claim_name}")] = None
        elif volume.get("ephemeral") is not None:
            refs[ClaimRef(f"{namespace}/{name}-{_text(volume.get('name'), f'{path}.name', True)}", True)] = None
    return tuple(refs)


def read_pod(obj: Any) -> Pod | str:
    """The pod as phalanx sees it, or why the JSON is not a pod phalanx can read: the border where
    no bad input gets past as an exception (a request's pod is read here once; nothing above
    ``cluster/`` sees it as a dict)."""
    try:
        return pod_from_json(obj)
    except InvalidInput as err:
        return f"phalanx: {err}"
    except (AttributeError, TypeError, ValueError, KeyError) as err:  # a field of the wrong type
        return f"phalanx: malformed pod: {type(err).__name__}: {err}"


def pod_from_json(obj: JSON) -> Pod:
    """A pod as the solver sees it. ``volumes`` is left empty: claims need the PVC, PV and
    StorageClass objects, see :func:`pod_claims` and :func:`cluster.volumes.resolve_claims`."""
    name = _name(obj, "pod")
    meta = obj["metadata"]
    namespace = _text(meta.get("namespace"), f"pod {name}: metadata.namespace") or "default"
    where = f"pod {namespace}/{name}"
    spec = _mapping(obj.get("spec"), f"{where}: spec")
    labels = _string_map(meta.get("labels"), f"{where}: metadata.labels")
    tolerations = tuple(
        _checked(path, Toleration, _text(t.get("key"), f"{path}.key"), _text(t.get("operator"), f"{path}.operator")
                 or "Equal", _text(t.get("value"), f"{path}.value"), _text(t.get("effect"), f"{path}.effect"))
        for path, t in _items(spec.get("tolerations"), f"{where}: spec.tolerations"))
    priority = spec.get("priority") or 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInput(f"{where}: spec.priority must be an integer")
    group = pod_group_name(obj)
    affinity, preferred_affinity = _pod_affinity(spec, "podAffinity", where, namespace, labels)
    anti_affinity, preferred_anti_affinity = _pod_affinity(spec, "podAntiAffinity", where, namespace, labels)
    return Pod(
        uid=str(meta.get("uid") or f"{namespace}/{name}"),
        name=name,
        namespace=namespace,
        node=_text(spec.get("nodeName"), f"{where}: spec.nodeName"),
        group=f"{namespace}/{group}" if group else "",
        labels=labels,
        spec=_shared(PodSpec(
            requests=pod_requests(spec, where),
            node_selector=_string_map(spec.get("nodeSelector"), f"{where}: spec.nodeSelector"),
            affinity=_affinity(spec, where),
            tolerations=tolerations,
            priority=priority,
            pod_affinity=affinity,
            pod_anti_affinity=anti_affinity,
            preferred_affinity=preferred_affinity,
            preferred_anti_affinity=preferred_anti_affinity,
            spread=_spread(spec, where, labels),
            host_ports=_host_ports(spec, where),
        )),
    )


#: one PodSpec object per distinct spec among the pods alive: the pods of a StatefulSet, a Job or a
#: gang share theirs, so grouping pods by shape meets the same key object (an identity check, not a
#: walk through tolerations and affinity terms), eligibility caches hit, and 500,000 pods hold as
#: many specs as they have shapes. Weak: a spec goes when its last pod does.
_SPECS: "weakref.WeakValueDictionary[tuple[object, ...], PodSpec]" = weakref.WeakValueDictionary()


def _shared(spec: PodSpec) -> PodSpec:
    """The PodSpec object already held for an equal spec, or ``spec`` (then held)."""
    key = (spec.shape_key, spec.priority, spec.host_ports)  # every field (the shape key sorts ports)
    try:
        return _SPECS.setdefault(key, spec)
    except TypeError:  # an unhashable part (never from JSON): not shared
        return spec


#: The most bytes phalanx reads of an annotation a user writes as a hint (preferred topology,
#: placement preference, expected duration): the API lets all of an object's annotations together
#: reach 256 KiB, and a hint that long is a mistake — refused with its size, never parsed or echoed.
MAX_HINT_BYTES = 4096
#: The same for a StatefulSet's or LeaderWorkerSet's scheduling annotation (a JSON object that may
#: list resource claims).
MAX_SCHEDULING_BYTES = 16384


def annotation_text(annotations: Any, name: str, limit: int = MAX_HINT_BYTES) -> str | None:
    """The annotation ``name`` as text (None when absent); raises InvalidInput naming it and its
    size when it is longer than ``limit`` bytes."""
    raw = annotations.get(name) if isinstance(annotations, Mapping) else None
    if raw is None:
        return None
    text = str(raw)
    size = len(text.encode())
    if size > limit:
        raise InvalidInput(f"annotation {name} is {size:,} bytes; phalanx reads at most {limit:,}")
    return text


def preferred_keys(meta: JSON) -> tuple[str, ...]:
    """``scheduling.phalanx.dev/preferred-topology``: comma-separated keys or a JSON list."""
    raw = (annotation_text(meta.get("annotations"), names.ANNOTATION_PREFERRED_TOPOLOGY) or "").strip()
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


@dataclass(frozen=True)
class GroupSpec:
    """The parts of a PodGroup's spec phalanx reads (the v1beta1 schema, both flavors)."""

    policy: Policy = Policy.BASIC
    min_count: int = 1  # 1 for a Basic group
    topology_key: str = ""  # the required key, "" none
    disruption_mode: DisruptionMode = DisruptionMode.SINGLE
    priority_class: str = ""
    priority: int | None = None  # spec.priority as written, None when absent
    preemption_policy: str = "PreemptLowerPriority"
    expected_duration: float | None = None  # seconds, from scheduling.phalanx.dev/expected-duration


def podgroup_spec(obj: JSON) -> GroupSpec:
    """``spec`` of a PodGroup: schedulingPolicy (basic or gang with minCount), at most one required
    topology key, disruptionMode, priority (class and value) and preemptionPolicy."""
    return _group_spec(obj, "podgroup", "minCount")


def _group_spec(obj: JSON, kind: str, count_field: str) -> GroupSpec:
    """The spec fields PodGroups and CompositePodGroups share; ``count_field`` is the gang policy's
    count (``minCount`` of pods, ``minGroupCount`` of child groups), read into ``min_count``."""
    name = _name(obj, kind)
    where = f"{kind} {(obj.get('metadata') or {}).get('namespace') or 'default'}/{name}"
    spec = _mapping(obj.get("spec"), f"{where}: spec")
    policy_spec = _mapping(spec.get("schedulingPolicy"), f"{where}: spec.schedulingPolicy")
    if "gang" in policy_spec and "basic" in policy_spec:
        raise InvalidInput(f"{where}: schedulingPolicy sets both basic and gang")
    gang = "gang" in policy_spec
    min_count = 1
    if gang:
        path = f"{where}: spec.schedulingPolicy.gang"
        min_count = _integer(_mapping(policy_spec["gang"], path).get(count_field), f"{path}.{count_field}", default=1)
        if not 1 <= min_count <= INT32_MAX:  # upstream's validation: an int32, at least 1
            raise InvalidInput(f"{path}.{count_field} must be between 1 and {INT32_MAX}, got {min_count}")
    path = f"{where}: spec.schedulingConstraints.topology"
    topology = _items(_mapping(spec.get("schedulingConstraints"), f"{where}: spec.schedulingConstraints")
                      .get("topology"), path)
    if len(topology) > 1:
        raise InvalidInput(f"{where}: at most one topology constraint is supported, got {len(topology)}")
    priority = spec.get("priority")
    return GroupSpec(
        policy=Policy.GANG if gang else Policy.BASIC,
        min_count=min_count,
        topology_key=_text(topology[0][1].get("key"), f"{path}[0].key") if topology else "",
        disruption_mode=DisruptionMode.ALL
        if "all" in _mapping(spec.get("disruptionMode"), f"{where}: spec.disruptionMode") else DisruptionMode.SINGLE,
        priority_class=_text(spec.get("priorityClassName"), f"{where}: spec.priorityClassName"),
        priority=None if priority is None else _integer(priority, f"{where}: spec.priority"),
        preemption_policy=_text(spec.get("preemptionPolicy"), f"{where}: spec.preemptionPolicy")
        or "PreemptLowerPriority",
        expected_duration=expected_duration(obj.get("metadata") or {}),
    )


def parent_composite(obj: JSON, kind: str) -> str:
    """``spec.parentCompositePodGroupName`` of a PodGroup or CompositePodGroup ("" none)."""
    name = _name(obj, kind)
    where = f"{kind} {(obj.get('metadata') or {}).get('namespace') or 'default'}/{name}"
    spec = _mapping(obj.get("spec"), f"{where}: spec")
    return _text(spec.get("parentCompositePodGroupName"), f"{where}: spec.parentCompositePodGroupName")


@dataclass(frozen=True)
class CompositeRecord:
    """A CompositePodGroup (``scheduling.k8s.io/v1alpha3``) as the watch cache keeps it: a group of
    groups — its children are the PodGroups and CompositePodGroups that name it as their parent.
    ``spec.min_count`` is the gang policy's ``minGroupCount``."""

    namespace: str
    name: str
    spec: GroupSpec = GroupSpec()
    parent: str = ""  # spec.parentCompositePodGroupName: the composite it nests in ("" a root)
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def composite_record(obj: JSON) -> CompositeRecord:
    """A CompositePodGroup's record; raises InvalidInput naming the field when it is malformed
    (upstream's schema: schedulingPolicy basic or gang with minGroupCount, at most one topology
    constraint, disruptionMode, priority, preemptionPolicy, an optional parent)."""
    spec = _group_spec(obj, "compositepodgroup", "minGroupCount")
    meta = obj["metadata"]
    return CompositeRecord(namespace=str(meta.get("namespace") or "default"), name=str(meta["name"]), spec=spec,
                           parent=parent_composite(obj, "compositepodgroup"), uid=str(meta.get("uid") or ""))


_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def expected_duration(meta: JSON) -> float | None:
    """``scheduling.phalanx.dev/expected-duration``: seconds ("3600") or a Go-style duration of
    hours, minutes and seconds ("2h30m", "90m", "45s"); None when absent. Anything else, or not
    positive, is rejected with the annotation named."""
    raw = annotation_text(meta.get("annotations"), names.ANNOTATION_EXPECTED_DURATION)
    if raw is None or str(raw).strip() == "":
        return None
    text = str(raw).strip().lower()
    bad = InvalidInput(f"{names.ANNOTATION_EXPECTED_DURATION} must be seconds or a duration like 2h30m, "
                       f"got {raw!r}")
    try:
        seconds = float(text)
    except ValueError:
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text)
        if not parts or not any(parts.groups()):
            raise bad from None
        seconds = sum(float(v) * _DURATION_UNITS[u] for v, u in zip(parts.groups(), "hms", strict=True) if v)
    if not seconds > 0 or seconds == float("inf"):
        raise bad
    return seconds


def podgroup_from_json(obj: JSON, members: tuple[Pod, ...] = (),
                       priority_classes: Mapping[str, int] | None = None, spec: GroupSpec | None = None) -> PodGroup:
    """A PodGroup (built-in or CRD flavor, same v1beta1 schema) with its member pods (see
    :func:`podgroup_of`); ``spec`` is :func:`podgroup_spec` of ``obj`` when the caller already has it."""
    return podgroup_of(podgroup_record(obj, spec), members, priority_classes)


def placement_preference(meta: JSON) -> str:
    """``scheduling.phalanx.dev/placement-preference``: ``pack`` (the default) or ``spread``; anything
    else is rejected with the annotation named, so the PodGroup says what is wrong."""
    raw = annotation_text(meta.get("annotations"), names.ANNOTATION_PLACEMENT_PREFERENCE) or "pack"
    value = str(raw).strip().lower()
    if value not in DEFAULT_PREFERENCES:
        raise InvalidInput(f"{names.ANNOTATION_PLACEMENT_PREFERENCE} must be one of "
                           f"{', '.join(DEFAULT_PREFERENCES)}, got {raw!r}")
    return value


# -- the placement record (a PodGroup's scheduling.phalanx.dev/Placement condition) ---------------
@dataclass(frozen=True)
class PlacementRecord:
    """The write-ahead record of a gang's plan: its domain and pod name -> node."""

    domain: str = ""
    pods: Mapping[str, str] = field(default_factory=dict)


RECORD = "placement record"  # how errors name it, wherever it is kept
#: the record's format. 1: ``{"format": 1, "domain": D, "pods": {pod name: node}}``; records with
#: no ``format`` (written before it was versioned) have the same fields. The rule that keeps
#: upgrades and rollbacks safe: a later format only *adds* fields, so the version before reads a
#: later record's domain and pods as its own (it ignores what it does not know), and a record a
#: later format could not say that way must not be written by it as this record.
RECORD_FORMAT = 1


def _placement_json(text: str) -> Mapping[str, Any] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        raise InvalidInput(f"{RECORD}: not JSON: {str(text)[:80]!r}") from None
    return _mapping(data, RECORD)


def placement_record(text: str) -> PlacementRecord | None:
    """The placement record ``text`` (a PodGroup record's ``placement``); None when there is none.
    Raises InvalidInput when it is not ``{"domain": ..., "pods": {name: node}}`` (any ``format``:
    a later one only adds fields, :data:`RECORD_FORMAT`)."""
    data = _placement_json(text)
    if data is None:
        return None
    fmt = data.get("format", RECORD_FORMAT)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise InvalidInput(f"{RECORD}: format must be a positive integer, got {fmt!r}")
    if "pods" not in data:
        newer = f" (format {fmt}, written by a later phalanx than this one's {RECORD_FORMAT})" \
            if fmt > RECORD_FORMAT else ""
        raise InvalidInput(f"{RECORD}: no pods{newer}")
    pods = _string_map(data["pods"], f"{RECORD}: pods")
    return PlacementRecord(str(data.get("domain", "")), pods)


def placement_domain(text: str) -> str:
    """The domain of the placement record ``text``; "" when there is none or it is malformed."""
    try:
        data = _placement_json(text)
    except InvalidInput:
        return ""
    return str(data.get("domain", "")) if data is not None else ""


def placement_text(domain: str, pods: Mapping[str, str]) -> str:
    """The placement record's text for ``domain`` and pod name -> node, in :data:`RECORD_FORMAT`."""
    return json.dumps({"format": RECORD_FORMAT, "domain": domain, "pods": dict(pods)}, sort_keys=True,
                      separators=(",", ":"))


def recorded_placement(annotations: Mapping[str, str], conditions: tuple["Condition", ...]) -> str:
    """A PodGroup's placement record text: its ``Placement`` condition's message while True, else
    the annotation (a record too long for a condition, or one an earlier version wrote); an
    abandoned record's condition is False and its annotation removed."""
    condition = next((c for c in conditions if c.type == names.CONDITION_PLACEMENT), None)
    if condition is not None and condition.status == "True":
        return condition.message
    return annotations.get(names.ANNOTATION_PLACEMENT) or ""


@dataclass(frozen=True)
class PdbRecord:
    """A PodDisruptionBudget as the watch cache keeps it."""

    key: str  # namespace/name
    namespace: str
    selector: LabelSelector | None  # None: protects nothing
    allowed: int  # status.disruptionsAllowed

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the budget protects a pod of ``namespace`` with ``labels``."""
        return namespace == self.namespace and self.selector is not None and self.selector.matches(labels)


def pdb_record(pdb: JSON) -> PdbRecord:
    """A PodDisruptionBudget's record; raises InvalidInput naming the field when it is malformed."""
    meta = pdb.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    where = f"poddisruptionbudget {namespace}/{meta.get('name')}"
    selector = label_selector((pdb.get("spec") or {}).get("selector"), f"{where}: spec.selector")
    allowed = (pdb.get("status") or {}).get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise InvalidInput(f"{where}: status.disruptionsAllowed must be an integer")
    return PdbRecord(f"{namespace}/{meta.get('name')}", namespace, selector, max(0, allowed))


def disruption_budget(pdb: PdbRecord, pods: list[tuple[str, str, Mapping[str, str]]]) -> DisruptionBudget:
    """A PodDisruptionBudget as the preemption planner sees it: the uids it protects (from
    ``pods`` as (uid, namespace, labels)) and how many disruptions it still allows."""
    covered = frozenset(uid for uid, ns, labels in pods if pdb.selects(ns, labels))
    return DisruptionBudget(pdb.key, covered, pdb.allowed)


def _timestamp(text: Any) -> float:
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# -- storage: claims, volumes, classes, CSI nodes ------------------------------------------------
def _storage_class_name(meta: JSON, spec: JSON, where: str) -> str:
    """The class of a claim or a volume: the beta annotation wins over ``storageClassName``."""
    annotations = _string_map(meta.get("annotations"), f"{where}: metadata.annotations")
    if names.ANNOTATION_BETA_STORAGE_CLASS in annotations:
        return annotations[names.ANNOTATION_BETA_STORAGE_CLASS]
    return _text(spec.get("storageClassName"), f"{where}: spec.storageClassName")


def _storage(values: Any, where: str) -> int:
    return _quantities(_mapping(values, where), where).get("storage", 0)


def _controller_uid(meta: JSON, where: str) -> str:
    owners = _items(meta.get("ownerReferences"), f"{where}: metadata.ownerReferences")
    return next((str(o.get("uid") or "") for _, o in owners if o.get("controller") is True), "")


@dataclass(frozen=True)
class ClaimInfo:
    """A PersistentVolumeClaim as placement needs it."""

    name: str  # namespace/claim
    storage_class: str = ""
    volume_name: str = ""  # the PV it is bound to, "" unbound
    request: int = 0  # bytes
    access_modes: frozenset[str] = frozenset()
    owner_uid: str = ""  # the controller ownerReference (a generic ephemeral volume's pod)
    terminating: bool = False


def claim_from_json(obj: JSON) -> ClaimInfo:
    name = _name(obj, "persistentvolumeclaim")
    meta = obj["metadata"]
    key = f"{meta.get('namespace') or 'default'}/{name}"
    where = f"persistentvolumeclaim {key}"
    spec = _mapping(obj.get("spec"), f"{where}: spec")
    return ClaimInfo(
        name=key,
        storage_class=_storage_class_name(meta, spec, where),
        volume_name=_text(spec.get("volumeName"), f"{where}: spec.volumeName"),
        request=_storage(_mapping(spec.get("resources"), f"{where}: spec.resources").get("requests"),
                         f"{where}: spec.resources.requests"),
        access_modes=frozenset(_strings(spec.get("accessModes"), f"{where}: spec.accessModes")),
        owner_uid=_controller_uid(meta, where),
        terminating=bool(meta.get("deletionTimestamp")),
    )


@dataclass(frozen=True)
class VolumeInfo:
    """A PersistentVolume: the solver's record plus its phase."""

    volume: PersistentVolume
    phase: str = ""


def volume_from_json(obj: JSON) -> VolumeInfo:
    name = _name(obj, "persistentvolume")
    where = f"persistentvolume {name}"
    spec = _mapping(obj.get("spec"), f"{where}: spec")
    ref = _mapping(spec.get("claimRef"), f"{where}: spec.claimRef")
    claim_ref = f"{ref.get('namespace') or 'default'}/{ref['name']}" if ref.get("name") else ""
    required = _mapping(_mapping(spec.get("nodeAffinity"), f"{where}: spec.nodeAffinity").get("required"),
                        f"{where}: spec.nodeAffinity.required")
    affinity = None
    if required:
        affinity = node_selector_terms(required.get("nodeSelectorTerms"),
                                       f"{where}: spec.nodeAffinity.required.nodeSelectorTerms")
    volume = PersistentVolume(
        name=name,
        storage_class=_storage_class_name(obj["metadata"], spec, where),
        capacity=_storage(spec.get("capacity"), f"{where}: spec.capacity"),
        access_modes=frozenset(_strings(spec.get("accessModes"), f"{where}: spec.accessModes")),
        node_affinity=affinity,
        claim_ref=claim_ref,
        csi_driver=_text(_mapping(spec.get("csi"), f"{where}: spec.csi").get("driver"), f"{where}: spec.csi.driver"),
    )
    phase = _text(_mapping(obj.get("status"), f"{where}: status").get("phase"), f"{where}: status.phase")
    return VolumeInfo(volume, phase)


@dataclass(frozen=True)
class ClassInfo:
    """A StorageClass: binding mode, provisioner, allowed topologies (None: anywhere), and whether
    it is marked the default class (with its creation time: the newest default wins)."""

    name: str
    delayed: bool = False  # volumeBindingMode WaitForFirstConsumer
    provisioner: str = ""
    allowed_topologies: NodeAffinity | None = None
    default: bool = False
    created: str = ""  # metadata.creationTimestamp (RFC 3339: sorts as time)

    @property
    def dynamic(self) -> bool:
        """Provisions volumes (anything but the static-only no-provisioner)."""
        return bool(self.provisioner) and self.provisioner != names.PROVISIONER_NONE


def _topology_term(term: JSON, where: str) -> tuple[Requirement, ...]:
    """One TopologySelectorTerm: each matchLabelExpressions entry is ``key In values``."""
    return tuple(_checked(path, Requirement, _text(e.get("key"), f"{path}.key", required=True), "In",
                          _strings(e.get("values"), f"{path}.values"))
                 for path, e in _items(term.get("matchLabelExpressions"), f"{where}.matchLabelExpressions"))


def storage_class_from_json(obj: JSON) -> ClassInfo:
    name = _name(obj, "storageclass")
    where = f"storageclass {name}"
    items = _items(obj.get("allowedTopologies"), f"{where}: allowedTopologies")
    terms = tuple(_topology_term(t, path) for path, t in items)
    mode = _text(obj.get("volumeBindingMode"), f"{where}: volumeBindingMode")
    annotations = _string_map(obj["metadata"].get("annotations"), f"{where}: metadata.annotations")
    default = any(annotations.get(a) == "true" for a in (names.ANNOTATION_DEFAULT_STORAGE_CLASS,
                                                          names.ANNOTATION_BETA_DEFAULT_STORAGE_CLASS))
    return ClassInfo(name=name, delayed=mode == names.BINDING_WAIT_FOR_FIRST_CONSUMER,
                     provisioner=_text(obj.get("provisioner"), f"{where}: provisioner"),
                     allowed_topologies=NodeAffinity(terms) if terms else None, default=default,
                     created=_text(obj["metadata"].get("creationTimestamp"), f"{where}: metadata.creationTimestamp"))


def csinode_limits(obj: JSON) -> dict[str, int]:
    """A CSINode's attach limit per driver (``spec.drivers[].allocatable.count``; drivers without
    one have no limit). The CSINode is named after its node."""
    where = f"csinode {_name(obj, 'csinode')}: spec.drivers"
    limits = {}
    for path, driver in _items(_mapping(obj.get("spec"), where).get("drivers"), where):
        count = _mapping(driver.get("allocatable"), f"{path}.allocatable").get("count")
        if count is not None:
            name = _text(driver.get("name"), f"{path}.name", required=True)
            limits[name] = _integer(count, f"{path}.allocatable.count")
    return limits


def namespace_labels(obj: JSON) -> dict[str, str]:
    """A Namespace's labels, with ``kubernetes.io/metadata.name`` as the API server always sets it."""
    name = _name(obj, "namespace")
    labels = _string_map(obj["metadata"].get("labels"), f"namespace {name}: metadata.labels")
    labels.setdefault(names.LABEL_NAMESPACE_NAME, name)
    return labels


class GroupOwner(NamedTuple):
    """Who a PodGroup belongs to, as the dashboard and ``phalanx explain`` show it: its controller
    owner reference, and for a LeaderWorkerSet's group the guide's level (``level`` "" otherwise)."""

    kind: str
    name: str
    level: str = ""


LWS_LEVEL_WORDS = {"replica": "replica level", "whole": "whole-LWS level", "role": "role level"}


def _lenient_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is an object, else an empty one (for readers that never raise)."""
    return value if isinstance(value, Mapping) else {}


def podgroup_owner(obj: JSON) -> GroupOwner:
    """The PodGroup's controller owner; for a group phalanx made for a LeaderWorkerSet (the
    ``scheduling.phalanx.dev/lws-level`` annotation) also its level, role and replica, e.g.
    ``role level, worker of group 0``. Malformed metadata gives an empty owner, never an error."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return GroupOwner("", "")
    refs = meta.get("ownerReferences")
    ref = next((o for o in refs if isinstance(o, Mapping) and o.get("controller") is True),
               None) if isinstance(refs, list) else None
    if ref is None:
        return GroupOwner("", "")
    owner = GroupOwner(str(ref.get("kind") or ""), str(ref.get("name") or ""))
    level = _lenient_mapping(meta.get("annotations")).get(names.ANNOTATION_LWS_LEVEL)
    if owner.kind != "LeaderWorkerSet" or level not in LWS_LEVEL_WORDS:
        return owner
    index = _lenient_mapping(meta.get("labels")).get(names.LABEL_LWS_GROUP_INDEX)
    ref_spec = _lenient_mapping(_lenient_mapping(obj.get("spec")).get("workloadRef"))
    words = LWS_LEVEL_WORDS[level]
    if level == "role":
        words += f", {ref_spec.get('templateName') or 'role'}"
        words += f" of group {index}" if index else ""
    elif index:
        words += f", group {index}"
    return owner._replace(level=words)


# -- a PodGroup as the cycle reads it --------------------------------------------------------------
@dataclass(frozen=True)
class Condition:
    """One of an object's ``status.conditions`` (metav1.Condition's fields)."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "status": self.status, "reason": self.reason,
                               "message": self.message, "lastTransitionTime": self.last_transition_time}
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out


def conditions_from_json(obj: JSON) -> tuple[Condition, ...]:
    """``status.conditions``; entries that are not objects with a type are left out (a status
    phalanx cannot read is never a reason to stop scheduling)."""
    status = obj.get("status")
    items = status.get("conditions") if isinstance(status, Mapping) else None
    out = []
    for c in items if isinstance(items, list) else ():
        if not isinstance(c, Mapping) or not c.get("type"):
            continue
        generation = c.get("observedGeneration")
        out.append(Condition(str(c["type"]), str(c.get("status") or ""), str(c.get("reason") or ""),
                             str(c.get("message") or ""), str(c.get("lastTransitionTime") or ""),
                             generation if isinstance(generation, int) and not isinstance(generation, bool) else None))
    return tuple(out)


@dataclass(frozen=True)
class PodGroupRecord:
    """A PodGroup as the watch cache keeps it: read once, when its event arrives."""

    namespace: str
    name: str
    spec: GroupSpec = GroupSpec()  # policy, minCount, topology, disruption mode, priority
    uid: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: float = 0.0
    preferred_keys: tuple[str, ...] = ()  # scheduling.phalanx.dev/preferred-topology, the required key left out
    default_preference: str = "pack"  # scheduling.phalanx.dev/placement-preference
    owner: GroupOwner = GroupOwner("", "")
    conditions: tuple[Condition, ...] = ()
    placement: str = ""  # the placement record's text (recorded_placement), "" when none
    parent: str = ""  # spec.parentCompositePodGroupName: the CompositePodGroup it is a child of
    resource_version: str = ""  # the version this record is of: phalanx's writes on the group are conditional on it

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


def podgroup_record(obj: JSON, spec: GroupSpec | None = None) -> PodGroupRecord:
    """A PodGroup's record; raises InvalidInput naming the field when the object is malformed
    (``spec``: :func:`podgroup_spec` of ``obj`` when the caller already has it)."""
    spec = spec or podgroup_spec(obj)
    meta = obj["metadata"]
    annotations = _string_map(meta.get("annotations"), f"podgroup {meta['name']}: metadata.annotations")
    conditions = conditions_from_json(obj)
    return PodGroupRecord(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta["name"]),
        spec=spec,
        uid=str(meta.get("uid") or ""),
        annotations=annotations,
        created=_timestamp(meta.get("creationTimestamp")),
        preferred_keys=tuple(k for k in preferred_keys(meta) if k != spec.topology_key),
        default_preference=placement_preference(meta),
        owner=podgroup_owner(obj),
        conditions=conditions,
        placement=recorded_placement(annotations, conditions),
        parent=parent_composite(obj, "podgroup"),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def podgroup_of(record: PodGroupRecord, members: tuple[Pod, ...] = (),
                priority_classes: Mapping[str, int] | None = None, finished: int = 0) -> PodGroup:
    """The PodGroup the solver places, with its member pods and the count of its finished ones.
    The priority is the value of ``spec.priorityClassName``, else ``spec.priority``, else the
    members' highest."""
    spec = record.spec
    # the class wins when it resolves: the API server defaults spec.priority to 0 even when a
    # priorityClassName is set, as pods' spec.priority is only filled in by admission
    priority = (priority_classes or {}).get(spec.priority_class)
    if priority is None:
        priority = spec.priority
    if priority is None:
        priority = max((p.spec.priority for p in members), default=0)
    return PodGroup(
        namespace=record.namespace,
        name=record.name,
        members=members,
        policy=spec.policy,
        min_count=spec.min_count,
        topology_key=spec.topology_key,
        preferred_keys=record.preferred_keys,
        disruption_mode=spec.disruption_mode,
        priority=priority,
        created=record.created,
        # the text as written: PodGroup converts it, and rejects a bad one naming the group
        preemption_policy=cast(PreemptionPolicy, spec.preemption_policy),
        default_preference=record.default_preference,
        finished=finished,
    )
