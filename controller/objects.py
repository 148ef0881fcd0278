"""Compiling a StatefulSet into its Workload and PodGroup, and stamping its pods — pure functions.

Object shapes follow ``scheduling.k8s.io/v1beta1`` exactly; the CRD fallback
(``scheduling.phalanx.dev/v1beta1``) has the same schema, and differs only in how a pod names its
group (``spec.schedulingGroup.podGroupName`` built in, the ``scheduling.phalanx.dev/pod-group`` label
in the CRD flavor). OwnerReferences follow KEP-6277's Field Mapping:

- Workload -> StatefulSet (controller);
- PodGroup -> StatefulSet (controller) and -> Workload (non-controller, only when phalanx manages
  the Workload: a parent's Workload is never given an owner link from the PodGroup);
- Pod -> StatefulSet (controller, set by the StatefulSet controller) and -> PodGroup.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from cluster import convert, names
from cluster.kube import api_path

from . import naming
from .config import SchedulingConfig

STS_API_VERSION = "apps/v1"


@dataclass(frozen=True)
class Flavor:
    """Which Workload API the cluster serves: built in, or phalanx's CRDs (chosen by discovery)."""

    group: str

    @property
    def builtin(self) -> bool:
        return self.group == names.SCHEDULING_GROUP

    @property
    def api_version(self) -> str:
        return f"{self.group}/{names.SCHEDULING_VERSION}"

    def path(self, resource: str, namespace: str, name: str | None = None) -> str:
        return api_path(self.api_version, resource, namespace, name)

    def pod_group_of(self, pod: Mapping[str, Any]) -> str | None:
        """The PodGroup a pod names, if any, read as ``phalanx serve`` reads it (cluster.convert)."""
        try:
            return convert.pod_group_name(pod) or None
        except convert.InvalidInput:
            return None


BUILTIN = Flavor(names.SCHEDULING_GROUP)
CRD = Flavor(names.CRD_GROUP)


def replicas(sts: Mapping[str, Any]) -> int:
    value = (sts.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def min_count(sts: Mapping[str, Any]) -> int:
    """Gang minCount = replicas, clamped to 1 (minCount must be positive; replicas may be 0).
    Used controller-side only, never written back to the StatefulSet."""
    return max(1, replicas(sts))


def owner_ref(obj: Mapping[str, Any], api_version: str, kind: str, controller: bool) -> dict:
    meta = obj["metadata"]
    ref = {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"],
           "blockOwnerDeletion": True}
    if controller:
        ref["controller"] = True
    return ref


def controller_of(obj: Mapping[str, Any]) -> dict | None:
    return next((r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")), None)


def is_managed(obj: Mapping[str, Any]) -> bool:
    """Created by phalanx (the managed-by annotation), as opposed to by a user or a parent controller."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations.get(names.ANNOTATION_MANAGED_BY) == names.MANAGED_BY_VALUE


def template_fields(config: SchedulingConfig, sts: Mapping[str, Any]) -> dict:
    """The fields a PodGroupTemplate carries for this StatefulSet (the PodGroup snapshots them),
    with the pod template's priorityClassName (as upstream's Job integration does): the group's
    priority is its pods'."""
    fields = policy_fields(config, min_count(sts))
    if klass := pod_priority_class(sts):
        fields["priorityClassName"] = klass
    return fields


def pod_priority_class(owner: Mapping[str, Any]) -> str:
    """``spec.template.spec.priorityClassName`` of a pod-template owner, "" when unset."""
    return str(((((owner.get("spec") or {}).get("template") or {}).get("spec") or {})
                .get("priorityClassName")) or "")


def policy_fields(config: SchedulingConfig, gang_min_count: int) -> dict:
    """A PodGroupTemplate's fields for ``config``, a gang's minCount given."""
    fields: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": gang_min_count}} if config.gang else {"basic": {}},
    }
    if config.topology_keys:
        fields["schedulingConstraints"] = {"topology": [{"key": k} for k in config.topology_keys]}
    if config.disruption_mode:
        fields["disruptionMode"] = {config.disruption_mode: {}}
    if config.resource_claims:
        fields["resourceClaims"] = [dict(c) for c in config.resource_claims]
    return fields


def compile_workload(sts: Mapping[str, Any], config: SchedulingConfig, flavor: Flavor) -> dict:
    meta = sts["metadata"]
    return {
        "apiVersion": flavor.api_version, "kind": "Workload",
        "metadata": {
            "name": naming.workload_name(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "annotations": {names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE},
            "ownerReferences": [owner_ref(sts, STS_API_VERSION, "StatefulSet", controller=True)],
        },
        "spec": {
            "controllerRef": {"apiGroup": "apps", "kind": "StatefulSet", "name": meta["name"]},
            "podGroupTemplates": [{"name": naming.template_name(meta["name"]), **template_fields(config, sts)}],
        },
    }


def compile_podgroup(sts: Mapping[str, Any], workload: Mapping[str, Any], template: Mapping[str, Any],
                     flavor: Flavor, owns_workload: bool, parent_composite: str | None = None,
                     name: str | None = None, owner: tuple[str, str] = (STS_API_VERSION, "StatefulSet")) -> dict:
    """The PodGroup instantiated from ``template`` of ``workload`` (a snapshot of its fields).
    ``sts`` is its controller, of kind ``owner`` (apiVersion, kind); ``name`` None: the StatefulSet
    naming scheme."""
    wmeta = workload["metadata"]
    owners = [owner_ref(sts, owner[0], owner[1], controller=True)]
    if owns_workload:
        owners.append(owner_ref(workload, flavor.api_version, "Workload", controller=False))
    spec = {k: copy.deepcopy(v) for k, v in template.items() if k != "name"}
    spec["workloadRef"] = {"workloadName": wmeta["name"], "templateName": template["name"]}
    if parent_composite:
        spec["parentCompositePodGroupName"] = parent_composite
    return {
        "apiVersion": flavor.api_version, "kind": "PodGroup",
        "metadata": {
            "name": name or naming.podgroup_name(wmeta["name"], template["name"], wmeta["uid"], sts["metadata"]["uid"]),
            "namespace": wmeta.get("namespace") or sts["metadata"]["namespace"],
            "annotations": {names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE},
            "ownerReferences": owners,
            "finalizers": [names.FINALIZER_PODGROUP_PROTECTION],
        },
        "spec": spec,
    }


def gang_min_count(fields: Mapping[str, Any]) -> int | None:
    """minCount of a template or PodGroup spec; None for Basic."""
    gang = (fields.get("schedulingPolicy") or {}).get("gang")
    return None if gang is None else gang.get("minCount")


def min_count_patch(path_to_fields: str, current: Mapping[str, Any], target: int) -> list[dict] | None:
    """A JSON patch setting gang minCount at ``path_to_fields``, or None when nothing changes
    (Basic, or already in sync). The ``test`` op makes a concurrent change fail, not clobber."""
    value = gang_min_count(current)
    if value is None or value == target:
        return None
    at = f"{path_to_fields}/schedulingPolicy/gang/minCount"
    return [{"op": "test", "path": at, "value": value}, {"op": "replace", "path": at, "value": target}]


# -- pods -------------------------------------------------------------------------------------------

def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def pod_patch(pod: Mapping[str, Any], podgroup: Mapping[str, Any], flavor: Flavor,
              shared: tuple["SharedClaim", ...] = (), owned: bool = True) -> list[dict]:
    """JSON patch for a new pod: its PodGroup reference, an ownerReference to the PodGroup (not with
    ``owned`` False: the PodGroup need not exist yet), the ``podgroup-sync`` scheduling gate (lifted
    by the reconciler once minCount is in sync and the shared claims exist), and its exactly
    matching claim entries pointed at ``shared``."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    group = podgroup["metadata"]["name"]
    ops: list[dict] = []
    if flavor.builtin:
        ops.append({"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": group}})
    elif meta.get("labels"):
        ops.append({"op": "add", "path": f"/metadata/labels/{_escape(names.LABEL_POD_GROUP)}", "value": group})
    else:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {names.LABEL_POD_GROUP: group}})
    if owned:
        ref = {"apiVersion": flavor.api_version, "kind": "PodGroup", "name": group, "uid": podgroup["metadata"]["uid"]}
        if meta.get("ownerReferences"):
            ops.append({"op": "add", "path": "/metadata/ownerReferences/-", "value": ref})
        else:
            ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": [ref]})
    gate = {"name": names.GATE_PODGROUP_SYNC}
    if spec.get("schedulingGates"):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    return ops + claim_patch(pod, shared)


def has_sync_gate(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == names.GATE_PODGROUP_SYNC for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def ungate_patch(pod: Mapping[str, Any]) -> list[dict]:
    """JSON patch removing the sync gate (gates may only be removed after creation)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    kept = [g for g in gates if g.get("name") != names.GATE_PODGROUP_SYNC]
    return [{"op": "test", "path": "/spec/schedulingGates", "value": gates},
            {"op": "replace", "path": "/spec/schedulingGates", "value": kept}]


# -- shared ResourceClaims (KEP-6277 story 4, without KEP-5729 in the cluster) ------------------------
#
# With DRAWorkloadResourceClaims on, the API server keeps a PodGroup's ``spec.resourceClaims`` and
# the ResourceClaim controller generates one claim per PodGroup from each template, reserved for the
# PodGroup as a whole. With the gate off (the default in 1.37) the API server drops the field, and in
# the CRD flavor no built-in controller reads it: phalanx then creates that one claim itself, owned
# by the PodGroup, and the pod webhook points each pod's exactly matching entry at it.
#
# Limit of this fallback: the claim is consumed through ``resourceClaimName``, so kube-scheduler
# reserves it pod by pod in ``status.reservedFor``, which holds at most 256 entries. A group sharing
# one claim this way is limited to 256 pods (the 257th stays unschedulable), unlike KEP-5729's
# PodGroup-level reservation.


@dataclass(frozen=True)
class SharedClaim:
    """A PodGroup's shared claim phalanx provides: pods whose entry has ``name`` and
    ``resourceClaimTemplateName: template`` are pointed at the ResourceClaim ``claim``."""

    name: str
    template: str
    claim: str


def shared_claims(podgroup: Mapping[str, Any], configured: Any, flavor: Flavor) -> tuple[SharedClaim, ...]:
    """The template-sourced shared claims phalanx must create for ``podgroup``.

    None when the cluster implements PodGroup-level claims (built-in flavor and the stored PodGroup
    kept ``spec.resourceClaims``). Otherwise the PodGroup's own entries, or, when the API server
    dropped them, the StatefulSet's ``configured`` ones. Entries naming a ``resourceClaimName`` are
    shared as they are: nothing is created for them and pods keep them unchanged.
    """
    stored = (podgroup.get("spec") or {}).get("resourceClaims") or []
    if flavor.builtin and stored:
        return ()
    meta = podgroup["metadata"]
    return tuple(SharedClaim(c["name"], c["resourceClaimTemplateName"],
                             naming.claim_name(meta["name"], c["name"], meta.get("uid", "")))
                 for c in stored or configured or () if c.get("name") and c.get("resourceClaimTemplateName"))


def compile_claim(podgroup: Mapping[str, Any], shared: SharedClaim, template: Mapping[str, Any],
                  flavor: Flavor) -> dict:
    """The ResourceClaim for ``shared`` from its ResourceClaimTemplate: the template's
    ``spec.spec`` and its labels and annotations, plus phalanx's marks, owned by the PodGroup."""
    meta = (template.get("spec") or {}).get("metadata") or {}
    return {
        "apiVersion": names.RESOURCE_API_VERSION, "kind": "ResourceClaim",
        "metadata": {
            "name": shared.claim,
            "namespace": podgroup["metadata"]["namespace"],
            "labels": {**(meta.get("labels") or {}), names.LABEL_PODGROUP_CLAIM: shared.name},
            "annotations": {**(meta.get("annotations") or {}), names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE},
            "ownerReferences": [owner_ref(podgroup, flavor.api_version, "PodGroup", controller=True)],
        },
        "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
    }


def claim_patch(pod: Mapping[str, Any], shared: tuple[SharedClaim, ...]) -> list[dict]:
    """JSON patch pointing the pod's claim entries at the PodGroup's claims. Only an exact match is
    rewritten: same ``name`` and ``resourceClaimTemplateName`` equal to the group entry's template
    (and no ``resourceClaimName``); every other entry stays a per-pod claim."""
    by_name = {s.name: s for s in shared}
    ops = []
    for i, entry in enumerate((pod.get("spec") or {}).get("resourceClaims") or []):
        match = by_name.get(entry.get("name"))
        if match and entry.get("resourceClaimTemplateName") == match.template and not entry.get("resourceClaimName"):
            ops.append({"op": "replace", "path": f"/spec/resourceClaims/{i}",
                        "value": {"name": match.name, "resourceClaimName": match.claim}})
    return ops
