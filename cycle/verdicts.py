"""kube-scheduler's verdicts: what phalanx cannot model, it learns from the filter calls.

Each extender filter call carries the nodes kube-scheduler's own filters passed for one pod,
judged against its cache (which counts pods waiting at phalanx's bind barrier as assumed). That
list is the pod's *verdict*: a plan that puts the pod on a node it left out will be rejected,
whatever the reason (DRA devices, an out-of-tree plugin, a rule phalanx models differently). The
cycle passes the verdicts to the solver as per-pod allowed node sets.

A verdict is kept as the nodes it *excluded* (the nodes phalanx knew at the time, minus the
candidates): a node added later was never judged and stays allowed, and a pod nothing was
excluded for needs no restriction at all — the common case costs nothing.

Life cycle of a verdict (one per pending pod uid)::

    filter(pod, candidates) --> learned (replaces the pod's previous verdict)
    pod bound / deleted, its group's plan bound --> forgotten
    pod unknown to the cache for VERDICT_TTL (a re-list dropped it unseen) --> swept
    more than MAX_VERDICTS pods --> the oldest forgotten first

A node phalanx saw added less than :data:`NEW_NODE_GRACE` seconds ago is never taken as excluded:
kube-scheduler's informer may not have it yet (its candidate list then leaves the node out
without judging it), and learning that as a verdict would keep a gang off the very room that
was just added — two nodes added back to back left a gang Unschedulable that way.

Identical excluded sets are stored once (interned): 1,000 members of a gang usually share one.

Its own lock is a leaf (nothing is called while it is held), so the cache's listeners may forget
verdicts without taking the cycle's lock.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import AbstractSet, Any, Callable, Iterable

from solver import Pod, PodGroup

#: pods with a verdict at most; beyond it the oldest is forgotten (a forgotten pod is only
#: unrestricted until its next filter call). 50,000 pending group members is far beyond any
#: cluster phalanx serves; with interned sets the cost is ~300 bytes per pod.
MAX_VERDICTS = 50_000
#: seconds a verdict is kept for a pod the cache does not know (the cache may lag a filter call by
#: a watch event, so an unknown pod is not gone at once; a re-list removes pods without an event)
VERDICT_TTL = 600.0
#: seconds between sweeps (on the requeue thread, off the cycle's lock)
SWEEP_INTERVAL = 60.0
#: seconds after phalanx sees a node added during which kube-scheduler leaving it out of a
#: candidate list is not learned (its informer may lag phalanx's watch)
NEW_NODE_GRACE = 10.0
#: seconds a transient verdict is used: a rejection for resources, which phalanx counts itself, says
#: only that kube-scheduler's cache and phalanx's differed for a moment (a pod bound while the
#: serve link was down, another gang's members assumed); both agree again once a watch event lands
TRANSIENT_VERDICT_SECONDS = 15.0


@dataclass(frozen=True)
class Verdict:
    excluded: frozenset[str]  # nodes kube-scheduler's filters left out
    shape_key: tuple[object, ...]
    portable: bool  # may stand in for an identical sibling (see Verdicts.allowed)
    at: float
    until: float = 0.0  # a transient verdict is not used past this time (0: kept until forgotten)


class Verdicts:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._by_uid: OrderedDict[str, Verdict] = OrderedDict()
        self._sets: dict[frozenset[str], list[Any]] = {}  # interned excluded set -> [the set, references]
        self._new_nodes: dict[str, float] = {}  # node -> when phalanx saw it added (within the grace)
        self._ends: list[tuple[float, str]] = []  # heap of (until, group) of transient verdicts learned

    def __len__(self) -> int:
        return len(self._by_uid)

    @property
    def distinct_sets(self) -> int:
        return len(self._sets)

    def node_added(self, name: str) -> None:
        """phalanx's cache just saw ``name`` added (the cache's listener)."""
        with self._lock:
            self._new_nodes[name] = self.clock()

    def learn(self, pod: Pod, excluded: frozenset[str], transient: bool = False,
              alive: Callable[[str], bool] | None = None) -> None:
        """kube-scheduler's filters left ``excluded`` out for ``pod`` (filter phase); nodes added
        within the grace are not counted (kube-scheduler may not know them yet). ``transient``:
        used for TRANSIENT_VERDICT_SECONDS only. ``alive(uid)``: whether the cache still has the
        pod, asked once the verdict is in: a call that raced the pod's deletion (its forget ran
        first) leaves nothing held until the sweep's VERDICT_TTL."""
        at = self.clock()
        with self._lock:
            if self._new_nodes:
                for name, seen in list(self._new_nodes.items()):
                    if at - seen >= NEW_NODE_GRACE:
                        del self._new_nodes[name]
                if self._new_nodes and not excluded.isdisjoint(self._new_nodes):
                    excluded = excluded.difference(self._new_nodes)
            self._drop(pod.uid)
            entry = self._sets.get(excluded)
            if entry is None:
                entry = self._sets[excluded] = [excluded, 0]
            entry[1] += 1
            self._by_uid[pod.uid] = Verdict(entry[0], pod.spec.shape_key, not pod.volumes, at,
                                            at + TRANSIENT_VERDICT_SECONDS if transient else 0.0)
            if transient and pod.group:
                heapq.heappush(self._ends, (at + TRANSIENT_VERDICT_SECONDS, pod.group))
            while len(self._by_uid) > MAX_VERDICTS:
                self._drop(next(iter(self._by_uid)))
            if alive is not None and not alive(pod.uid):
                self._drop(pod.uid)

    def next_end(self) -> float | None:
        """When the next transient verdict ends (None: none is in force)."""
        with self._lock:
            return self._ends[0][0] if self._ends else None

    def ended(self) -> list[str]:
        """The groups whose members' transient verdicts ended since the last call (each once):
        nothing else tells kube-scheduler to retry a member phalanx turned away while a verdict
        kept it off the node it needs — the event that freed the node came and went meanwhile."""
        now = self.clock()
        groups: dict[str, None] = {}
        with self._lock:
            while self._ends and self._ends[0][0] <= now:
                groups[heapq.heappop(self._ends)[1]] = None
        return list(groups)

    def get(self, uid: str) -> Verdict | None:
        """The pod's verdict in force (a transient one past its time is none)."""
        now = self.clock()
        with self._lock:
            verdict = self._by_uid.get(uid)
        return verdict if verdict is not None and (not verdict.until or verdict.until > now) else None

    def forget(self, uids: Iterable[str]) -> None:
        with self._lock:
            for uid in uids:
                self._drop(uid)

    def sweep(self, still_pending: Callable[[str], bool | None]) -> None:
        """Forget verdicts of pods that are bound (``still_pending`` False) or that the cache has
        not known (None) for VERDICT_TTL. Runs off the cycle's lock (the requeue thread)."""
        horizon = self.clock() - VERDICT_TTL
        with self._lock:
            items = list(self._by_uid.items())
        gone = []
        for uid, verdict in items:
            pending = still_pending(uid)
            if pending is False or (pending is None and verdict.at < horizon) or 0 < verdict.until < horizon:
                gone.append(uid)
        self.forget(gone)

    def allowed(self, group: PodGroup, nodes: AbstractSet[str], fresh: str = "") -> dict[str, frozenset[str]]:
        """The ``nodes`` each pending member of ``group`` may take, for :func:`solver.place`.

        A member's own verdict applies to it. A member without one borrows a sibling's only where
        that is sound: the same ``pod.spec.shape_key`` (requests, node eligibility, inter-pod
        terms, spread, host ports) AND neither pod mounts volumes (``pod.volumes`` empty) — each
        StatefulSet pod has its own PersistentVolumeClaim, so kube-scheduler's verdict for pod-0
        says nothing about pod-1's volume topology. Among siblings the ``fresh`` pod's verdict
        (the pod of the current filter call) is preferred, then the most recent. A member's own
        verdict older than such a sibling's is lifted where the sibling's no longer excludes a node
        (kube-scheduler judged the same pod there since; it never adds an exclusion): kube-scheduler
        retries a gang's members one at a time, so the members not retried kept what they learned
        while a rack was full, and a gang whose first member saw the room free again still found
        it closed. Members with neither, or whose verdict excluded nothing, are not named:
        unrestricted."""
        pending = group.pending
        now = self.clock()
        with self._lock:
            own = {p.uid: v for p in pending if (v := self._by_uid.get(p.uid)) is not None
                   and (not v.until or v.until > now)}
        borrowed: dict[tuple[object, ...], Verdict] = {}
        for recent in sorted((v for v in own.values() if v.portable), key=lambda v: v.at):
            borrowed[recent.shape_key] = recent  # the most recent wins...
        newest = own.get(fresh)
        if newest is not None and newest.portable:
            borrowed[newest.shape_key] = newest  # ...and the current call's above all
        allowed: dict[str, frozenset[str]] = {}
        sets: dict[tuple[int, int], frozenset[str]] = {}  # one difference per distinct (interned) set
        for pod in pending:
            verdict = own.get(pod.uid)
            newer = None
            if verdict is None and not pod.volumes:
                verdict = borrowed.get(pod.spec.shape_key)
            elif verdict is not None and verdict.portable:
                later = borrowed.get(pod.spec.shape_key)
                if later is not None and later.at > verdict.at and not verdict.excluded <= later.excluded:
                    newer = later  # lifts what it no longer excludes
            if verdict is not None and verdict.excluded:
                key = (id(verdict.excluded), id(newer.excluded) if newer is not None else 0)
                if key not in sets:
                    excluded = verdict.excluded if newer is None else verdict.excluded & newer.excluded
                    sets[key] = frozenset(nodes - excluded)
                allowed[pod.uid] = sets[key]
        return allowed

    def _drop(self, uid: str) -> None:
        verdict = self._by_uid.pop(uid, None)
        if verdict is None:
            return
        entry = self._sets[verdict.excluded]
        entry[1] -= 1
        if not entry[1]:
            del self._sets[verdict.excluded]
