"""The cluster as phalanx sees it: a watch cache of small immutable records, fed by events.

Both backends — the real API server (list + watch) and the simulated cluster — feed the same
:class:`ClusterCache` through one method, :meth:`ClusterCache.apply`, with the raw JSON of an
ADDED / MODIFIED / DELETED event. Code above the cache cannot tell the backends apart.

Object life cycle, in one place::

    event(ADDED|MODIFIED, obj) --convert--> record replaces the previous one (indexes updated)
    event(DELETED, obj)        ----------> record removed (indexes updated)
    malformed obj              ----------> skipped with a warning; ``skipped`` counter +1;
                                           the previous record (if any) is kept

Pods are indexed by node, by PodGroup and by the claims they mount; per-node usage (requests of
bound, non-terminal pods) is maintained incrementally so a snapshot costs O(nodes), not O(pods).
A pod's claims are resolved (:mod:`cluster.volumes`) when the pod arrives and again whenever one of
its PVCs, their PVs or a StorageClass changes, so a claim the PV controller binds later shows up
in the members next time they are read. A pod that fails to convert is also remembered in
``invalid_pods`` (uid -> group, pod, error) until it converts, is deleted or disappears in a re-list,
so its group can say why it waits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence, TypeGuard

import numpy as np

from solver import (
    DisruptionMode,
    InvalidInput,
    Node,
    Pod,
    PodGroup,
    PreemptionContext,
    Snapshot,
    VictimInfo,
    VolumeInventory,
)
from solver.composite import MAX_DEPTH as COMPOSITE_MAX_DEPTH
from solver.composite import Composite
from solver.model import PODS

from . import kinds, names
from .convert import (
    ClaimInfo,
    ClaimRef,
    ClassInfo,
    CompositeRecord,
    PdbRecord,
    PodGroupRecord,
    VolumeInfo,
    claim_from_json,
    composite_record,
    conditions_from_json,
    csinode_limits,
    disruption_budget,
    namespace_labels,
    node_from_json,
    pdb_record,
    pod_claims,
    pod_from_json,
    pod_group_key,
    podgroup_of,
    podgroup_record,
    storage_class_from_json,
    volume_from_json,
)
from .karpenter import NodeClaimRecord, NodePoolRecord, nodeclaim_record, nodepool_record
from .provisioning import ProvisioningRecord, provisioning_record
from .volumes import resolve_claims, volume_inventory

log = logging.getLogger("phalanx.cache")

#: kinds whose records feed the volume and inter-pod rules, and their converters
STORAGE_KINDS: Mapping[str, Callable[[Mapping[str, Any]], Any]] = {
    "PersistentVolumeClaim": claim_from_json,
    "PersistentVolume": volume_from_json,
    "StorageClass": storage_class_from_json,
    "CSINode": csinode_limits,
    "Namespace": namespace_labels,
}
KINDS = ("Node", "Pod", "PodGroup", "Workload", "PriorityClass", "PodDisruptionBudget", "ProvisioningRequest",
         "CompositePodGroup", "NodeClaim", "NodePool", *STORAGE_KINDS)
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodRecord:
    """A pod as phalanx needs it: the solver record plus life-cycle facts."""

    pod: Pod
    phase: str = "Pending"
    owner_kind: str = ""
    owner_name: str = ""
    gated: bool = False  # has scheduling gates: not yet schedulable
    terminating: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    disrupted: bool = False  # carries the DisruptionTarget condition (evicted or preempted)
    claims: tuple[ClaimRef, ...] = ()  # the PVCs it mounts (``pod.volumes`` holds them resolved)
    scheduler_name: str = names.DEFAULT_SCHEDULER  # the profile of kube-scheduler that places it
    generation: int = 0  # metadata.generation (0: not set): its spec read again only when it moves

    @property
    def active(self) -> bool:
        """Holds resources: not finished. (A terminating pod still holds them until it is gone.)"""
        return self.phase not in TERMINAL_PHASES


@dataclass(frozen=True)
class CacheEvent:
    """One change the cache applied, as its listeners get it: the kind, the watch event's type, the
    object's key (a pod's uid; ``namespace/name`` or a cluster-scoped name otherwise), its record
    as the cache now holds it (None once deleted) and, for a pod, its record before the change."""

    kind: str
    type: str  # ADDED | MODIFIED | DELETED
    key: str
    record: Any = None
    previous: Any = None  # Pod events: the record before (None: the pod was not held)

    @property
    def deleted(self) -> bool:
        return self.record is None

    @property
    def pod(self) -> "PodRecord | None":
        """The pod's record, for a Pod event that did not delete it."""
        return self.record if self.kind == "Pod" and isinstance(self.record, PodRecord) else None

    @property
    def groups(self) -> frozenset[str]:
        """The PodGroups the change touches: a PodGroup's own key; the group a pod names before
        and after it (a deleted pod's from its previous record)."""
        if self.kind == "PodGroup":
            return frozenset((self.key,))
        if self.kind != "Pod":
            return frozenset()
        return frozenset(r.pod.group for r in (self.previous, self.record) if isinstance(r, PodRecord) and r.pod.group)


CacheListener = Callable[[CacheEvent], None]


@dataclass(frozen=True)
class InvalidPod:
    """A pod that failed to convert: which group it names, the pod, and why."""

    uid: str
    group: str  # namespace/name, "" when it names none
    pod: str  # namespace/name
    error: str


def _pod_record(obj: Mapping[str, Any], previous: PodRecord | None = None) -> PodRecord:
    """A pod as the cache keeps it: the solver's pod (cluster.convert) and what the cycle reads of its
    object (cluster.kinds: owner, gates, phase, deletion), read once when its event arrives.

    The solver's pod is read from the name, labels and spec only. The API server bumps a pod's
    ``metadata.generation`` on every change of its spec but one, the binding's ``nodeName``
    (k8s.io/kubernetes v1.37.2, pkg/registry/core/pod: ``updatePodGeneration``; the binding
    subresource sets the node without it). So an update of ``previous`` at the same generation
    with the same labels — the binding, and each status update after it — keeps ``previous``'s
    solver pod with the new node, instead of reading the spec again: two of a pod's three reads."""
    pod = _same_spec(obj, previous) or pod_from_json(obj)
    view = kinds.pod(obj)
    owner = view.meta.controller
    return PodRecord(
        pod=pod,
        phase=view.phase or "Pending",
        owner_kind=owner.kind if owner else "",
        owner_name=owner.name if owner else "",
        gated=bool(view.gates),
        terminating=view.meta.deleting,
        labels=pod.labels,
        disrupted=any(c.type == names.CONDITION_DISRUPTION_TARGET and c.status == "True"
                      for c in conditions_from_json(obj)),
        claims=pod_claims(obj),
        scheduler_name=view.scheduler_name,
        generation=_generation(obj),
    )


def _generation(obj: Mapping[str, Any]) -> int:
    generation = (obj.get("metadata") or {}).get("generation")
    return generation if type(generation) is int and generation > 0 else 0


def _same_spec(obj: Mapping[str, Any], previous: PodRecord | None) -> Pod | None:
    """``previous``'s solver pod (with ``obj``'s node) when ``obj`` is the same pod at the same
    generation with the same labels; None when it must be read (see :func:`_pod_record`)."""
    if previous is None or previous.generation <= 0:
        return None
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if type(meta) is not dict or type(spec) is not dict or meta.get("generation") != previous.generation:
        return None
    if (meta.get("labels") or {}) != previous.pod.labels:
        return None
    node = spec.get("nodeName") or ""
    if type(node) is not str:
        return None  # malformed: the full read says so
    return previous.pod if node == previous.pod.node else replace(previous.pod, node=node)


def _placed(record: PodRecord | None) -> TypeGuard[PodRecord]:
    """Sits on a node for the snapshot's bound pods."""
    return record is not None and bool(record.pod.node) and record.active


def _discard(index: dict[str, set[str]], key: str, uid: str) -> None:
    """Take ``uid`` out of ``index[key]``, and the key out once its set is empty."""
    members = index.get(key)
    if members:
        members.discard(uid)
        if not members:
            del index[key]


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class ClusterCache:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, PodRecord] = {}  # by uid
        self.podgroups: dict[str, PodGroupRecord] = {}  # by namespace/name
        self.composites: dict[str, CompositeRecord] = {}  # CompositePodGroups, by namespace/name
        self.workloads: dict[str, kinds.Workload] = {}
        self.priority_classes: dict[str, int] = {}
        self.pdbs: dict[str, PdbRecord] = {}
        self.provisioning_requests: dict[str, ProvisioningRecord] = {}  # by namespace/name
        self.nodeclaims: dict[str, NodeClaimRecord] = {}  # Karpenter's, by name (watched with --provisioner karpenter)
        self.nodepools: dict[str, NodePoolRecord] = {}  # by name
        self.claims: dict[str, ClaimInfo] = {}  # by namespace/name
        self.persistent_volumes: dict[str, VolumeInfo] = {}  # by name
        self.storage_classes: dict[str, ClassInfo] = {}  # by name
        self.csinodes: dict[str, Mapping[str, int]] = {}  # node -> CSI driver -> attach limit
        self.namespaces: dict[str, Mapping[str, str]] = {}  # name -> labels
        self.invalid_pods: dict[str, InvalidPod] = {}  # by uid: pods that failed to convert
        self.invalid_podgroups: dict[str, str] = {}  # namespace/name -> why it failed to convert
        self.pods_by_node: dict[str, set[str]] = {}
        self.pods_by_group: dict[str, set[str]] = {}
        self.pods_by_claim: dict[str, set[str]] = {}
        self.usage: dict[str, dict[str, int]] = {}  # node -> requests of active bound pods (nodes with some)
        # the nodes as a solver snapshot, rebuilt only when a node's record changes, and the usage
        # matrix aligned with it, kept incrementally, so a cycle's snapshot is one matrix copy
        self._base: Snapshot | None = None
        self._used: np.ndarray | None = None
        self.nodes_version = 0  # moves on with every change of a node's record
        # the bound pods as one tuple and the volume inventory, rebuilt only after a change to them;
        # the tuple is made from ``_on_nodes`` (uid -> pod, in ``pods``' order: active pods bound to a
        # known node), kept beside ``pods`` so that a binding costs one entry, not a pass over every pod
        self._bound: tuple[Pod, ...] | None = None
        self._on_nodes: dict[str, Pod] | None = None  # None: rebuilt from ``pods`` when next read
        self._anti: set[str] = set()  # the uids in ``_on_nodes`` with required anti-affinity
        self._inventory: VolumeInventory | None = None
        self.skipped = 0  # malformed objects ignored
        self.version = 0  # bumps on every applied change
        self.capacity_version = 0  # bumps when room may have appeared: a node added/changed, a bound pod gone
        self._listeners: list[CacheListener] = []

    # -- feeding ------------------------------------------------------------------------------
    def subscribe(self, listener: CacheListener) -> None:
        """``listener(event)`` after each applied change (on the thread that applied it)."""
        self._listeners.append(listener)

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event. Returns False (and counts it) when the object is malformed."""
        try:
            with self._lock:
                key, record, previous = self._apply(kind, event_type, obj)
                self.version += 1
        except (InvalidInput, KeyError, TypeError, ValueError, AttributeError) as err:
            self.skipped += 1
            log.warning("skipping malformed %s %s: %s", kind, _safe_key(obj), err)
            if kind == "PodGroup":
                with self._lock:  # its members' answers say why it is not read
                    self.invalid_podgroups[_safe_key(obj)] = str(err)
            return False
        event = CacheEvent(kind, event_type, key, record, previous)
        for listener in self._listeners:
            listener(event)
        return True

    def replace(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        """A full re-list: drop every record of ``kind`` not in ``objects``, apply the rest."""
        with self._lock:
            if kind == "Pod":
                keep = {str((o.get("metadata") or {}).get("uid", "")) for o in objects}
                for uid in [u for u in self.pods if u not in keep]:
                    self._note_bound_change(self._remove_pod(uid), None)
                for uid in [u for u in self.invalid_pods if u not in keep]:
                    del self.invalid_pods[uid]
            else:
                keep = {_key(o) for o in objects}
                for key in [k for k in self._store(kind) if k not in keep]:
                    self._delete(kind, key)
                if kind == "PodGroup":
                    for key in [k for k in self.invalid_podgroups if k not in keep]:
                        del self.invalid_podgroups[key]
            self.version += 1
        for obj in objects:
            self.apply(kind, "ADDED", obj)

    def _store(self, kind: str) -> dict[str, Any]:
        stores: dict[str, dict[str, Any]] = {
            "Node": self.nodes, "PodGroup": self.podgroups, "Workload": self.workloads,
            "PriorityClass": self.priority_classes, "PodDisruptionBudget": self.pdbs,
            "ProvisioningRequest": self.provisioning_requests, "CompositePodGroup": self.composites,
            "NodeClaim": self.nodeclaims, "NodePool": self.nodepools,
            "PersistentVolumeClaim": self.claims, "PersistentVolume": self.persistent_volumes,
            "StorageClass": self.storage_classes, "CSINode": self.csinodes, "Namespace": self.namespaces}
        return stores[kind]

    def _apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> tuple[str, Any, Any]:
        """Apply one event under the lock: the object's key, its record (None once deleted) and, for
        a pod, its record before (None otherwise)."""
        deleted = event_type == "DELETED"
        if kind == "Pod":
            return self._apply_pod(deleted, obj)
        if kind not in KINDS:
            raise InvalidInput(f"unknown kind {kind!r}")
        store = self._store(kind)
        key = _key(obj)
        if key == "None":
            raise InvalidInput(f"{kind}: metadata.name is missing")
        if kind == "PodGroup":
            self.invalid_podgroups.pop(key, None)  # deleted, or read again below
        if deleted:
            self._delete(kind, key)
            return key, None, None
        record: Any
        if kind == "Node":
            record = node_from_json(obj)
            if self.nodes.get(key) != record:  # heartbeats change nothing phalanx reads
                self._nodes_changed()
                self.capacity_version += 1
        elif kind in STORAGE_KINDS:
            stored = STORAGE_KINDS[kind](obj)
            previous = store.get(key)
            store[key] = stored
            self._storage_changed(kind, previous, stored)
            return key, stored, None
        else:  # read now, so a malformed object is skipped here, not mid-cycle
            record = RECORDS[kind](obj)
        store[key] = record
        return key, record, None

    def _apply_pod(self, deleted: bool, obj: Mapping[str, Any]) -> tuple[str, PodRecord | None, PodRecord | None]:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if not uid:
            raise InvalidInput(f"pod {_safe_key(obj)}: metadata.uid is missing")
        # convert first: a bad object changes nothing (but is remembered for its group)
        record = None if deleted else self._resolved(self._convert_pod(uid, obj, self.pods.get(uid)))
        if deleted:
            self.invalid_pods.pop(uid, None)
        previous = self._remove_pod(uid)
        self._note_bound_change(previous, record)
        if previous is not None and previous.pod.node and previous.active and not (
            record is not None and record.pod.node and record.active
        ):
            self.capacity_version += 1  # a bound pod went away or finished: room was freed
        if record is not None:
            self._add_pod(record)
        return uid, record, previous

    def _delete(self, kind: str, key: str) -> None:
        """Forget the record ``key`` of ``kind`` (not Pod), with whatever depended on it."""
        previous = self._store(kind).pop(key, None)
        if previous is None:
            return
        if kind == "Node":
            self._nodes_changed()
        elif kind in STORAGE_KINDS:
            self._storage_changed(kind, previous, None)

    def _nodes_changed(self) -> None:
        self.nodes_version += 1
        self._base = None
        self._bound = self._on_nodes = None  # the bound pods listed are those on known nodes

    def _convert_pod(self, uid: str, obj: Mapping[str, Any], previous: PodRecord | None = None) -> PodRecord:
        """The pod's record (``previous``: the one held); a pod that does not convert is remembered
        in ``invalid_pods``."""
        try:
            record = _pod_record(obj, previous)
        except (InvalidInput, KeyError, TypeError, ValueError, AttributeError) as err:
            self.invalid_pods[uid] = InvalidPod(uid, pod_group_key(obj), _safe_key(obj), str(err))
            raise
        self.invalid_pods.pop(uid, None)
        return record

    def _resolved(self, record: PodRecord) -> PodRecord:
        """``record`` with its claims resolved against the current PVCs, PVs and StorageClasses."""
        if not record.claims:
            return record
        volumes = resolve_claims(record.claims, record.pod.uid, self.claims, self.persistent_volumes,
                                 self.storage_classes)
        return record if volumes == record.pod.volumes else replace(record, pod=replace(record.pod, volumes=volumes))

    def _storage_changed(self, kind: str, previous: Any, record: Any) -> None:
        """A PVC, PV, StorageClass, CSINode or Namespace changed: re-resolve the pods whose claims
        it touches, drop the volume inventory, and note that room may have appeared."""
        if previous == record:
            return
        self.capacity_version += 1
        if kind == "Namespace":
            return
        self._inventory = None
        if kind == "PersistentVolumeClaim":
            self._reresolve({(previous or record).name})
        elif kind == "PersistentVolume":
            self._reresolve({v.volume.claim_ref for v in (previous, record) if v is not None} - {""})
        elif kind == "StorageClass":
            self._reresolve(set(self.pods_by_claim))

    def _reresolve(self, claims: set[str]) -> None:
        uids = set().union(*(self.pods_by_claim.get(c, ()) for c in claims))
        for uid in uids:
            before = self.pods[uid]
            after = self._resolved(before)
            if after is not before:
                self.pods[uid] = after
                if self._on_nodes is not None and uid in self._on_nodes:
                    self._on_nodes[uid] = after.pod
                self._note_bound_change(before, after)

    def _note_bound_change(self, before: PodRecord | None, after: PodRecord | None) -> None:
        """Drop the cached bound-pod tuple when a change touches a bound pod as the solver sees it
        (status-only updates of a running pod keep it)."""
        if not (_placed(before) or _placed(after)):
            return
        if _placed(before) and _placed(after) and before.pod == after.pod and before.pod.labels == after.pod.labels:
            return
        self._bound = None

    def _add_pod(self, record: PodRecord) -> None:
        pod = record.pod
        self.pods[pod.uid] = record
        for claim in record.claims:
            self.pods_by_claim.setdefault(claim.name, set()).add(pod.uid)
        if pod.group:
            self.pods_by_group.setdefault(pod.group, set()).add(pod.uid)
        if pod.node:
            self.pods_by_node.setdefault(pod.node, set()).add(pod.uid)
            if record.active:
                self._charge(pod, +1)
                if self._on_nodes is not None and pod.node in self.nodes:
                    self._on_nodes[pod.uid] = pod
                    if pod.spec.pod_anti_affinity:
                        self._anti.add(pod.uid)

    def _remove_pod(self, uid: str) -> PodRecord | None:
        record = self.pods.pop(uid, None)
        if record is None:
            return None
        if self._on_nodes is not None:
            self._on_nodes.pop(uid, None)
            self._anti.discard(uid)
        pod = record.pod
        for claim in record.claims:
            _discard(self.pods_by_claim, claim.name, uid)
        if pod.group:
            _discard(self.pods_by_group, pod.group, uid)
        if pod.node:
            _discard(self.pods_by_node, pod.node, uid)
            if record.active:
                self._charge(pod, -1)
        return record

    def _charge(self, pod: Pod, sign: int) -> None:
        slot = self.usage.setdefault(pod.node, {})
        slot[PODS] = slot.get(PODS, 0) + sign
        for r, amount in pod.spec.requests.items():
            slot[r] = slot.get(r, 0) + sign * amount
        if slot[PODS] <= 0:  # its last active pod went: no entry, or every node name ever used stays
            del self.usage[pod.node]
        base, used = self._base, self._used
        if base is not None and used is not None:
            i = base.index.get(pod.node)
            if i is not None:
                used[i, base.rindex[PODS]] += sign
                for r, amount in pod.spec.requests.items():
                    j = base.rindex.get(r)
                    if j is not None:
                        used[i, j] += sign * amount

    def _base_snapshot(self) -> tuple[Snapshot, np.ndarray]:
        if self._base is None or self._used is None:  # (set together)
            base = Snapshot(list(self.nodes.values()))
            used = base.used.copy()
            for node, amounts in self.usage.items():
                i = base.index.get(node)
                if i is None:
                    continue
                for r, amount in amounts.items():
                    j = base.rindex.get(r)
                    if j is not None:
                        used[i, j] += amount
            self._base, self._used = base, used
        return self._base, self._used

    # -- reading -----------------------------------------------------------------------------
    def pod_slots(self) -> int:
        """How many pods all nodes together may run (their allocatable ``pods`` summed): a gang
        needing more can never be placed, whatever else happens (read from the node snapshot,
        rebuilt only when a node changes)."""
        with self._lock:
            base, _ = self._base_snapshot()
        j = base.rindex.get(PODS)
        return int(base.allocatable[:, j].sum()) if j is not None else 0

    def empty_snapshot(self) -> tuple[Snapshot, int]:
        """The nodes alone, as if no pod ran and nothing were reserved, and the ``nodes_version``
        it was read at."""
        with self._lock:
            base, _ = self._base_snapshot()
            return base, self.nodes_version

    def bound_node(self, uid: str) -> str:
        """The node pod ``uid`` is bound to, "" when it is unbound or unknown."""
        record = self.pods.get(uid)
        return record.pod.node if record else ""

    def members(self, group_key: str) -> list[PodRecord]:
        """Non-terminal pods that name the group, in a stable order."""
        with self._lock:
            uids = self.pods_by_group.get(group_key, ())
            records = [self.pods[u] for u in uids if self.pods[u].active and not self.pods[u].terminating]
        return sorted(records, key=lambda r: r.pod.name)

    # the rule's one home (docs/design.md: phalanx/gang-history)
    def finished_members(self, group_key: str) -> list[PodRecord]:
        """Members that ran and finished and still count toward the gang's minCount, one per slot.

        A member finishes only after it ran, and a gang member runs only once its gang was placed
        whole, so a finished member is itself the record that the gang was admitted: no state to
        keep, the same after a restart and in both API flavors. A slot is what a replacement
        keeps: an Indexed Job's completion index, else the pod's name (StatefulSet and
        LeaderWorkerSet pods are recreated under their name). A Succeeded member's slot is done
        for good; a Failed one counts while no live member holds its slot — its owner has not
        replaced it (yet), or never will (a Job's index past its backoffLimitPerIndex). A Failed
        pod of a Job without completion indexes does not count: that Job replaces it under a
        new name. Terminating pods never count."""
        with self._lock:
            records = [self.pods[u] for u in self.pods_by_group.get(group_key, ())]
        ended = [r for r in records if not r.active and not r.terminating]
        if not ended:
            return []  # the common case, on every cycle's path: one pass, nothing built
        held = {_slot(r) for r in records if r.active and not r.terminating}
        finished: dict[str, PodRecord] = {}
        # a Succeeded one stands for its slot
        for r in sorted(ended, key=lambda r: (r.phase != "Succeeded", r.pod.name)):
            if _slot(r) in held:
                continue
            if r.phase == "Failed" and r.owner_kind == "Job" and names.LABEL_JOB_COMPLETION_INDEX not in r.labels:
                continue
            finished.setdefault(_slot(r), r)
        return sorted(finished.values(), key=lambda r: r.pod.name)

    def podgroup(self, group_key: str, members: list[PodRecord] | None = None) -> PodGroup | None:
        """The solver's view of a PodGroup with its current (non-gated) members and the count of
        its finished ones, or None when the PodGroup object does not exist (yet)."""
        with self._lock:
            record = self.podgroups.get(group_key)
        if record is None:
            return None
        records = members if members is not None else self.members(group_key)
        pods = tuple(r.pod for r in records if not r.gated)
        return podgroup_of(record, pods, self.priority_classes, finished=len(self.finished_members(group_key)))

    def composite_root(self, group_key: str) -> str:
        """The root CompositePodGroup (namespace/name) of the tree the PodGroup ``group_key`` is a
        leaf of, or "" when it names no parent. A parent not seen (yet), or a chain deeper than
        upstream allows or looping, still gives the last composite reached: the tree is then not
        ready (:meth:`composite`)."""
        with self._lock:
            record = self.podgroups.get(group_key)
            if record is None or not record.parent:
                return ""
            key = f"{record.namespace}/{record.parent}"
            for _ in range(COMPOSITE_MAX_DEPTH):
                parent = self.composites.get(key)
                if parent is None or not parent.parent:
                    return key
                key = f"{parent.namespace}/{parent.parent}"
            return key

    def composite(self, key: str) -> Composite | str:
        """The solver's view of the CompositePodGroup ``key`` and its subtree (children: the
        PodGroups and CompositePodGroups of its namespace naming it as parent, in name order), or
        why it cannot be planned yet: the composite not seen, or a tree deeper than upstream allows."""
        with self._lock:
            children_of: dict[str, list[str]] = {}
            for table, kind in ((self.podgroups, "pg"), (self.composites, "cpg")):
                for child_key, child in table.items():
                    if child.parent:
                        children_of.setdefault(f"{child.namespace}/{child.parent}", []).append(f"{kind}:{child_key}")
            composites = dict(self.composites)

        def build(at: str, depth: int) -> Composite | str:
            record = composites.get(at)
            if record is None:
                return f"compositepodgroup {at} does not exist (yet)"
            if depth > COMPOSITE_MAX_DEPTH:
                return f"compositepodgroup {at}: the tree is deeper than {COMPOSITE_MAX_DEPTH} levels"
            children: list[PodGroup | Composite] = []
            for tagged in sorted(children_of.get(at, ())):
                kind, child_key = tagged.split(":", 1)
                child = build(child_key, depth + 1) if kind == "cpg" else self.podgroup(child_key)
                if isinstance(child, str):
                    return child
                if child is not None:
                    children.append(child)
            spec = record.spec
            priority = self.priority_classes.get(spec.priority_class)
            try:
                return Composite(record.namespace, record.name, tuple(children), spec.policy, spec.min_count,
                                 spec.topology_key, priority if priority is not None else spec.priority or 0,
                                 spec.disruption_mode)
            except InvalidInput as err:
                return str(err)
        return build(key, 1)

    # the rule's one home (docs/design.md: composite/disruption-all)
    def all_composite(self, group_key: str) -> Composite | None:
        """The outermost CompositePodGroup above the PodGroup ``group_key`` whose disruptionMode is
        ``all`` (its members go as one unit: a member lost, the whole composite is evicted; a
        preemptor evicts all of it or none), or None."""
        outermost = self._outermost_all(group_key)
        tree = self.composite(outermost) if outermost else None
        return tree if isinstance(tree, Composite) else None

    def _outermost_all(self, group_key: str) -> str:
        """The key of :meth:`all_composite`'s composite, "" none (its parent chain only, no tree built)."""
        with self._lock:
            record = self.podgroups.get(group_key)
            key = f"{record.namespace}/{record.parent}" if record is not None and record.parent else ""
            outermost = ""
            for _ in range(COMPOSITE_MAX_DEPTH):
                parent = self.composites.get(key)
                if parent is None:
                    break
                if parent.spec.disruption_mode is DisruptionMode.ALL:
                    outermost = key
                key = f"{parent.namespace}/{parent.parent}" if parent.parent else ""
        return outermost

    def invalid_members(self, group_key: str) -> list[InvalidPod]:
        """Pods naming the group that failed to convert (the group cannot be complete without them)."""
        with self._lock:
            return sorted((p for p in self.invalid_pods.values() if p.group == group_key), key=lambda p: p.pod)

    def assumed_pods(self, assignments: Mapping[str, str]) -> tuple[Pod, ...]:
        """The pods of a plan (uid -> node) as placed on their planned nodes, for a snapshot's
        ``assumed`` pods; uids unknown or already bound are left out."""
        with self._lock:
            records = [(self.pods.get(uid), node) for uid, node in assignments.items()]
        return tuple(replace(r.pod, node=node) for r, node in records if r is not None and not r.pod.node)

    def budgeted(self, uid: str) -> bool:
        """Whether a PodDisruptionBudget of the pod's namespace selects pod ``uid`` (False for a pod
        the cache does not hold)."""
        with self._lock:
            record = self.pods.get(uid)
            if record is None:
                return False
            return any(pdb.selects(record.pod.namespace, record.labels) for pdb in self.pdbs.values())

    def preemption_context(self) -> PreemptionContext:
        """Who may be evicted and at what cost: each bound pod's unit (its PodGroup's priority and
        disruption mode) and the PodDisruptionBudgets with the pods they protect."""
        with self._lock:
            groups = []
            for key in {r.pod.group for r in self.pods.values() if r.pod.node and r.pod.group}:
                try:
                    group = self.podgroup(key)
                except InvalidInput:
                    continue
                if group is not None:
                    groups.append(group)
            pods = [(r.pod.uid, r.pod.namespace, r.labels) for r in self.pods.values() if r.pod.node and r.active]
            budgets = [disruption_budget(pdb, pods) for pdb in self.pdbs.values()]
        context = PreemptionContext.from_groups(groups, budgets)
        if not self.composites:
            return context
        victims = dict(context.victims)
        trees: dict[str, Composite | str] = {}  # each `all` tree built once, however many children it has
        for group in groups:  # the leaves of an `all` composite are one unit, at the tree's priority
            key = self._outermost_all(group.key)
            if key and key not in trees:
                trees[key] = self.composite(key)
            unit = trees.get(key)
            if not isinstance(unit, Composite):
                continue
            priority = max([unit.priority, *(leaf.priority for leaf in unit.leaves())])
            for pod in group.bound:
                victims[pod.uid] = VictimInfo(priority, unit.key, DisruptionMode.ALL)
        return PreemptionContext(victims, context.budgets)

    def snapshot(self, reserved: Mapping[str, Mapping[str, int]] | None = None, with_bound: bool = True,
                 assumed: Mapping[str, str] | None = None) -> Snapshot:
        """An immutable snapshot: nodes, usage of bound pods, plus ``reserved`` capacity; the bound
        pods themselves (labels, namespaces, terms and claims: what inter-pod and volume rules
        read), the namespaces' labels and the volume inventory. ``assumed`` (uid -> node: other
        groups' plans not bound yet) adds those pods for the inter-pod rules and host ports, not
        for capacity (``reserved`` charges that). ``with_bound`` is kept for callers: bound pods
        are always listed."""
        del with_bound
        extra = self.assumed_pods(assumed) if assumed else None
        with self._lock:
            base, used = self._base_snapshot()
            snapshot = base.with_used(used, self._bound_pods(), bound_anti=bool(self._anti)).with_context(
                assumed=extra, namespaces=self.namespaces, volumes=self._volume_inventory())
        reserved = {n: a for n, a in (reserved or {}).items() if n in snapshot.index}
        return snapshot.with_usage(reserved) if reserved else snapshot

    def _bound_pods(self) -> tuple[Pod, ...]:
        if self._bound is None:
            if self._on_nodes is None:
                self._on_nodes = {u: r.pod for u, r in self.pods.items() if r.pod.node in self.nodes and r.active}
                self._anti = {u for u, p in self._on_nodes.items() if p.spec.pod_anti_affinity}
            self._bound = tuple(self._on_nodes.values())
        return self._bound

    def _volume_inventory(self) -> VolumeInventory:
        if self._inventory is None:
            self._inventory = volume_inventory(self.persistent_volumes.values(), self.claims, self.csinodes)
        return self._inventory


def _slot(record: PodRecord) -> str:
    """What a member's replacement keeps: an Indexed Job's completion index, else the pod's name."""
    index = record.labels.get(names.LABEL_JOB_COMPLETION_INDEX)
    return f"index {index}" if index is not None else record.pod.name


def priority_value(obj: Mapping[str, Any]) -> int:
    """A PriorityClass's value; raises InvalidInput when it is not an integer."""
    value = obj.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"priorityclass {_key(obj)}: value must be an integer")
    return value


#: the other kinds' readers: each object is read once, when its event arrives
RECORDS: Mapping[str, Callable[[Mapping[str, Any]], Any]] = {
    "PodGroup": podgroup_record,
    "PriorityClass": priority_value,
    "Workload": kinds.workload,
    "PodDisruptionBudget": pdb_record,
    "ProvisioningRequest": provisioning_record,
    "CompositePodGroup": composite_record,
    "NodeClaim": nodeclaim_record,
    "NodePool": nodepool_record,
}


def _safe_key(obj: Any) -> str:
    try:
        return _key(obj)
    except Exception:  # noqa: BLE001 - only for a log line about an already-broken object
        return "<unnamed>"
