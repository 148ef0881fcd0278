"""LeaderWorkerSets (LWS v0.9.0): the LWS gang-scheduling guide's Workload and PodGroups, kept right
against the API by phalanx's controller (LWS itself creates none before its native support ships).

LWS creates a leader StatefulSet (pod ``<lws>-<i>`` per replica ``i``) and, per leader pod, a worker
StatefulSet (pods ``<lws>-<i>-<j>``) owned by that leader pod; its webhook labels every pod with
``leaderworkerset.sigs.k8s.io/name``, ``group-index`` and ``worker-index`` (0 for the leader).
phalanx recognises the pods by those labels (see ``controller.lws_admission``) and creates, for an
LWS with the ``scheduling.phalanx.dev/scheduling`` annotation (``controller.lws_config``):

- one Workload (``<lws>-<uid-hash>``, controllerRef to the LWS) with one PodGroupTemplate per unit
  of the level: ``replica``, ``leaderworkerset``, or ``leader`` and ``worker``;
- whole-LWS level: one PodGroup ``<lws>-<uid-hash>``, created with the Workload, before any pod is
  admitted; gang minCount = the sum over replicas 0..replicas-1 of the size of the revision each
  replica runs (a replica the rollout has not replaced yet counts with its previous size; a missing
  one with the current size). Once the running pods meet it, a replacement or surge replica's pods
  are placed as they come, not all-or-nothing;
- replica / role level: per live leader pod, PodGroups named
  ``<lws>-<uid-hash>.<incarnation>-<group-index>[-leader|-worker]-<revision>``, with the minCount of
  the leader's revision (``leaderworkerset.sigs.k8s.io/size``): size at the replica level, 1 and
  size-1 at the role level (no worker PodGroup for size 1). The *incarnation* is 5 random characters
  the pod webhook gives each new leader pod (label ``scheduling.phalanx.dev/lws-incarnation``);
  workers inherit their leader's. So a recreated leader (same name, index and revision) gets fresh
  PodGroups and never waits on its predecessor's, which is being deleted, and a rolled-out replica
  gets PodGroups of its new revision. PodGroups no live leader names are deleted.

Every name is a valid label value (at most 63 characters, the LWS name cut to fit), so the CRD
flavor's pod label holds it. Owner references as for StatefulSets: Workload -> LWS (controller),
PodGroup -> LWS (controller) and -> Workload; everything goes with the LWS through the garbage
collector. Pods get no ownerReference to their PodGroup (a replica's PodGroups are created after its
leader is admitted). The pods wait behind the ``podgroup-sync`` gate until their PodGroup exists with
the right minCount and, for a gang, until minCount of its pods exist (``complete``); the reconciler
lifts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from cluster import kinds, names
from cluster.kube import KubeError, api_path

from . import naming, objects
from .config import ConfigError, raw_scheduling
from .lws_config import (
    LEVEL_ROLE,
    LEVEL_WHOLE,
    TEMPLATE_REPLICA,
    TEMPLATE_WHOLE,
    LwsScheduling,
    priority_class,
    resolve_lws,
    validate_lws,
)
from .reconciler import CreationFailed, Reconciler, StatefulSetGone, _stale

KEY_PREFIX = "lws:"  # work-queue keys of LeaderWorkerSets: "lws:<namespace>/<name>"
OWNER = (names.LWS_API_VERSION, "LeaderWorkerSet")
INCARNATION_LENGTH = 5

LWS = kinds.LeaderWorkerSet | Mapping[str, Any]


def lws_key(namespace: str, name: str) -> str:
    return f"{KEY_PREFIX}{namespace}/{name}"


def lws_path(namespace: str | None = None, name: str | None = None) -> str:
    return api_path(names.LWS_API_VERSION, "leaderworkersets", namespace, name)


def key_of(meta: kinds.Meta) -> str | None:
    """The LWS key an object belongs to: LWS StatefulSets and pods by their name label, Workloads and
    PodGroups by their controller reference."""
    ctrl = meta.controller
    if ctrl and ctrl.kind == OWNER[1] and ctrl.api_version.startswith(names.LWS_API_GROUP):
        return lws_key(meta.namespace, ctrl.name)
    name = meta.labels.get(names.LABEL_LWS_NAME)
    return lws_key(meta.namespace, name) if name else None


# -- reading an LWS and its pods (the one place their fields are parsed) ------------------------------

def replicas(lws: LWS) -> int:
    value = kinds.leaderworkerset(lws).replicas
    return 1 if value is None else value


def size(lws: LWS) -> int:
    return kinds.leaderworkerset(lws).size


@dataclass(frozen=True)
class Member:
    """What phalanx reads from an LWS pod."""

    lws: str
    leader: bool
    group_index: str
    revision: str
    size: int | None  # the group size of the pod's revision (annotation), None when absent
    leader_name: str  # the pod itself for a leader
    incarnation: str


def member(pod: kinds.Pod | Mapping[str, Any]) -> Member | None:
    """The pod as an LWS member, or None when it is not one. A worker carries its leader's name;
    a leader's group index comes from LWS's label, else from the StatefulSet's pod index."""
    meta = kinds.pod(pod).meta
    labels, annotations = meta.labels, meta.annotations
    name = labels.get(names.LABEL_LWS_NAME)
    if not name:
        return None
    leader_name = annotations.get(names.ANNOTATION_LWS_LEADER_NAME)
    index = labels.get(names.LABEL_LWS_GROUP_INDEX) or ("" if leader_name else labels.get(names.LABEL_POD_INDEX)) or ""
    try:
        pod_size: int | None = int(annotations.get(names.ANNOTATION_LWS_SIZE, ""))
    except ValueError:
        pod_size = None
    return Member(lws=name, leader=not leader_name, group_index=str(index),
                  revision=labels.get(names.LABEL_LWS_REVISION, ""), size=pod_size,
                  leader_name=leader_name or meta.name,
                  incarnation=labels.get(names.LABEL_LWS_INCARNATION, ""))


# -- names ----------------------------------------------------------------------------------------

def workload_name(lws: LWS) -> str:
    meta = kinds.leaderworkerset(lws).meta
    return naming.workload_name(meta.name, meta.uid)


def whole_podgroup_name(lws: LWS) -> str:
    """The whole-LWS PodGroup: it does not depend on a replica (nor on a revision)."""
    meta = kinds.leaderworkerset(lws).meta
    return naming.fair_join([meta.name], naming.name_hash(meta.uid), naming.MAX_LABEL)


def replica_podgroup_name(lws: LWS, incarnation: str, group_index: str, revision: str,
                          role: str | None = None) -> str:
    """``<lws>-<uid-hash>.<incarnation>-<group-index>[-<role>]-<revision>``, at most 63 characters."""
    # the rule's one home (docs/design.md: LWS/incarnation-name)
    meta = kinds.leaderworkerset(lws).meta
    tail = f"{naming.name_hash(meta.uid)}.{incarnation}-{group_index}" + (f"-{role}" if role else "")
    return naming.fair_join([meta.name], f"{tail}-{revision}" if revision else tail, naming.MAX_LABEL)


def podgroup_for(lws: LWS, sched: LwsScheduling, pod: Member) -> str | None:
    """The PodGroup an LWS pod joins (None: a replica-level pod whose leader has no incarnation)."""
    if sched.level == LEVEL_WHOLE:
        return whole_podgroup_name(lws)
    if not pod.incarnation:
        return None
    role = ("leader" if pod.leader else "worker") if sched.level == LEVEL_ROLE else None
    return replica_podgroup_name(lws, pod.incarnation, pod.group_index, pod.revision, role)


# -- objects --------------------------------------------------------------------------------------

def whole_min_count(lws: LWS, leaders: Mapping[str, Member]) -> int:
    """The guide's rollout rule: replicas the rollout has not replaced yet count with their
    previous size (their leader's), the others (and missing ones) with the current size."""
    # the rule's one home (docs/design.md: LWS/whole-level)
    current = size(lws)
    total = sum((leaders[str(i)].size or current) if str(i) in leaders else current for i in range(replicas(lws)))
    return max(1, total)


def replica_min_counts(level: str, group_size: int) -> dict[str, int]:
    """The minCount of each PodGroup of one replica of ``group_size`` pods, by template: the whole
    replica, or at the role level the leader (1) and the workers (``size-1``; 0: no worker group)."""
    # these rules' one home (docs/design.md: LWS/replica-level, LWS/role-level)
    if level == LEVEL_ROLE:
        return {"leader": 1, "worker": group_size - 1}
    return {TEMPLATE_REPLICA: group_size}


def template_min_counts(lws: LWS, sched: LwsScheduling, leaders: Mapping[str, Member]) -> dict[str, int]:
    """The Workload's templates' minCounts: a replica's, each at least 1 (a template needs one)."""
    # the rule's one home (docs/design.md: LWS/template-min-counts)
    if sched.level == LEVEL_WHOLE:
        return {TEMPLATE_WHOLE: whole_min_count(lws, leaders)}
    return {t: max(1, c) for t, c in replica_min_counts(sched.level, size(lws)).items()}


def compile_workload(lws: LWS, sched: LwsScheduling, flavor: objects.Flavor,
                     leaders: Mapping[str, Member]) -> dict[str, Any]:
    meta = kinds.leaderworkerset(lws).meta
    counts = template_min_counts(lws, sched, leaders)
    return kinds.object_json(
        flavor.api_version, "Workload",
        objects.managed_metadata(workload_name(lws), meta.namespace,
                                 [kinds.owner_ref_json(meta, *OWNER, controller=True)],
                                 annotations={names.ANNOTATION_LWS_LEVEL: sched.level},
                                 labels={names.LABEL_LWS_NAME: meta.name}),
        {"controllerRef": {"apiGroup": names.LWS_API_GROUP, "kind": OWNER[1], "name": meta.name},
         "podGroupTemplates": [{"name": t, **objects.policy_fields(c, counts[t])} for t, c in sched.units]})


@dataclass(frozen=True)
class Wanted:
    """A PodGroup the LWS should have: its name, template, minCount and group index ("" whole)."""

    name: str
    template: str
    min_count: int
    group_index: str = ""


def wanted_podgroups(lws: LWS, sched: LwsScheduling, leaders: Mapping[str, Member]) -> list[Wanted]:
    """The PodGroups the LWS should have now: the whole-LWS one, or per live leader its replica's."""
    if sched.level == LEVEL_WHOLE:
        return [Wanted(whole_podgroup_name(lws), TEMPLATE_WHOLE, whole_min_count(lws, leaders))]
    out = []
    for index, leader in sorted(leaders.items()):
        if not leader.incarnation:
            continue  # admitted without phalanx's webhook: not in a group
        for template, count in replica_min_counts(sched.level, leader.size or size(lws)).items():
            if count < 1:
                continue  # a replica of one pod has no worker group
            one = leader if template != "worker" else Member(
                leader.lws, False, index, leader.revision, leader.size, leader.leader_name, leader.incarnation)
            out.append(Wanted(podgroup_for(lws, sched, one) or "", template, count, index))
    return out


def compile_podgroup(lws: LWS, workload: kinds.Workload | Mapping[str, Any], wanted: Wanted, level: str,
                     flavor: objects.Flavor) -> dict[str, Any]:
    lws, workload = kinds.leaderworkerset(lws), kinds.workload(workload)
    template = workload.template(wanted.template)
    if template is None:
        raise CreationFailed(f"Workload {workload.meta.name} has no podGroupTemplate {wanted.template}")
    labels = {names.LABEL_LWS_NAME: lws.meta.name}
    if wanted.group_index:
        labels[names.LABEL_LWS_GROUP_INDEX] = wanted.group_index
    # the group's priority is its pods' (the API server defaults spec.priority to 0)
    overrides = objects.GroupOverrides(wanted.min_count, wanted.name, priority_class(lws), labels,
                                       {names.ANNOTATION_LWS_LEVEL: level})
    return objects.compile_podgroup(lws, workload, template, flavor, True, owner=OWNER, overrides=overrides)


# -- the reconciler -------------------------------------------------------------------------------

@dataclass
class LwsResolution:
    """What a sync found: the LWS's PodGroups by name (created or existing, as the API returned
    them), its pods (kinds.Pod), or why not."""

    groups: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)  # names of the PodGroups this sync created
    pods: list[kinds.Pod] = field(default_factory=list)
    why: str = ""
    sched: LwsScheduling | None = None


class LwsReconciler(Reconciler):
    """The StatefulSet reconciler's machinery (creates with events and the gone-check, minCount
    patches with a ``test`` op, gate lifting, cascade and finalizer) applied to LeaderWorkerSets."""

    def _alive(self, lws: kinds.StatefulSet | kinds.LeaderWorkerSet) -> bool:
        live = self.kube.get_or_none(lws_path(lws.meta.namespace, lws.meta.name))
        if live is None:
            return False
        meta = kinds.meta_of(live, "LeaderWorkerSet")
        return meta.uid == lws.meta.uid and not meta.deleting

    def lws_pods(self, lws: LWS) -> list[kinds.Pod]:
        meta = kinds.leaderworkerset(lws).meta
        return [kinds.pod(p) for p in self.kube.list_pages(api_path("v1", "pods", meta.namespace),
                                                           labelSelector=f"{names.LABEL_LWS_NAME}={meta.name}")[0]]

    def sync_lws(self, lws: LWS, write: bool = True) -> LwsResolution:
        # these rules' one home (docs/design.md: LWS/opt-in, LWS/stale-podgroups-deleted)
        lws = kinds.leaderworkerset(lws)
        try:
            raw = raw_scheduling(lws)
        except ConfigError as err:
            return self._invalid_lws(lws, [str(err)], write)
        if raw is None:
            return LwsResolution()
        errors = validate_lws(lws)
        if errors:
            return self._invalid_lws(lws, errors, write)
        sched = resolve_lws(raw)
        pods = self.lws_pods(lws)
        leaders = {m.group_index: m for pod in pods if (m := member(pod)) and m.leader and not pod.meta.deleting}
        found = LwsResolution(pods=pods, sched=sched)
        workload = self._lws_workload(lws, sched, leaders, write)
        if workload is None:
            found.why = "the Workload is not created yet"
            return found
        self._sync_podgroups(lws, workload, sched, leaders, found, write)
        return found

    def _sync_podgroups(self, lws: kinds.LeaderWorkerSet, workload: kinds.Workload, sched: LwsScheduling,
                        leaders: dict[str, Member], found: LwsResolution, write: bool) -> None:
        """The LWS's PodGroups as the guide's level wants them: created, minCount synced, and (but at
        the whole-LWS level) those of replicas gone deleted."""
        existing = {g.meta.name: g for g in self._podgroups(lws.meta.namespace)
                    if g.workload_name == workload.meta.name and not _stale(g.meta, lws)}
        wanted = wanted_podgroups(lws, sched, leaders)
        for want in wanted:
            group = existing.get(want.name)
            if group is None:
                if not write:
                    continue
                body = compile_podgroup(lws, workload, want, sched.level, self.flavor)
                found.groups[want.name] = self._create(lws, "podgroups", body, names.EVENT_PODGROUP_CREATED)
                found.created.add(want.name)
            elif write and group.meta.managed and group.fields.min_count is not None:
                found.groups[want.name] = self._sync_min_count(group.raw, group.meta, "/spec", group.fields,
                                                               want.min_count, "podgroups")
            else:
                found.groups[want.name] = group.raw
        if write and sched.level != LEVEL_WHOLE:
            keep = {w.name for w in wanted}
            for name, group in existing.items():
                if name not in keep and group.meta.managed and not group.meta.deleting:
                    self._delete_podgroup(group)

    def _invalid_lws(self, lws: kinds.LeaderWorkerSet, errors: list[str], write: bool) -> LwsResolution:
        return LwsResolution(why=self._invalid(lws, errors, write).why)  # the event, the metric

    def _lws_workload(self, lws: kinds.LeaderWorkerSet, sched: LwsScheduling, leaders: Mapping[str, Member],
                      write: bool) -> kinds.Workload | None:
        ref = kinds.ControllerRef(names.LWS_API_GROUP, OWNER[1], lws.meta.name)
        found = [w for w in self._workloads(lws.meta.namespace) if w.controller_ref == ref and not _stale(w.meta, lws)]
        if len(found) > 1:
            self._ambiguous(lws, "Workloads", [w.meta for w in found], write)
            return None
        if not found:
            if not write:
                return None
            return kinds.workload(self._create(lws, "workloads", compile_workload(lws, sched, self.flavor, leaders),
                                               names.EVENT_WORKLOAD_CREATED))
        workload = found[0]
        if write and workload.meta.managed:
            counts = template_min_counts(lws, sched, leaders)
            for i, template in enumerate(workload.templates):
                if template.name in counts:
                    workload = kinds.workload(self._sync_min_count(
                        workload.raw, workload.meta, f"/spec/podGroupTemplates/{i}", template.fields,
                        counts[template.name], "workloads"))
        return workload

    def _delete_podgroup(self, group: kinds.PodGroup) -> None:
        """A PodGroup no live leader names (its leader was deleted, or replaced by the rollout):
        deleted; the protection finalizer keeps it while a terminating pod still names it."""
        meta = group.meta
        try:
            self.kube.delete(self.flavor.path("podgroups", meta.namespace, meta.name),
                             {"preconditions": {"uid": meta.uid}})
        except KubeError as err:
            if err.status not in (404, 409):
                raise CreationFailed(f"deleting PodGroup {meta.name}: {err}") from err

    def reconcile_lws(self, namespace: str, name: str) -> tuple[bool, bool]:
        """One reconcile of the LWS ``namespace/name``: sync, then lift the gate of pods whose
        PodGroup is in sync. Returns (the LWS exists, reconcile again shortly): a PodGroup created
        by this sync has its pods released by the next one, so that every watcher (phalanx serve's
        cache above all) has seen the PodGroup before kube-scheduler sees its pods."""
        # the rule's one home (docs/design.md: LWS/workload-first)
        raw = self.kube.get_or_none(lws_path(namespace, name))
        if raw is None:
            return False, False
        lws = kinds.leaderworkerset(raw)
        if lws.meta.deleting:
            return True, False
        try:
            found = self.sync_lws(lws)
        except StatefulSetGone:
            return True, False
        for group_name, group in found.groups.items():
            if group_name not in found.created and complete(group, found.pods, self.flavor):
                self.release_pods(lws, group, found.pods)
        return True, bool(found.created)


def complete(group: kinds.PodGroup | Mapping[str, Any], pods: Sequence[kinds.Pod | Mapping[str, Any]],
             flavor: objects.Flavor) -> bool:
    """A gang's pods are released together, once minCount of them exist (LWS creates a replica's
    leader before its workers): kube-scheduler then takes them as one group, and none is parked as
    "waiting for members". Beyond minCount (a surge or replacement replica while the running pods
    meet it) each new pod is released as it comes. Basic groups are released at once."""
    group = kinds.podgroup(group)
    target = group.fields.min_count
    if target is None:
        return True
    present = sum(1 for p in map(kinds.pod, pods) if p.group == group.meta.name and not p.meta.deleting
                  and p.phase not in ("Succeeded", "Failed"))
    return present >= target
