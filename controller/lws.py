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

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from cluster import names
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


def lws_key(namespace: str, name: str) -> str:
    return f"{KEY_PREFIX}{namespace}/{name}"


def lws_path(namespace: str | None = None, name: str | None = None) -> str:
    return api_path(names.LWS_API_VERSION, "leaderworkersets", namespace, name)


def key_of(obj: Mapping[str, Any]) -> str | None:
    """The LWS key an object belongs to: LWS StatefulSets and pods by their name label, Workloads and
    PodGroups by their controller reference."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    ctrl = objects.controller_of(obj)
    if ctrl and ctrl.get("kind") == OWNER[1] and str(ctrl.get("apiVersion", "")).startswith(names.LWS_API_GROUP):
        return lws_key(ns, str(ctrl.get("name")))
    name = (meta.get("labels") or {}).get(names.LABEL_LWS_NAME)
    return lws_key(ns, name) if name else None


# -- reading an LWS and its pods (the one place their fields are parsed) ------------------------------

def replicas(lws: Mapping[str, Any]) -> int:
    value = (lws.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def size(lws: Mapping[str, Any]) -> int:
    return int(((lws.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)


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


def member(pod: Mapping[str, Any]) -> Member | None:
    """The pod as an LWS member, or None when it is not one. A worker carries its leader's name;
    a leader's group index comes from LWS's label, else from the StatefulSet's pod index."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    name = labels.get(names.LABEL_LWS_NAME)
    if not name:
        return None
    leader_name = annotations.get(names.ANNOTATION_LWS_LEADER_NAME)
    index = labels.get(names.LABEL_LWS_GROUP_INDEX) or ("" if leader_name else labels.get(names.LABEL_POD_INDEX)) or ""
    try:
        pod_size: int | None = int(annotations[names.ANNOTATION_LWS_SIZE])
    except (KeyError, ValueError):
        pod_size = None
    return Member(lws=name, leader=not leader_name, group_index=str(index),
                  revision=labels.get(names.LABEL_LWS_REVISION, ""), size=pod_size,
                  leader_name=leader_name or str(meta.get("name", "")),
                  incarnation=labels.get(names.LABEL_LWS_INCARNATION, ""))


# -- names ----------------------------------------------------------------------------------------

def workload_name(lws: Mapping[str, Any]) -> str:
    meta = lws["metadata"]
    return naming.workload_name(meta["name"], meta["uid"])


def whole_podgroup_name(lws: Mapping[str, Any]) -> str:
    """The whole-LWS PodGroup: it does not depend on a replica (nor on a revision)."""
    meta = lws["metadata"]
    return naming.fair_join([meta["name"]], naming.name_hash(meta["uid"]), naming.MAX_LABEL)


def replica_podgroup_name(lws: Mapping[str, Any], incarnation: str, group_index: str, revision: str,
                          role: str | None = None) -> str:
    """``<lws>-<uid-hash>.<incarnation>-<group-index>[-<role>]-<revision>``, at most 63 characters."""
    meta = lws["metadata"]
    tail = f"{naming.name_hash(meta['uid'])}.{incarnation}-{group_index}" + (f"-{role}" if role else "")
    return naming.fair_join([meta["name"]], f"{tail}-{revision}" if revision else tail, naming.MAX_LABEL)


def podgroup_for(lws: Mapping[str, Any], sched: LwsScheduling, pod: Member) -> str | None:
    """The PodGroup an LWS pod joins (None: a replica-level pod whose leader has no incarnation)."""
    if sched.level == LEVEL_WHOLE:
        return whole_podgroup_name(lws)
    if not pod.incarnation:
        return None
    role = ("leader" if pod.leader else "worker") if sched.level == LEVEL_ROLE else None
    return replica_podgroup_name(lws, pod.incarnation, pod.group_index, pod.revision, role)


# -- objects --------------------------------------------------------------------------------------

def whole_min_count(lws: Mapping[str, Any], leaders: Mapping[str, Member]) -> int:
    """The guide's rollout rule: replicas the rollout has not replaced yet count with their
    previous size (their leader's), the others (and missing ones) with the current size."""
    current = size(lws)
    total = sum((leaders[str(i)].size or current) if str(i) in leaders else current for i in range(replicas(lws)))
    return max(1, total)


def template_min_counts(lws: Mapping[str, Any], sched: LwsScheduling, leaders: Mapping[str, Member]) -> dict[str, int]:
    if sched.level == LEVEL_WHOLE:
        return {TEMPLATE_WHOLE: whole_min_count(lws, leaders)}
    if sched.level == LEVEL_ROLE:
        return {"leader": 1, "worker": max(1, size(lws) - 1)}
    return {TEMPLATE_REPLICA: size(lws)}


def compile_workload(lws: Mapping[str, Any], sched: LwsScheduling, flavor: objects.Flavor,
                     leaders: Mapping[str, Member]) -> dict:
    meta = lws["metadata"]
    counts = template_min_counts(lws, sched, leaders)
    return {
        "apiVersion": flavor.api_version, "kind": "Workload",
        "metadata": {
            "name": workload_name(lws), "namespace": meta["namespace"],
            "annotations": {names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE,
                            names.ANNOTATION_LWS_LEVEL: sched.level},
            "labels": {names.LABEL_LWS_NAME: meta["name"]},
            "ownerReferences": [objects.owner_ref(lws, *OWNER, controller=True)],
        },
        "spec": {
            "controllerRef": {"apiGroup": names.LWS_API_GROUP, "kind": OWNER[1], "name": meta["name"]},
            "podGroupTemplates": [{"name": t, **objects.policy_fields(c, counts[t])} for t, c in sched.units],
        },
    }


@dataclass(frozen=True)
class Wanted:
    """A PodGroup the LWS should have: its name, template, minCount and group index ("" whole)."""

    name: str
    template: str
    min_count: int
    group_index: str = ""


def wanted_podgroups(lws: Mapping[str, Any], sched: LwsScheduling, leaders: Mapping[str, Member]) -> list[Wanted]:
    if sched.level == LEVEL_WHOLE:
        return [Wanted(whole_podgroup_name(lws), TEMPLATE_WHOLE, whole_min_count(lws, leaders))]
    out = []
    for index, leader in sorted(leaders.items()):
        if not leader.incarnation:
            continue  # admitted without phalanx's webhook: not in a group
        group_size = leader.size or size(lws)
        if sched.level == LEVEL_ROLE:
            out.append(Wanted(podgroup_for(lws, sched, leader) or "", "leader", 1, index))
            if group_size > 1:
                worker = Member(leader.lws, False, index, leader.revision, leader.size, leader.leader_name,
                                leader.incarnation)
                out.append(Wanted(podgroup_for(lws, sched, worker) or "", "worker", group_size - 1, index))
        else:
            out.append(Wanted(podgroup_for(lws, sched, leader) or "", TEMPLATE_REPLICA, group_size, index))
    return out


def compile_podgroup(lws: Mapping[str, Any], workload: Mapping[str, Any], wanted: Wanted, level: str,
                     flavor: objects.Flavor) -> dict:
    template = next(t for t in workload["spec"]["podGroupTemplates"] if t["name"] == wanted.template)
    template = json.loads(json.dumps(template))
    if objects.gang_min_count(template) is not None:
        template["schedulingPolicy"]["gang"]["minCount"] = wanted.min_count
    body = objects.compile_podgroup(lws, workload, template, flavor, True, name=wanted.name, owner=OWNER)
    if klass := priority_class(lws):  # the group's priority (the API server defaults spec.priority to 0)
        body["spec"]["priorityClassName"] = klass
    body["metadata"]["annotations"][names.ANNOTATION_LWS_LEVEL] = level
    labels = {names.LABEL_LWS_NAME: lws["metadata"]["name"]}
    if wanted.group_index:
        labels[names.LABEL_LWS_GROUP_INDEX] = wanted.group_index
    body["metadata"]["labels"] = labels
    return body


# -- the reconciler -------------------------------------------------------------------------------

@dataclass
class LwsResolution:
    """What a sync found: the LWS's PodGroups by name (created or existing), its pods, or why not."""

    groups: dict = field(default_factory=dict)
    created: set = field(default_factory=set)  # names of the PodGroups this sync created
    pods: list = field(default_factory=list)
    why: str = ""
    sched: LwsScheduling | None = None


class LwsReconciler(Reconciler):
    """The StatefulSet reconciler's machinery (creates with events and the gone-check, minCount
    patches with a ``test`` op, gate lifting, cascade and finalizer) applied to LeaderWorkerSets."""

    def _alive(self, lws: Mapping[str, Any]) -> bool:
        meta = lws["metadata"]
        live = self.kube.get_or_none(lws_path(meta["namespace"], meta["name"]))
        return (live is not None and live["metadata"].get("uid") == meta.get("uid")
                and not live["metadata"].get("deletionTimestamp"))

    def lws_pods(self, lws: Mapping[str, Any]) -> list[dict]:
        meta = lws["metadata"]
        return self.kube.list_pages(api_path("v1", "pods", meta["namespace"]),
                                    labelSelector=f"{names.LABEL_LWS_NAME}={meta['name']}")[0]

    def sync_lws(self, lws: dict, write: bool = True) -> LwsResolution:
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
        leaders = {}
        for pod in pods:
            m = member(pod)
            if m and m.leader and not pod["metadata"].get("deletionTimestamp"):
                leaders[m.group_index] = m
        found = LwsResolution(pods=pods, sched=sched)
        workload = self._lws_workload(lws, sched, leaders, write)
        if workload is None:
            found.why = "the Workload is not created yet"
            return found
        ns = lws["metadata"]["namespace"]
        mine = workload["metadata"]["name"]
        existing = {g["metadata"]["name"]: g for g in self._list(self.flavor.path("podgroups", ns))
                    if ((g.get("spec") or {}).get("workloadRef") or {}).get("workloadName") == mine
                    and not _stale(g, lws)}
        wanted = wanted_podgroups(lws, sched, leaders)
        for want in wanted:
            group = existing.get(want.name)
            if group is None:
                if not write:
                    continue
                body = compile_podgroup(lws, workload, want, sched.level, self.flavor)
                group = self._create(lws, "podgroups", body, names.EVENT_PODGROUP_CREATED)
                found.created.add(want.name)
            elif write and objects.is_managed(group) and objects.gang_min_count(group.get("spec") or {}) is not None:
                group = self._sync_min_count(group, "/spec", group["spec"], want.min_count, "podgroups")
            found.groups[want.name] = group
        if write and sched.level != LEVEL_WHOLE:
            keep = {w.name for w in wanted}
            for name, group in existing.items():
                if name not in keep and objects.is_managed(group) and not group["metadata"].get("deletionTimestamp"):
                    self._delete_podgroup(group)
        return found

    def _invalid_lws(self, lws: dict, errors: list[str], write: bool) -> LwsResolution:
        return LwsResolution(why=self._invalid(lws, errors, write).why)  # the event, the metric

    def _lws_workload(self, lws: dict, sched: LwsScheduling, leaders: Mapping[str, Member], write: bool) -> dict | None:
        ns, name = lws["metadata"]["namespace"], lws["metadata"]["name"]
        ref = {"apiGroup": names.LWS_API_GROUP, "kind": OWNER[1], "name": name}
        found = [w for w in self._list(self.flavor.path("workloads", ns))
                 if (w.get("spec") or {}).get("controllerRef") == ref and not _stale(w, lws)]
        if len(found) > 1:
            self._ambiguous(lws, "Workloads", found, write)
            return None
        if not found:
            if not write:
                return None
            return self._create(lws, "workloads", compile_workload(lws, sched, self.flavor, leaders),
                                names.EVENT_WORKLOAD_CREATED)
        workload = found[0]
        if write and objects.is_managed(workload):
            counts = template_min_counts(lws, sched, leaders)
            for i, template in enumerate((workload.get("spec") or {}).get("podGroupTemplates") or []):
                if template.get("name") in counts:
                    workload = self._sync_min_count(workload, f"/spec/podGroupTemplates/{i}", template,
                                                    counts[template["name"]], "workloads")
        return workload

    def _delete_podgroup(self, group: Mapping[str, Any]) -> None:
        """A PodGroup no live leader names (its leader was deleted, or replaced by the rollout):
        deleted; the protection finalizer keeps it while a terminating pod still names it."""
        meta = group["metadata"]
        try:
            self.kube.delete(self.flavor.path("podgroups", meta["namespace"], meta["name"]),
                             {"preconditions": {"uid": meta["uid"]}})
        except KubeError as err:
            if err.status not in (404, 409):
                raise CreationFailed(f"deleting PodGroup {meta['name']}: {err}") from err

    def reconcile_lws(self, namespace: str, name: str) -> tuple[bool, bool]:
        """One reconcile of the LWS ``namespace/name``: sync, then lift the gate of pods whose
        PodGroup is in sync. Returns (the LWS exists, reconcile again shortly): a PodGroup created
        by this sync has its pods released by the next one, so that every watcher (phalanx serve's
        cache above all) has seen the PodGroup before kube-scheduler sees its pods."""
        lws = self.kube.get_or_none(lws_path(namespace, name))
        if lws is None:
            return False, False
        if lws["metadata"].get("deletionTimestamp"):
            return True, False
        try:
            found = self.sync_lws(lws)
        except StatefulSetGone:
            return True, False
        for group_name, group in found.groups.items():
            if group_name not in found.created and complete(group, found.pods, self.flavor):
                self.release_pods(lws, group, found.pods)
        return True, bool(found.created)


def complete(group: Mapping[str, Any], pods: list[dict], flavor: objects.Flavor) -> bool:
    """A gang's pods are released together, once minCount of them exist (LWS creates a replica's
    leader before its workers): kube-scheduler then takes them as one group, and none is parked as
    "waiting for members". Beyond minCount (a surge or replacement replica while the running pods
    meet it) each new pod is released as it comes. Basic groups are released at once."""
    target = objects.gang_min_count(group.get("spec") or {})
    if target is None:
        return True
    name = group["metadata"]["name"]
    present = sum(1 for p in pods if flavor.pod_group_of(p) == name and not p["metadata"].get("deletionTimestamp")
                  and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
    return present >= target
