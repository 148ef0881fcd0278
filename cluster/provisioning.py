"""ProvisioningRequests and their PodTemplates: the typed reader and the JSON writers.

The upstream type is cluster-autoscaler's (Go module ``k8s.io/autoscaler/cluster-autoscaler/apis``,
``provisioningrequest/autoscaling.x-k8s.io/v1/types.go``): ``spec.podSets`` lists
``{podTemplateRef: {name}, count}`` (1 to 32 sets, each referring to a PodTemplate of the request's
namespace), ``spec.provisioningClassName`` names the class, and both are immutable;
``status.conditions`` are ``metav1.Condition`` of the types ``Accepted``, ``Provisioned``,
``Failed``, ``CapacityRevoked`` and ``BookingExpired``.

phalanx asks for one request per gang and size, named from the PodGroup's uid and the members it
already holds (:func:`request_name`), so a second ask for the same gang (another cycle, a restart
of ``phalanx serve``) finds the first, and a gang that grows once bound (its minCount raised, a
lost member's replacement) asks again for the increment under a name of its own; the request and
its PodTemplates are owned by the PodGroup, so deleting the group deletes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from solver import InvalidInput, PodSpec

from . import names
from .convert import Condition, conditions_from_json

#: the most pod sets a request may carry (types.go: ``+kubebuilder:validation:MaxItems=32``)
MAX_POD_SETS = 32
#: what the template's one container runs: nothing (cluster-autoscaler only simulates the pods)
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
#: requests that need no limit beside them; any other (extended resources, hugepages) must have
#: its limit equal to its request in a pod spec (the API server's pod validation)
REQUEST_ONLY = frozenset({"cpu", "memory", "ephemeral-storage"})
#: conditions in the order they tell most: a request that failed says so first
TELLING = (names.PROVISIONING_FAILED, names.PROVISIONING_CAPACITY_REVOKED, names.PROVISIONING_BOOKING_EXPIRED,
           names.PROVISIONING_PROVISIONED, names.PROVISIONING_ACCEPTED)
#: the conditions after which the request's capacity will not come (or is gone)
FINAL = frozenset({names.PROVISIONING_FAILED, names.PROVISIONING_CAPACITY_REVOKED,
                   names.PROVISIONING_BOOKING_EXPIRED})


def request_name(podgroup_uid: str, held: int = 0) -> str:
    """The one request of the gang whose PodGroup has this uid while ``held`` of its members are
    bound or finished: ``phalanx-<uid>`` for a gang that holds nothing yet (the name of every
    earlier version), ``phalanx-<uid>-<held>`` for the increment of a gang that grows."""
    return f"phalanx-{podgroup_uid}-{held}" if held else f"phalanx-{podgroup_uid}"


def request_held(name: str, podgroup_uid: str) -> int | None:
    """The members held when ``name`` was asked for the PodGroup of this uid (see
    :func:`request_name`), or None when ``name`` is no request of that PodGroup."""
    first = request_name(podgroup_uid)
    if name == first:
        return 0
    held = name[len(first) + 1:] if name.startswith(first + "-") else ""
    return int(held) if held.isdigit() and not held.startswith("0") else None


@dataclass(frozen=True)
class ProvisioningRecord:
    """A ProvisioningRequest as the watch cache keeps it."""

    namespace: str
    name: str
    podgroup: str = ""  # the PodGroup (its name, same namespace) phalanx made it for; "" if not phalanx's
    class_name: str = ""
    templates: tuple[str, ...] = ()  # the PodTemplates its pod sets refer to
    pods: int = 0  # the pods it asks room for, over its pod sets
    conditions: tuple[Condition, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def state(self) -> Condition | None:
        """Its most telling condition that is True (Failed first), or None while none is."""
        true = {c.type: c for c in self.conditions if c.status == "True"}
        return next((true[t] for t in TELLING if t in true), None)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def provisioning_record(obj: Mapping[str, Any]) -> ProvisioningRecord:
    """A ProvisioningRequest's record; raises InvalidInput naming the field when it is malformed."""
    meta = _mapping(obj.get("metadata"))
    if not meta.get("name"):
        raise InvalidInput("provisioningrequest: metadata.name is missing")
    spec = _mapping(obj.get("spec"))
    sets = spec.get("podSets")
    sets = sets if isinstance(sets, list) else []
    templates, pods = [], 0
    for i, entry in enumerate(sets):
        if not isinstance(entry, Mapping):
            raise InvalidInput(f"provisioningrequest {meta['name']}: spec.podSets[{i}] is not an object")
        ref = entry.get("podTemplateRef")
        templates.append(str(ref.get("name") or "") if isinstance(ref, Mapping) else "")
        count = entry.get("count")
        pods += count if isinstance(count, int) and not isinstance(count, bool) else 0
    labels = _mapping(meta.get("labels"))
    return ProvisioningRecord(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta["name"]),
        podgroup=str(labels.get(names.LABEL_PROVISIONING_PODGROUP) or ""),
        class_name=str(spec.get("provisioningClassName") or ""),
        templates=tuple(t for t in templates if t),
        pods=pods,
        conditions=conditions_from_json(obj),
    )


@dataclass(frozen=True)
class PodSet:
    """``count`` pods of one shape: the gang's pod spec as the scheduler reads it."""

    spec: PodSpec
    count: int


@dataclass(frozen=True)
class ProvisioningAsk:
    """What phalanx asks for: room for ``pod_sets`` in one topology domain (``topology_key`` =
    ``domain``; none when the key is empty), for the PodGroup ``namespace/podgroup``."""

    namespace: str
    podgroup: str
    podgroup_uid: str
    pod_sets: tuple[PodSet, ...]
    topology_key: str = ""
    domain: str = ""
    class_name: str = names.PROVISIONING_CLASS_ATOMIC
    parameters: Mapping[str, str] = field(default_factory=dict)
    held: int = 0  # the gang's members bound or finished when it asked (a growing gang's increment)
    #: more topology labels the nodes must carry: a composite's value around its child's domain
    outer: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return request_name(self.podgroup_uid, self.held)

    @property
    def templates(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{i}" for i in range(len(self.pod_sets)))

    @property
    def pods(self) -> int:
        return sum(s.count for s in self.pod_sets)


def quantity(resource: str, amount: int) -> str:
    """An amount in phalanx's base units (milli for CPU) as a Kubernetes quantity."""
    return f"{amount}m" if resource == "cpu" else str(amount)


def _owner(ask: ProvisioningAsk, podgroup_api_version: str) -> dict[str, Any]:
    return {"apiVersion": podgroup_api_version, "kind": "PodGroup", "name": ask.podgroup, "uid": ask.podgroup_uid}


def _metadata(ask: ProvisioningAsk, name: str, podgroup_api_version: str) -> dict[str, Any]:
    return {"name": name, "namespace": ask.namespace,
            "labels": {names.LABEL_PROVISIONING_PODGROUP: ask.podgroup},
            "annotations": {names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE},
            "ownerReferences": [_owner(ask, podgroup_api_version)]}


def pod_template_json(ask: ProvisioningAsk, index: int, podgroup_api_version: str) -> dict[str, Any]:
    """The PodTemplate of pod set ``index``: the shape's requests, node selector and tolerations,
    and the domain's topology label as one more node selector term."""
    spec = ask.pod_sets[index].spec
    requests = {r: quantity(r, v) for r, v in sorted(spec.requests.items()) if v}
    limits = {r: q for r, q in requests.items() if r not in REQUEST_ONLY}
    selector = dict(spec.node_selector)
    selector.update(ask.outer)
    if ask.topology_key:
        selector[ask.topology_key] = ask.domain
    resources: dict[str, Any] = {"requests": requests, **({"limits": limits} if limits else {})}
    pod_spec: dict[str, Any] = {"containers": [{"name": "pod", "image": PAUSE_IMAGE, "resources": resources}]}
    if selector:
        pod_spec["nodeSelector"] = selector
    if spec.tolerations:
        pod_spec["tolerations"] = [{k: v for k, v in (("key", t.key), ("operator", t.operator), ("value", t.value),
                                                      ("effect", t.effect)) if v} for t in spec.tolerations]
    return {"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": _metadata(ask, ask.templates[index], podgroup_api_version),
            "template": {"metadata": {"labels": {names.LABEL_PROVISIONING_PODGROUP: ask.podgroup}}, "spec": pod_spec}}


def provisioning_request_json(ask: ProvisioningAsk, podgroup_api_version: str) -> dict[str, Any]:
    """The ProvisioningRequest for ``ask``, referring to its PodTemplates by name."""
    if not 1 <= len(ask.pod_sets) <= MAX_POD_SETS:
        raise InvalidInput(f"a ProvisioningRequest carries 1 to {MAX_POD_SETS} pod sets, not {len(ask.pod_sets)}")
    spec: dict[str, Any] = {
        "provisioningClassName": ask.class_name,
        "podSets": [{"podTemplateRef": {"name": t}, "count": s.count}
                    for t, s in zip(ask.templates, ask.pod_sets, strict=True)],
    }
    if ask.parameters:
        spec["parameters"] = dict(ask.parameters)
    return {"apiVersion": names.PROVISIONING_API_VERSION, "kind": "ProvisioningRequest",
            "metadata": _metadata(ask, ask.name, podgroup_api_version), "spec": spec}
