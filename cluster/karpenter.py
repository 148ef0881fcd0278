"""Karpenter's NodePools and NodeClaims: the typed readers and the NodeClaim writer.

The upstream types are Karpenter's (Go module ``sigs.k8s.io/karpenter`` v1.15.0, ``pkg/apis/v1``):
a cluster-scoped ``NodePool`` holds ``spec.template`` — the ``metadata.labels`` its nodes get and a
``spec`` with ``nodeClassRef {group, kind, name}``, ``requirements`` (node selector requirements,
``In``/``NotIn``/``Exists``/``DoesNotExist``/``Gt``/``Lt``), ``taints``, ``startupTaints``,
``expireAfter`` and ``terminationGracePeriod`` — and a cluster-scoped ``NodeClaim`` carries that
template's ``spec`` plus ``resources.requests``; Karpenter launches one node for it (its cloud
provider picks the cheapest offering the requirements allow: the KWOK provider requires an
``node.kubernetes.io/instance-type`` requirement), records ``status.nodeName`` and the conditions
``Launched``, ``Registered`` and ``Initialized``, and deletes a NodeClaim it cannot launch for lack
of capacity. A NodeClaim labelled with a NodePool and owned by it is that pool's like the ones
Karpenter makes itself: counted in its resources, disrupted by its policy unless its node says
``karpenter.sh/do-not-disrupt: "true"``.

phalanx makes the NodeClaims of one gang at once (:func:`nodeclaim_json`), named from the
PodGroup's uid and the members it held when it asked (:func:`nodeclaim_prefix`), so another cycle or
a restarted ``phalanx serve`` finds them and never asks twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from solver import InvalidInput
from solver.model import Taint, TaintEffect

from . import names
from .convert import Condition, conditions_from_json
from .provisioning import quantity


@dataclass(frozen=True)
class Requirement:
    """One of a NodePool's (or NodeClaim's) node selector requirements."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def allows(self, value: str) -> bool:
        """Whether a node whose label ``key`` is ``value`` meets it (for the operators a label value
        answers: In, NotIn, Exists, DoesNotExist; Gt and Lt are left to Karpenter)."""
        if self.operator == "In":
            return value in self.values
        if self.operator == "NotIn":
            return value not in self.values
        if self.operator == "DoesNotExist":
            return False
        return True

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True)
class NodePoolRecord:
    """A NodePool as the watch cache keeps it: what a NodeClaim of it copies."""

    name: str
    uid: str = ""
    node_class_ref: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    startup_taints: tuple[Taint, ...] = ()
    expire_after: str = ""
    termination_grace_period: str = ""

    def refuses(self, key: str, value: str) -> Requirement | None:
        """The requirement of this pool that a node labelled ``key=value`` would break, if any."""
        return next((r for r in self.requirements if r.key == key and not r.allows(value)), None)


@dataclass(frozen=True)
class NodeClaimRecord:
    """A NodeClaim as the watch cache keeps it."""

    name: str
    podgroup: str = ""  # namespace/name of the PodGroup phalanx made it for; "" when not phalanx's
    podgroup_uid: str = ""
    held: int = 0
    nodepool: str = ""
    node_name: str = ""
    deleting: bool = False
    protected: bool = False  # says karpenter.sh/do-not-disrupt: "true"
    conditions: tuple[Condition, ...] = ()

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def registered(self) -> bool:
        registered = self.condition(names.NODECLAIM_REGISTERED)
        return bool(self.node_name) and registered is not None and registered.status == "True"

    def trouble(self) -> str:
        """Why its launch has not succeeded yet, as Karpenter says it ("" when it has not said)."""
        launched = self.condition(names.NODECLAIM_LAUNCHED)
        if launched is None or launched.status == "True" or not (launched.reason or launched.message):
            return ""
        return f"{launched.reason}: {launched.message}" if launched.message else launched.reason


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    meta = _mapping(obj.get("metadata"))
    if not meta.get("name"):
        raise InvalidInput(f"{kind}: metadata.name is missing")
    return meta


def _requirements(raw: Any, where: str) -> tuple[Requirement, ...]:
    out = []
    for i, item in enumerate(raw if isinstance(raw, list) else ()):
        if not isinstance(item, Mapping) or not item.get("key") or not item.get("operator"):
            raise InvalidInput(f"{where}.requirements[{i}]: key and operator are required")
        values = item.get("values")
        out.append(Requirement(str(item["key"]), str(item["operator"]),
                               tuple(str(v) for v in values) if isinstance(values, list) else ()))
    return tuple(out)


def _taints(raw: Any, where: str) -> tuple[Taint, ...]:
    out = []
    for i, item in enumerate(raw if isinstance(raw, list) else ()):
        if not isinstance(item, Mapping) or not item.get("key"):
            raise InvalidInput(f"{where}[{i}]: a taint needs a key")
        try:
            effect = TaintEffect(str(item.get("effect") or TaintEffect.NO_SCHEDULE.value))
        except ValueError:
            raise InvalidInput(f"{where}[{i}]: unknown taint effect {item.get('effect')!r}") from None
        out.append(Taint(str(item["key"]), str(item.get("value") or ""), effect))
    return tuple(out)


def nodepool_record(obj: Mapping[str, Any]) -> NodePoolRecord:
    """A NodePool's record; raises InvalidInput naming the field when it is malformed."""
    meta = _name(obj, "nodepool")
    where = f"nodepool {meta['name']}: spec.template"
    template = _mapping(_mapping(obj.get("spec")).get("template"))
    spec = _mapping(template.get("spec"))
    labels = _mapping(_mapping(template.get("metadata")).get("labels"))
    return NodePoolRecord(
        name=str(meta["name"]), uid=str(meta.get("uid") or ""),
        node_class_ref={str(k): str(v) for k, v in _mapping(spec.get("nodeClassRef")).items()},
        requirements=_requirements(spec.get("requirements"), f"{where}.spec"),
        labels={str(k): str(v) for k, v in labels.items()},
        taints=_taints(spec.get("taints"), f"{where}.spec.taints"),
        startup_taints=_taints(spec.get("startupTaints"), f"{where}.spec.startupTaints"),
        expire_after=str(spec.get("expireAfter") or ""),
        termination_grace_period=str(spec.get("terminationGracePeriod") or ""))


def nodeclaim_record(obj: Mapping[str, Any]) -> NodeClaimRecord:
    """A NodeClaim's record; raises InvalidInput when it has no name."""
    meta = _name(obj, "nodeclaim")
    labels, annotations = _mapping(meta.get("labels")), _mapping(meta.get("annotations"))
    held = str(labels.get(names.LABEL_NODECLAIM_HELD) or "0")
    return NodeClaimRecord(
        name=str(meta["name"]),
        podgroup=str(annotations.get(names.ANNOTATION_NODECLAIM_PODGROUP) or ""),
        podgroup_uid=str(labels.get(names.LABEL_NODECLAIM_PODGROUP_UID) or ""),
        held=int(held) if held.isdigit() else 0,
        nodepool=str(labels.get(names.LABEL_KARPENTER_NODEPOOL) or ""),
        node_name=str(_mapping(obj.get("status")).get("nodeName") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        protected=str(annotations.get(names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT) or "") == "true",
        conditions=conditions_from_json(obj))


def nodeclaim_prefix(podgroup_uid: str, held: int = 0) -> str:
    """The names of one ask's NodeClaims begin so (``-<i>`` follows): the PodGroup's uid and the
    members it held when it asked (a gang that grows asks anew for its increment)."""
    return f"phalanx-{podgroup_uid}-{held}"


@dataclass(frozen=True)
class NodeClaimAsk:
    """One node phalanx asks Karpenter for: of ``pool``, of ``instance_type``, carrying ``labels``
    (the gang's domain, the node selector its pods share), with room for ``requests``."""

    name: str
    namespace: str
    podgroup: str
    podgroup_uid: str
    held: int
    instance_type: str
    labels: Mapping[str, str]
    requests: Mapping[str, int]


def _taints_json(taints: tuple[Taint, ...]) -> list[dict[str, str]]:
    return [{k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect.value)) if v} for t in taints]


def nodeclaim_json(ask: NodeClaimAsk, pool: NodePoolRecord) -> dict[str, Any]:
    """The NodeClaim for ``ask``: the pool's template with the instance type and the labels pinned
    (the pool's own requirements on those keys are replaced), owned by the pool, protected from
    voluntary disruption until phalanx releases it."""
    pinned = {names.LABEL_INSTANCE_TYPE: ask.instance_type, **ask.labels}
    requirements = [r.to_json() for r in pool.requirements if r.key not in pinned]
    requirements += [{"key": k, "operator": "In", "values": [v]} for k, v in pinned.items()]
    labels = {**pool.labels, **ask.labels, names.LABEL_KARPENTER_NODEPOOL: pool.name,
              names.LABEL_NODECLAIM_PODGROUP_UID: ask.podgroup_uid, names.LABEL_NODECLAIM_HELD: str(ask.held)}
    spec: dict[str, Any] = {
        "nodeClassRef": dict(pool.node_class_ref),
        "requirements": requirements,
        "resources": {"requests": {r: quantity(r, v) for r, v in sorted(ask.requests.items()) if v and r != "pods"}},
    }
    if pool.taints:
        spec["taints"] = _taints_json(pool.taints)
    if pool.startup_taints:
        spec["startupTaints"] = _taints_json(pool.startup_taints)
    if pool.expire_after:
        spec["expireAfter"] = pool.expire_after
    if pool.termination_grace_period:
        spec["terminationGracePeriod"] = pool.termination_grace_period
    metadata: dict[str, Any] = {
        "name": ask.name, "labels": labels,
        "annotations": {names.ANNOTATION_KARPENTER_DO_NOT_DISRUPT: "true",
                        names.ANNOTATION_NODECLAIM_PODGROUP: f"{ask.namespace}/{ask.podgroup}"}}
    if pool.uid:
        metadata["ownerReferences"] = [{"apiVersion": names.KARPENTER_API_VERSION, "kind": "NodePool",
                                        "name": pool.name, "uid": pool.uid, "blockOwnerDeletion": True}]
    return {"apiVersion": names.KARPENTER_API_VERSION, "kind": "NodeClaim", "metadata": metadata, "spec": spec}
