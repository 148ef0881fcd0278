"""The workload-cycle service: plans whole PodGroups, holds their capacity, binds them as one.

kube-scheduler sees one pod at a time; phalanx answers for the whole group. The moves, by the
kube-scheduler phase that calls them (DESIGN section 4):

- **filter** (scheduling cycle, after the in-tree filters): a pod of a group that has fewer than
  minCount members gets no node ("waiting for members"). The first member to arrive once the group
  is complete triggers a *workload cycle*: one snapshot minus the other groups' reservations, one
  solver call for every pending member. A feasible answer becomes a :class:`Plan` whose capacity
  is *reserved* until its deadline; each member is then answered with its planned node only.
  Pods without a group are kept off capacity reserved for plans.

  What phalanx cannot model, it learns: every filter call's candidate list is kube-scheduler's
  verdict for that pod (:mod:`.verdicts`), and each cycle passes the verdicts to the solver as
  per-pod allowed nodes, with the other plans' members not yet bound as assumed pods (as
  kube-scheduler's cache has them). When the in-tree filters dropped a member's planned node, the
  member first swaps nodes with a not-yet-answered identical member whose node they passed
  (*re-slot*: the plan's nodes are unchanged, nothing else moves); only when none exists is the
  plan released and the group re-planned — and only so often (:mod:`.replans`): then the group
  backs off and its status names what kube-scheduler rejected. Never a livelock.
- **bind** (binding cycle, one goroutine per pod): a gang member waits at the :class:`Barrier`
  until every planned member has arrived (or is already bound). Then the placement record is
  written on the PodGroup (so a restart finishes the gang, never splits it), all members are bound
  in parallel, and every waiter returns. On timeout nothing is bound and the plan is released.
- **plugin mode** (phalanx's kube-scheduler framework plugin, adapted by :mod:`.plugin_mode`):
  the same plans through the plugin's extension points, each a public method built on the
  helpers filter and bind use: :meth:`WorkloadCycle.plan_for_member` (PreFilter, the member's
  answer on every node), :meth:`~WorkloadCycle.report_rejection` (PostFilter: the verdict, then
  re-slot or release), :meth:`~WorkloadCycle.reserve` / :meth:`~WorkloadCycle.unreserve` (the
  barrier's arrivals), :meth:`~WorkloadCycle.permit` (the barrier: the placement record, then
  kube-scheduler binds) and :meth:`~WorkloadCycle.reservations_snapshot` (what the plugin's
  cache must count as held).

Plan life cycle: one explicit state machine, :class:`PlanState` (``planned`` --> ``binding`` -->
``bound``, or ``released`` / ``expired`` / ``failed``), every transition through
:meth:`WorkloadCycle._transition`, which writes status, events, metrics and listener notifications
the same way for gang and Basic groups. Timers (plan TTL, barrier, backoff) use the injected clock.

Concurrency (DESIGN section 4):

- **Barrier capacity is planned.** Each waiting gang member holds one server thread at the
  barrier, and several gangs wait at once; so the cycle knows how many members the server can
  hold waiting (``barrier_capacity``: its thread count minus a reserve for filter, prioritize and
  the probes, see :func:`barrier_capacity`) and never holds more planned-but-unbound gang members
  than that. A gang whose plan would exceed the free capacity is not planned ("waiting for
  barrier capacity") and is planned when capacity frees, in queue order: a gang waiting for more
  room than is free blocks later ones from taking it (no starvation), and a gang that could never
  fit is Unschedulable, saying so. Waiting binds are not served without a thread: planning the
  capacity keeps the server simple (a thread per call) and bounds the waiting by construction.
- **Nothing slow under the lock.** API writes (events, status, record removals, touches) go
  through the asynchronous :class:`~.dispatch.Dispatcher`; the placement record and the bindings
  stay synchronous but are made outside the lock. Solves (plans and preemption plans) run off the
  lock on inputs taken under it, and commit under it only if the plan generation did not move.
- Any exception while binding finishes the plan as ``failed``: no plan stays in ``binding``.
- Every map keyed by group or pod is pruned on PodGroup deletion and re-list (:meth:`prune`).

No input reaching a verb raises out of it: a pod that does not convert is answered with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Callable, Iterable, Mapping

from cluster import names
from cluster.backend import ClusterWriter, WriteError
from cluster.cache import ClusterCache, PodRecord
from cluster.convert import PlacementRecord, placement_annotation, placement_record, pod_from_json, pod_group_name
from solver import (
    InvalidInput,
    Placement,
    PlacementInvalid,
    Pod,
    PodGroup,
    Policy,
    Snapshot,
    SolveOptions,
    assert_placement_valid,
    place,
    rank_candidates,
)
from solver.model import PODS, add_resources, placement_usage

from . import replans
from .dispatch import Dispatcher, Write
from .heap import Heap
from .holds import QueuePolicies
from .metrics import CycleMetrics
from .parked import ParkedMembers
from .preemption import GroupPreemption
from .queue import PodGroupQueue, QueuePolicy
from .records import RecordedHolds
from .replans import ReplanBudget
from .verdicts import SWEEP_INTERVAL, Verdicts

log = logging.getLogger("phalanx.cycle")


class PlanState(str, Enum):
    """Where a plan is in its life (DESIGN section 6). Like kube-scheduler's cache of assumed pods
    (assumed -> added, or expired / forgotten), a plan holds capacity from ``planned`` until its
    bindings are seen; it leaves only through :meth:`WorkloadCycle._transition`::

        (new) --> planned --barrier complete (gang) / first member at bind (Basic)--> binding
        planned --stale node, new member, barrier timeout, group deleted--> released
        planned --deadline--> expired          binding (Basic) --deadline--> expired
        binding --every binding made--> bound   binding --any error while binding--> failed

    ``bound`` is kept until the cache shows the bindings, then forgotten; ``released``,
    ``expired`` and ``failed`` are final and hold nothing."""

    PLANNED = "planned"
    BINDING = "binding"
    BOUND = "bound"
    RELEASED = "released"
    EXPIRED = "expired"
    FAILED = "failed"


#: the allowed transitions; None is a plan being made. Basic plans may also leave ``binding`` by
#: release or expiry (their members bind one by one; the unbound rest is re-planned).
TRANSITIONS: dict[PlanState | None, frozenset[PlanState]] = {
    None: frozenset({PlanState.PLANNED}),
    PlanState.PLANNED: frozenset({PlanState.BINDING, PlanState.RELEASED, PlanState.EXPIRED}),
    PlanState.BINDING: frozenset({PlanState.BOUND, PlanState.FAILED, PlanState.RELEASED, PlanState.EXPIRED}),
    PlanState.BOUND: frozenset(),
    PlanState.RELEASED: frozenset(),
    PlanState.EXPIRED: frozenset(),
    PlanState.FAILED: frozenset(),
}
FINAL = frozenset({PlanState.RELEASED, PlanState.EXPIRED, PlanState.FAILED})
HOLDING = frozenset({PlanState.PLANNED, PlanState.BINDING, PlanState.BOUND})  # reserve capacity
#: a workload cycle whose inputs changed while it solved off the lock is solved again, this often
SOLVE_ATTEMPTS = 3


def barrier_capacity(http_threads: int) -> int:
    """Gang members the server can hold waiting at the bind barrier at once: its threads minus a
    reserve for filter, prioritize, preempt and the probes (1/16 of the pool, at least 8, at most
    half of a small pool)."""
    return max(1, http_threads - max(min(8, http_threads // 2), http_threads // 16))


@dataclass
class Plan:
    group: str
    assignments: dict[str, str]  # pending pod uid -> node
    requests: dict[str, Mapping[str, int]]  # pod uid -> requests (for reservations)
    domain: str
    created: float
    deadline: float
    placement: Placement | None = None
    placement_ms: float = 0.0  # how long the solve took (for the Planned event and listeners)
    gang: bool = True  # Basic groups bind member by member, with no barrier
    state: PlanState | None = None  # None until it is held (see PlanState)
    arrived: set[str] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)  # members phalanx bound (a Basic plan's, one by one)
    failed_uids: set[str] = field(default_factory=set)
    error: str = ""
    members: dict[str, Pod] = field(default_factory=dict)  # pending pod uid -> its record when planned
    answered: set[str] = field(default_factory=set)  # members filter answered with their node

    def swap(self, a: str, b: str) -> None:
        """Exchange two identical members' nodes (re-slot): the plan's nodes stay the same."""
        self.assignments[a], self.assignments[b] = self.assignments[b], self.assignments[a]
        if self.placement is not None:
            self.placement = replace(self.placement, assignments=dict(self.assignments))

    def reservations(self, exclude_bound: set[str] = frozenset()) -> dict[str, dict[str, int]]:
        held = {uid: node for uid, node in self.assignments.items() if uid not in exclude_bound}
        return placement_usage(held, self.requests)


@dataclass
class BarrierWaiter:
    """A gang whose plan would exceed the free barrier capacity, waiting its turn."""

    need: int
    order: tuple  # (-priority, created, key): queue order, as PodGroupQueue.order
    refreshed: float  # injected clock; a waiter not seen again within plan_ttl is dropped


@dataclass(frozen=True)
class FilterAnswer:
    """What filter tells kube-scheduler: feasible nodes, and reasons for the rest."""

    nodes: list[str]
    failed: dict[str, str] = field(default_factory=dict)  # resolvable (preemption may help)
    unresolvable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PermitAnswer:
    """What :meth:`WorkloadCycle.permit` tells phalanx's framework plugin (plugin mode)."""

    decision: str  # allow | wait | reject
    reason: str = ""
    allow: tuple[str, ...] = ()  # the members the plugin allows now
    wait_seconds: float = 0.0


class BindError(RuntimeError):
    """Binding refused or failed; kube-scheduler un-reserves the pod and retries it."""


def convert_pod(pod_json: Any) -> tuple[Pod, str] | str:
    """The pod and its PodGroup's name ("" for none), or why the JSON is not a pod phalanx can
    read: the border where no bad input gets past as an exception."""
    try:
        return pod_from_json(pod_json), pod_group_name(pod_json)
    except InvalidInput as err:
        return f"phalanx: {err}"
    except (AttributeError, TypeError, ValueError, KeyError) as err:  # a field of the wrong type
        return f"phalanx: malformed pod: {type(err).__name__}: {err}"


def _uid_of(pod_json: Any) -> str:
    meta = pod_json.get("metadata") if isinstance(pod_json, Mapping) else None
    return str(meta.get("uid") or "") if isinstance(meta, Mapping) else ""


def _not_planned_there(plan: Plan | None, key: str, uid: str, node: str) -> str:
    """Why the plugin's member ``uid`` is not planned (on ``node``, when given), or "" when it is."""
    if plan is None or uid not in plan.assignments:
        return f"phalanx: podgroup {key} holds no plan for pod {uid}; re-planning"
    if node and plan.assignments[uid] != node:
        return f"phalanx: pod {uid} is planned on {plan.assignments[uid]}, not {node}"
    return ""


def _total(usages: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """Per-node usages added up, per node."""
    total: dict[str, dict[str, int]] = {}
    for usage in usages:
        for node, amounts in usage.items():
            total[node] = add_resources(total.get(node, {}), amounts)
    return total


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _podgroup_obj(key: str) -> str:
    return f"PodGroup/{key}"


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
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.options = options
        self.barrier_timeout = barrier_timeout
        self.plan_ttl = plan_ttl
        self.clock = clock
        self.metrics = metrics or CycleMetrics()
        # gang members that may be planned and unbound at once (None: no limit); see _barrier_wait
        self.barrier_capacity = barrier_capacity
        self.dispatcher = dispatcher or Dispatcher(clock, self.metrics)
        self.plans: dict[str, Plan] = {}
        self.explanations: dict[str, str] = {}  # group -> last reason it did not fit
        # group -> (topology key, domain) it was placed in; forgotten when a member is disrupted
        # (evicted, preempted) or the PodGroup is deleted
        self.domains: dict[str, tuple[str, str]] = {}
        self.barrier_queue: dict[str, BarrierWaiter] = {}  # gangs waiting for barrier capacity
        self._conditions: dict[str, dict] = {}  # group -> the last condition queued (the cache lags)
        self._solving: set[str] = set()  # groups whose cycle is solving off the lock now
        self._generation = 0  # bumps whenever reservations change or phalanx binds a pod no plan held
        self._lock = threading.RLock()
        self._arrival = threading.Condition(self._lock)
        self._preempt_lock = threading.Lock()  # one group-preemption solve at a time, off the cycle's lock
        self._binder = ThreadPoolExecutor(max_workers=bind_workers, thread_name_prefix="phalanx-bind")
        self._listeners: list[Callable[[str, Mapping[str, Any]], None]] = []
        self.preemption = GroupPreemption(self)
        self.queue = PodGroupQueue(clock)
        self.queue_policies = QueuePolicies(self, queue_policy)  # starvation holds, fragmentation, lost work
        self.verdicts = Verdicts(clock)  # pod uid -> kube-scheduler's latest candidate list
        self._nodes_seen: set[str] = set(cache.nodes)  # to tell a node added from a re-list's replay
        self.parked = ParkedMembers()  # members answered "no node": touched when their plan forms
        self._nudges: list[tuple[str, str]] = []  # (namespace, name) to touch, by the requeue thread
        self._deleted: set[str] = set()  # PodGroups deleted, pruned by the requeue thread
        self._arrived: set[str] = set()  # groups waiting for members that got a schedulable one
        self._preempt_incomplete: set[str] = set()  # of those, answered at a preemption call
        self.recorded = RecordedHolds(cache)  # partly bound gangs' records hold their nodes
        self.heap = Heap()  # settled (frozen) once the caches are synced: see heap.py
        self.replans = ReplanBudget()  # group -> plans released since it last bound
        for reason in replans.REASONS:
            self.metrics.plans_released.labels(reason=reason)  # exported at 0 from the start
        self._capacity_seen = cache.capacity_version
        self._changed_nodes: set[str] = set()
        self._changed_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        cache.subscribe(self._on_cache_change)
        threading.Thread(target=self._requeue_loop, name="phalanx-requeue", daemon=True).start()

    # -- events for the dashboard / gRPC stream ----------------------------------------------
    def subscribe(self, listener: Callable[[str, Mapping[str, Any]], None]) -> None:
        self._listeners.append(listener)

    def _emit(self, kind: str, **data: Any) -> None:
        for listener in self._listeners:
            try:
                listener(kind, data)
            except Exception:  # noqa: BLE001 - a broken listener must not break scheduling
                log.exception("event listener failed")

    @contextmanager
    def _unlocked(self):
        """Run a slow step (a solve) without the cycle's lock; called with it held once."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    # -- the plan state machine ----------------------------------------------------------------
    def _transition(self, plan: Plan, to: PlanState, reason: str = "", why: str = "", pod: str = "",
                    node: str = "", note: str = "") -> bool:
        """The one door between plan states (call with the lock held): status, events, metrics and
        listener notifications are written here, the same way for gang and Basic groups.
        ``reason`` is one of :data:`replans.REASONS` for a counted release, ``why`` the words for
        people. Returns False (and changes nothing) for a transition the table does not allow."""
        came = plan.state
        if to not in TRANSITIONS[came] or (came is PlanState.BINDING and plan.gang
                                           and to in (PlanState.RELEASED, PlanState.EXPIRED)):
            log.debug("plan of %s: no transition %s -> %s", plan.group, came, to)
            return False
        key = plan.group
        plan.state = to
        if came not in HOLDING or to not in HOLDING:
            # a plan made or dropped changes what other groups' solves see; planned -> binding ->
            # bound holds the same capacity on the same nodes, so a solve in flight stays valid
            self._generation += 1
        self.metrics.transitions.labels(to=to.value).inc()
        if to is PlanState.PLANNED:
            self.plans[key] = plan
            self.explanations.pop(key, None)
            self.barrier_queue.pop(key, None)
            self._event_key(key, names.EVENT_PLANNED, note)
            self._emit("planned", group=key, domain=plan.domain, assignments=dict(plan.assignments),
                       path=plan.placement.path if plan.placement else "", ms=(plan.placement_ms or 0.0))
        elif to is PlanState.BINDING:
            self._set_status(key, True, "Scheduled",
                             f"{len(plan.assignments)} pods going to binding in {plan.domain or 'the cluster'}")
        elif to is PlanState.BOUND:
            self.verdicts.forget(plan.assignments)  # learned for this group's members, now moot
            self.replans.forget(key)
            self.metrics.time_to_place.observe(max(0.0, self.clock() - plan.created))
            self._event_key(key, names.EVENT_BOUND, f"bound {len(plan.assignments)} pods")
            self._emit("bound", group=key, assignments=dict(plan.assignments))
        else:  # released, expired, failed: nothing is held any more
            plan.error = why
            if self.plans.get(key) is plan:
                del self.plans[key]
            if to is PlanState.FAILED:
                self._event_key(key, names.EVENT_BIND_FAILED, why, "Warning")
                self._emit("bind_failed", group=key, error=why)
            else:
                self._emit("plan_released", group=key, reason=why)
            if reason:
                self._count_release(key, reason, why, pod, node)
        if to is not PlanState.PLANNED and to is not PlanState.BINDING:
            self._barrier_freed()
        self.metrics.plans.set(len(self.plans))
        self.metrics.barrier_held.set(self._barrier_held())
        self._arrival.notify_all()
        return True

    def _forget(self, plan: Plan, all_bound: bool = False) -> None:
        """A plan whose bindings the cache shows holds nothing: drop it (no state change).
        ``all_bound``: the cache shows every member bound, so the plan held nothing any more and
        what other groups' solves see is unchanged (no generation bump: a solve in flight stays
        valid)."""
        if self.plans.get(plan.group) is plan:
            del self.plans[plan.group]
            if not all_bound:
                self._generation += 1
            self.metrics.plans.set(len(self.plans))

    def check_timers(self) -> None:
        """Run the plan TTL now and wake barrier waiters to look at their deadlines (the injected
        clock may have moved without any call arriving: tests, a quiet cluster)."""
        with self._lock:
            self._expire()
            self._arrival.notify_all()

    # -- reservations ------------------------------------------------------------------------
    def _expire(self) -> None:
        now = self.clock()
        for _key, plan in list(self.plans.items()):
            done = all(self._bound_node(u) for u in plan.assignments)
            if done and plan.state is PlanState.BINDING and not plan.gang:
                self._transition(plan, PlanState.BOUND)
            if done and plan.state in (PlanState.PLANNED, PlanState.BOUND) or (
                    plan.state is PlanState.BOUND and plan.deadline < now):
                # a plan is kept until the cache shows its bindings (a Basic group's member by
                # member), so its capacity is never counted free twice
                self._forget(plan, all_bound=done)
            elif plan.deadline < now and (plan.state is PlanState.PLANNED or (
                    plan.state is PlanState.BINDING and not plan.gang)):
                self._transition(plan, PlanState.EXPIRED, replans.EXPIRED,
                                 "plan expired before all members reached bind")

    def _release(self, key: str, reason: str, why: str, pod: str = "", node: str = "") -> None:
        """Release ``key``'s plan short of binding: ``reason`` is one of :data:`replans.REASONS`,
        ``why`` the words for people."""
        plan = self.plans.get(key)
        if plan is not None:
            self._transition(plan, PlanState.RELEASED, reason, why, pod, node)

    def _count_release(self, key: str, reason: str, why: str, pod: str = "", node: str = "") -> None:
        """Count a release; past the reason's limit the group backs off instead of re-planning."""
        self.metrics.plans_released.labels(reason=reason).inc()
        give_up = self.replans.record(key, reason, why, pod, node)
        if not give_up:
            return
        self.queue.failed_attempt(key, self.cache.capacity_version, give_up,
                                  failures=self.replans.past_limits(key))
        self.explanations[key] = give_up
        self._set_status(key, False, names.REASON_UNSCHEDULABLE, give_up)
        self._event_key(key, names.EVENT_FAILED_SCHEDULING, give_up, "Warning")
        self._emit("unschedulable", group=key, message=give_up)

    def reservations(self, exclude_group: str = "") -> dict[str, dict[str, int]]:
        """Capacity held by plans (other than ``exclude_group``), per node, minus bound members."""
        with self._lock:  # also called by group preemption, off the lock
            self._refresh_records()
            held = [plan.reservations({uid for uid in plan.assignments if self._bound_node(uid)})
                    for key, plan in self.plans.items() if key != exclude_group and plan.state in HOLDING]
            held += self.recorded.usage(lambda key: key == exclude_group or (
                key in self.plans and self.plans[key].state in HOLDING))  # a plan holds it already
            held += self.preemption.reservations(exclude_group)  # under its own lock
        return _total(held)

    def _refresh_records(self) -> None:
        """Bring the records' holds up to date (lock held); a change is a reservation change."""
        if self.recorded.refresh():
            self._generation += 1

    def _bound_node(self, uid: str) -> str:
        record = self.cache.pods.get(uid)
        return record.pod.node if record else ""

    # -- barrier capacity ----------------------------------------------------------------------
    def _barrier_held(self, exclude: str = "") -> int:
        """Gang members planned and not yet bound: each may hold a server thread at the barrier."""
        return sum(1 for key, plan in self.plans.items()
                   if plan.gang and key != exclude and plan.state in (PlanState.PLANNED, PlanState.BINDING)
                   for uid in plan.assignments if uid not in plan.bound and not self._bound_node(uid))

    def _barrier_never(self, group: PodGroup, need: int) -> str:
        if self.barrier_capacity is None or group.policy is not Policy.GANG or need <= self.barrier_capacity:
            return ""
        return (f"podgroup {group.key}: {need} members cannot all wait at the bind barrier: the server "
                f"holds at most {self.barrier_capacity} (raise --http-threads)")

    def _barrier_wait(self, group: PodGroup, need: int | None) -> str:
        """"" when a gang plan of ``need`` members (None: as many as last time, if known) may be
        held now, else why the group waits. Barrier capacity is planned: the planned-but-unbound
        members of all gangs never exceed what the server can hold at the barrier, so several
        gangs cannot deadlock its thread pool. Queue order: a gang waiting for more room than is
        free blocks later (lower, younger) ones from taking it, so a big gang is not starved."""
        if self.barrier_capacity is None or group.policy is not Policy.GANG:
            return ""
        key = group.key
        now = self.clock()
        for other, waiter in list(self.barrier_queue.items()):
            if waiter.refreshed + self.plan_ttl < now and other != key:
                del self.barrier_queue[other]  # its members stopped asking
        mine = self.barrier_queue.get(key)
        if need is None:
            if mine is None:
                return ""
            need = mine.need
        order = (-group.priority, group.created, key)
        held = self._barrier_held(key)
        ahead = any(w.order < order for k, w in self.barrier_queue.items() if k != key)
        if need <= self.barrier_capacity - held and not ahead:
            self.barrier_queue.pop(key, None)
            return ""
        self.barrier_queue[key] = BarrierWaiter(need, order, now)
        first = "" if not ahead else ", behind an earlier gang"
        return (f"podgroup {key}: waiting for barrier capacity: {held} members planned elsewhere "
                f"({need} needed of {self.barrier_capacity}{first})")

    def _barrier_freed(self) -> None:
        """Barrier capacity may have freed: touch the parked members of the first waiting gang
        that now fits, so kube-scheduler retries it (the rest wait their turn)."""
        if not self.barrier_queue:
            return
        free = (self.barrier_capacity or 0) - self._barrier_held()
        key, waiter = min(self.barrier_queue.items(), key=lambda kv: kv[1].order)
        if waiter.need <= free:
            parked = self.parked.take_group(key)
            if parked:
                with self._changed_lock:
                    self._nudges.extend(parked)
                self._wake.set()

    # -- filter ------------------------------------------------------------------------------
    def filter(self, pod_json: Mapping[str, Any], candidates: list[str]) -> FilterAnswer:
        """kube-scheduler's filter phase, after its own filters: which of ``candidates`` may the
        pod go to. Never raises for bad pod content: it answers with reasons instead."""
        converted = convert_pod(pod_json)
        if isinstance(converted, str):
            return FilterAnswer([], unresolvable={n: converted for n in candidates})
        pod, group = converted
        if not group:
            with self._lock:
                self._expire()
                return self._filter_plain(pod, candidates)
        # built off the lock (10,000 names cost ~1 ms): what kube-scheduler left out of the nodes
        # phalanx knows (a C-level copy of the keys, safe while the cache's thread adds nodes)
        passed = frozenset(candidates)
        self.verdicts.learn(pod, frozenset(self.cache.nodes.keys() - passed))
        with self._lock:
            self._expire()
            return self._filter_member(pod, f"{pod.namespace}/{group}", passed)

    def _filter_plain(self, pod: Pod, candidates: list[str]) -> FilterAnswer:
        """A pod without a group: only keep it off capacity reserved for planned groups."""
        if not self.plans and not self.preemption.nominations:
            return FilterAnswer(list(candidates))  # fast path: nothing reserved
        reserved = self.reservations()
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

    def _filter_member(self, pod: Pod, key: str, candidates: frozenset[str]) -> FilterAnswer:
        def no(reason: str) -> FilterAnswer:
            self.parked.park(key, pod.uid, pod.namespace, pod.name)
            self.preemption.clear_if_gone(key)  # parked after its last victim went: touch it
            return FilterAnswer([], unresolvable={n: reason for n in candidates})

        self.parked.here(pod.uid)

        plan = self.plans.get(key)
        # a Basic plan's members bind one by one: one not bound yet is answered as planned
        open_ = plan is not None and (plan.state is PlanState.PLANNED or (
            plan.state is PlanState.BINDING and not plan.gang and pod.uid not in plan.bound))
        if plan is not None and pod.uid in plan.assignments and open_:
            answer = self._answer_planned(plan, pod, candidates)
            if answer is not None:
                return answer
            self._release_rejected(plan, pod)
        elif plan is not None and plan.state is PlanState.BINDING and plan.gang:
            return no(f"phalanx: podgroup {key} is binding")
        elif plan is not None and plan.state in (PlanState.PLANNED, PlanState.BINDING):
            # a Basic plan's bound members stay where they are; the rest is planned with the new one
            self._release(key, replans.NEW_MEMBER, f"re-plan: new member {pod.key}")
        elif plan is not None and plan.state is PlanState.BOUND and pod.uid not in plan.assignments:
            self._forget(plan)  # a new member after the gang bound: planned on its own below

        waiting = self.preemption.waiting(key)
        if waiting:
            return no(waiting)
        group = self._group_view(key, pod)
        if isinstance(group, str):
            self.explanations[key] = group
            self._park_incomplete(key, pod)
            return no(group)
        backing_off = self.queue.backing_off(key, self.cache.capacity_version)
        if backing_off:
            return no(backing_off)  # nothing freed since the last attempt failed: do not re-solve
        waiting = self._barrier_wait(group, None)
        if waiting:
            return no(waiting)  # known not to fit the free barrier capacity yet: do not re-solve
        placement = self._resume(group, candidates) or self._cycle(group, fresh=pod.uid)
        if not placement.assignments:
            return no(self.explanations.get(key) or f"podgroup {key}: no placement")
        plan = self.plans.get(key)
        if plan is None or pod.uid not in plan.assignments:
            return no(f"phalanx: podgroup {key} planned without {pod.key}")
        answer = self._answer_planned(plan, pod, candidates)
        if answer is None:
            # the solver chose a node kube-scheduler's filters just refused: a plan known to fail
            # holds nothing; the group is re-planned at the next call, as often as replans allows
            self._release_rejected(plan, pod)
            return no(self.explanations.get(key) or f"phalanx: podgroup {key}: planned node "
                      f"{plan.assignments[pod.uid]} for {pod.key} was filtered out; re-planning")
        return answer

    def _answer_planned(self, plan: Plan, pod: Pod, candidates: frozenset[str]) -> FilterAnswer | None:
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
            if other is None or other.volumes or other.spec.shape_key != pod.spec.shape_key or self._bound_node(uid):
                continue
            verdict = self.verdicts.get(uid)
            partner = partner or uid
            if verdict is None or mine not in verdict.excluded:
                partner = uid
                break
        if not partner:
            return ""
        plan.swap(pod.uid, partner)
        self._emit("reslotted", group=plan.group, pod=pod.key, node=plan.assignments[pod.uid], was=mine)
        return plan.assignments[pod.uid]

    def _release_rejected(self, plan: Plan, pod: Pod) -> None:
        node = plan.assignments[pod.uid]
        self._release(plan.group, replans.FILTERED_OUT, f"stale: planned node {node} was filtered out for {pod.key}",
                      pod.name, node)

    def _group_view(self, key: str, pod: Pod) -> PodGroup | str:
        """The group with its members as the cache knows them plus this pod (the cache may lag
        kube-scheduler by a watch event), or the reason it cannot be planned yet."""
        members = self.cache.members(key)
        if pod.uid not in {m.pod.uid for m in members}:
            members.append(PodRecord(pod=pod))
        try:
            group = self.cache.podgroup(key, members)
        except InvalidInput as err:
            return f"phalanx: {err}"
        if group is None:
            return f"phalanx: podgroup {key} does not exist yet"
        if group.policy is Policy.GANG and len(group.members) < group.min_count:
            malformed = self._malformed_member(key)
            if malformed:  # it will never convert as it is: say so, not "waiting" for ever
                message = f"podgroup {key}: {malformed}"
                self._set_status(key, False, names.REASON_UNSCHEDULABLE, message)
                return message
            return f"podgroup {key}: waiting for members, {len(group.members)} of {group.min_count} exist"
        return group

    def _malformed_member(self, key: str) -> str:
        """``member <pod> is malformed: <error>`` for a member of ``key`` whose JSON the cache could
        not convert, or ""."""
        invalid = self.cache.invalid_members(key)
        return f"member {invalid[0].pod} is malformed: {invalid[0].error}" if invalid else ""

    def _resume(self, group: PodGroup, candidates: list[str]) -> Placement | None:
        """After a restart (or a lost member), finish a gang from its placement record: the pending
        members go to the recorded nodes when those still fit. A record whose nodes no longer fit
        is abandoned (removed) and the members are planned afresh, in the bound members' domain."""
        record = self.cache.podgroups.get(group.key)
        try:
            recorded = placement_record(record.annotations) if record else None
        except InvalidInput:
            recorded = PlacementRecord()  # malformed: abandoned below, like a record that no longer fits
        if recorded is None or not group.bound or not group.pending:
            return None
        assignments = {p.uid: recorded.pods[p.name] for p in group.pending if p.name in recorded.pods}
        snapshot = self._snapshot_for(group.key)
        try:
            if not assignments or any(n not in candidates for n in assignments.values()):
                raise PlacementInvalid("recorded nodes are not among the candidates")
            assert_placement_valid(snapshot, group, assignments)
        except PlacementInvalid as err:
            self._event(group, names.EVENT_PLACEMENT_ABANDONED, f"placement record no longer fits: {err}", "Warning")
            self.recorded.abandon(group.key)
            self._submit(group.key, "annotate", lambda: self.writer.annotate_podgroup(
                group.namespace, group.name, {names.ANNOTATION_PLACEMENT: None}))
            return None
        return self._keep_plan(group, Placement(group.key, assignments, recorded.domain,
                                                path="record"), 0.0)

    def _keep_plan(self, group: PodGroup, placement: Placement, elapsed: float) -> Placement:
        """Hold ``placement`` as the group's plan: its capacity is reserved until the deadline —
        unless a gang's members cannot all wait at the barrier now (then no plan, and the reason)."""
        key = group.key
        need = len(placement.assignments)
        never = self._barrier_never(group, need)
        if never:
            self.metrics.attempts.labels(result="unschedulable").inc()
            self.explanations[key] = never
            self.queue.failed_attempt(key, self.cache.capacity_version, never)
            self._set_status(key, False, names.REASON_UNSCHEDULABLE, never)
            self._event(group, names.EVENT_FAILED_SCHEDULING, never, "Warning")
            self._emit("unschedulable", group=key, message=never)
            return Placement(key, {}, explanation=None)
        waiting = self._barrier_wait(group, need)
        if waiting:
            self.explanations[key] = waiting
            return Placement(key, {}, explanation=None)
        now = self.clock()
        by_uid = {p.uid: p for p in group.pending}
        self.preemption.release(key)
        self.queue.succeeded(key)
        plan = Plan(
            members={uid: by_uid[uid] for uid in placement.assignments},
            group=key,
            assignments=dict(placement.assignments),
            requests={uid: by_uid[uid].spec.requests for uid in placement.assignments},
            domain=placement.domain,
            created=now,
            deadline=now + self.plan_ttl,
            placement=placement,
            placement_ms=elapsed * 1000.0,
            gang=group.policy is Policy.GANG,
        )
        parked = self.parked.take(key, placement.assignments)
        if parked:  # kube-scheduler holds them back after phalanx said "no node": retry them now
            with self._changed_lock:
                self._nudges.extend(parked)
            self._wake.set()
        if group.topology_key and placement.domain:
            self.domains[key] = (group.topology_key, placement.domain)
        where = f" in {group.topology_key}={placement.domain}" if group.topology_key else ""
        note = (f"planned {len(placement.assignments)} pods on {len(set(placement.assignments.values()))} "
                f"nodes{where} ({placement.path}, {elapsed * 1000:.1f} ms)")
        self._transition(plan, PlanState.PLANNED, note=note)
        return placement

    def _snapshot_for(self, key: str) -> Snapshot:
        """What a cycle for ``key`` sees: the cluster minus the other plans' (and nominations')
        reservations, with the other plans' members not yet bound as assumed pods on their planned
        nodes — kube-scheduler's cache counts them as assumed, so inter-pod rules must too."""
        assumed = {uid: node for other, plan in self.plans.items() if other != key and plan.state in HOLDING
                   for uid, node in plan.assignments.items()}  # the cache leaves the bound ones out
        return self.cache.snapshot(self.reservations(exclude_group=key), assumed=assumed)

    def _cycle(self, group: PodGroup, fresh: str = "") -> Placement:
        """One workload cycle for ``group``: snapshot, solve, plan or explain. ``fresh`` is the pod
        of the filter call that triggered it (its verdict is the newest, see Verdicts.allowed).

        Called with the lock held (once); the solve runs without it: the snapshot and inputs are
        taken under the lock, the solver runs off it, and the result is committed under it only if
        the plan generation (bumped whenever reservations change or phalanx binds a pod no plan
        held) is unchanged — else it is solved again, at most :data:`SOLVE_ATTEMPTS` times, then
        the pod is answered "retry". One cycle per group at a time: a second call for a group
        being solved waits for that cycle and takes its outcome."""
        key = group.key
        if key in self._solving:
            deadline = time.monotonic() + max(self.barrier_timeout, 30.0)
            while key in self._solving and time.monotonic() < deadline:
                self._arrival.wait(timeout=1.0)
            plan = self.plans.get(key)
            if plan is not None and plan.placement is not None:
                return plan.placement
            return Placement(key, {}, explanation=None)
        self._solving.add(key)
        try:
            return self._solve_and_commit(group, fresh)
        finally:
            self._solving.discard(key)
            self._arrival.notify_all()

    def _solve_and_commit(self, group: PodGroup, fresh: str) -> Placement:
        key = group.key
        for _ in range(SOLVE_ATTEMPTS):
            started = time.perf_counter()
            generation = self._generation
            capacity_version = self.cache.capacity_version  # before the snapshot: a later change retries
            snapshot = self._snapshot_for(key)
            allowed = self.verdicts.allowed(group, snapshot.index.keys(), fresh)
            reach = self._reach(group, allowed)
            snapshot, _ = self.queue_policies.restrict(group, snapshot)  # holds read the whole cluster
            if reach is not None:
                snapshot = snapshot.only_nodes(reach)
            with self._unlocked():
                try:
                    placement: Placement | InvalidInput = place(snapshot, group, self.options, allowed=allowed)
                except InvalidInput as err:
                    placement = err
            self._refresh_records()  # a record that came or went meanwhile counts as a change
            if self._generation == generation:
                break
        else:
            message = f"phalanx: podgroup {key}: other plans changed while it was being solved; retrying"
            self.explanations[key] = message
            pod = next((p for p in group.pending if p.uid == fresh), None)
            if pod is not None:  # answered "no node" for a reason that is already gone: retry it
                with self._changed_lock:
                    self._nudges.append((pod.namespace, pod.name))
                self._wake.set()
            return Placement(key, {}, explanation=None)
        if isinstance(placement, InvalidInput):
            self.metrics.attempts.labels(result="error").inc()
            self._set_status(key, False, names.REASON_SCHEDULER_ERROR, str(placement))
            return Placement(key, {}, explanation=None)
        elapsed = time.perf_counter() - started
        self.metrics.attempt_duration.observe(elapsed)
        if not placement.assignments:
            self.metrics.attempts.labels(result="unschedulable").inc()
            message = placement.explanation.message() if placement.explanation else "no placement"
            with self._unlocked(), self._preempt_lock:  # a preemption plan is a solve too
                preempting = self.preemption.try_preempt(group)
            if preempting:
                self._generation += 1  # a nomination now holds room
                message = f"{message}; {preempting}"
            self.explanations[key] = message
            if not preempting:  # while victims terminate, the nomination makes the group wait
                self.queue.failed_attempt(key, capacity_version, message)
            self._set_status(key, False, names.REASON_UNSCHEDULABLE, message)
            self._event(group, names.EVENT_FAILED_SCHEDULING, message, "Warning")
            self._emit("unschedulable", group=key, message=message)
            return placement
        self.metrics.attempts.labels(result="scheduled").inc()
        return self._keep_plan(group, placement, elapsed)

    def _reach(self, group: PodGroup, allowed: Mapping[str, frozenset[str]]) -> set[str] | None:
        """The nodes any pending member may take, or None for all: the union of the verdicts when
        every pending member has one (no member goes outside it, whatever the solver does with the
        per-pod sets) plus the bound members' nodes, cut to the domain the group keeps."""
        reach = None
        if allowed and len(allowed) == len(group.pending):
            reach = set().union(*{id(nodes): nodes for nodes in allowed.values()}.values())
            reach |= {p.node for p in group.bound}
        chosen = self.domains.get(group.key)
        if chosen and chosen[0] == group.topology_key:
            # a group keeps the domain it was first placed in, even while the cache has not yet
            # seen its members' bindings (a Basic group's members arrive and bind one by one)
            nodes = self.cache.nodes
            reach = {n for n in (nodes if reach is None else reach)
                     if n in nodes and nodes[n].labels.get(chosen[0]) == chosen[1]}
        return reach

    # -- prioritize --------------------------------------------------------------------------
    def prioritize(self, pod_json: Mapping[str, Any], candidates: list[str]) -> dict[str, int]:
        """Planned node scores 10, the rest 0; pods without a plan score all nodes 0."""
        uid = _uid_of(pod_json)
        with self._lock:
            for plan in self.plans.values():
                node = plan.assignments.get(uid)
                if node is not None:
                    return {n: (10 if n == node else 0) for n in candidates}
        return {n: 0 for n in candidates}

    # -- preempt (pods without a group) ------------------------------------------------------
    def preempt_for_group(self, pod_json: Mapping[str, Any]) -> None:
        """kube-scheduler's PostFilter for a group member: its own filters left no node, so the
        extender's filter was never asked. Group preemption is phalanx's job, not per-pod: run the
        group's cycle on every node and, when it does not fit, plan and start a group preemption.
        The answer to kube-scheduler is always "no per-pod preemption"."""
        converted = convert_pod(pod_json)
        if isinstance(converted, str):
            return
        pod, name = converted
        key = f"{pod.namespace}/{name}"
        with self._lock:
            self._expire()
            if key in self.plans or self.preemption.waiting(key):
                return
            group = self._group_view(key, pod)
            if isinstance(group, str):
                # kube-scheduler parks the pod, and retries it only on events its own filters
                # care about (a touch is not one): phalanx runs the cycle once the group is complete
                self.explanations[key] = group
                self._park_incomplete(key, pod, preempting=True)
                return
            self._cycle(group)

    def preempt_candidates(self, pod_json: Mapping[str, Any], candidates: Mapping[str, Mapping[str, Any]]
                           ) -> dict[str, Mapping[str, Any]]:
        """kube-scheduler's per-pod preemption for a pod without a group: a victim in a
        ``disruptionMode: all`` group costs its whole group, so candidates that would break such a
        group are dropped whenever a cheaper candidate exists (breaking one is the last resort; the
        rest of a broken group is then evicted by phalanx, see GroupPreemption). Victims stay those
        on the candidate node, as kube-scheduler requires."""
        try:
            proposed = {node: [str(p.get("UID", "")) for p in v.get("Pods") or ()] for node, v in candidates.items()}
        except (AttributeError, TypeError) as err:
            log.info("preempt: keeping kube-scheduler's candidates, unreadable: %s", err)
            return dict(candidates) if isinstance(candidates, Mapping) else {}
        with self._lock:
            snapshot = self.cache.snapshot(with_bound=True)
            known = {p.uid for p in snapshot.bound}
            usable = {n: uids for n, uids in proposed.items()
                      if n in snapshot.index and all(u in known for u in uids)}
            try:
                ranked = rank_candidates(usable, snapshot, self.cache.preemption_context())
            except InvalidInput as err:
                log.info("preempt: keeping kube-scheduler's candidates: %s", err)
                return dict(candidates)
        kept = {c.node for c in ranked}
        # nodes phalanx cannot judge (pods it has not seen yet) are passed through unchanged
        return {n: v for n, v in candidates.items() if n in kept or n not in usable}

    # -- bind --------------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """kube-scheduler's bind: returns once the Binding exists; raises BindError otherwise."""
        with self._lock:
            plan = next((p for p in self.plans.values() if uid in p.assignments), None)
        if plan is None:
            record = self.cache.pods.get(uid)
            group = record.pod.group if record else ""
            if group and group in self.cache.podgroups and self._is_gang(group):
                raise BindError(f"phalanx: pod {namespace}/{name} of podgroup {group} has no plan; not binding")
            self._bind_one(namespace, name, uid, node)  # pods without a group (or Basic groups)
            with self._lock:
                self._generation += 1  # capacity no plan held is taken: a solve in flight re-checks
            return
        if plan.assignments[uid] != node:
            raise BindError(f"phalanx: pod {namespace}/{name} is planned on {plan.assignments[uid]}, not {node}")
        if not plan.gang:
            self._bind_member(plan, namespace, name, uid, node)
            return
        self._barrier(plan, uid, namespace, name)

    def _is_gang(self, key: str) -> bool:
        record = self.cache.podgroups.get(key)
        return bool(record and record.spec.policy is Policy.GANG)

    def _bind_one(self, namespace: str, name: str, uid: str, node: str) -> None:
        try:
            self.writer.bind(namespace, name, uid, node)
        except WriteError as err:
            raise BindError(f"phalanx: binding {namespace}/{name} to {node} failed: {err}") from None
        except Exception as err:  # noqa: BLE001 - whatever the writer raises, kube-scheduler gets an answer
            log.exception("binding %s/%s failed", namespace, name)
            raise BindError(f"phalanx: binding {namespace}/{name} to {node} failed: "
                            f"{type(err).__name__}: {err}") from None

    def _bind_member(self, plan: Plan, namespace: str, name: str, uid: str, node: str) -> None:
        """A Basic group's member binds at once, as planned; the plan is ``binding`` from the
        first member on and ``bound`` once every planned member is."""
        with self._lock:
            if plan.state is PlanState.PLANNED:
                self._transition(plan, PlanState.BINDING)
        self._bind_one(namespace, name, uid, node)
        with self._lock:
            plan.bound.add(uid)
            if plan.state is PlanState.BINDING and all(u in plan.bound or self._bound_node(u)
                                                       for u in plan.assignments):
                self._transition(plan, PlanState.BOUND)

    def _barrier(self, plan: Plan, uid: str, namespace: str, name: str) -> None:
        """Wait until every planned member reached bind (or is bound); the last to arrive leads
        the binding of all. Holds no lock while bindings are made. The deadline is on the
        injected clock (see :meth:`check_timers`)."""
        deadline = self.clock() + self.barrier_timeout
        lead = False
        with self._lock:
            plan.arrived.add(uid)
            self.metrics.barrier_waiting.inc()
            try:
                # only an arrival can complete the gang, so only the arriving call checks (O(N));
                # waiters sleep until the plan's state changes: no thundering herd at 1,000 pods
                if plan.state is PlanState.PLANNED and self._complete(plan):
                    lead = self._transition(plan, PlanState.BINDING)
                while plan.state is PlanState.PLANNED:
                    left = deadline - self.clock()
                    if left <= 0:
                        self.metrics.barrier.labels(outcome="timeout").inc()
                        arrived = sum(1 for u in plan.assignments if u in plan.arrived or self._bound_node(u))
                        why = f"barrier timed out: {arrived} of {len(plan.assignments)} members reached bind"
                        self._transition(plan, PlanState.RELEASED, replans.BARRIER_TIMEOUT, why)
                        self._event_key(plan.group, names.EVENT_BARRIER_TIMEOUT, why, "Warning")
                        raise BindError(f"phalanx: podgroup {plan.group}: {why}; nothing was bound")
                    self._arrival.wait(timeout=min(left, 5.0))
                    plan.deadline = max(plan.deadline, self.clock() + 1.0)  # no expiry while waiting
            finally:
                self.metrics.barrier_waiting.dec()
        if lead:
            self._bind_all(plan)
        with self._lock:
            while plan.state is PlanState.BINDING:
                self._arrival.wait(timeout=1.0)
            if plan.state is not PlanState.BOUND or uid in plan.failed_uids:
                raise BindError(f"phalanx: podgroup {plan.group}: {plan.error or 'binding failed'}")

    def _complete(self, plan: Plan) -> bool:
        return all(u in plan.arrived or self._bound_node(u) for u in plan.assignments)

    def _bind_all(self, plan: Plan) -> None:
        """The gang is complete at the barrier: bind everyone. Whatever goes wrong on the way
        (a WriteError or any other exception) finishes the plan as failed: the waiters are
        answered with the error, the plan is released and a BindFailed event is written."""
        try:
            self._bind_gang(plan)
        except Exception as err:  # noqa: BLE001 - a plan must never stay in binding
            log.exception("binding podgroup %s failed", plan.group)
            self._finish(plan, False, f"binding failed: {type(err).__name__}: {err}")

    def _bind_gang(self, plan: Plan) -> None:
        """Write the placement record (synchronously: before any binding), then bind everyone."""
        self.metrics.barrier.labels(outcome="released").inc()
        pending = {uid: node for uid, node in plan.assignments.items() if not self._bound_node(uid)}
        try:
            self._write_record(plan)
        except WriteError as err:
            self._finish(plan, False, f"could not write the placement record: {err}")
            return
        futures = {uid: self._binder.submit(self._bind_uid, uid, node) for uid, node in pending.items()}
        failed = {}
        for uid, future in futures.items():
            try:
                why = future.result()
            except Exception as err:  # noqa: BLE001 - counted as this member's failure
                why = f"binding {self._pod_name(uid)} failed: {type(err).__name__}: {err}"
            if why:
                failed[uid] = why
        if failed:
            plan.failed_uids = set(failed)
            self._finish(plan, False, "; ".join(failed.values()))
        else:
            self._finish(plan, True, "")

    def _write_record(self, plan: Plan) -> None:
        """The placement record on the plan's PodGroup, synchronously (before any member binds, so
        a restart finishes the gang, never splits it); raises what the writer raises."""
        ns, name = plan.group.split("/", 1)
        self.dispatcher.flush(_podgroup_obj(plan.group), timeout=5.0)  # an older queued record removal lands first
        self.writer.annotate_podgroup(ns, name, {names.ANNOTATION_PLACEMENT: placement_annotation(
            plan.domain, {self._pod_name(uid): n for uid, n in plan.assignments.items()})})

    def _pod_name(self, uid: str) -> str:
        record = self.cache.pods.get(uid)
        return record.pod.name if record else uid

    def _bind_uid(self, uid: str, node: str) -> str:
        record = self.cache.pods.get(uid)
        if record is None:
            return f"pod {uid} is gone"
        try:
            self.writer.bind(record.pod.namespace, record.pod.name, uid, node)
        except WriteError as err:
            return f"binding {record.pod.key} to {node} failed: {err}"
        except Exception as err:  # noqa: BLE001 - any writer failure fails the plan, never hangs it
            log.exception("binding %s failed", record.pod.key)
            return f"binding {record.pod.key} to {node} failed: {type(err).__name__}: {err}"
        return ""

    def _finish(self, plan: Plan, ok: bool, error: str) -> None:
        with self._lock:
            if plan.state is not PlanState.BINDING:
                return
            self._transition(plan, PlanState.BOUND if ok else PlanState.FAILED,
                             "" if ok else replans.BIND_FAILED, error)

    # -- plugin mode: phalanx's kube-scheduler framework plugin (see plugin_mode.py) ----------
    # The same plans and state machine as filter and bind; each call takes the lock briefly.
    def plan_for_member(self, pod: Pod, key: str) -> tuple[FilterAnswer, Plan | None]:
        """PreFilter: the member's answer as :meth:`filter` gives it, on every node phalanx knows
        (the plugin runs before kube-scheduler's filters: there is no candidate list), and its
        group's plan when the answer is a node."""
        with self._lock:
            self._expire()
            answer = self._filter_member(pod, key, frozenset(self.cache.nodes.keys()))
            return answer, (self.plans.get(key) if answer.nodes else None)

    def report_rejection(self, pod: Pod, key: str, node: str, plugin: str, reason: str) -> tuple[str, str]:
        """PostFilter: kube-scheduler's filters (``plugin``, for ``reason``) rejected ``node`` for
        the member: the node joins its verdict, then the member is re-slotted as at filter, or the
        plan released (a counted re-plan). Returns ("reslotted", its new node), ("released", "")
        or ("none", "") when the member is not planned on ``node``."""
        known = self.verdicts.get(pod.uid)
        excluded = (known.excluded if known else frozenset()) | {node}
        self.verdicts.learn(pod, frozenset(excluded))
        with self._lock:
            plan = self.plans.get(key)
            if plan is None or plan.assignments.get(pod.uid) != node or plan.state is not PlanState.PLANNED:
                return "none", ""
            answer = self._answer_planned(plan, pod, frozenset(self.cache.nodes.keys() - excluded))
            if answer is not None:
                return "reslotted", answer.nodes[0]
            by = f" by {plugin}" if plugin else ""
            self._release(key, replans.FILTERED_OUT,
                          f"stale: planned node {node} was rejected{by} for {pod.key}: {reason}", pod.name, node)
        return "released", ""

    def reserve(self, uid: str, key: str, node: str) -> tuple[bool, str]:
        """Reserve: a planned member kube-scheduler assumed on ``node`` arrives at the barrier.
        Returns (False, why) when it is not planned there."""
        with self._lock:
            plan = self.plans.get(key)
            refused = _not_planned_there(plan, key, uid, node)
            if refused or plan is None:
                return False, refused
            self._arrive(plan, (uid,))
        return True, ""

    def _arrive(self, plan: Plan, uids: Iterable[str]) -> None:
        """Members kube-scheduler assumed on their planned nodes arrive at the barrier (under the
        lock). No expiry while members wait at Permit (they are rejected at the barrier timeout);
        no generation bump: what a solve of another group sees (the plan's capacity for its
        members not bound) does not change when one arrives, so solves in flight stay valid."""
        plan.arrived.update(uids)
        plan.deadline = max(plan.deadline, self.clock() + self.barrier_timeout + 5.0)

    def unreserve(self, uid: str, key: str, reason: str) -> tuple[str, list[str]]:
        """Unreserve: the member leaves the barrier. A gang member rejected at Permit (``reason``
        "rejected": its barrier timed out) while the plan is still planned releases the plan.
        Returns ("none", []) when the group holds no plan for it, ("unreserved", []), or
        ("released", the other members reserved: rejected too, a gang never binds partially)."""
        with self._lock:
            plan = self.plans.get(key)
            if plan is None or uid not in plan.assignments:
                return "none", []
            plan.arrived.discard(uid)  # the plan's capacity is unchanged (see reserve)
            if not plan.gang or plan.state is not PlanState.PLANNED or reason != "rejected":
                return "unreserved", []
            others = sorted(u for u in plan.arrived if u != uid)
            why = (f"barrier timed out: {len(plan.arrived)} of {len(plan.assignments)} members reserved "
                   f"when {self._pod_name(uid)} was rejected at Permit")
            self.metrics.barrier.labels(outcome="timeout").inc()
            self._transition(plan, PlanState.RELEASED, replans.BARRIER_TIMEOUT, why)
            self._event_key(key, names.EVENT_BARRIER_TIMEOUT, why, "Warning")
        return "released", others

    def permit(self, uid: str, key: str, reserved: tuple[str, ...] = (), node: str = "") -> PermitAnswer:
        """Permit, the plugin's barrier (``reserved``: members the plugin reserved itself from its
        mirror of the plan, each as if reserve had been called; ``node``: where kube-scheduler
        assumed ``uid``, checked against its plan when it is among them). Once every planned
        member is reserved (or bound) the placement record is written (off the lock, before any
        member binds), the plan goes ``binding`` then ``bound`` (kube-scheduler binds; the plan
        holds its capacity until the cache shows the bindings) and every reserved member is
        allowed. Calls may overlap: one while the record is being written is answered wait. A
        Basic group's member is allowed at once."""
        with self._lock:
            plan = self.plans.get(key)
            refused = _not_planned_there(plan, key, uid, node if uid in reserved else "")
            if refused or plan is None:
                return PermitAnswer("reject", refused)
            if reserved and plan.state is PlanState.PLANNED:
                self._arrive(plan, (u for u in reserved if u in plan.assignments))
            if not plan.gang:
                if plan.state is PlanState.PLANNED:
                    self._transition(plan, PlanState.BINDING)
                plan.bound.add(uid)
                if all(u in plan.bound or self._bound_node(u) for u in plan.assignments):
                    self._transition(plan, PlanState.BOUND)
                return PermitAnswer("allow", allow=(uid,))
            if plan.state is PlanState.BOUND:
                return PermitAnswer("allow", allow=(uid,))
            if plan.state is PlanState.BINDING:  # the completing member's call is writing the record
                return PermitAnswer("wait", f"phalanx: podgroup {key}: writing the placement record",
                                    wait_seconds=self.barrier_timeout)
            if not self._complete(plan):
                have = sum(1 for u in plan.assignments if u in plan.arrived or self._bound_node(u))
                return PermitAnswer("wait", f"phalanx: podgroup {key}: {have} of {len(plan.assignments)} "
                                    "members reserved", wait_seconds=self.barrier_timeout)
            self.metrics.barrier.labels(outcome="released").inc()
            self._transition(plan, PlanState.BINDING)
        error = ""
        try:
            self._write_record(plan)
        except WriteError as err:
            error = f"could not write the placement record: {err}"
        except Exception as err:  # noqa: BLE001 - any writer failure fails the plan, never hangs it
            error = f"could not write the placement record: {type(err).__name__}: {err}"
        with self._lock:
            if error:
                self._transition(plan, PlanState.FAILED, replans.BIND_FAILED, error)
                return PermitAnswer("reject", f"phalanx: podgroup {key}: {error}")
            allow = tuple(sorted(plan.arrived))
            self._transition(plan, PlanState.BOUND)  # kube-scheduler binds; held until the cache shows it
        return PermitAnswer("allow", allow=allow)

    def reservations_snapshot(self) -> tuple[tuple[Plan, ...], dict[str, dict[str, int]]]:
        """For the plugin's reservations stream: every plan holding capacity except a gang's once
        bound (every member was allowed at Permit; a member whose binding fails asks again with
        PlanForPod, so the stream, sent whole after each change, stays the size of the groups being
        placed rather than of those waiting for the cache to show their bindings), and per node
        the capacity held for members neither reserved at the plugin (kube-scheduler's cache
        counts those as assumed) nor bound (a gang's only while it is planned), plus preemption
        nominations."""
        with self._lock:
            self._expire()
            plans = tuple(p for p in self.plans.values()
                          if p.state in HOLDING and not (p.gang and p.state is PlanState.BOUND))
            held = [p.reservations({u for u in p.assignments if u in p.arrived or self._bound_node(u)})
                    for p in plans if p.state is PlanState.PLANNED or not p.gang]
            held += self.preemption.reservations()
        return plans, _total(held)

    # -- status and events (asynchronous: see dispatch.py) -----------------------------------
    def _submit(self, key: str, kind: str, call: Callable[[], None], coalesce: str = "") -> None:
        self.dispatcher.submit(Write(_podgroup_obj(key), kind, call, coalesce))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued API write was made (tests, benchmarks, shutdown)."""
        return self.dispatcher.flush(timeout=timeout)

    def _set_status(self, key: str, ok: bool, reason: str, message: str) -> None:
        record = self.cache.podgroups.get(key)
        if record is None:
            return  # the group is gone (or not seen yet): nothing to write on
        conditions = list((record.raw.get("status") or {}).get("conditions") or [])
        # the condition last queued wins over the cache's, which lags the dispatcher
        current = self._conditions.get(key) or next(
            (c for c in conditions if c.get("type") == names.CONDITION_INITIALLY_SCHEDULED), None)
        if current and current.get("status") == "True":
            return  # never back to False; True -> True keeps its lastTransitionTime
        status = "True" if ok else "False"
        if current and current.get("status") == status and current.get("message") == message[:32768]:
            return
        condition = {
            "type": names.CONDITION_INITIALLY_SCHEDULED,
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": (current or {}).get("lastTransitionTime") if current and current.get(
                "status") == status else _now_rfc3339(),
        }
        self._conditions[key] = condition
        others = [c for c in conditions if c.get("type") != names.CONDITION_INITIALLY_SCHEDULED]
        namespace, name = key.split("/", 1)
        patch = {"conditions": others + [condition]}
        self._submit(key, "status", lambda: self.writer.patch_podgroup_status(namespace, name, patch),
                     coalesce=f"status:{key}")

    def _event(self, group: PodGroup, reason: str, note: str, type_: str = "Normal") -> None:
        self._event_key(group.key, reason, note, type_)

    def _event_key(self, key: str, reason: str, note: str, type_: str = "Normal") -> None:
        ns, name = key.split("/", 1)
        record = self.cache.podgroups.get(key)
        ref = {"kind": "PodGroup", "namespace": ns, "name": name, "uid": record.uid if record else ""}
        self._submit(key, "event", lambda: self.writer.event(ref, reason, note[:1024], type_))

    # -- requeue on capacity changes ---------------------------------------------------------
    def _on_cache_change(self, kind: str, event_type: str, record: Any) -> None:
        # runs on whichever thread applied the event (possibly holding a backend lock): only note
        # the work and wake the requeue thread, never take the cycle's lock here
        if kind == "PodGroup":
            self.recorded.mark(record if isinstance(record, str) else record.key)
        elif kind == "Pod":
            if isinstance(record, PodRecord) and record.pod.group:
                self.recorded.mark(record.pod.group)
            else:
                self.recorded.mark_held()
        if kind == "PodGroup" and event_type == "DELETED":
            key = record if isinstance(record, str) else record.key
            self.domains.pop(key, None)
            self.replans.forget(key)
            self.parked.forget_group(key)
            with self._changed_lock:
                self._deleted.add(key)  # the rest under the cycle's lock, by the requeue thread
            self._wake.set()
        if kind == "Pod" and (isinstance(record, str) or (isinstance(record, PodRecord) and record.pod.node)):
            uid = record if isinstance(record, str) else record.pod.uid
            self.verdicts.forget([uid])  # deleted or bound
            self.parked.forget_pod(uid)
        # a group waiting for members got one (or its PodGroup came): checked by the requeue thread
        arrived = record.pod.group if (kind == "Pod" and isinstance(record, PodRecord) and not record.pod.node
                                       and not record.gated) else ""
        if kind == "PodGroup" and event_type != "DELETED":
            arrived = record if isinstance(record, str) else record.key
        if arrived and self.parked.waits_for_members(arrived):
            with self._changed_lock:
                self._arrived.add(arrived)
            self._wake.set()
        if kind == "Pod" and isinstance(record, PodRecord) and record.disrupted and record.pod.group:
            self.domains.pop(record.pod.group, None)  # evicted or preempted: free to land anywhere
            self.recorded.abandon(record.pod.group)  # and its record holds no room for it any more
        if kind == "Node":
            name = record if isinstance(record, str) else record.name
            if event_type == "DELETED":
                self._nodes_seen.discard(name)
            elif name not in self._nodes_seen:  # new to phalanx (a re-list replays known ones)
                self._nodes_seen.add(name)
                self.verdicts.node_added(name)
            with self._changed_lock:
                self._changed_nodes.add(record if isinstance(record, str) else record.name)
            self._wake.set()
        if self.cache.capacity_version != self._capacity_seen and self.queue.failed:
            self._wake.set()

    def _invalidate_plans(self) -> None:
        """A plan whose node was deleted, cordoned or tainted is released before anyone binds to it
        (a plan's other nodes changing capacity is caught at filter: the node is no candidate)."""
        with self._changed_lock:
            changed, self._changed_nodes = self._changed_nodes, set()
        with self._lock:
            for node_name in changed:
                node = self.cache.nodes.get(node_name)
                if node is not None and not node.unschedulable and not any(
                        t.effect.value != "PreferNoSchedule" for t in node.taints):
                    continue
                why = "deleted" if node is None else "cordoned or tainted"
                for key, plan in list(self.plans.items()):
                    if plan.state == "planned" and node_name in plan.assignments.values():
                        self._release(key, replans.NODE_CHANGED, f"stale: node {node_name} was {why}")

    def _requeue_loop(self) -> None:
        """kube-scheduler retries a pod the extender rejected on its next cluster event, which may
        arrive before phalanx's cache has seen that event: the retry then fails again and nothing
        else wakes the pod. So when room appears, phalanx checks the groups backing off and, for
        each that now fits, touches one pending member (annotation ``scheduling.phalanx.dev/retry``):
        that pod update makes kube-scheduler retry it, and its binding wakes the rest."""
        swept = time.monotonic()
        while not self._closed:
            woken = self._wake.wait(timeout=SWEEP_INTERVAL)
            self._wake.clear()
            try:
                if time.monotonic() - swept >= SWEEP_INTERVAL:
                    swept = time.monotonic()
                    self.verdicts.sweep(self._still_pending)  # off the cycle's lock
                    self.heap.tick()
                self.prune()  # deletions noted, and what a re-list dropped without an event
                if not woken:
                    continue
                self._members_arrived()
                self._victims_cleared()
                self._touch_parked()
                time.sleep(0.2)  # let a burst of events land first
                self._invalidate_plans()
                if self.cache.capacity_version != self._capacity_seen and self.queue.failed:
                    self._requeue_fitting()
            except Exception:  # noqa: BLE001 - the loop must survive a bad group
                log.exception("requeue pass failed")

    def _park_incomplete(self, key: str, pod: Pod, preempting: bool = False) -> None:
        """Park a member answered while its group looked incomplete, and have the requeue thread
        check the group once more: an event that completed it may have landed meanwhile.
        ``preempting``: answered at kube-scheduler's preemption call (its own filters left no node)."""
        self.parked.park(key, pod.uid, pod.namespace, pod.name, incomplete=True)
        with self._changed_lock:
            self._arrived.add(key)
            if preempting:
                self._preempt_incomplete.add(key)
        self._wake.set()

    def _members_arrived(self) -> None:
        """Members parked "waiting for members" while the cache lagged (a sibling's creation or
        ungating not yet seen): once the group has minCount schedulable members, touch them all,
        so kube-scheduler retries them. A group answered so at kube-scheduler's preemption call
        gets its cycle (and group preemption) run here: kube-scheduler retries a pod its own
        filters rejected only when they may pass now (victims gone), never for a touch."""
        with self._changed_lock:
            arrived, self._arrived = self._arrived, set()
        for key in arrived:
            try:
                group = self.cache.podgroup(key)
            except InvalidInput:
                continue  # the group's own explanation says why
            if group is None or len(group.members) < group.min_count:
                continue
            parked = self.parked.complete(key)
            with self._changed_lock:
                self._nudges.extend(parked)
                preempting = key in self._preempt_incomplete
                self._preempt_incomplete.discard(key)
            if preempting and group.pending:
                with self._lock:
                    self._expire()
                    if key not in self.plans and not self.preemption.waiting(key):
                        self._cycle(group)

    def _victims_cleared(self) -> None:
        """A nominated group's victims are all gone: touch its parked members, so kube-scheduler
        retries them now that the freed room is known here (see GroupPreemption._victim_gone)."""
        for key in self.preemption.take_cleared():
            parked = self.parked.take_group(key)
            with self._changed_lock:
                self._nudges.extend(parked)

    def _touch_parked(self) -> None:
        """Touch the parked members of groups that were just planned (off the cycle's lock)."""
        with self._changed_lock:
            nudges, self._nudges = self._nudges, []
        for namespace, name in nudges:
            self._nudge(namespace, name)

    def _nudge(self, namespace: str, name: str) -> None:
        def touch() -> None:
            try:
                self.writer.annotate_pod(namespace, name, {names.ANNOTATION_RETRY: _now_rfc3339()})
            except WriteError as err:  # a pod gone or changed: the next event retries it anyway
                log.info("could not nudge %s/%s: %s", namespace, name, err)
        self.dispatcher.submit(Write(f"Pod/{namespace}/{name}", "nudge", touch, f"nudge:{namespace}/{name}"))

    def prune(self) -> None:
        """Forget everything kept for PodGroups that no longer exist — deleted (noted by the
        cache listener) or dropped by a re-list (which sends no event): every map keyed by group
        or pod returns to its size before the group. A plan of a gone group that still holds
        capacity is released (a gang already binding finishes on its own)."""
        with self._changed_lock:
            deleted, self._deleted = self._deleted, set()
        with self._lock:
            live = self.cache.podgroups
            gone = set(deleted)
            for table in (self.plans, self.explanations, self.domains, self.barrier_queue, self._conditions,
                          self.queue.failed, self.replans.groups):
                gone.update(k for k in table if k not in live)
            for key in gone:
                if key in live:
                    continue  # deleted and created again since
                plan = self.plans.get(key)
                if plan is not None:
                    if plan.state is PlanState.PLANNED or (plan.state is PlanState.BINDING and not plan.gang):
                        self._transition(plan, PlanState.RELEASED, "", f"podgroup {key} was deleted")
                    elif plan.state is PlanState.BOUND:
                        self._forget(plan)
                for table in (self.explanations, self.domains, self.barrier_queue, self._conditions,
                              self.queue.failed):
                    table.pop(key, None)
                self.replans.forget(key)
                self.parked.forget_group(key)
            self.parked.prune(live)
            with self._changed_lock:
                self._preempt_incomplete &= set(live)
            self.recorded.prune(live)
            self._refresh_records()

    def _still_pending(self, uid: str) -> bool | None:
        """For the verdict sweep: True while the pod waits for a node, None when unknown."""
        record = self.cache.pods.get(uid)
        return None if record is None else not record.pod.node and record.active

    def _requeue_fitting(self) -> None:
        work = []
        with self._lock:  # inputs under the lock, solves off it (a stale answer costs one touch)
            self._capacity_seen = self.cache.capacity_version
            for key in list(self.queue.failed):
                pending = [m.pod for m in self.cache.members(key) if not m.pod.node and not m.gated]
                group = self._group_view(key, pending[0]) if pending else "no pending members"
                if isinstance(group, str):
                    self.queue.succeeded(key)
                    continue
                snapshot = self._snapshot_for(key)
                work.append((key, group, snapshot, self.verdicts.allowed(group, snapshot.index.keys()), pending[0]))
        nudges = []
        for key, group, snapshot, allowed, pod in work:
            try:
                if place(snapshot, group, self.options, allowed=allowed).assignments:
                    nudges.append((key, pod))
            except InvalidInput:
                pass
        with self._lock:
            for key, _ in nudges:
                self.queue.succeeded(key)
        for _, pod in nudges:
            self._nudge(pod.namespace, pod.name)

    # -- on demand (gRPC PlaceGroup, the demo driver) ----------------------------------------
    def place_group(self, key: str) -> Placement | str:
        """Run a workload cycle for ``key`` now, on every node (no kube-scheduler pre-filter).
        Returns the placement held as the plan, or the reason there is none."""
        with self._lock:
            self._expire()
            plan = self.plans.get(key)
            if plan is not None and plan.placement is not None:
                return plan.placement
            members = self.cache.members(key)
            pending = [m.pod for m in members if not m.pod.node and not m.gated]
            if not pending:
                return f"podgroup {key}: no pending members"
            group = self._group_view(key, pending[0])
            if isinstance(group, str):
                self.explanations[key] = group
                return group
            placement = self._resume(group, list(self.cache.nodes)) or self._cycle(group)
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
        with self._lock:
            order = self.queue.order(groups)
        # one group at a time, each cycle taking the lock itself (its solve runs off it)
        return {g.key: self.place_group(g.key) for g in order}

    # -- introspection -----------------------------------------------------------------------
    def plan_of(self, key: str) -> Plan | None:
        with self._lock:
            return self.plans.get(key)

    def group_state(self, key: str) -> str:
        """One word for operators: waiting, planned, binding, scheduled, unschedulable, pending."""
        with self._lock:
            self._expire()
            plan = self.plans.get(key)
            if plan is not None:
                return {PlanState.BOUND: "scheduled"}.get(plan.state, plan.state.value)
            reason = self.explanations.get(key, "")
        members = self.cache.members(key)
        group = self.cache.podgroups.get(key)
        if group is None:
            return "unknown"
        min_count = group.spec.min_count
        bound = sum(1 for m in members if m.pod.node)
        if members and bound >= min(min_count, len(members)) and bound == len(members):
            return "scheduled"
        if "waiting for members" in reason or len(members) < min_count:
            return "waiting"
        if reason:
            return "unschedulable"
        return "pending"

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._binder.shutdown(wait=False, cancel_futures=True)
        self.dispatcher.flush(timeout=2.0)
        self.dispatcher.close()
