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

from cluster import convert, kinds, names
from cluster.kube import api_path

from . import naming
from .config import Owner, SchedulingConfig

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

    def pod_group_of(self, pod: kinds.Pod | Mapping[str, Any]) -> str | None:
        """The PodGroup a pod names, if any, read as ``phalanx serve`` reads it (cluster.convert)."""
        if isinstance(pod, kinds.Pod):
            return pod.group or None
        try:
            return convert.pod_group_name(pod) or None
        except convert.InvalidInput:
            return None


BUILTIN = Flavor(names.SCHEDULING_GROUP)
CRD = Flavor(names.CRD_GROUP)


#: annotations of a StatefulSet or LeaderWorkerSet that the PodGroups made for it carry
INHERITED_ANNOTATIONS = frozenset({names.ANNOTATION_PROVISIONING, names.ANNOTATION_PREFERRED_TOPOLOGY,
                                   names.ANNOTATION_PLACEMENT_PREFERENCE, names.ANNOTATION_EXPECTED_DURATION})

def replicas(sts: kinds.StatefulSet | Mapping[str, Any]) -> int:
    value = kinds.statefulset(sts).replicas
    return 1 if value is None else value


def min_count(sts: kinds.StatefulSet | Mapping[str, Any]) -> int:
    """Gang minCount = replicas, clamped to 1 (minCount must be positive; replicas may be 0).
    Used controller-side only, never written back to the StatefulSet."""
    # the rule's one home (docs/design.md: KEP-6277/min-count-from-replicas)
    return max(1, replicas(sts))


def template_fields(config: SchedulingConfig, sts: kinds.StatefulSet | Mapping[str, Any]) -> dict[str, Any]:
    """The fields a PodGroupTemplate carries for this StatefulSet (the PodGroup snapshots them),
    with the pod template's priorityClassName (as upstream's Job integration does): the group's
    priority is its pods'."""
    sts = kinds.statefulset(sts)
    return policy_fields(config, min_count(sts), sts.template.priority_class)


def policy_fields(config: SchedulingConfig, gang_min_count: int, priority_class: str = "") -> dict[str, Any]:
    """A PodGroupTemplate's fields for ``config``, a gang's minCount given."""
    # the rule's one home (docs/design.md: KEP-6277/claims-pass-through)
    return kinds.group_fields_json(gang_min_count if config.gang else None, config.topology_keys,
                                   config.disruption_mode, config.resource_claims, priority_class)


def managed_metadata(name: str, namespace: str, owners: list[dict[str, Any]], labels: Mapping[str, str] | None = None,
                     annotations: Mapping[str, str] | None = None, finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    """The metadata of an object phalanx creates: the managed-by annotation besides ``annotations``."""
    return kinds.metadata_json(name, namespace, owners, labels,
                               {names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE, **(annotations or {})}, finalizers)


def compile_workload(sts: kinds.StatefulSet | Mapping[str, Any], config: SchedulingConfig,
                     flavor: Flavor) -> dict[str, Any]:
    sts = kinds.statefulset(sts)
    meta = sts.meta
    # the rule's one home (docs/design.md: KEP-6277/workload-owner)
    return kinds.object_json(
        flavor.api_version, "Workload",
        managed_metadata(naming.workload_name(meta.name, meta.uid), meta.namespace,
                         [kinds.owner_ref_json(meta, STS_API_VERSION, "StatefulSet", controller=True)]),
        {"controllerRef": {"apiGroup": "apps", "kind": "StatefulSet", "name": meta.name},
         "podGroupTemplates": [{"name": naming.template_name(meta.name), **template_fields(config, sts)}]})


@dataclass(frozen=True)
class GroupOverrides:
    """What an LWS PodGroup sets beyond its template: minCount (None: the template's), name (None: the
    StatefulSet scheme), priority class, labels and annotations added to phalanx's."""

    min_count: int | None = None
    name: str | None = None
    priority_class: str = ""
    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None


def compile_podgroup(sts: Owner | Mapping[str, Any], workload: kinds.Workload | Mapping[str, Any],
                     template: kinds.GroupTemplate | Mapping[str, Any], flavor: Flavor, owns_workload: bool,
                     parent_composite: str | None = None, owner: tuple[str, str] = (STS_API_VERSION, "StatefulSet"),
                     overrides: GroupOverrides = GroupOverrides()) -> dict[str, Any]:
    """The PodGroup instantiated from ``template`` of ``workload`` (a snapshot of its fields).
    ``sts`` is its controller, of kind ``owner`` (apiVersion, kind)."""
    # these rules' one home (docs/design.md: KEP-6277/podgroup-owners, KEP-6277/finalizer-added)
    owner_meta = kinds.workload_owner(sts).meta
    wl = kinds.workload(workload)
    if not isinstance(template, kinds.GroupTemplate):
        template = kinds.group_template(template)
    owners = [kinds.owner_ref_json(owner_meta, owner[0], owner[1], controller=True)]
    if owns_workload:
        owners.append(kinds.owner_ref_json(wl.meta, flavor.api_version, "Workload", controller=False))
    spec = kinds.podgroup_spec_json(template.fields, wl.meta.name, template.name, overrides.min_count,
                                    overrides.priority_class, parent_composite)
    # the owner's ProvisioningRequest opt-in (or opt-out, docs/autoscaling.md) and placement hints
    # (docs/solver.md) are the group's
    inherited = {k: v for k, v in owner_meta.annotations.items() if k in INHERITED_ANNOTATIONS}
    metadata = managed_metadata(
        overrides.name or naming.podgroup_name(wl.meta.name, template.name, wl.meta.uid, owner_meta.uid),
        wl.meta.namespace or owner_meta.namespace, owners, overrides.labels,
        {**inherited, **(overrides.annotations or {})},
        (names.FINALIZER_PODGROUP_PROTECTION,))
    return kinds.object_json(flavor.api_version, "PodGroup", metadata, spec)


def gang_min_count(fields: kinds.GroupFields | Mapping[str, Any]) -> int | None:
    """minCount of a template or PodGroup spec; None for Basic."""
    if not isinstance(fields, kinds.GroupFields):
        fields = kinds.group_fields(fields, "schedulingPolicy")
    return fields.min_count


def min_count_patch(path_to_fields: str, current: kinds.GroupFields | Mapping[str, Any],
                    target: int) -> list[dict[str, Any]] | None:
    """A JSON patch setting gang minCount at ``path_to_fields``, or None when nothing changes
    (Basic, or already in sync). The ``test`` op makes a concurrent change fail, not clobber."""
    value = gang_min_count(current)
    if value is None or value == target:
        return None
    at = f"{path_to_fields}/schedulingPolicy/gang/minCount"
    return [{"op": "test", "path": at, "value": value}, {"op": "replace", "path": at, "value": target}]


# -- pods -------------------------------------------------------------------------------------------

def pod_patch(pod: kinds.Pod | Mapping[str, Any], podgroup: kinds.PodGroup | kinds.Meta | Mapping[str, Any],
              flavor: Flavor,
              shared: tuple["SharedClaim", ...] = (), owned: bool = True) -> list[dict[str, Any]]:
    """JSON patch for a new pod: its PodGroup reference, an ownerReference to the PodGroup (not with
    ``owned`` False: the PodGroup need not exist yet), the ``podgroup-sync`` scheduling gate (lifted
    by the reconciler once minCount is in sync and the shared claims exist), and its exactly
    matching claim entries pointed at ``shared``. ``podgroup``: the PodGroup, or its metadata."""
    # these rules' one home (docs/design.md: KEP-6277/pod-owner, KEP-6277/pod-names-podgroup)
    pod = kinds.pod(pod)
    group_meta = podgroup if isinstance(podgroup, kinds.Meta) else kinds.podgroup(podgroup).meta
    group = group_meta.name
    ops: list[dict[str, Any]] = []
    if flavor.builtin:
        ops.append({"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": group}})
    elif pod.meta.labels:
        at = kinds.json_pointer("metadata", "labels", names.LABEL_POD_GROUP)
        ops.append({"op": "add", "path": at, "value": group})
    else:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {names.LABEL_POD_GROUP: group}})
    if owned:
        ref = {"apiVersion": flavor.api_version, "kind": "PodGroup", "name": group, "uid": group_meta.uid}
        if pod.meta.owners:
            ops.append({"op": "add", "path": "/metadata/ownerReferences/-", "value": ref})
        else:
            ops.append({"op": "add", "path": "/metadata/ownerReferences", "value": [ref]})
    gate = {"name": names.GATE_PODGROUP_SYNC}
    if pod.gates:
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": gate})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [gate]})
    return ops + claim_patch(pod, shared)


def has_sync_gate(pod: kinds.Pod | Mapping[str, Any]) -> bool:
    return names.GATE_PODGROUP_SYNC in kinds.pod(pod).gate_names


def ungate_patch(pod: kinds.Pod | Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch removing the sync gate (gates may only be removed after creation)."""
    pod = kinds.pod(pod)
    gates = [dict(g) for g in pod.gates]
    kept = [g for g, name in zip(gates, pod.gate_names, strict=True) if name != names.GATE_PODGROUP_SYNC]
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


def shared_claims(podgroup: kinds.PodGroup | Mapping[str, Any], configured: Any,
                  flavor: Flavor) -> tuple[SharedClaim, ...]:
    """The template-sourced shared claims phalanx must create for ``podgroup``.

    None when the cluster implements PodGroup-level claims (built-in flavor and the stored PodGroup
    kept ``spec.resourceClaims``). Otherwise the PodGroup's own entries, or, when the API server
    dropped them, the StatefulSet's ``configured`` ones. Entries naming a ``resourceClaimName`` are
    shared as they are: nothing is created for them and pods keep them unchanged.
    """
    group = kinds.podgroup(podgroup)
    stored = group.fields.claims
    if flavor.builtin and stored:
        return ()
    entries = stored or kinds.claim_entries(list(configured or ()), "spec.scheduling.resourceClaims")
    return tuple(SharedClaim(c.name, c.template_name, naming.claim_name(group.meta.name, c.name, group.meta.uid))
                 for c in entries if c.name and c.template_name)


def compile_claim(podgroup: kinds.PodGroup | Mapping[str, Any], shared: SharedClaim,
                  template: kinds.ClaimTemplate | Mapping[str, Any], flavor: Flavor) -> dict[str, Any]:
    """The ResourceClaim for ``shared`` from its ResourceClaimTemplate: the template's
    ``spec.spec`` and its labels and annotations, plus phalanx's marks, owned by the PodGroup."""
    group = kinds.podgroup(podgroup).meta
    if not isinstance(template, kinds.ClaimTemplate):
        template = kinds.claim_template(template)
    return kinds.object_json(names.RESOURCE_API_VERSION, "ResourceClaim", {
        "name": shared.claim,
        "namespace": group.namespace,
        "labels": {**template.labels, names.LABEL_PODGROUP_CLAIM: shared.name},
        "annotations": {**template.annotations, names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE},
        "ownerReferences": [kinds.owner_ref_json(group, flavor.api_version, "PodGroup", controller=True)],
    }, copy.deepcopy(dict(template.spec)))


def claim_patch(pod: kinds.Pod | Mapping[str, Any], shared: tuple[SharedClaim, ...]) -> list[dict[str, Any]]:
    """JSON patch pointing the pod's claim entries at the PodGroup's claims. Only an exact match is
    rewritten: same ``name`` and ``resourceClaimTemplateName`` equal to the group entry's template
    (and no ``resourceClaimName``); every other entry stays a per-pod claim."""
    by_name = {s.name: s for s in shared}
    ops = []
    for i, entry in enumerate(kinds.pod(pod).claims):
        match = by_name.get(entry.name)
        if match and entry.template_name == match.template and not entry.claim_name:
            ops.append({"op": "replace", "path": f"/spec/resourceClaims/{i}",
                        "value": {"name": match.name, "resourceClaimName": match.claim}})
    return ops
