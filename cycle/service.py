"""The workload-cycle service: plans whole PodGroups, holds their capacity, binds them as one.

kube-scheduler sees one pod at a time; phalanx answers for the whole group. :class:`WorkloadCycle`
wires one file per job and answers kube-scheduler's verbs, by the phase that calls them:

- **filter** (scheduling cycle, after the in-tree filters): a pod of a group that has fewer than
  minCount members gets no node ("waiting for members"). The first member to arrive once the group
  is complete triggers a workload cycle (:mod:`.planning`); each member is then answered with its
  planned node only. Pods without a group are kept off capacity reserved for plans.

  What phalanx cannot model, it learns: every filter call's candidate list is kube-scheduler's
  verdict for that pod (:mod:`.verdicts`). When the in-tree filters dropped a member's planned
  node, the member first swaps nodes with a not-yet-answered identical member whose node they
  passed (*re-slot*: the plan's nodes are unchanged, nothing else moves); only when none exists
  is the plan released and the group re-planned — and only so often (:mod:`.replans`). Never a
  livelock.
- **prioritize** (scoring): the planned node scores 10.
- **preempt** (PostFilter): group preemption for a member (:mod:`.preemption`); for a pod without
  a group, kube-scheduler's candidates without those that break a ``disruptionMode: all`` group
  when a cheaper one exists.
- **bind** (binding cycle): the barrier of :mod:`.binding`.
- **plugin mode**: the same plans through the plugin's extension points (:mod:`.plugin_mode`).

The jobs: the plan book and its state machine (:mod:`.plans`), planning (:mod:`.planning`),
barrier capacity (:mod:`.capacity`), binding (:mod:`.binding`), status and events
(:mod:`.status`), requeue and cache events (:mod:`.requeue`, its thread started by
:meth:`WorkloadCycle.start`), group preemption (:mod:`.preemption`), queue policies
(:mod:`.holds`). Each is handed what it needs; :meth:`WorkloadCycle._on_transition` is the one
place a plan transition's consequences are written (status, events, metrics, notifications), the
same way for gang and Basic groups. Timers (plan TTL, barrier, backoff) use the injected clock.

The verbs take typed pods: the entry points read a request's pod once (``cluster.convert.read_pod``)
and answer one that does not convert with the reason. No group's content raises out of a verb.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from cluster import names
from cluster.backend import ClusterWriter
from cluster.cache import ClusterCache
from cluster.convert import CompositeRecord
from cluster.leadership import AlwaysActing, Leadership
from cluster.sizes import collection_sizes
from cluster.whatif import DraftGroup
from solver import InvalidInput, Placement, Pod, SolveOptions, rank_candidates
from solver.model import PODS

from . import replans
from .ahead import PlanAhead
from .binding import Binding
from .capacity import BarrierCapacity
from .context import CycleContext
from .dispatch import Dispatcher
from .heap import Heap
from .holds import QueuePolicies
from .inbox import Inbox
from .karpenter import KarpenterOptions, NodeClaims
from .leading import LeaderWriter
from .lock import CycleLock
from .metrics import CycleMetrics
from .parked import ParkedMembers
from .planning import Planner
from .plans import Change, Plan, PlanBook, PlanState, interchangeable
from .preemption import GroupPreemption
from .provisioning import Provisioning
from .queue import PodGroupQueue, QueuePolicy
from .records import RecordedHolds
from .replans import ReplanBudget
from .requeue import Requeue
from .smallest import SmallestChanges
from .status import StatusWriter, scheduled_message
from .tenants import NamespaceLimits, Tenants
from .verdicts import Verdicts
from .whatif import WhatIf, WhatIfAnswer
from .workers import Solves

log = logging.getLogger("phalanx.cycle")


class SameReason(Mapping[str, str]):
    """Every candidate node refused for one reason, held as the reason and the nodes: a group that
    waits is refused at every node, and plugin mode asks with all 5,000 of them and reads only the
    reason (a dict built per answer was an eighth of phalanx serve's time in upstream's
    GangScheduling benchmark); the extender's reply makes the dict it sends."""

    __slots__ = ("reason", "nodes")

    def __init__(self, reason: str, nodes: Iterable[str]) -> None:
        self.reason = reason
        self.nodes: frozenset[str] = nodes if isinstance(nodes, frozenset) else frozenset(nodes)

    def __getitem__(self, node: str) -> str:
        if node in self.nodes:
            return self.reason
        raise KeyError(node)

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class FilterAnswer:
    """What filter tells kube-scheduler: feasible nodes, and reasons for the rest."""

    nodes: list[str]
    failed: Mapping[str, str] = field(default_factory=dict)  # resolvable (preemption may help)
    unresolvable: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def refused(cls, reason: str, candidates: Iterable[str]) -> "FilterAnswer":
        """No node, for ``reason`` (a pod that could not be read, a group that waits)."""
        return cls([], unresolvable=SameReason(reason, candidates))


@dataclass(frozen=True)
class CompositeOf:
    """A PodGroup's CompositePodGroup tree, for explain: its root (namespace/name), every PodGroup
    of the tree, the root's policy in words, and why the tree cannot be planned yet ("" when it can)."""

    root: str
    groups: tuple[str, ...]
    how: str
    why: str = ""


class WorkloadCycle:
    def __init__(
        self,
        cache: ClusterCache,
        writer: ClusterWriter,
        options: SolveOptions = SolveOptions(),
        barrier_timeout: float = 30.0,
        plan_ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: CycleMetrics | None = None,
        bind_workers: int = 16,
        barrier_capacity: int | None = None,
        dispatcher: Dispatcher | None = None,
        queue_policy: QueuePolicy = QueuePolicy(),
        plan_ahead: frozenset[str] = frozenset(),
        namespace_limits: NamespaceLimits = NamespaceLimits(),
        provisioning: str = names.PROVISIONING_NONE,
        karpenter: KarpenterOptions | None = None,
        solves: Solves | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """``solves``: where group preemption plans and smallest-change searches run — the
        process's solver workers unless given (``InProcess()``: in this interpreter).
        ``leadership``: whether this serve acts or is a standby (several replicas,
        cluster/leadership.py); one replica always acts."""
        self.cache = cache
        self.options = options
        self.clock = clock
        self.metrics = metrics or CycleMetrics()
        self.leadership: Leadership = leadership or AlwaysActing()
        # every write passes the gate: a standby writes nothing (cycle/leading.py)
        self.writer = writer = LeaderWriter(writer, self.leadership, self.metrics)
        self.dispatcher = dispatcher or Dispatcher(clock, self.metrics)
        self.lock = CycleLock()
        self.book = PlanBook(self._on_transition)
        self.status = StatusWriter(cache, writer, self.dispatcher)
        self.inbox = Inbox()
        self.explanations: dict[str, str] = {}  # group -> the last reason it did not fit
        self.smallest = SmallestChanges(cache, self.status, self.lock, self.explanations,
                                        solves)  # group -> what would make it fit
        self.domains: dict[str, tuple[str, str]] = {}  # group -> (topology key, domain) it keeps
        self.queue = PodGroupQueue(clock)
        self.verdicts = Verdicts(clock)  # pod uid -> kube-scheduler's latest candidate list
        self.parked = ParkedMembers(clock)  # members answered "no node": touched when their plan forms
        self.recorded = RecordedHolds(cache)  # partly bound gangs' records hold their nodes
        self.heap = Heap(returned=self.metrics.heap_returned.inc)  # settled once the caches are synced; see heap.py
        self.replans = ReplanBudget()  # group -> plans released since it last bound
        for reason in replans.REASONS:
            self.metrics.plans_released.labels(reason=reason)  # exported at 0 from the start
        self.tenants = Tenants(self.book, namespace_limits, clock)
        self.capacity = BarrierCapacity(self.book, barrier_capacity, cache.bound_node, clock, plan_ttl)
        self.queue_policies = QueuePolicies(cache, clock, self.queue, self.status, queue_policy)
        self.preemption = GroupPreemption(cache, writer, clock, self.metrics, self.status, self.inbox,
                                          reservations=lambda exclude: self.planner.reservations(exclude),
                                          victim_contexts=self.queue_policies.victim_contexts, solves=solves,
                                          acting=self.leadership.acting)
        # gangs short of capacity ask cluster-autoscaler for nodes (by default, or by annotation)
        # (with karpenter: NodeClaims of a NodePool instead of a ProvisioningRequest)
        node_claims = None if karpenter is None else NodeClaims(
            cache, writer, self.status, self.explanations, self.inbox, karpenter.nodepool, karpenter.timeout, clock)
        self.provisioning = Provisioning(cache, writer, self.status, self.explanations, self.inbox, provisioning,
                                         node_claims)
        # what the cycle's jobs share, handed as one (cycle/context.py)
        self.context = CycleContext(self.lock, self.book, cache, self.status, self.metrics, clock, self.inbox,
                                    self.queue, self.verdicts, self.parked, self.recorded, self.tenants,
                                    self.explanations, self.domains, self.leadership.acting)
        self.planner = Planner(self.context, options, plan_ttl, barrier_timeout, self.capacity, self.queue_policies,
                               self.preemption, self.smallest, self.provisioning)
        self.binding = Binding(self.lock, self.book, cache, writer, self.status, self.metrics, clock,
                               barrier_timeout, bind_workers)
        self.requeue = Requeue(self.context, self.planner, self.capacity, self.preemption, self.replans, self.heap)
        # gangs of these profiles planned before they ask
        self.ahead = PlanAhead(self.context, self.planner, self.preemption, plan_ahead)
        self.metrics.leading.set_function(lambda: 1 if self.leadership.acting() else 0)  # as of the scrape
        self.leadership.subscribe(self._on_leadership)
        self.whatif = WhatIf(self.lock, cache, self.planner, self.preemption, options)  # read only
        self.metrics.track_sizes(self.sizes)

    def sizes(self) -> dict[str, int]:
        """Entries of every long-lived collection of the cycle, its cache and its helpers
        (``cluster.sizes.collection_sizes``): what a soak watches for leaks."""
        return collection_sizes(self, "cycle")

    def start(self) -> "WorkloadCycle":
        """Start the cycle's threads (requeue, broken-unit evictions): ``phalanx serve`` does once
        its caches are listed."""
        if self.leadership.acting():
            with self.lock:
                self.planner.inherit(self.cache.podgroups)  # the records a former serve left
            self.preemption.solves.warm()  # its first plan should not wait for the worker to start
        self.requeue.start()
        self.preemption.start()
        self.ahead.start()
        return self

    @property
    def plans(self) -> PlanBook:
        """The plan book (read-only: plans change only through its transitions)."""
        return self.book

    def subscribe(self, listener: Callable[[str, Mapping[str, Any]], None]) -> None:
        self.status.subscribe(listener)

    def _on_leadership(self, acting: bool) -> None:
        """This serve started or stopped acting (several replicas). Stopping, plans not yet binding
        are dropped (reason leadership): the next term, here or on another replica, starts from the
        cluster and the placement records, as after a restart. Starting, the plans its book holds
        are kept — a standby's were made for the calls of the kube-scheduler that now leads, in the
        moment before serve saw it take the Lease — every complete group is planned ahead, units
        that broke while it stood by are evicted, and partly bound gangs go on from their records."""
        if not acting:
            with self.lock:
                for plan in list(self.book.holding()):
                    if plan.state is PlanState.PLANNED:
                        self.planner.release(plan.group, replans.LEADERSHIP, "this phalanx serve stopped acting")
            self.ahead.pause()
            return
        with self.lock:
            self.planner.inherit(self.cache.podgroups)  # the records the term before left
        self.preemption.solves.warm()
        self.ahead.resume(self.cache.podgroups)
        self.preemption.resume()
        self.inbox.wake()

    # -- the consequences of a plan transition -------------------------------------------------
    def _on_transition(self, plan: Plan, came: PlanState | None, to: PlanState, change: Change) -> None:
        """Everything a transition writes, the same way for gang and Basic groups (lock held)."""
        key = plan.group
        self.metrics.transitions.labels(to=to.value).inc()
        if to is PlanState.PLANNED:
            self.explanations.pop(key, None)
            self.smallest.forget(key)
            self.capacity.waiting.pop(key, None)
            self.status.emit("planned", group=key, domain=plan.domain, assignments=dict(plan.assignments),
                             path=plan.placement.path if plan.placement else "", ms=(plan.placement_ms or 0.0))
        elif to is PlanState.BINDING:
            # a gang's goes out with its placement record (Binding.write_record), in one write;
            # kube-scheduler's pod-group cycle writes it where it says it does
            if not plan.gang and not plan.condition_by_scheduler:
                self.status.set_status(key, True, names.REASON_SCHEDULED,
                                       scheduled_message(len(plan.assignments), plan.domain))
        elif to is PlanState.BOUND:
            self.verdicts.forget(plan.assignments)  # learned for this group's members, now moot
            self.replans.forget(key)
            self.metrics.time_to_place.observe(max(0.0, self.clock() - plan.created))
            # no event: the condition went True at binding and kube-scheduler writes each member's
            # Scheduled event; one write fewer per group (docs/operations.md, "Condition and events")
            self.status.emit("bound", group=key, assignments=dict(plan.assignments))
        elif to is not PlanState.FORGOTTEN:  # released, expired, failed: nothing is held any more
            self._dropped(plan, to, change)
        if to is not PlanState.PLANNED and to is not PlanState.BINDING:
            # barrier capacity may have freed: the first waiting gang that now fits is retried
            fitting = self.capacity.first_fitting()
            if fitting:
                self.inbox.nudge(self.parked.take_group(fitting))
            if came in (PlanState.PLANNED, PlanState.BINDING):
                # a plan of its namespace closed: the group its namespace's limit held back longest goes
                freed = self.tenants.plans.freed(key)
                if freed:
                    self.inbox.nudge(self.parked.take_group(freed))
        self.metrics.plans.set(len(self.book))
        self.metrics.barrier_held.set(self.capacity.held())
        self.lock.notify()

    def _dropped(self, plan: Plan, to: PlanState, change: Change) -> None:
        key = plan.group
        plan.error = change.why
        # a gang's members at its barrier (plugin mode: waiting at Permit, assumed by kube-scheduler)
        # are waiting for a plan that is gone: the plugin adapter has them rejected
        arrived = tuple(sorted(plan.arrived)) if plan.gang else ()
        if not plan.bound and not any(self.cache.bound_node(uid) for uid in plan.assignments) \
                and (plan.gang or not (plan.answered or plan.arrived)):
            # nothing of this plan bound nor about to (a gang's members bind only through a plan; a
            # Basic member answered may still be bound): the domain it was planned in holds none of
            # the group, so the next plan may go elsewhere (bound members keep theirs in the solver)
            self.domains.pop(key, None)
        if to is PlanState.FAILED:
            self.status.event(key, names.EVENT_BIND_FAILED, change.why, "Warning")
            self.status.emit("bind_failed", group=key, error=change.why, arrived=arrived)
        else:
            self.status.emit("plan_released", group=key, reason=change.why, arrived=arrived)
        if not change.reason:
            return
        # a counted release; past the reason's limit the group backs off instead of re-planning
        self.metrics.plans_released.labels(reason=change.reason).inc()
        give_up = self.replans.record(key, change.reason, change.why, change.pod, change.node)
        if give_up:
            self.queue.failed_attempt(key, self.cache.capacity_version, give_up,
                                      failures=self.replans.past_limits(key))
            self.explanations[key] = give_up
            self.status.unschedulable(key, give_up)

    def check_timers(self) -> None:
        """Run the plan TTL now and wake barrier waiters to look at their deadlines (the injected
        clock may have moved without any call arriving: tests, a quiet cluster)."""
        with self.lock:
            self.planner.expire()
            self.lock.notify()

    # -- filter ------------------------------------------------------------------------------
    def filter(self, pod: Pod, candidates: list[str]) -> FilterAnswer:
        """kube-scheduler's filter phase, after its own filters: which of ``candidates`` may the
        pod go to (the entry point read the pod: see cluster.convert.read_pod). Never raises for
        a group's content: it answers with reasons instead."""
        if not pod.group:
            with self.lock:
                self.planner.expire()
                return self._filter_plain(pod, candidates)
        # built off the lock (10,000 names cost ~1 ms): what kube-scheduler left out of the nodes
        # phalanx knows (a C-level copy of the keys, safe while the cache's thread adds nodes)
        passed = frozenset(candidates)
        self.verdicts.learn(pod, frozenset(self.cache.nodes.keys() - passed), alive=self.cache.pods.__contains__)
        self.binding.filtered(pod.uid, pod.group)  # its bind call names only the pod (own leaf lock)
        with self.lock:
            self.planner.expire()
            self.planner.release_throttled()
            return self.answer_member(pod, pod.group, passed)

    def _filter_plain(self, pod: Pod, candidates: list[str]) -> FilterAnswer:
        """A pod without a group: only keep it off capacity reserved for planned groups."""
        if not self.book and not self.preemption.nominations:
            return FilterAnswer(list(candidates))  # fast path: nothing reserved
        reserved = self.planner.reservations()
        touched = [n for n in candidates if n in reserved]
        if not touched:
            return FilterAnswer(list(candidates))
        failed = {}
        free = self.cache.usage
        for node_name in touched:
            node = self.cache.nodes.get(node_name)
            if node is None:
                continue
            used = free.get(node_name, {})
            held = reserved[node_name]
            for r, amount in list(pod.spec.requests.items()) + [(PODS, 1)]:
                if amount and node.allocatable.get(r, 0) - used.get(r, 0) - held.get(r, 0) < amount:
                    failed[node_name] = f"phalanx: {r} on this node is reserved for a planned podgroup"
                    break
        return FilterAnswer([n for n in candidates if n not in failed], failed=failed)

    def answer_member(self, pod: Pod, key: str, candidates: frozenset[str]) -> FilterAnswer:
        """A member's answer (lock held): its planned node when a plan holds it (a cycle first when
        none does and the group may be planned), else no node and why."""
        def no(reason: str) -> FilterAnswer:
            self.parked.park(key, pod.uid, pod.namespace, pod.name)
            self.preemption.clear_if_gone(key)  # parked after its last victim went: touch it
            return FilterAnswer.refused(reason, candidates)

        self.parked.here(pod.uid)
        answer = self._answer_from_plan(pod, key, candidates)
        if isinstance(answer, str):
            return no(answer)
        if answer is not None:
            return answer
        waiting = self.preemption.waiting(key)
        if waiting:
            return no(waiting)
        group = self.planner.group_view(key, pod)
        if isinstance(group, str):
            self.explanations[key] = group
            self._park_incomplete(key, pod)
            return no(group)
        held = self.planner.held_back(group)
        if held:
            return no(held)  # backing off, or known not to fit the barrier capacity: do not re-solve
        placement = self.planner.resume(group, candidates) or self.planner.cycle(group, fresh=pod.uid)
        if not placement.assignments:
            return no(self.explanations.get(key) or f"podgroup {key}: no placement")
        plan = self.book.get(key)
        if plan is None or pod.uid not in plan.assignments:
            return no(f"phalanx: podgroup {key} planned without {pod.key}")
        answer = self.answer_planned(plan, pod, candidates)
        if answer is None:
            # the solver chose a node kube-scheduler's filters just refused: a plan known to fail
            # holds nothing; the group is re-planned at the next call, as often as replans allows
            self._release_rejected(plan, pod)
            return no(self.explanations.get(key) or f"phalanx: podgroup {key}: planned node "
                      f"{plan.assignments[pod.uid]} for {pod.key} was filtered out; re-planning")
        return answer

    def _answer_from_plan(self, pod: Pod, key: str, candidates: frozenset[str]) -> FilterAnswer | str | None:
        """The answer the group's plan gives ``pod`` (a string: no node, and why), or None when a
        cycle must decide (no plan, or one just released or forgotten)."""
        plan = self.book.get(key)
        if plan is None:
            return None
        # a Basic plan's members bind one by one: one not bound yet is answered as planned
        open_ = plan.state is PlanState.PLANNED or (
            plan.state is PlanState.BINDING and not plan.gang and pod.uid not in plan.bound)
        if pod.uid in plan.assignments and open_:
            answer = self.answer_planned(plan, pod, candidates)
            if answer is not None:
                return answer
            self._release_rejected(plan, pod)
        elif plan.state is PlanState.BINDING and plan.gang:
            return f"phalanx: podgroup {key} is binding"
        elif plan.gang and pod.uid in plan.left_out and plan.state is PlanState.PLANNED:
            # the solve saw it and placed minCount without it: releasing the plan for it would
            # re-plan the same room for ever; it is placed once the gang bound, if room remains
            return (f"phalanx: podgroup {key} is planned without {pod.key} ({len(plan.assignments)} members "
                    "placed, minCount met); it is placed after the gang binds if room remains")
        elif plan.state in (PlanState.PLANNED, PlanState.BINDING):
            # a Basic plan's bound members stay where they are; the rest is planned with the new one
            self.planner.release(key, replans.NEW_MEMBER, f"re-plan: new member {pod.key}")
        elif plan.state is PlanState.BOUND and pod.uid not in plan.assignments:
            self.book.transition(plan, PlanState.FORGOTTEN)  # a new member after the gang bound
        return None

    def answer_planned(self, plan: Plan, pod: Pod, candidates: frozenset[str]) -> FilterAnswer | None:
        """The planned node when kube-scheduler's filters passed it, else a re-slotted one, else
        None (the plan is stale for this pod)."""
        node = plan.assignments[pod.uid]
        if node not in candidates:
            node = self._reslot(plan, pod, candidates)
            if not node:
                return None
        plan.answered.add(pod.uid)
        # the other candidates are dropped without a reason (they count as unresolvable): one node
        # fits, so no reason would ever be shown, and 10,000 of them cost ~1 ms
        return FilterAnswer([node])

    def _reslot(self, plan: Plan, pod: Pod, candidates: frozenset[str]) -> str:
        """kube-scheduler's filters dropped ``pod``'s planned node: swap with a member of the same
        plan that has the same shape key and no volumes, has not been answered (nor reached bind,
        nor bound) and whose planned node IS among ``pod``'s candidates. The plan's multiset of
        nodes is unchanged, so nothing else moves; so a topology-spread plan works in whatever
        order kube-scheduler sends its members. A partner whose own verdict passed ``pod``'s old
        node is preferred. Returns the new node, or "" when no swap exists."""
        if pod.volumes:
            return ""
        mine = plan.assignments[pod.uid]
        partner = ""
        for uid, node in plan.assignments.items():
            if uid == pod.uid or node == mine or node not in candidates or uid in plan.answered or uid in plan.arrived:
                continue
            other = plan.members.get(uid)
            if other is None or not interchangeable(pod, other):
                continue
            if self.cache.bound_node(uid):
                continue
            verdict = self.verdicts.get(uid)
            partner = partner or uid
            if verdict is None or mine not in verdict.excluded:
                partner = uid
                break
        if not partner:
            return ""
        plan.swap(pod.uid, partner)
        self.status.emit("reslotted", group=plan.group, pod=pod.key, node=plan.assignments[pod.uid], was=mine,
                         partner=plan.members[partner].key)
        return plan.assignments[pod.uid]

    def _release_rejected(self, plan: Plan, pod: Pod, detail: str = "was filtered out") -> None:
        node = plan.assignments[pod.uid]
        self.planner.release(plan.group, replans.FILTERED_OUT, f"stale: planned node {node} {detail} for {pod.key}",
                             pod.name, node)

    def _park_incomplete(self, key: str, pod: Pod, preempting: bool = False) -> None:
        """Park a member answered while its group looked incomplete, and have the requeue thread
        check the group once more: an event that completed it may have landed meanwhile.
        ``preempting``: answered at kube-scheduler's preemption call (its own filters left no node)."""
        self.parked.park(key, pod.uid, pod.namespace, pod.name, incomplete=True,
                         unseen=key not in self.cache.podgroups)
        self.inbox.arrived(key, preempting)

    # -- prioritize --------------------------------------------------------------------------
    def prioritize(self, uid: str, candidates: list[str]) -> dict[str, int]:
        """Scoring: pod ``uid``'s planned node scores 10, the rest 0; pods without a plan score all
        nodes 0."""
        with self.lock:
            plan = self.book.of_member(uid)
            if plan is not None:
                node = plan.assignments[uid]
                return {n: (10 if n == node else 0) for n in candidates}
        return {n: 0 for n in candidates}

    # -- preempt -----------------------------------------------------------------------------
    def preempt_for_group(self, pod: Pod) -> None:
        """kube-scheduler's PostFilter for a group member: its own filters left no node, so the
        extender's filter was never asked. Group preemption is phalanx's job, not per-pod: run the
        group's cycle on every node and, when it does not fit, plan and start a group preemption.
        The answer to kube-scheduler is always "no per-pod preemption"."""
        key = pod.group
        with self.lock:
            self.planner.expire()
            if key in self.book or self.preemption.waiting(key):
                return
            group = self.planner.group_view(key, pod)
            if isinstance(group, str):
                # kube-scheduler parks the pod, and retries it only on events its own filters
                # care about (a touch is not one): phalanx runs the cycle once the group is complete
                self.explanations[key] = group
                self._park_incomplete(key, pod, preempting=True)
                return
            self.planner.cycle(group)

    def preempt_candidates(self, proposed: Mapping[str, list[str]]) -> set[str]:
        """kube-scheduler's per-pod preemption for a pod without a group (``proposed``: candidate
        node -> the uids of its victims): the candidate nodes to keep. A victim in a
        ``disruptionMode: all`` group costs its whole group, so candidates that would break such a
        group are dropped whenever a cheaper candidate exists (breaking one is the last resort; the
        rest of a broken group is then evicted by phalanx, see GroupPreemption). Victims stay those
        on the candidate node, as kube-scheduler requires."""
        with self.lock:
            snapshot = self.cache.snapshot(with_bound=True)
            known = {p.uid for p in snapshot.bound}
            usable = {n: uids for n, uids in proposed.items()
                      if n in snapshot.index and all(u in known for u in uids)}
            try:
                ranked = rank_candidates(usable, snapshot, self.cache.preemption_context())
            except InvalidInput as err:
                log.info("preempt: keeping kube-scheduler's candidates: %s", err)
                return set(proposed)
        kept = {c.node for c in ranked}
        # nodes phalanx cannot judge (pods it has not seen yet) are passed through unchanged
        return {n for n in proposed if n in kept or n not in usable}

    # -- bind --------------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """kube-scheduler's bind: returns once the Binding exists; raises BindError otherwise."""
        self.binding.bind(namespace, name, uid, node)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued API write was made (tests, benchmarks, shutdown)."""
        return self.smallest.settle(timeout) and self.dispatcher.flush(timeout=timeout)

    def prune(self) -> None:
        """Forget everything kept for PodGroups that no longer exist (see Requeue.prune)."""
        self.requeue.prune()

    # -- on demand (gRPC PlaceGroup, the demo driver) ----------------------------------------
    def place_group(self, key: str) -> Placement | str:
        """Run a workload cycle for ``key`` now, on every node (no kube-scheduler pre-filter).
        Returns the placement held as the plan, or the reason there is none."""
        with self.lock:
            self.planner.expire()
            plan = self.book.get(key)
            if plan is not None and plan.placement is not None:
                return plan.placement
            members = self.cache.members(key)
            pending = [m.pod for m in members if not m.pod.node and not m.gated]
            if not pending:
                return f"podgroup {key}: no pending members"
            group = self.planner.group_view(key, pending[0])
            if isinstance(group, str):
                self.explanations[key] = group
                return group
            placement = self.planner.resume(group, list(self.cache.nodes)) or self.planner.cycle(group)
            if placement.assignments:
                return placement
            return placement.explanation.message() if placement.explanation else self.explanations.get(key, "")

    def place_eligible(self) -> dict[str, Placement | str]:
        """One pass of the queue: every eligible group with pending members, highest priority then
        oldest, gets a cycle now (so a high-priority gang plans before a lower one takes its room,
        whatever order kube-scheduler sends pods in). Returns each group's placement or reason."""
        groups = []
        for key in list(self.cache.podgroups):
            try:
                group = self.cache.podgroup(key)
            except InvalidInput:
                continue
            if group is not None:
                groups.append(group)
        with self.lock:
            order = self.queue.order(groups)
        # one group at a time, each cycle taking the lock itself (its solve runs off it)
        return {g.key: self.place_group(g.key) for g in order}

    # -- introspection -----------------------------------------------------------------------
    def what_if(self, drafts: tuple[DraftGroup, ...],
                composites: tuple[CompositeRecord, ...] = ()) -> list[WhatIfAnswer]:
        """Where ``drafts`` (a manifest's PodGroups, not created) would go now, with the manifest's
        CompositePodGroups; changes nothing (:mod:`.whatif`)."""
        return self.whatif.plan(drafts, composites)

    def plan_of(self, key: str) -> Plan | None:
        with self.lock:
            return self.book.get(key)

    def composite_of(self, key: str) -> "CompositeOf | None":
        """The CompositePodGroup tree PodGroup ``key`` is a child of, as explain shows it (None
        when it names no parent)."""
        root = self.cache.composite_root(key)
        if not root:
            return None
        tree = self.cache.composite(root)
        if isinstance(tree, str):
            return CompositeOf(root, (), "", tree)
        need = (f"{tree.required} of {len(tree.children)} children together" if tree.required
                else f"{len(tree.children)} children, each on its own (basic)")
        where = f", in one {tree.topology_key}" if tree.topology_key else ""
        return CompositeOf(root, tuple(g.key for g in tree.leaves()), f"{need}{where}")

    def group_state(self, key: str) -> str:
        """One word for operators: waiting, planned, binding, scheduled, finished (every member
        that counts has finished), unschedulable, pending."""
        with self.lock:
            self.planner.expire()
            plan = self.book.get(key)
            if plan is not None:
                return "scheduled" if plan.state is PlanState.BOUND else (plan.state or PlanState.PLANNED).value
            reason = self.explanations.get(key, "")
        members = self.cache.members(key)
        group = self.cache.podgroups.get(key)
        if group is None:
            return "unknown"
        min_count = group.spec.min_count
        bound = sum(1 for m in members if m.pod.node)
        if members and bound >= min(min_count, len(members)) and bound == len(members):
            return "scheduled"
        finished = len(self.cache.finished_members(key))
        if not members and finished:
            return "finished"
        if "waiting for members" in reason or len(members) + finished < min_count:
            return "waiting"
        if reason:
            return "unschedulable"
        return "pending"

    def close(self) -> None:
        self.ahead.close()
        self.requeue.close()
        self.binding.close()
        self.dispatcher.flush(timeout=2.0)
        self.dispatcher.close()
