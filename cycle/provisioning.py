"""Gang-aware autoscaling: a ProvisioningRequest for exactly what a gang lacks, in one domain.

A gang that does not fit for lack of capacity, and may not preempt its way in, asks
cluster-autoscaler for the missing part, all at once or not at all (the
``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` class), when its PodGroup opts in
(annotation ``scheduling.phalanx.dev/provisioning: atomic``, copied from its StatefulSet or
LeaderWorkerSet) or ``phalanx serve --provisioning atomic`` makes it the default (``none`` on the
PodGroup opts out). The decision, :meth:`Provisioning.consider`, runs in the workload cycle that
found the gang infeasible (lock held, no I/O):

- **which domain, how many pods**: the solver's explanation lists the domains nearest miss first;
  the nearest whose shortfall is capacity (not "no eligible node": taints, selectors, cordons; not
  the pods' own rules — more nodes cure neither) is chosen, and the pods that do not fit there
  (``needed - fits``; a bound when the totals alone ruled the domain out) are asked for, the
  largest of the gang's pod shapes first, each as its requests, node selector and tolerations
  plus the domain's topology label as a node selector;
- **once per gang**: the request is named from the PodGroup's uid, so another cycle or a restarted
  ``phalanx serve`` finds it (in the cache, or in :attr:`Provisioning.asked` before the cache
  shows it) and never asks twice; a request that failed stays, and says so.

The writes (the PodTemplates, the request, the members' consume annotations) go through the
dispatcher. :meth:`Provisioning.sync` runs on the requeue thread whenever a request or a member
of a gang with one changed: the request's state (Accepted, Provisioned, Failed, CapacityRevoked,
BookingExpired) reaches the PodGroup's condition message, an event and ``phalanx explain``; once
the gang is bound (or its PodGroup is gone) the request and its PodTemplates are deleted. The
nodes the request brings are room like any other: the cache's capacity change retries the gang.
"""

from __future__ import annotations

import threading
from typing import Mapping, NamedTuple, Protocol

from cluster import names
from cluster.backend import ClusterWriter, WriteError
from cluster.cache import CacheEvent, ClusterCache
from cluster.convert import PodGroupRecord
from cluster.provisioning import (
    FINAL,
    MAX_POD_SETS,
    PodSet,
    ProvisioningAsk,
    ProvisioningRecord,
    request_held,
    request_name,
)
from solver import Explanation, PodGroup, PodSpec, Policy
from solver.composite import Composite, CompositePlacement
from solver.explain import CAPACITY, DomainShortfall
from solver.model import Pod, by_shape

from .dispatch import transient
from .inbox import Inbox
from .status import StatusWriter

#: what :attr:`Provisioning.said` holds for a group whose request is being deleted
DELETING = "deleting"


def describe(record: ProvisioningRecord | None, key: str) -> str:
    """What the request ``key`` (namespace/name) says now, for a condition message."""
    state = record.state() if record else None
    if state is None:
        return f"ProvisioningRequest {key} is waiting for cluster-autoscaler"
    why = f" ({state.reason}: {state.message})" if state.message else (f" ({state.reason})" if state.reason else "")
    said = {names.PROVISIONING_FAILED: "failed", names.PROVISIONING_CAPACITY_REVOKED: "lost its capacity",
            names.PROVISIONING_BOOKING_EXPIRED: "expired before the gang was placed",
            names.PROVISIONING_PROVISIONED: "is provisioned, the gang is placed once its nodes are seen",
            names.PROVISIONING_ACCEPTED: "is accepted, its nodes are being provisioned"}
    return f"ProvisioningRequest {key} {said[state.type]}{why}"


def condition_reason(record: ProvisioningRecord | None) -> str:
    """The reason of the group's ``PodGroupInitiallyScheduled=False`` while it has this request."""
    state = record.state() if record else None
    return names.REASON_PROVISIONING_FAILED if state and state.type in FINAL else names.REASON_PROVISIONING


class Asked(NamedTuple):
    """What :meth:`Provisioning.consider` adds to a group's condition: words after the solver's
    reason ("" for none) and the condition's reason."""

    words: str = ""
    reason: str = names.REASON_UNSCHEDULABLE


def _size(pod: Pod, largest: Mapping[str, int]) -> float:
    """A pod's requests as a share of the largest of each resource in its gang (to order shapes)."""
    return sum(v / largest[r] for r, v in pod.spec.requests.items() if largest.get(r))


def pod_sets(pending: tuple[Pod, ...], missing: int) -> tuple[PodSet, ...]:
    """``missing`` of the gang's pending pods by shape, the largest shapes first (they are the ones
    the nodes that exist could not take)."""
    shapes = [pods for pods in by_shape(pending).values()]
    largest: dict[str, int] = {}
    for pod in pending:
        for r, v in pod.spec.requests.items():
            largest[r] = max(largest.get(r, 0), v)
    shapes.sort(key=lambda pods: -_size(pods[0], largest))
    sets: list[PodSet] = []
    for pods in shapes[:MAX_POD_SETS]:
        take = min(len(pods), missing - sum(s.count for s in sets))
        if take <= 0:
            break
        sets.append(PodSet(pods[0].spec, take))
    return tuple(sets)


def capacity_shortfall(explanation: Explanation | None) -> DomainShortfall | str:
    """The nearest domain whose shortfall more nodes would cure, or why there is none."""
    if explanation is None:
        return "no explanation of the shortfall"
    if explanation.summary:
        return explanation.summary  # a resource no node offers, a topology label no node has
    for shortfall in explanation.domains:
        if shortfall.kind == CAPACITY and shortfall.missing:
            return shortfall
    return "no domain lacks capacity only"


class NodeProvisioner(Protocol):
    """Another way to the nodes a gang lacks, in place of a ProvisioningRequest (karpenter.py)."""

    def consider(self, group: PodGroup, record: PodGroupRecord, explanation: Explanation | None,
                 reason: str, held: int) -> Asked: ...

    def sync(self) -> None: ...

    def prune(self, live: Mapping[str, object]) -> None: ...


class Provisioning:
    def __init__(self, cache: ClusterCache, writer: ClusterWriter, status: StatusWriter,
                 explanations: dict[str, str], inbox: Inbox, default: str = names.PROVISIONING_NONE,
                 karpenter: NodeProvisioner | None = None) -> None:
        self.karpenter = karpenter  # --provisioner karpenter: NodeClaims instead of a ProvisioningRequest
        self.cache = cache
        self.writer = writer
        self.status = status
        self.explanations = explanations  # group -> the last reason it did not fit (shared)
        self.inbox = inbox  # wakes the requeue thread, which runs sync
        self.default = default
        self._lock = threading.Lock()  # over the maps below: the cache's thread notes, the cycle reads
        self.asked: dict[str, str] = {}  # group -> the request asked for (the cache may not show it yet)
        self.said: dict[str, str] = {}  # group -> the request's state last written on the group
        self.deleting: set[str] = set()  # requests (namespace/name) whose deletion is queued
        self.reasons: dict[str, str] = {}  # group -> the solver's reason the request was made for
        # a composite's first PodGroup, whose request it is -> every PodGroup of its tree (they all
        # say the request's state; it is deleted once all are bound)
        self.trees: dict[str, tuple[str, ...]] = {}
        # namespace/name of a request of phalanx's -> its group: those listed before this cycle
        # subscribed (serve lists its caches first), then kept by the cache's events
        self.requests: dict[str, str] = {}
        cache.subscribe(self._on_cache_event)
        for record in list(cache.provisioning_requests.values()):
            if record.podgroup:
                self.requests[record.key] = f"{record.namespace}/{record.podgroup}"
        # a request, or a member of a gang with one, changed since the last sync (at start: the
        # requests listed may belong to gangs bound or deleted meanwhile)
        self.dirty = bool(self.requests)
        if self.dirty:
            inbox.wake()

    # -- the decision (a workload cycle, lock held) ----------------------------------------------
    def wanted(self, record: PodGroupRecord) -> bool:
        mode = record.annotations.get(names.ANNOTATION_PROVISIONING, self.default)
        return mode == names.PROVISIONING_ATOMIC

    def consider(self, group: PodGroup, explanation: Explanation | None, reason: str) -> Asked:
        """Ask for the room ``group`` lacks, once (see the module's docstring); what to add to its
        condition (nothing when it does not take part)."""
        record = self.cache.podgroups.get(group.key)
        if record is None or not record.uid or group.policy is not Policy.GANG or not self.wanted(record):
            return Asked()
        held = len(group.bound) + group.finished  # a gang that grows asks for its increment anew
        if self.karpenter is not None:
            return self.karpenter.consider(group, record, explanation, reason, held)
        key = f"{group.namespace}/{request_name(record.uid, held)}"
        existing = self.cache.provisioning_requests.get(key)
        with self._lock:
            asked = self.asked.get(group.key)
            self.reasons[group.key] = reason
        if existing is not None or asked == key:
            return Asked(describe(existing, key), condition_reason(existing))
        shortfall = capacity_shortfall(explanation)
        if isinstance(shortfall, str):
            return Asked(f"no ProvisioningRequest: {shortfall}")
        sets = pod_sets(group.pending, shortfall.missing)
        if not sets:
            return Asked()
        ask = ProvisioningAsk(group.namespace, group.name, record.uid, sets, group.topology_key, shortfall.value,
                              held=held)
        with self._lock:
            self.asked[group.key] = key
        self._create(group, ask)
        where = f" in {shortfall.domain}" if group.topology_key else ""
        note = f"ProvisioningRequest {key} asks for {ask.pods} pods{where}, all at once"
        self.status.event(group.key, names.EVENT_PROVISIONING_REQUESTED, note)
        return Asked(note, names.REASON_PROVISIONING)

    # the rule's one home (docs/design.md: composite/provisioning)
    def consider_composite(self, tree: Composite, placement: CompositePlacement, reason: str) -> Asked:
        """Ask once for the room a gang composite lacks in the value of its key nearest to holding
        it (lock held, no I/O): one request, made for the tree's first PodGroup and owned by it,
        for the required children left out there — the first one's missing pods in the domain of
        its own key nearest to fitting it, the others' whole, all in that one domain (one node
        group: the atomic class grows one) inside the composite's value. Opted in when a PodGroup
        of the tree says ``atomic``, or by serve's default unless one says ``none``."""
        leaves = tree.leaves()
        anchor = leaves[0]
        records = [self.cache.podgroups.get(leaf.key) for leaf in leaves]
        record = records[0]
        if tree.policy is not Policy.GANG or record is None or not record.uid or not self._tree_wanted(records):
            return Asked()
        if self.karpenter is not None:
            return Asked("no NodeClaims for a compositepodgroup: only a ProvisioningRequest asks for a whole tree")
        held = sum(len(leaf.bound) + leaf.finished for leaf in leaves)
        key = f"{anchor.namespace}/{request_name(record.uid, held)}"
        existing = self.cache.provisioning_requests.get(key)
        with self._lock:
            asked = self.asked.get(anchor.key)
            self.reasons[anchor.key] = reason
            self.trees[anchor.key] = tuple(leaf.key for leaf in leaves)
        if existing is not None or asked == key:
            return Asked(describe(existing, key), condition_reason(existing))
        where = self._tree_ask(tree, placement)
        if isinstance(where, str):
            return Asked(f"no ProvisioningRequest: {where}")
        pods, sets, child_key, value = where
        if not sets or len(sets) > MAX_POD_SETS:
            return Asked() if not sets else Asked(f"no ProvisioningRequest: {len(sets)} pod shapes, at most "
                                                  f"{MAX_POD_SETS} in one")
        outer = ((tree.topology_key, placement.domain),) if tree.topology_key and tree.topology_key != child_key else ()
        ask = ProvisioningAsk(anchor.namespace, anchor.name, record.uid, sets, child_key, value, held=held,
                              outer=outer)
        with self._lock:
            self.asked[anchor.key] = key
        self._create(anchor, ask, pods)
        domain = [f"{k}={v}" for k, v in (*outer, (child_key, value)) if k]
        where_words = f" in {', '.join(domain)}" if domain else ""
        note = (f"ProvisioningRequest {key} asks for {ask.pods} pods{where_words} for compositepodgroup "
                f"{tree.key}, all at once")
        for leaf in leaves:
            self.status.event(leaf.key, names.EVENT_PROVISIONING_REQUESTED, note)
        return Asked(note, names.REASON_PROVISIONING)

    def _tree_wanted(self, records: list[PodGroupRecord | None]) -> bool:
        modes = [r.annotations.get(names.ANNOTATION_PROVISIONING, "") for r in records if r is not None]
        if names.PROVISIONING_ATOMIC in modes:
            return True
        return self.default == names.PROVISIONING_ATOMIC and names.PROVISIONING_NONE not in modes

    def _tree_ask(self, tree: Composite, placement: CompositePlacement
                  ) -> tuple[tuple[Pod, ...], tuple[PodSet, ...], str, str] | str:
        """The pods a composite asks room for, the pod sets asked, and the one domain (key, value)
        of its first left-out child's key they go in (see :meth:`consider_composite`); or why there
        is none."""
        if tree.topology_key and not placement.domain:
            return f"no {tree.topology_key} domain to ask in"
        placed = len(tree.children) - len(placement.left_out)
        short = max(tree.required - placed, 1)
        chosen = list(placement.left_out)[:short]
        pods: list[Pod] = []
        counts: dict[tuple[object, ...], tuple[PodSpec, int]] = {}  # by shape, in the order met

        def add(spec: PodSpec, count: int) -> None:
            first, had = counts.get(spec.shape_key, (spec, 0))
            counts[spec.shape_key] = (first, had + count)

        child_key, value = "", ""
        for left in chosen:
            leaves = left.child.leaves() if isinstance(left.child, Composite) else (left.child,)
            mine = [p for leaf in leaves for p in leaf.pending]
            if not child_key and isinstance(left.child, PodGroup) and left.child.topology_key:
                shortfall = capacity_shortfall(left.explanation)
                if isinstance(shortfall, str):
                    return f"podgroup {left.child.key}: {shortfall}"
                child_key, value = left.child.topology_key, shortfall.value
                if not self._inside(tree.topology_key, placement.domain, child_key, value):
                    return (f"podgroup {left.child.key}'s nearest {child_key}={value} is outside "
                            f"{tree.topology_key}={placement.domain}")
                for pod_set in pod_sets(tuple(mine), shortfall.missing):
                    add(pod_set.spec, pod_set.count)
            else:
                for pod in mine:
                    add(pod.spec, 1)
            pods += mine
        sets = tuple(PodSet(spec, count) for spec, count in counts.values() if count)
        return tuple(pods), sets, child_key, value

    def _inside(self, outer_key: str, outer: str, key: str, value: str) -> bool:
        """Whether a node of ``key=value`` carries ``outer_key=outer`` (no outer key: always)."""
        if not outer_key:
            return True
        return any(n.labels.get(key) == value and n.labels.get(outer_key) == outer for n in self.cache.nodes.values())

    def _create(self, group: PodGroup, ask: ProvisioningAsk, pods: tuple[Pod, ...] | None = None) -> None:
        """Queue the request's writes: the PodTemplates and the request, then the annotations naming
        it on the pods it asks room for (``group``'s pending ones unless given; cluster-autoscaler
        leaves pods that consume a request out of its ordinary scale-up)."""
        def create() -> None:
            try:
                self.writer.create_provisioning_request(ask)
            except WriteError as err:
                if transient(err):
                    raise  # the dispatcher tries again until the API server takes it
                # refused (the CRD not installed, forbidden, invalid): said, and a later cycle may ask
                with self._lock:
                    self.asked.pop(group.key, None)
                self.status.event(group.key, names.EVENT_PROVISIONING_ERROR,
                                  f"ProvisioningRequest {ask.namespace}/{ask.name} not created: {err}", "Warning")
        self.status.submit(group.key, "provisioning", create)
        consume = {names.ANNOTATION_CONSUME_PROVISIONING: ask.name, names.ANNOTATION_PROVISIONING_CLASS: ask.class_name}
        for pod in group.pending if pods is None else pods:
            self.status.annotate_pod(pod.namespace, pod.name, consume)

    # -- the cache's thread: note only ----------------------------------------------------------
    def _on_cache_event(self, event: CacheEvent) -> None:
        if event.kind == "ProvisioningRequest":
            with self._lock:  # the groups with a request, as the cache shows them (a restart asked none)
                self.requests.pop(event.key, None)
                if isinstance(event.record, ProvisioningRecord) and event.record.podgroup:
                    self.requests[event.key] = f"{event.record.namespace}/{event.record.podgroup}"
        elif event.kind in ("Pod", "PodGroup") and (self.asked or self.requests):
            with self._lock:
                concerned = set(self.asked) | set(self.requests.values())
            if not event.groups & concerned:
                return
        else:
            return
        self.dirty = True
        self.inbox.wake()

    # -- the requeue thread (lock held) ----------------------------------------------------------
    def sync(self) -> None:
        """Bring the groups up to date with their requests (see the module's docstring)."""
        if self.karpenter is not None:
            self.karpenter.sync()
        if not self.dirty:
            return
        self.dirty = False
        ours: dict[str, list[ProvisioningRecord]] = {}
        for request in list(self.cache.provisioning_requests.values()):
            if request.podgroup:
                ours.setdefault(f"{request.namespace}/{request.podgroup}", []).append(request)
        with self._lock:
            groups = set(self.asked) | set(ours)
            self.deleting &= set(self.cache.provisioning_requests)  # gone: their deletion landed
        for group_key in groups:
            self._sync_group(group_key, self._newest(group_key, ours.get(group_key, [])))

    def _newest(self, group_key: str, requests: list[ProvisioningRecord]) -> ProvisioningRecord | None:
        """The request of ``group_key`` asked for its latest size; the earlier ones of the same
        PodGroup (a gang that grew before its last request was deleted) are deleted."""
        record = self.cache.podgroups.get(group_key)
        if record is None or len(requests) < 2:
            return requests[0] if requests else None
        def held(request: ProvisioningRecord) -> int:  # -1: not a request of this PodGroup's uid
            count = request_held(request.name, record.uid)
            return -1 if count is None else count
        requests = sorted(requests, key=held)
        newest = requests[-1]
        for request in requests[:-1]:
            self._delete(group_key, request, f"superseded by {newest.key}", superseded=True)
        return newest

    def _sync_group(self, group_key: str, request: ProvisioningRecord | None) -> None:
        record = self.cache.podgroups.get(group_key)
        if request is not None and (record is None or request_held(request.name, record.uid) is None):
            self._delete(group_key, request, "its PodGroup is gone")  # (owner references collect it too)
            return
        if record is None:
            return
        with self._lock:
            tree = self.trees.get(group_key, (group_key,))
        groups = [self.cache.podgroup(k) for k in tree]
        if request is not None and all(g is not None and g.bound and not g.pending for g in groups):
            bound = sum(len(g.bound) for g in groups if g is not None)
            what = "the gang is" if len(tree) == 1 else f"its compositepodgroup's {len(tree)} PodGroups are"
            self._delete(group_key, request, f"{what} bound ({bound} pods)")
            return
        if request is None:
            return  # asked, not seen yet (or deleted once bound)
        state = request.state()
        said = state.type if state else ""
        with self._lock:
            if self.said.get(group_key, "") == said:
                return  # nothing new (a request no one answered yet says what consider said)
            self.said[group_key] = said
            reason = self.reasons.get(group_key, "")
        words = describe(request, request.key)
        final = state is not None and state.type in FINAL
        for key in tree:  # a composite's request: every PodGroup of its tree says it
            self.explanations[key] = f"{reason}; {words}" if reason else words
            self.status.set_status(key, False, condition_reason(request), self.explanations[key])
            self.status.event(key, names.EVENT_PROVISIONING_CHANGED, words, "Warning" if final else "Normal")

    def _delete(self, group_key: str, request: ProvisioningRecord, why: str, superseded: bool = False) -> None:
        """Queue ``request``'s deletion, once (the cache shows it until the deletion lands);
        ``superseded``: an earlier request of a gang that asked again, whose state is its newest's."""
        with self._lock:
            if request.key in self.deleting:
                return
            self.deleting.add(request.key)
            if not superseded:
                self.said[group_key] = DELETING
                self.reasons.pop(group_key, None)
        def delete() -> None:
            self.writer.delete_provisioning_request(request.namespace, request.name, request.templates)
        self.status.submit(group_key, "provisioning", delete, coalesce=f"provisioning-delete:{request.key}")
        if self.cache.podgroups.get(group_key) is not None:
            self.status.event(group_key, names.EVENT_PROVISIONING_DELETED,
                              f"ProvisioningRequest {request.key} deleted: {why}")

    def prune(self, live: Mapping[str, object]) -> None:
        """Forget the groups not in ``live`` (deleted): a gang is asked for once per PodGroup uid."""
        if self.karpenter is not None:
            self.karpenter.prune(live)
        with self._lock:
            for table in (self.asked, self.said, self.reasons, self.trees):
                for key in [k for k in table if k not in live]:
                    del table[key]
