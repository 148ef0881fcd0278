"""The workload cycle as phalanx's kube-scheduler framework plugin sees it (plugin mode).

In extender mode kube-scheduler calls phalanx's filter and bind over HTTP and the bind barrier
holds a server thread per waiting member. In plugin mode kube-scheduler runs phalanx's framework
plugin (plugin/, ``phalanx-scheduler``) and the same :class:`WorkloadCycle` decides; this adapter
maps the plugin's extension points onto it, keeping the cycle's plan state machine as it is:

- **plan_for_pod** (PreFilter): the member's plan, planned on every node phalanx knows (the
  plugin runs before kube-scheduler's filters, so there is no candidate list); what
  kube-scheduler's filters refuse is learned from **report_rejection** (PostFilter) instead, with
  the rejecting plugin and its reason: the node joins the pod's verdict, the member is re-slotted
  or the plan released (bounded re-plans, as in extender mode).
- **reserve** / **unreserve**: a planned member kube-scheduler assumed counts as arrived at the
  barrier (the plan's ``arrived`` set). Unreserving a member of a gang whose plan is still
  ``planned`` releases the plan when the member was rejected at Permit (its barrier timed out):
  the reply names the members still waiting, which the plugin rejects with it.
- **permit**: the barrier. Once every planned member is reserved (or bound), the placement record
  is written on the PodGroup (synchronously, before any member binds), the plan goes ``binding``
  then ``bound`` (kube-scheduler binds; the plan keeps its capacity until the cache shows the
  bindings) and every reserved member is allowed. The plugin makes these calls beside its
  scheduling loop, so they may overlap: a member asking while the record is being written is
  answered "wait" (the completing call's reply allows it). A Basic group's member is allowed at
  once.
- **snapshot** (the reservations stream): every held plan, the capacity held per node for members
  neither reserved (kube-scheduler's cache counts those as assumed) nor bound, preemption
  nominations, the gang groups still waiting for members, and the *left* members: those reserved
  for a gang plan that was dropped before it completed (a node rejected, the placement record not
  written, the plan expired). Such a member waits at Permit for a plan that is gone, assumed on its
  node by kube-scheduler, which phalanx no longer counts: the plugin rejects it at once. Waiting out
  its Permit timeout instead, it held capacity another plan was given (kube-scheduler's filters then
  refused that plan's nodes) and its rejection released the group's next plan as a barrier timeout:
  two gangs of 16 went round that loop for a minute after an API-throttling fault.
- **unreserve** releases a gang's plan only for a member that was at *that* plan's barrier; a left
  member's rejection leaves the group's current plan alone.

Each verb is built on what filter and bind use — the member's answer and re-slotting
(:class:`~.service.WorkloadCycle`), the plan book's one door, the placement record and the barrier's
timeout (:mod:`.binding`) — and keeps what only the plugin needs: converting the pod, the answers'
shape, the plan ids and change counter of the stream, the groups waiting for members. Every call
takes the cycle's lock briefly; the solve of a workload cycle runs off it as always.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from cluster import names
from cluster.cache import CacheEvent
from solver import Pod, Policy

from . import replans
from .plans import Change, Plan, PlanState, Usage, total_usage
from .service import WorkloadCycle

#: how often the reservations stream may send (changes inside the window are coalesced); members
#: never wait for it (a plan reaches the plugin in the PlanForPod reply), plain pods and PreEnqueue do
COALESCE_SECONDS = 0.05
#: how long past the barrier timeout a left member is streamed for rejection (the plugin's Permit
#: timeout, the barrier timeout plus a little, has rejected it by then)
LEFT_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class PermitAnswer:
    """What :meth:`PluginEnforcement.permit` tells phalanx's framework plugin."""

    decision: str  # allow | wait | reject
    reason: str = ""
    allow: tuple[str, ...] = ()  # the members the plugin allows now
    wait_seconds: float = 0.0


def not_planned_there(plan: Plan | None, key: str, uid: str, node: str = "") -> str:
    """Why the plugin's member ``uid`` is not planned (on ``node``, when given), or "" when it is."""
    if plan is None:
        return f"phalanx: podgroup {key} holds no plan for pod {uid}; re-planning"
    return plan.not_planned_there(uid, node)


@dataclass(frozen=True)
class PlanAnswer:
    verdict: str  # planned | wait | not_a_member
    node: str = ""
    reason: str = ""
    plan: Plan | None = None
    members_missing: bool = False


@dataclass(frozen=True)
class Snapshot:
    version: int
    plans: tuple[Plan, ...]
    nodes: Mapping[str, Mapping[str, int]]
    waiting_groups: tuple[str, ...]
    plan_ids: Mapping[str, int] = field(default_factory=dict)  # group -> id of its plan
    left: tuple[str, ...] = ()  # members reserved for a gang plan dropped before it completed
    preempting: tuple[str, ...] = ()  # groups whose preemption's victims have not all gone yet
    untried: tuple[str, ...] = ()  # gangs held while plan ahead tries them (phalanx/hold-until-tried)


class PluginEnforcement:
    """The plugin's contract over one running :class:`WorkloadCycle`."""

    def __init__(self, cycle: WorkloadCycle) -> None:
        self.cycle = cycle  # the member's answer and re-slotting, as filter gives them
        self.cache = cycle.cache
        self.lock = cycle.lock
        self.book = cycle.book
        self.planner = cycle.planner
        self.binding = cycle.binding
        self.verdicts = cycle.verdicts
        self.preemption = cycle.preemption
        self.metrics = cycle.metrics
        self.clock = cycle.clock
        self.barrier_timeout = cycle.binding.barrier_timeout
        self._ids: dict[str, tuple[Plan, int]] = {}  # group -> (plan object, its id)
        self._next_id = 1
        self._ids_lock = threading.RLock()  # PlanForPod replies and snapshots name plans at once
        self._changed = threading.Condition(threading.Lock())
        self._version = 0
        # the gang groups still waiting for members, kept per group: a cache event marks the groups
        # it touches for a recount, the stream recounts only those
        self._waiting: dict[str, None] = {}  # an ordered set
        self._recount: set[str] | None = None  # None: every group, as at start
        self._waiting_lock = threading.Lock()
        # members reserved for a gang plan dropped before it completed: uid -> until when streamed
        self._left: dict[str, float] = {}
        self._left_lock = threading.Lock()
        cycle.subscribe(self._on_cycle_event)
        self.cache.subscribe(self._on_cache_change)
        # the last victim of a group's preemption going (a plain pod, often) ends its hold; plan
        # ahead's try of a group that does not fit changes nothing else the stream carries
        self.preemption.on_cleared(lambda _groups: self.changed())
        cycle.ahead.on_tried(self.changed)

    # -- change notification for the stream --------------------------------------------------
    def _on_cycle_event(self, kind: str, data: Mapping[str, object]) -> None:
        """The cycle's listener (lock held): every event changes what the stream may carry; a gang
        plan dropped with members at its barrier leaves them to be rejected."""
        arrived = data.get("arrived") if kind in ("plan_released", "bind_failed") else None
        if isinstance(arrived, tuple) and arrived:
            until = self.clock() + self.barrier_timeout + LEFT_GRACE_SECONDS
            with self._left_lock:
                self._left.update((str(uid), until) for uid in arrived)
        self.changed()

    def _forget_left(self, uids: Iterable[str]) -> None:
        with self._left_lock:
            for uid in uids:
                self._left.pop(uid, None)

    def _left_members(self) -> tuple[str, ...]:
        """The left members still to reject (their time past, the plugin's Permit timeout did)."""
        now = self.clock()
        with self._left_lock:
            for uid in [u for u, until in self._left.items() if until <= now]:
                del self._left[uid]
            return tuple(sorted(self._left))

    def changed(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def _on_cache_change(self, event: CacheEvent) -> None:
        # members arriving, binding or going, groups appearing; a plain pod changes nothing the
        # stream carries
        groups = event.groups
        if groups:
            with self._waiting_lock:
                if self._recount is not None:
                    self._recount |= groups
            self.changed()

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until the change counter passes ``seen`` (or ``timeout``); returns it."""
        with self._changed:
            if self._version == seen:
                self._changed.wait(timeout)
            return self._version

    def plan_id(self, plan: Plan) -> int:
        """A number naming this plan object (a re-plan of the group gets a new one)."""
        with self._ids_lock:
            held = self._ids.get(plan.group)
            if held is not None and held[0] is plan:
                return held[1]
            self._ids[plan.group] = (plan, self._next_id)
            self._next_id += 1
            return self._next_id - 1

    # -- PreFilter -----------------------------------------------------------------------------
    def plan_for_pod(self, pod: Pod) -> PlanAnswer:
        """PreFilter: the member's answer as filter gives it, on every node phalanx knows (the
        plugin runs before kube-scheduler's filters: there is no candidate list), with its group's
        plan when the answer is a node."""
        if not pod.group:
            return PlanAnswer("not_a_member")
        key = pod.group
        with self.lock:
            self.planner.expire()
            before = self.book.get(key)
            held = before is not None and pod.uid in before.assignments
            answer = self.cycle.answer_member(pod, key, frozenset(self.cache.nodes.keys()))
            plan = self.book.get(key) if answer.nodes else None
        self.metrics.plan_requests.labels(plan="none" if not answer.nodes else "held" if held else "made").inc()
        if answer.nodes:
            return PlanAnswer("planned", node=answer.nodes[0], plan=plan)
        reason = next(iter(answer.unresolvable.values()), "") or self.cycle.explanations.get(key, "") or (
            f"podgroup {key}: no placement")
        return PlanAnswer("wait", reason=reason, members_missing="waiting for members" in reason)

    # -- PostFilter ----------------------------------------------------------------------------
    def report_rejection(self, pod: Pod, node: str, plugin: str, reason: str) -> tuple[str, str]:
        """kube-scheduler's filters (``plugin``, for ``reason``) rejected ``node`` for the pod: the
        node joins its verdict, then the member is re-slotted as at filter (another identical
        member's node of the same plan), or the plan released (a counted re-plan). Returns
        (outcome, node): ("reslotted", new node), ("released", "") or ("none", "") when the member
        is not planned on ``node``."""
        if not pod.group:
            return "none", ""
        outcome, moved = self._rejected(pod, pod.group, node, plugin, reason)
        if outcome == "reslotted":
            self.changed()
        return outcome, moved

    def _rejected(self, pod: Pod, key: str, node: str, plugin: str, reason: str) -> tuple[str, str]:
        known = self.verdicts.get(pod.uid)
        excluded = (known.excluded if known else frozenset()) | {node}
        # a resource rejection is learned for a moment only: phalanx counts resources itself, and
        # kube-scheduler's cache differs from its own only until a watch event lands (a pod bound
        # while the serve link was down, members of another gang assumed). Kept, such a verdict kept
        # the node from every member of the gang long after both views agreed: a rack gang stayed
        # pending at rest with room in the network-fault run. (Added to a lasting verdict, it lasts.)
        transient = plugin == names.PLUGIN_NODE_RESOURCES_FIT and (known is None or bool(known.until))
        self.verdicts.learn(pod, frozenset(excluded), transient=transient, alive=self.cache.pods.__contains__)
        with self.lock:
            plan = self.book.get(key)
            if plan is None or plan.assignments.get(pod.uid) != node or plan.state is not PlanState.PLANNED:
                return "none", ""
            answer = self.cycle.answer_planned(plan, pod, frozenset(self.cache.nodes.keys() - excluded))
            if answer is not None:
                return "reslotted", answer.nodes[0]
            by = f" by {plugin}" if plugin else ""
            self.planner.release(key, replans.FILTERED_OUT,
                                 f"stale: planned node {node} was rejected{by} for {pod.key}: {reason}", pod.name, node)
        return "released", ""

    # -- Reserve / Unreserve -------------------------------------------------------------------
    def reserve(self, uid: str, group: str, node: str, traded_with: str = "",
                simulation: bool = False) -> tuple[bool, str]:
        """Reserve: a planned member kube-scheduler assumed on ``node`` arrives at the barrier.
        ``traded_with``: the member planned on ``node`` whose place it took (kube-scheduler's
        filters refused its own planned node for now, see :meth:`.Plan.trade_classes`); the two
        trade nodes first. ``simulation``: the Reserve of kube-scheduler's pod-group cycle
        simulation, which it reverts without telling (the trade is kept, the member does not
        arrive: it arrives with its real Reserve or its Permit call). Returns (False, why) when it
        is not planned there."""
        with self.lock:
            plan = self.book.get(group)
            if traded_with and plan is not None:
                refused = self._trade(plan, uid, traded_with, node)
                if refused:
                    return False, refused
            refused = not_planned_there(plan, group, uid, node)
            if refused or plan is None:
                return False, refused
            if not simulation:
                self._arrive(plan, (uid,))
        self.changed()  # an arrival or a trade: the stream carries both
        return True, ""

    def _trade(self, plan: Plan, uid: str, partner: str, node: str) -> str:
        """Member ``uid`` takes ``partner``'s planned ``node`` and gives it its own (lock held):
        why not, or "". The plan's nodes stay the same, so nothing else moves."""
        if plan.state is not PlanState.PLANNED or uid not in plan.assignments or partner not in plan.assignments:
            return f"phalanx: podgroup {plan.group}: no trade with {partner} in this plan"
        if plan.assignments[partner] != node:
            return f"phalanx: pod {partner} is planned on {plan.assignments[partner]}, not {node}"
        if partner in plan.arrived or self.cache.bound_node(partner):
            return f"phalanx: pod {partner} already holds {node}"
        classes = plan.trade_classes()
        if uid not in classes or classes.get(partner) != classes[uid]:
            return f"phalanx: pods {uid} and {partner} do not trade nodes (not in one trade class)"
        was = plan.assignments[uid]
        plan.swap(uid, partner)
        self.cycle.status.emit("reslotted", group=plan.group, pod=plan.members[uid].key, node=node, was=was,
                               partner=plan.members[partner].key)
        return ""

    def _arrive(self, plan: Plan, uids: Iterable[str]) -> None:
        """Members kube-scheduler assumed on their planned nodes arrive at the barrier (lock held).
        No expiry while members wait at Permit (they are rejected at the barrier timeout); no
        generation bump: what a solve of another group sees (the plan's capacity for its members
        not bound) does not change when one arrives, so solves in flight stay valid."""
        uids = tuple(uids)
        plan.arrived.update(uids)
        plan.deadline = max(plan.deadline, self.clock() + self.barrier_timeout + 5.0)
        self._forget_left(uids)  # at this plan's barrier now, no longer a left member

    def unreserve(self, uid: str, group: str, reason: str) -> list[str]:
        """Unreserve: the member leaves the barrier. A gang member rejected at Permit (``reason``
        "rejected": its barrier timed out) while the plan is still planned releases the plan — when
        the member was at this plan's barrier: a left member (reserved for an earlier plan of the
        group, or never arrived) only leaves. Returns the members the plugin should reject too (a
        gang never binds partially)."""
        self._forget_left((uid,))
        with self.lock:
            plan = self.book.get(group)
            if plan is None or uid not in plan.assignments:
                return []
            at_barrier = uid in plan.arrived
            plan.arrived.discard(uid)  # the plan's capacity is unchanged (see reserve)
            released = plan.gang and plan.state is PlanState.PLANNED and reason == "rejected" and at_barrier
            if released:
                others = sorted(u for u in plan.arrived if u != uid)
                why = (f"barrier timed out: {len(plan.arrived)} of {len(plan.assignments)} members reserved "
                       f"when {self.binding.pod_name(uid)} was rejected at Permit")
                self.binding.time_out(plan, why)
                self._retry_members(group)
        if not released:
            self.changed()  # a release notifies through the cycle's listeners
            return []
        return others

    def _retry_members(self, key: str) -> None:
        """The gang's members were rejected at Permit: kube-scheduler keeps such a pod aside until a
        cluster event its plugins registered for (or its own flush, minutes later), and at rest
        none follows — a gang whose placement record could not be written while the API server
        link was down stayed pending although it fit. One touch of a pending member is that event
        (the plugin's queueing hint retries every member it left aside); a group past its re-plan
        limit backs off instead, and its backoff's end touches it (requeue.py)."""
        if key in self.cycle.queue.failed:
            return
        pending = [r.pod for r in self.cache.members(key) if not r.pod.node and not r.gated]
        if pending:
            self.cycle.inbox.nudge([(pending[0].namespace, pending[0].name)])

    # -- Permit --------------------------------------------------------------------------------
    def permit(self, uid: str, group: str, reserved: tuple[str, ...] = (), node: str = "",
               condition_by_scheduler: bool = False, reserved_nodes: Mapping[str, str] | None = None) -> PermitAnswer:
        """Permit, the plugin's barrier (``reserved``: members the plugin reserved itself from its
        mirror of the plan, each as if reserve had been called — the stream then stops counting
        their capacity as held; ``node``: where kube-scheduler assumed ``uid``, checked against its
        plan when it is among them). Once every planned member is reserved (or bound) the placement
        record is written (off the lock, before any member binds), the plan goes ``binding`` then
        ``bound`` (kube-scheduler binds; the plan holds its capacity until the cache shows the
        bindings) and every reserved member is allowed. A Basic group's member is allowed at once.
        ``condition_by_scheduler``: kube-scheduler's pod-group cycle writes the group's
        PodGroupInitiallyScheduled condition, so binding does not write it too. ``reserved_nodes``:
        where kube-scheduler assumed each of ``reserved`` — the plugin reserved them against its
        mirror, which may be older than the group's plan: one assumed off its planned node rejects
        the call, none of them counted (allowed, it would bind where no plan put it)."""
        answer = self._permit(uid, group, reserved, node, condition_by_scheduler, reserved_nodes or {})
        if reserved:
            self.changed()
        return answer

    def _permit(self, uid: str, key: str, reserved: tuple[str, ...], node: str,
                condition_by_scheduler: bool, reserved_nodes: Mapping[str, str]) -> PermitAnswer:
        with self.lock:
            plan = self.book.get(key)
            if plan is not None and condition_by_scheduler:
                plan.condition_by_scheduler = True
            early = self._permit_now(plan, uid, key, reserved, node, reserved_nodes)
            if early is not None or plan is None:
                return early or PermitAnswer("reject")
            self.metrics.barrier.labels(outcome="released").inc()
            plans = self.binding.start_binding(plan)  # a composite's children: all of them, together
            if not plans:
                return PermitAnswer("wait", f"phalanx: podgroup {key}: writing the placement record",
                                    wait_seconds=self.barrier_timeout)
        errors = [(p, error) for p in plans if (error := self.binding.record(p))]
        with self.lock:
            if errors:
                for p in plans:  # one child's record not written: none of the tree binds
                    self.book.transition(p, PlanState.FAILED, Change(replans.BIND_FAILED, errors[0][1]))
                    self._retry_members(p.group)
                return PermitAnswer("reject", f"phalanx: podgroup {errors[0][0].group}: {errors[0][1]}")
            allow = tuple(sorted(u for p in plans for u in p.arrived))
            for p in plans:
                self.book.transition(p, PlanState.BOUND)  # kube-scheduler binds; held until the cache shows it
        return PermitAnswer("allow", allow=allow)

    def _permit_now(self, plan: Plan | None, uid: str, key: str, reserved: tuple[str, ...],
                    node: str, reserved_nodes: Mapping[str, str]) -> PermitAnswer | None:
        """The answer when it needs no record written (lock held), or None: the gang is complete
        and this call writes it. Calls may overlap: one while the record is being written is
        answered wait (the completing call's reply allows it)."""
        refused = not_planned_there(plan, key, uid, node if uid in reserved else "")
        if not refused and plan is not None:  # every reported member on its planned node, or the first why not
            refused = next(filter(None, (plan.not_planned_there(u, where) for u, where in reserved_nodes.items()
                                         if u in reserved)), "")
        if refused or plan is None:
            return PermitAnswer("reject", refused)
        if reserved and plan.state is PlanState.PLANNED:
            self._arrive(plan, (u for u in reserved if u in plan.assignments))
        if not plan.gang:
            if plan.state is PlanState.PLANNED:
                self.book.transition(plan, PlanState.BINDING)
            plan.bound.add(uid)
            self.binding.settle_basic(plan)
            return PermitAnswer("allow", allow=(uid,))
        if plan.state is PlanState.BOUND:
            return PermitAnswer("allow", allow=(uid,))
        if plan.state is PlanState.BINDING:  # the completing member's call is writing the record
            return PermitAnswer("wait", f"phalanx: podgroup {key}: writing the placement record",
                                wait_seconds=self.barrier_timeout)
        if not self.binding.complete(plan):
            where = (f"{self.binding.arrived(plan)} of {len(plan.assignments)} members reserved" if not plan.tree
                     else f"{sum(self.binding.arrived(p) for p in self.book.tree_of(plan))} of "
                          f"{sum(len(p.assignments) for p in self.book.tree_of(plan))} members of its "
                          f"compositepodgroup's {len(plan.tree)} groups reserved")
            return PermitAnswer("wait", f"phalanx: podgroup {key}: {where}", wait_seconds=self.barrier_timeout)
        return None

    # -- the reservations stream ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        version = self._version
        untried = self.cycle.ahead.untried()  # before the plans: a group tried meanwhile shows in them
        plans, nodes = self._reservations()
        with self._ids_lock:
            ids = {p.group: self.plan_id(p) for p in plans}
            live = {p.group for p in plans}
            for group in [g for g in self._ids if g not in live]:
                del self._ids[group]
        preempting = self.preemption.holding()
        held = live.union(preempting)
        return Snapshot(version, plans, nodes, self._waiting_groups(), ids, self._left_members(), preempting,
                        tuple(g for g in untried if g not in held))

    def timed(self) -> bool:
        """Whether the stream's content can change with time alone (a group held for its
        preemption's victims is let go at its nomination's deadline, a group waiting for plan
        ahead when plan ahead stalls, with no event): the stream then recomputes its snapshot every
        second even without a change."""
        return bool(self.preemption.nominations) or self.cycle.ahead.busy()

    def _reservations(self) -> tuple[tuple[Plan, ...], Usage]:
        """Every plan holding capacity except a gang's once bound (every member was allowed at
        Permit; a member whose binding fails asks again with PlanForPod, so the stream, sent whole
        after each change, stays the size of the groups being placed rather than of those waiting
        for the cache to show their bindings), and per node the capacity held for members neither
        reserved at the plugin (kube-scheduler's cache counts those as assumed) nor bound (a gang's
        only while it is planned), plus preemption nominations."""
        bound = self.cache.bound_node
        with self.lock:
            self.planner.expire()
            plans = tuple(p for p in self.book.holding() if not (p.gang and p.state is PlanState.BOUND))
            held = [p.reservations({u for u in p.assignments if u in p.arrived or bound(u)})
                    for p in plans if p.state is PlanState.PLANNED or not p.gang]
            held += self.preemption.reservations()
        return plans, total_usage(held)

    def _waiting_groups(self) -> tuple[str, ...]:
        """Gang groups with members but fewer live ones than their minimum: those marked by a cache
        event since the last call are recounted, the rest kept."""
        with self._waiting_lock:
            recount, self._recount = self._recount, set()
            if recount is None:  # the first call: every group
                recount = set(self.cache.podgroups)
                self._waiting.clear()
            for key in recount:
                if self._short_of_members(key):
                    self._waiting[key] = None
                else:
                    self._waiting.pop(key, None)
            return tuple(self._waiting)

    def _short_of_members(self, key: str) -> bool:
        record = self.cache.podgroups.get(key)
        if record is None or record.spec.policy is not Policy.GANG or record.spec.min_count <= 1:
            return False
        pods = self.cache.pods
        uids = list(self.cache.pods_by_group.get(key, ()))  # a copy: the cache's thread may add members meanwhile
        live = sum(1 for r in map(pods.get, uids) if r is not None and r.active and not r.terminating)
        if not uids or live >= record.spec.min_count:
            return False
        return live + len(self.cache.finished_members(key)) < record.spec.min_count  # phalanx/gang-history
