"""Group preemption, actuated: evict a minimal victim set for a PodGroup that does not fit, hold
the freed room for it, and keep ``disruptionMode: all`` groups whole when anyone disrupts them.

Life cycle of a nomination (one per preemptor group)::

    cycle infeasible --plan_preemption helps--> evictions sent, Nomination(victims, placement)
    Nomination --every victim gone--> dropped at the group's next cycle, which plans on the freed room
    Nomination --deadline (injected clock) / PodGroup deleted / every nominated member gone
               / the group planned--> dropped (its reservation released)

While a nomination stands, its planned placement is reserved (nobody else takes the freed room)
and no new preemption starts for that group. Deletions are seen in the event stream; what a
re-list drops silently (and the deadline) is caught by the pruning every read of the nominations
does, so nothing outlives its group.

Victims are evicted through ``policy/v1`` Eviction when the plan respects every
PodDisruptionBudget; when the plan had to accept a violation they are deleted instead — both with
the ``DisruptionTarget`` / ``PreemptionByScheduler`` condition.

A broken ``all`` unit — a live member that *newly* carries ``DisruptionTarget`` (evicted or
preempted by anyone, kube-scheduler included, or evicted by the taint eviction controller from a
NotReady node), or a live member whose Node is deleted — loses its remaining members too, so its
capacity really returns and its owner re-creates it whole. "Newly" is a transition seen in the
event stream: the previous record of that uid was live, not terminating and without the
condition. A re-list or restart replays every pod as
ADDED: a pod first seen already disrupted, a finished pod, or one that was terminating before it
got the condition never breaks a unit. The rest go through the Eviction API (PDBs respected); a
refusal is a Warning event on the PodGroup and a retry with backoff, never a plain delete.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Iterator, Mapping, TypeVar

from cluster import names
from cluster.backend import ClusterWriter, WriteError
from cluster.cache import CacheEvent, ClusterCache, PodRecord
from solver import (
    DisruptionMode,
    InvalidInput,
    PodGroup,
    PreemptionContext,
    PreemptionPlan,
    Snapshot,
    SolverError,
    first_plan,
)
from solver.composite import Composite, CompositePreemption, plan_composite_preemption
from solver.model import PreemptionPolicy, placement_usage

from .dispatch import Write
from .inbox import Inbox
from .metrics import CycleMetrics
from .plans import Usage, keys
from .status import StatusWriter
from .workers import Solves, shared

#: a group's or a composite's preemption plan (both say their victims)
Planned = TypeVar("Planned", PreemptionPlan, CompositePreemption)

log = logging.getLogger("phalanx.preemption")

TOO_MANY_REQUESTS = 429  # the Eviction API's answer when a PodDisruptionBudget refuses
EVICTION_WORKERS = 16  # a plan's evictions in flight at once
NOT_FOUND = 404
#: how long a deleted Node is remembered, so that members seen bound to it only afterwards still
#: break their unit (s): well past upstream's pod GC, which removes such pods 40 s after the node
LOST_NODE_MEMORY_SECONDS = 600.0
#: and at most this many of them (the oldest forgotten first): a bounded history, not a map of live
#: objects, so it is not emptied when the cluster is
LOST_NODES_KEPT = 4096
#: a standby's deferred broken units are checked against the PodGroups past this many
DEFERRED_PRUNE_AT = 1024
#: how often a standby's broken-unit worker looks again (s)
STANDBY_POLL_SECONDS = 0.25


@dataclass
class Nomination:
    group: str
    victims: set[str]  # pod uids still to go
    placement: dict[str, str]  # pod uid -> node the freed room is held on
    requests: dict[str, Mapping[str, int]]
    deadline: float
    plan: PreemptionPlan | None = None
    evicted_units: list[str] = field(default_factory=list)

    def reservations(self) -> dict[str, dict[str, int]]:
        return placement_usage(self.placement, self.requests)


@dataclass
class UnitRetry:
    """A broken unit whose remaining members a PDB (or an API error) kept: try again at ``due``."""

    due: float
    backoff: float


class GroupPreemption:
    SIZE_CAPS = {"_lost_nodes": LOST_NODES_KEPT}  # see cluster/sizes.py

    def __init__(self, cache: ClusterCache, writer: ClusterWriter, clock: Callable[[], float],
                 metrics: CycleMetrics, status: StatusWriter, inbox: Inbox,
                 reservations: Callable[[str | AbstractSet[str]], Usage],
                 victim_contexts: Callable[[PodGroup, PreemptionContext], Iterator[PreemptionContext]],
                 grace: float = 120.0, retry_initial: float = 5.0, retry_max: float = 300.0,
                 solves: Solves | None = None, acting: Callable[[], bool] = lambda: True) -> None:
        """``reservations(exclude_group)``: the capacity other groups hold, as a cycle sees it;
        ``victim_contexts``: the queue policies' victim offers (holds.py); ``solves``: where plans
        are solved (the process's solver workers unless given, see workers.py); ``acting``: whether
        this serve acts (several replicas: a standby evicts nothing)."""
        self.solves = solves or shared()
        self.cache = cache
        self.writer = writer
        self.clock = clock
        self.metrics = metrics
        self.status = status
        self.inbox = inbox
        self._reservations = reservations
        self._victim_contexts = victim_contexts
        self.grace = grace
        self.retry_initial, self.retry_max = retry_initial, retry_max
        self.nominations: dict[str, Nomination] = {}
        self._nominated: dict[str, str] = {}  # preemptor member uid -> its nomination's group
        # uids of group members whose last record was live, not terminating, not disrupted: only
        # these can newly break a unit
        self._intact: set[str] = set()
        self.retries: dict[str, UnitRetry] = {}  # broken unit -> next attempt
        self._lost_nodes: dict[str, float] = {}  # Node deleted -> when (clock); gone when re-created
        self._cleared: set[str] = set()  # nominated groups whose last victim the cache saw go
        self._on_cleared: list[Callable[[tuple[str, ...]], None]] = []  # told (no lock held) which groups cleared
        # guards the maps above; the cache's thread and the cycle's both use them, and nothing
        # slow (no API write, no cycle lock) is done while holding it
        self._lock = threading.Lock()
        self.solving = threading.Lock()  # one group-preemption solve at a time, off the cycle's lock
        self._units = threading.Lock()  # one broken-unit pass at a time (worker or caller)
        self._broken: queue.Queue[str | None] = queue.Queue()  # unit keys; None only wakes
        self.acting = acting
        self._deferred: set[str] = set()  # units that broke while this serve stood by, for resume()
        self._worker = threading.Thread(target=self._evict_broken_units, name="phalanx-broken-units", daemon=True)
        # a plan's victims are evicted side by side (kube-scheduler's preemption deletes its victims
        # from 16 goroutines): one after the other, a 1,000-pod plan took 75 s of API round trips
        self._evictions = ThreadPoolExecutor(max_workers=EVICTION_WORKERS, thread_name_prefix="phalanx-evict")
        cache.subscribe(self._on_cache_event)

    def start(self) -> None:
        """Start the worker that evicts the rest of broken units (once)."""
        if not self._worker.is_alive() and self._worker.ident is None:
            self._worker.start()

    # -- nominations (called under the cycle's lock) -------------------------------------------
    def waiting(self, key: str) -> str:
        """Why the group must wait for its victims, or "" when it may be planned."""
        with self._lock:
            self._prune()
            nomination = self.nominations.get(key)
            if nomination is None:
                return ""
            nomination.victims = self._live_victims(nomination)
            if not nomination.victims:
                self._drop(key)
                return ""
        return (f"podgroup {key}: waiting for {len(nomination.victims)} preempted pods to terminate "
                f"({', '.join(nomination.evicted_units[:3])}{'...' if len(nomination.evicted_units) > 3 else ''})")

    def reservations(self, exclude_group: str | AbstractSet[str] = "") -> list[dict[str, dict[str, int]]]:
        skip = keys(exclude_group)
        with self._lock:
            self._prune()
            return [n.reservations() for k, n in self.nominations.items() if k not in skip]

    def release(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    def _prune(self) -> None:
        """Drop nominations past their deadline, of a PodGroup no longer known, or whose nominated
        members are all gone (deletions a re-list made without events included). Under ``_lock``."""
        if not self.nominations:
            return
        now, cache = self.clock(), self.cache
        for key, nomination in list(self.nominations.items()):
            if (nomination.deadline < now or key not in cache.podgroups
                    or not any(uid in cache.pods for uid in nomination.placement)):
                self._drop(key)

    def _drop(self, key: str) -> None:
        """Forget ``key``'s nomination and its member index. Under ``_lock``."""
        nomination = self.nominations.pop(key, None)
        if nomination is None:
            return
        for uid in nomination.placement:
            if self._nominated.get(uid) == key:
                del self._nominated[uid]

    def _member_gone(self, uid: str) -> None:
        """A nominated member was deleted: the nomination goes once none of them is left. Under ``_lock``."""
        key = self._nominated.pop(uid, "")
        nomination = self.nominations.get(key)
        if nomination is not None and not any(self._nominated.get(u) == key for u in nomination.placement):
            self._drop(key)

    # the rule's one home (docs/design.md: KEP-6277/group-preemption)
    def try_preempt(self, group: PodGroup) -> str:
        """Plan and start a preemption for ``group``, which does not fit. Returns a message for
        operators ("" when preemption cannot help)."""
        if group.preemption_policy is PreemptionPolicy.NEVER:
            return ""
        snapshot = self.cache.snapshot(self._reservations(group.key), with_bound=True)
        plan = self._counted(group.key, lambda: self.plan(group, snapshot))
        if plan is None:
            return ""
        by_uid = {p.uid: p for p in group.pending}
        nomination = Nomination(
            group=group.key, victims=set(plan.victims), placement=dict(plan.placement),
            requests={uid: by_uid[uid].spec.requests for uid in plan.placement if uid in by_uid},
            deadline=self.clock() + self.grace, plan=plan,
            evicted_units=[u.describe() for u in plan.units],
        )
        self.nominate(nomination)
        note = (f"preempting {len(plan.victims)} pods in {len(plan.units)} units "
                f"({', '.join(nomination.evicted_units[:5])}) to place {len(plan.placement)} pods"
                f"{' in ' + plan.domain if plan.domain else ''}; PDB violations: {plan.pdb_violations}")
        self.status.event(group.key, names.EVENT_PREEMPTING, note)
        self.status.emit("preempting", group=group.key, victims=list(plan.victims), units=nomination.evicted_units)
        respect_pdb = plan.pdb_violations == 0
        for uid in plan.victims:
            self._evictions.submit(self._evict, group.key, uid, respect_pdb)
        return note

    def try_preempt_composite(self, tree: Composite) -> str:
        """Plan and start a preemption for the CompositePodGroup ``tree``, which does not fit (see
        :func:`solver.composite.plan_composite_preemption`): each placed child is nominated on the
        freed room, and the victims evicted once. Returns a message for operators ("" when
        preemption cannot help)."""
        leaves = {leaf.key: leaf for leaf in tree.leaves()}
        snapshot = self.cache.snapshot(self._reservations(frozenset(leaves)), with_bound=True)
        plan = self._counted(f"compositepodgroup {tree.key}", lambda: self.solves.run(
            plan_composite_preemption, snapshot, tree, self.cache.preemption_context()))
        if plan is None:
            return ""
        units = [u.describe() for u in plan.units]
        deadline = self.clock() + self.grace
        for key, answer in plan.placement.leaf_placements().items():
            if not answer.assignments:
                continue
            by_uid = {p.uid: p for p in leaves[key].pending}
            self.nominate(Nomination(
                group=key, victims=set(plan.victims), placement=dict(answer.assignments),
                requests={uid: by_uid[uid].spec.requests for uid in answer.assignments if uid in by_uid},
                deadline=deadline, evicted_units=units))
        where = f" in {plan.placement.domain}" if plan.placement.domain else ""
        note = (f"preempting {len(plan.victims)} pods in {len(plan.units)} units ({', '.join(units[:5])}) to place "
                f"compositepodgroup {tree.key} whole{where}; PDB violations: {plan.cost.pdb_violations}")
        for key in leaves:
            self.status.event(key, names.EVENT_PREEMPTING, note)
        self.status.emit("preempting", group=tree.key, victims=list(plan.victims), units=units)
        respect_pdb = plan.cost.pdb_violations == 0
        for uid in plan.victims:
            self._evictions.submit(self._evict, tree.key, uid, respect_pdb, "compositepodgroup")
        return note

    def _counted(self, what: str, solve: Callable[[], Planned | None]) -> Planned | None:
        """``solve()``'s plan, counted in the preemption metrics; None when it cannot help or
        failed (said in the log: a SolverError is a worker that died twice, workers.py)."""
        metrics = self.metrics
        try:
            plan = solve()
        except (InvalidInput, SolverError) as err:
            metrics.preemption_attempts.labels(result="error").inc()
            log.warning("preemption planning for %s failed: %s", what, err)
            return None
        if plan is None:
            metrics.preemption_attempts.labels(result="unschedulable").inc()
            return None
        metrics.preemption_attempts.labels(result="scheduled").inc()
        metrics.preemption_victims.observe(len(plan.victims))
        return plan

    def plan(self, group: PodGroup, snapshot: Snapshot) -> PreemptionPlan | None:
        """The victims whose eviction would let ``group`` fit on ``snapshot``, or None when
        preemption cannot help. Reads only: nothing is evicted, nominated or counted (a what-if
        asks this too). Raises InvalidInput for a group that cannot be planned."""
        # victims offered cheapest lost work first, in growing prefixes, within the lost-work
        # budget (see holds.py): none affordable, no preemption; the search over the prefixes is one
        # solve in a worker process (the calling thread waits, the interpreter does not)
        contexts = list(self._victim_contexts(group, self.cache.preemption_context()))
        return self.solves.run(first_plan, snapshot, group, contexts)

    def nominate(self, nomination: Nomination) -> None:
        """Hold ``nomination``'s placement for its group (replacing an earlier one)."""
        with self._lock:
            self._drop(nomination.group)
            self.nominations[nomination.group] = nomination
            for uid in nomination.placement:
                self._nominated[uid] = nomination.group

    def _evict(self, preemptor: str, uid: str, respect_pdb: bool, kind: str = "podgroup") -> None:
        """One victim of ``preemptor``'s plan (from the eviction pool); ``kind``: what the preemptor
        is (a podgroup, or a compositepodgroup)."""
        record = self.cache.pods.get(uid)
        if record is None:
            return
        pod = record.pod
        message = f"preempted by {kind} {preemptor}"
        # through the Eviction API only where a PodDisruptionBudget selects the victim: for any other
        # pod its budget check is empty, and the status patch and DELETE kube-scheduler's preemption
        # makes are one write fewer (the Eviction's own condition update, then the reason's patch)
        respect_pdb = respect_pdb and self.cache.budgeted(uid)
        try:
            self.writer.evict(pod.namespace, pod.name, uid, message, respect_pdb)
        except WriteError as err:
            log.warning("evicting %s for %s failed: %s", pod.key, preemptor, err)
            return
        self._victim_event(record, names.EVENT_PREEMPTED, message)

    def _victim_event(self, record: PodRecord, reason: str, note: str) -> None:
        """The victim's Event, off the eviction's path: queued to the dispatcher (kube-scheduler's
        events go through its broadcaster the same way), so an eviction waits for no Event."""
        pod = record.pod
        regarding = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        self.status.dispatcher.submit(Write(f"Pod/{pod.namespace}/{pod.name}", "event",
                                            lambda: self.writer.event(regarding, reason, note, "Normal")))

    # -- the event stream (the cache's thread: note the work, never write or take the cycle's lock)
    def _on_cache_event(self, event: CacheEvent) -> None:
        record = event.pod
        if event.kind == "Pod" and (record is None or not record.active):
            self._victim_gone(event.key)
        if event.kind == "PodGroup" and event.deleted:
            with self._lock:
                self._drop(event.key)
                self.retries.pop(event.key, None)
        elif event.kind == "Pod" and event.deleted:
            with self._lock:
                self._intact.discard(event.key)
                if event.key in self._nominated:
                    self._member_gone(event.key)
        elif event.kind == "Node":
            self._note_node(event.key, event.deleted)
            if event.deleted:
                for group in self._groups_on_node(event.key):
                    self._broken.put(group)
        elif record is not None and record.pod.group:
            if self._newly_disrupted(record) or self._seen_bound_to_lost_node(event):
                self._broken.put(record.pod.group)

    def _note_node(self, node: str, deleted: bool) -> None:
        """Remember the Nodes deleted in the last :data:`LOST_NODE_MEMORY_SECONDS` (a Node created
        again under the same name is forgotten: it is a new node)."""
        with self._lock:
            if not deleted:
                self._lost_nodes.pop(node, None)
                return
            now = self.clock()
            for name in [n for n, at in self._lost_nodes.items() if now - at > LOST_NODE_MEMORY_SECONDS]:
                del self._lost_nodes[name]
            self._lost_nodes.pop(node, None)
            self._lost_nodes[node] = now  # insertion order is deletion order: the oldest first
            while len(self._lost_nodes) > LOST_NODES_KEPT:
                del self._lost_nodes[next(iter(self._lost_nodes))]

    def _seen_bound_to_lost_node(self, event: CacheEvent) -> bool:
        """True when this pod event is the first to show a live member bound to a Node already
        deleted. phalanx's pod and node watches are separate streams: a gang bound just before
        its node went can reach the cache after the node's deletion, when :meth:`_groups_on_node`
        found none of it there."""
        record, previous = event.record, event.previous
        node = record.pod.node
        if not node or node not in self._lost_nodes or not record.active or record.terminating:
            return False
        return previous is None or previous.pod.node != node

    def _groups_on_node(self, node: str) -> set[str]:
        """The groups with a live member bound to ``node`` (a Node just deleted: those members are
        lost with it, whatever removes their pods later)."""
        pods = self.cache.pods
        return {pods[uid].pod.group for uid in self.cache.pods_by_node.get(node, ())
                if uid in pods and pods[uid].pod.group and pods[uid].active and not pods[uid].terminating}

    def on_cleared(self, listener: Callable[[tuple[str, ...]], None]) -> None:
        """Call ``listener`` with the groups (on the cache's thread, no lock held) whenever a
        nominated group's victims are all gone: plan ahead then plans the group in the room freed,
        and the plugin's stream stops holding its members back."""
        self._on_cleared.append(listener)

    def _tell_cleared(self, groups: tuple[str, ...]) -> None:
        for listener in self._on_cleared:
            listener(groups)

    def holding(self) -> tuple[str, ...]:
        """The nominated groups still waiting for a victim to go: their members cannot fit before,
        so the plugin keeps them out of kube-scheduler's queue (each attempt would fail member by
        member and cost a call here) until the stream no longer lists them."""
        with self._lock:
            self._prune()
            return tuple(sorted(k for k, n in self.nominations.items() if self._live_victims(n)))

    def _victim_gone(self, uid: str) -> None:
        """A pod was deleted or finished: a nomination left without live victims is noted for
        :meth:`take_cleared`. Its members were answered "waiting for preempted pods" and
        kube-scheduler retries them on a pod event, which may reach it before the cache saw the last
        victim go: that retry waited again and no event follows, so the cycle touches them."""
        cleared: list[str] = []
        with self._lock:
            for key, nomination in self.nominations.items():
                if uid in nomination.victims and not self._live_victims(nomination):
                    self._cleared.add(key)
                    self.inbox.wake()
                    cleared.append(key)
        if cleared:
            self._tell_cleared(tuple(cleared))

    def clear_if_gone(self, key: str) -> None:
        """A member of ``key`` was just parked: when the group's victims are all gone already
        (the cache saw the last one go before the member was parked, so :meth:`_victim_gone`
        found nobody to touch), note the group for :meth:`take_cleared` now."""
        if key not in self.nominations:  # fast path, read without the lock
            return
        with self._lock:
            nomination = self.nominations.get(key)
            cleared = nomination is not None and not self._live_victims(nomination)
            if cleared:
                self._cleared.add(key)
                self.inbox.wake()
        if cleared:
            self._tell_cleared((key,))

    def _live_victims(self, nomination: Nomination) -> set[str]:
        """The nomination's victims the cache still shows running (the cache's listeners run
        after it applied the change, so a pod just deleted or finished is not among them)."""
        pods = self.cache.pods
        return {u for u in nomination.victims if u in pods and pods[u].active}

    def take_cleared(self) -> set[str]:
        """The nominated groups whose victims are all gone since the last call."""
        with self._lock:
            cleared, self._cleared = self._cleared, set()
        return cleared

    def _newly_disrupted(self, record: PodRecord) -> bool:
        """Remember whether the pod is an intact member; True when this record is the transition
        of a live member to ``DisruptionTarget`` (its previous record was intact)."""
        uid = record.pod.uid
        with self._lock:
            was_intact = uid in self._intact
            if record.active and not record.terminating and not record.disrupted:
                self._intact.add(uid)
            else:
                self._intact.discard(uid)
            pods = self.cache.pods
            if len(self._intact) > 2 * len(pods) + 1024:  # a re-list dropped pods without events
                self._intact.intersection_update(pods.keys())
        return was_intact and record.disrupted and record.active

    # -- broken `all` units --------------------------------------------------------------------
    def _evict_broken_units(self) -> None:
        while True:
            with self._lock:
                poll = 0.25 if self.retries else None
            try:
                key = self._broken.get(timeout=poll)
            except queue.Empty:
                key = None
            try:
                if not self.acting():
                    self._defer(key)
                    continue
                if key is not None:
                    self.break_unit(key)
                self.retry_due()
            except Exception:  # noqa: BLE001 - keep the worker alive
                log.exception("evicting the rest of broken unit %s failed", key)

    def _defer(self, key: str | None) -> None:
        """A standby notes a broken unit for when it acts (units whose PodGroup went are dropped)."""
        with self._lock:
            if key is not None:
                self._deferred.add(key)
            if len(self._deferred) > DEFERRED_PRUNE_AT:
                self._deferred = {k for k in self._deferred if k in self.cache.podgroups}
        time.sleep(STANDBY_POLL_SECONDS)  # retries wait too: they are this serve's once it acts

    def resume(self) -> None:
        """This serve started acting: the units that broke while it stood by are evicted now."""
        with self._lock:
            deferred, self._deferred = self._deferred, set()
        for key in deferred:
            self._broken.put(key)
        self._broken.put(None)

    def retry_due(self) -> None:
        """Try again the broken units whose backoff ran out (by the injected clock)."""
        now = self.clock()
        with self._lock:
            due = [key for key, retry in self.retries.items() if retry.due <= now]
        for key in due:
            self.break_unit(key, retry=True)

    # the rule's one home (docs/design.md: KEP-6277/disruption-all-whole)
    def break_unit(self, key: str, retry: bool = False) -> None:
        """Evict the remaining members of the broken unit ``key`` through the Eviction API."""
        with self._units:
            cache = self.cache
            group = cache.podgroups.get(key)
            # a child of an `all` CompositePodGroup takes the whole composite with it
            composite = cache.all_composite(key) if group is not None else None
            leaves = [leaf.key for leaf in composite.leaves()] if composite is not None else [key]
            rest = [r for leaf in leaves for r in cache.members(leaf) if r.pod.node and not r.disrupted]
            whole = composite is not None or (group is not None and group.spec.disruption_mode is DisruptionMode.ALL)
            if group is None or not whole or not rest:
                with self._lock:
                    self.retries.pop(key, None)
                return
            message = (f"compositepodgroup {composite.key} has disruptionMode all and lost a member of podgroup "
                       f"{key}: the composite goes as a whole" if composite is not None else
                       f"podgroup {key} has disruptionMode all and lost a member: the unit goes as a whole")
            if not retry:
                log.info("%s; evicting %d members", message, len(rest))
                self.status.event(key, names.EVENT_UNIT_BROKEN, message, "Warning")
            refused: list[str] = []
            failed: list[str] = []
            for record in rest:
                pod = record.pod
                try:
                    self.writer.evict(pod.namespace, pod.name, pod.uid, message, True)
                except WriteError as err:
                    if err.status == NOT_FOUND:
                        continue  # gone already
                    (refused if err.status == TOO_MANY_REQUESTS else failed).append(pod.key)
                    log.warning("evicting %s of broken unit %s failed: %s", pod.key, key, err)
            self._schedule_retry(key, refused, failed)

    def _schedule_retry(self, key: str, refused: list[str], failed: list[str]) -> None:
        if not refused and not failed:
            with self._lock:
                self.retries.pop(key, None)
            return
        with self._lock:
            previous = self.retries.get(key)
            backoff = min(previous.backoff * 2, self.retry_max) if previous else self.retry_initial
            self.retries[key] = UnitRetry(self.clock() + backoff, backoff)
        self._broken.put(None)  # the worker polls while retries are pending
        if refused:
            shown = ", ".join(refused[:5]) + ("..." if len(refused) > 5 else "")
            self.status.event(
                key, names.EVENT_UNIT_EVICTION_BLOCKED,
                f"podgroup {key} has disruptionMode all and lost a member, but a PodDisruptionBudget refuses "
                f"evicting {len(refused)} of the rest ({shown}); retrying in {backoff:.0f}s", "Warning")
