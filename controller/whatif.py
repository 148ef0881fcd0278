"""What-if compilation: the PodGroups and member pods a manifest would produce, by the controller's
own rules, without creating anything.

For each object of a manifest, what the cluster would do once it is applied:

- a StatefulSet with a scheduling configuration: the admission webhook's checks
  (``config.validate_statefulset``), then the Workload and PodGroup the reconciler compiles
  (``objects.compile_workload``, ``objects.compile_podgroup``), and ``replicas`` pods from its
  template, stamped by the pod webhook's patch (``objects.pod_patch``) with the ``podgroup-sync``
  gate already lifted (``objects.ungate_patch``), as they are once the gang is complete;
- a LeaderWorkerSet with the annotation: the LWS webhook's checks (``lws_config.validate_lws``),
  then per replica a leader and ``size - 1`` workers labelled as LWS labels them, each pod given
  the incarnation its webhook gives (``lws_admission.new_incarnation``), and the PodGroups
  ``lws.wanted_podgroups`` wants for those leaders, compiled by ``lws.compile_podgroup``;
- a PodGroup (either flavor) as written, with the Pods and the Jobs' pods (``parallelism`` of
  them, ``completions`` at most) that name it;
- a CompositePodGroup (``scheduling.k8s.io/v1alpha3``, or the CRD flavor's) as written: the PodGroups of the manifest
  that name it as parent (and composites naming it, to any depth upstream allows) are answered
  with it, as one unit.

Objects of other kinds (a Service, a ConfigMap) create no pods phalanx places and are passed over.
An object the webhooks would refuse is refused with their messages, field by field; then nothing
is planned. Names carry what-if UIDs (``whatif-<namespace>-<name>``): the real ones are given by
the API server, so PodGroup names in the answer differ from the applied ones by their hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from cluster import kinds, names
from cluster.convert import CompositeRecord, composite_record
from cluster.whatif import (
    DraftGroup,
    Drafts,
    ManifestObject,
    ObjectErrors,
    draft_group,
    job_pods,
    leaderworkerset_pods,
    member_of,
    read_manifest,
    statefulset_claims,
    statefulset_pods,
)
from solver import InvalidInput

from . import lws, objects
from .config import ConfigError, raw_scheduling, resolve, validate_statefulset
from .lws_admission import new_incarnation
from .lws_config import resolve_lws, validate_lws
from .objects import BUILTIN, Flavor

POD_GROUP_APIS = {names.SCHEDULING_GROUP, names.CRD_GROUP}
MSG_NO_SCHEDULING = (f"metadata.annotations[{names.ANNOTATION_SCHEDULING}]: Required value: phalanx creates no "
                     "PodGroup for a {kind} without a scheduling configuration")
MSG_NO_GROUP = ("spec.schedulingGroup.podGroupName: Not found: {group}: no PodGroup of that name in the manifest "
                "(what-if plans the PodGroups it is given)")


class Refused(ValueError):
    """An object of the manifest the cluster would refuse: its messages, field by field."""

    def __init__(self, messages: Sequence[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = tuple(messages)


@dataclass
class _Manifest:
    """A manifest being compiled: the groups so far, the PodGroups given as objects and the pods
    naming them (with the object each comes from), and the refusals."""

    flavor: Flavor
    groups: list[DraftGroup] = field(default_factory=list)
    podgroups: dict[str, ManifestObject] = field(default_factory=dict)
    members: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    errors: list[ObjectErrors] = field(default_factory=list)
    composites: list[CompositeRecord] = field(default_factory=list)


def compile_objects(objects_: Sequence[Any], namespace: str = "default", flavor: Flavor = BUILTIN) -> Drafts:
    """The drafts of a manifest (see the module's docstring); ``namespace`` for objects naming none."""
    read, refused = read_manifest(objects_, namespace or "default")
    manifest = _Manifest(flavor, errors=refused)
    for obj in read:
        try:
            _compile_one(manifest, obj)
        except Refused as err:
            manifest.errors.append(ObjectErrors(obj.source, err.messages))
        except (InvalidInput, kinds.MalformedObject, ConfigError) as err:
            manifest.errors.append(ObjectErrors(obj.source, (str(err),)))
    for key, podgroup in manifest.podgroups.items():
        try:
            joined = [pod for _, pod in manifest.members.pop(key, [])]
            manifest.groups.append(draft_group(podgroup.raw, joined, podgroup.source))
        except (InvalidInput, kinds.MalformedObject) as err:
            manifest.errors.append(ObjectErrors(podgroup.source, (str(err),)))
    for key, strays in manifest.members.items():
        manifest.errors.append(ObjectErrors(strays[0][0], (MSG_NO_GROUP.format(group=key.split("/", 1)[1]),)))
    if manifest.errors:
        return Drafts(errors=tuple(manifest.errors))
    return Drafts(groups=tuple(manifest.groups), composites=tuple(manifest.composites))


def _compile_one(manifest: _Manifest, obj: ManifestObject) -> None:
    if obj.kind == "PodGroup" and obj.group in POD_GROUP_APIS:
        manifest.podgroups[f"{obj.namespace}/{obj.name}"] = obj
    elif obj.kind == "CompositePodGroup" and obj.group in POD_GROUP_APIS:
        manifest.composites.append(composite_record(obj.raw))
    elif (obj.group, obj.kind) == ("apps", "StatefulSet"):
        manifest.groups.append(_statefulset(obj, manifest.flavor))
    elif (obj.group, obj.kind) == (names.LWS_API_GROUP, "LeaderWorkerSet"):
        manifest.groups += _leaderworkerset(obj, manifest.flavor)
    elif (obj.group, obj.kind) == ("", "Pod"):
        _join(manifest, obj.source, obj.raw)
    elif (obj.group, obj.kind) == ("batch", "Job"):
        for pod in job_pods(obj):
            _join(manifest, obj.source, pod)


def _join(manifest: _Manifest, source: str, pod: dict[str, Any]) -> None:
    """A pod of the manifest joins the PodGroup it names (which the manifest must give)."""
    key = member_of(pod)
    if not key:
        raise Refused([MSG_NO_GROUP.format(group='""')])
    manifest.members.setdefault(key, []).append((source, pod))


def _stamped(pod: Mapping[str, Any], podgroup: dict[str, Any] | kinds.Meta, flavor: Flavor,
             shared: tuple[objects.SharedClaim, ...] = (), owned: bool = True) -> dict[str, Any]:
    """The pod as the pod webhook admits it, its ``podgroup-sync`` gate lifted by the reconciler."""
    admitted = kinds.apply_patch(pod, objects.pod_patch(kinds.pod(pod), podgroup, flavor, shared, owned))
    return kinds.apply_patch(admitted, objects.ungate_patch(kinds.pod(admitted)))


def _statefulset(obj: ManifestObject, flavor: Flavor) -> DraftGroup:
    errors, _warnings = validate_statefulset(obj.raw)
    if errors:
        raise Refused(errors)
    raw = raw_scheduling(obj.raw)
    if raw is None:
        raise Refused([MSG_NO_SCHEDULING.format(kind="StatefulSet")])
    sts, config = kinds.statefulset(obj.raw), resolve(raw)
    workload = objects.compile_workload(sts, config, flavor)
    podgroup = objects.compile_podgroup(sts, workload, kinds.workload(workload).templates[0], flavor, True)
    shared = objects.shared_claims(podgroup, config.resource_claims, flavor)
    replicas = objects.replicas(sts)
    pods = [_stamped(pod, podgroup, flavor, shared) for pod in statefulset_pods(obj, replicas)]
    return draft_group(podgroup, pods, obj.source, statefulset_claims(obj, replicas))


def _leaderworkerset(obj: ManifestObject, flavor: Flavor) -> list[DraftGroup]:
    errors = validate_lws(obj.raw)
    if errors:
        raise Refused(errors)
    lws_obj = kinds.leaderworkerset(obj.raw)
    raw = raw_scheduling(lws_obj)
    if raw is None:
        raise Refused([MSG_NO_SCHEDULING.format(kind="LeaderWorkerSet")])
    sched, replicas = resolve_lws(raw), lws.replicas(lws_obj)
    pods = [kinds.pod(p) for p in leaderworkerset_pods(obj, replicas, lws_obj.size,
                                                       [new_incarnation() for _ in range(replicas)])]
    leaders = {m.group_index: m for p in pods if (m := lws.member(p)) and m.leader}
    workload = lws.compile_workload(lws_obj, sched, flavor, leaders)
    by_group: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        me = lws.member(pod)
        group = lws.podgroup_for(lws_obj, sched, me) if me else None
        if group:
            by_group.setdefault(group, []).append(_stamped(pod.raw, kinds.Meta(name=group), flavor, owned=False))
    return [draft_group(lws.compile_podgroup(lws_obj, workload, want, sched.level, flavor),
                        by_group.get(want.name, []), obj.source)
            for want in lws.wanted_podgroups(lws_obj, sched, leaders)]
