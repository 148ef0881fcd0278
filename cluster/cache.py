"""The cluster as phalanx sees it: a watch cache of small immutable records, fed by events.

Both backends — the real API server (list + watch) and the simulated cluster — feed the same
:class:`ClusterCache` through one method, :meth:`ClusterCache.apply`, with the raw JSON of an
ADDED / MODIFIED / DELETED event. Code above the cache cannot tell the backends apart.

Object life cycle, in one place::

    event(ADDED|MODIFIED, obj) --convert--> record replaces the previous one (indexes updated)
    event(DELETED, obj)        ----------> record removed (indexes updated)
    malformed obj              ----------> skipped with a warning; ``skipped`` counter +1;
                                           the previous record (if any) is kept

Pods are indexed by node and by PodGroup; per-node usage (requests of bound, non-terminal pods)
is maintained incrementally so a snapshot costs O(nodes), not O(pods).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from solver import InvalidInput, Node, Pod, PodGroup, PreemptionContext, Snapshot
from solver.model import PODS

from . import names
from .convert import disruption_budget, node_from_json, pod_from_json, podgroup_from_json

log = logging.getLogger("phalanx.cache")

KINDS = ("Node", "Pod", "PodGroup", "Workload", "PriorityClass", "PodDisruptionBudget")
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

    @property
    def active(self) -> bool:
        """Holds resources: not finished. (A terminating pod still holds them until it is gone.)"""
        return self.phase not in TERMINAL_PHASES


@dataclass(frozen=True)
class PodGroupRecord:
    namespace: str
    name: str
    raw: Mapping[str, Any]  # the object as last seen (spec, status, annotations)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def annotations(self) -> Mapping[str, str]:
        return (self.raw.get("metadata") or {}).get("annotations") or {}

    @property
    def uid(self) -> str:
        return str((self.raw.get("metadata") or {}).get("uid", ""))


def _pod_record(obj: Mapping[str, Any]) -> PodRecord:
    pod = pod_from_json(obj)
    meta = obj.get("metadata") or {}
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), {})
    return PodRecord(
        pod=pod,
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        owner_kind=str(owner.get("kind", "")),
        owner_name=str(owner.get("name", "")),
        gated=bool((obj.get("spec") or {}).get("schedulingGates")),
        terminating=bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
        disrupted=any(c.get("type") == names.CONDITION_DISRUPTION_TARGET and c.get("status") == "True"
                      for c in (obj.get("status") or {}).get("conditions") or ()),
    )


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
        self.workloads: dict[str, Mapping[str, Any]] = {}
        self.priority_classes: dict[str, int] = {}
        self.pdbs: dict[str, Mapping[str, Any]] = {}
        self.pods_by_node: dict[str, set[str]] = {}
        self.pods_by_group: dict[str, set[str]] = {}
        self.usage: dict[str, dict[str, int]] = {}  # node -> requests of active bound pods
        # the nodes as a solver snapshot, rebuilt only when a node's record changes, and the usage
        # matrix aligned with it, kept incrementally, so a cycle's snapshot is one matrix copy
        self._base: Snapshot | None = None
        self._used = None
        self.skipped = 0  # malformed objects ignored
        self.version = 0  # bumps on every applied change
        self.capacity_version = 0  # bumps when room may have appeared: a node added/changed, a bound pod gone
        self._listeners: list[Callable[[str, str, Any], None]] = []

    # -- feeding ------------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[str, str, Any], None]) -> None:
        """``listener(kind, event_type, record_or_key)`` after each applied change."""
        self._listeners.append(listener)

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Apply one watch event. Returns False (and counts it) when the object is malformed."""
        try:
            with self._lock:
                record = self._apply(kind, event_type, obj)
                self.version += 1
        except (InvalidInput, KeyError, TypeError, ValueError, AttributeError) as err:
            self.skipped += 1
            log.warning("skipping malformed %s %s: %s", kind, _safe_key(obj), err)
            return False
        for listener in self._listeners:
            listener(kind, event_type, record)
        return True

    def replace(self, kind: str, objects: list[Mapping[str, Any]]) -> None:
        """A full re-list: drop every record of ``kind`` not in ``objects``, apply the rest."""
        with self._lock:
            if kind == "Pod":
                keep = {str((o.get("metadata") or {}).get("uid", "")) for o in objects}
                for uid in [u for u in self.pods if u not in keep]:
                    self._remove_pod(uid)
            else:
                store = self._store(kind)
                keep = {_key(o) for o in objects}
                for key in [k for k in store if k not in keep]:
                    del store[key]
                    if kind == "Node":
                        self._base = None
            self.version += 1
        for obj in objects:
            self.apply(kind, "ADDED", obj)

    def _store(self, kind: str) -> dict:
        return {"Node": self.nodes, "PodGroup": self.podgroups, "Workload": self.workloads,
                "PriorityClass": self.priority_classes, "PodDisruptionBudget": self.pdbs}[kind]

    def _apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> Any:
        deleted = event_type == "DELETED"
        if kind == "Pod":
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            if not uid:
                raise InvalidInput(f"pod {_safe_key(obj)}: metadata.uid is missing")
            record = None if deleted else _pod_record(obj)  # convert first: a bad object changes nothing
            previous = self.pods.get(uid)
            self._remove_pod(uid)
            if previous is not None and previous.pod.node and previous.active and not (
                record is not None and record.pod.node and record.active
            ):
                self.capacity_version += 1  # a bound pod went away or finished: room was freed
            if record is None:
                return uid
            self._add_pod(record)
            return record
        if kind not in KINDS:
            raise InvalidInput(f"unknown kind {kind!r}")
        store = self._store(kind)
        key = _key(obj)
        if key == "None":
            raise InvalidInput(f"{kind}: metadata.name is missing")
        if deleted:
            if store.pop(key, None) is not None and kind == "Node":
                self._base = None
            return key
        if kind == "Node":
            record = node_from_json(obj)
            if self.nodes.get(key) != record:  # heartbeats change nothing phalanx reads
                self._base = None
                self.capacity_version += 1
        elif kind == "PodGroup":
            podgroup_from_json(obj)  # validate now, so a bad spec is skipped here, not mid-cycle
            meta = obj.get("metadata") or {}
            record = PodGroupRecord(str(meta.get("namespace") or "default"), str(meta["name"]), obj)
        elif kind == "PriorityClass":
            value = obj.get("value")
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidInput(f"priorityclass {key}: value must be an integer")
            record = value
        else:
            record = obj
        store[key] = record
        return record

    def _add_pod(self, record: PodRecord) -> None:
        pod = record.pod
        self.pods[pod.uid] = record
        if pod.group:
            self.pods_by_group.setdefault(pod.group, set()).add(pod.uid)
        if pod.node:
            self.pods_by_node.setdefault(pod.node, set()).add(pod.uid)
            if record.active:
                self._charge(pod, +1)

    def _remove_pod(self, uid: str) -> None:
        record = self.pods.pop(uid, None)
        if record is None:
            return
        pod = record.pod
        if pod.group:
            members = self.pods_by_group.get(pod.group)
            if members:
                members.discard(uid)
                if not members:
                    del self.pods_by_group[pod.group]
        if pod.node:
            on_node = self.pods_by_node.get(pod.node)
            if on_node:
                on_node.discard(uid)
                if not on_node:
                    del self.pods_by_node[pod.node]
            if record.active:
                self._charge(pod, -1)

    def _charge(self, pod: Pod, sign: int) -> None:
        slot = self.usage.setdefault(pod.node, {})
        slot[PODS] = slot.get(PODS, 0) + sign
        for r, amount in pod.spec.requests.items():
            slot[r] = slot.get(r, 0) + sign * amount
        base = self._base
        if base is not None:
            i = base.index.get(pod.node)
            if i is not None:
                self._used[i, base.rindex[PODS]] += sign
                for r, amount in pod.spec.requests.items():
                    j = base.rindex.get(r)
                    if j is not None:
                        self._used[i, j] += sign * amount

    def _base_snapshot(self) -> Snapshot:
        if self._base is None:
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
        return self._base

    # -- reading -----------------------------------------------------------------------------
    def members(self, group_key: str) -> list[PodRecord]:
        """Non-terminal pods that name the group, in a stable order."""
        with self._lock:
            uids = self.pods_by_group.get(group_key, ())
            records = [self.pods[u] for u in uids if self.pods[u].active and not self.pods[u].terminating]
        return sorted(records, key=lambda r: r.pod.name)

    def podgroup(self, group_key: str, members: list[PodRecord] | None = None) -> PodGroup | None:
        """The solver's view of a PodGroup with its current (non-gated) members, or None when the
        PodGroup object does not exist (yet)."""
        with self._lock:
            record = self.podgroups.get(group_key)
        if record is None:
            return None
        records = members if members is not None else self.members(group_key)
        pods = tuple(r.pod for r in records if not r.gated)
        return podgroup_from_json(record.raw, pods, self.priority_classes)

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
            budgets = []
            for pdb in self.pdbs.values():
                try:
                    budgets.append(disruption_budget(pdb, pods))
                except InvalidInput as err:
                    log.warning("ignoring %s", err)
        return PreemptionContext.from_groups(groups, budgets)

    def snapshot(self, reserved: Mapping[str, Mapping[str, int]] | None = None, with_bound: bool = False) -> Snapshot:
        """An immutable snapshot: nodes, usage of bound pods, plus ``reserved`` capacity.
        ``with_bound`` also lists the bound pods themselves (preemption needs them)."""
        with self._lock:
            base = self._base_snapshot()
            bound = [r.pod for r in self.pods.values() if r.pod.node in self.nodes and r.active] if with_bound else None
            snapshot = base.with_used(self._used, bound)
        reserved = {n: a for n, a in (reserved or {}).items() if n in snapshot.index}
        return snapshot.with_usage(reserved) if reserved else snapshot

    def priority_of(self, class_name: str) -> int | None:
        with self._lock:
            return self.priority_classes.get(class_name)


def _safe_key(obj: Any) -> str:
    try:
        return _key(obj)
    except Exception:  # noqa: BLE001 - only for a log line about an already-broken object
        return "<unnamed>"
