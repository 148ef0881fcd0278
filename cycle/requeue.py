"""Requeue: the cluster's changes reach the cycle, and pods answered "no node" are retried.

kube-scheduler retries a pod the extender (or the plugin) rejected on its next cluster event, which
may arrive before phalanx's cache has seen that event: the retry then fails again and nothing else
wakes the pod. So phalanx keeps a thread of its own, started by ``phalanx serve``
(:meth:`Requeue.start`), that:

- takes the cache's events (:meth:`Requeue.on_cache_change`, on the watch thread: it only notes
  work in the :class:`~.inbox.Inbox`, never takes the cycle's lock) — deleted PodGroups, members
  that arrived, disrupted members, nodes added, changed or deleted;
- releases plans whose node was deleted, cordoned or tainted before anyone binds to it;
- touches (annotation ``scheduling.phalanx.dev/retry``) the parked members of groups that were
  just planned, whose members arrived, whose victims are gone, or that now fit after room appeared:
  that pod update makes kube-scheduler retry it, and its binding wakes the rest;
- prunes every map keyed by group or pod of PodGroups that are gone (deleted, or dropped by a
  re-list, which sends no event), and sweeps stale verdicts and the heap.
"""

from __future__ import annotations

import logging
import threading
import time

from cluster.cache import CacheEvent, PodRecord
from solver import InvalidInput, TaintEffect

from . import replans
from .capacity import BarrierCapacity
from .context import CycleContext
from .heap import Heap
from .planning import Planner
from .plans import Change, PlanState
from .preemption import GroupPreemption
from .replans import ReplanBudget
from .verdicts import SWEEP_INTERVAL

log = logging.getLogger("phalanx.cycle")

#: seconds between two full prunes by the requeue thread (deletions noted are forgotten at once)
FULL_PRUNE_INTERVAL = 1.0


class Requeue:
    def __init__(self, ctx: CycleContext, planner: Planner, capacity: BarrierCapacity, preemption: GroupPreemption,
                 replans_: ReplanBudget, heap: Heap) -> None:
        """A standby (``ctx.acting`` False) touches nothing, it only prunes."""
        self.acting = ctx.acting
        self.lock, self.book, self.cache, self.status = ctx.lock, ctx.book, ctx.cache, ctx.status
        self.queue, self.verdicts, self.recorded, self.parked = ctx.queue, ctx.verdicts, ctx.recorded, ctx.parked
        self.inbox, self.clock = ctx.inbox, ctx.clock
        self.tenants = ctx.tenants  # per-namespace limits: a pass checks a namespace's fair share
        self.planner = planner
        self.capacity = capacity
        self.preemption = preemption
        self.replans = replans_
        self.heap = heap
        cache, clock = ctx.cache, ctx.clock
        self._nodes_seen: set[str] = set(cache.nodes)  # to tell a node added from a re-list's replay
        self._capacity_seen = cache.capacity_version
        self._backoffs_seen = clock()  # backoffs ending up to this time were looked at
        self._closed = False
        self._full_prune = time.monotonic()  # the last full prune (a cost bound, not a timer: real time)
        #: deletions were handled by a partial prune since the last full one: some per-group maps
        #: (status conditions, the queue policies' bound_at, the record's dirty set) are only pruned
        #: by the full one, so the thread wakes for it rather than sleeping until the next sweep
        self._full_prune_due = False
        self._thread: threading.Thread | None = None
        cache.subscribe(self.on_cache_change)

    # -- the thread --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the requeue thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="phalanx-requeue", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._closed = True
        self.inbox.wake()

    def _loop(self) -> None:
        swept = self.clock()
        while not self._closed:
            woken = self.inbox.woken.wait(timeout=self._next_wake(swept))
            self.inbox.woken.clear()
            try:
                if self.clock() - swept >= SWEEP_INTERVAL:
                    swept = self.clock()
                    self.verdicts.sweep(self._still_pending)  # off the cycle's lock
                    self.heap.tick()
                    self.heap.release()
                self.heap.release_if_grown()
                self.prune_step()
                if not self.acting():
                    continue  # a standby keeps its maps pruned and touches nothing
                self.requeue_ended_backoffs()
                self.requeue_ended_verdicts()
                if not woken:
                    continue
                self.pass_once()
            except Exception:  # noqa: BLE001 - the loop must survive a bad group
                log.exception("requeue pass failed")

    def pass_once(self) -> None:
        """One pass over the inbox (what the thread does when woken)."""
        with self.lock:
            self.planner.provisioning.sync()
        self.members_arrived()
        self.victims_cleared()
        self.touch_parked()
        time.sleep(0.2)  # let a burst of events land first
        self.invalidate_plans()
        if self.cache.capacity_version != self._capacity_seen and self.queue.failed:
            self.requeue_fitting()

    # -- cache events (watch thread: note and wake only) -------------------------------------
    def on_cache_change(self, event: CacheEvent) -> None:
        # runs on whichever thread applied the event (possibly holding a backend lock): only note
        # the work and wake the requeue thread, never take the cycle's lock here
        if event.kind == "PodGroup":
            self._podgroup_changed(event.deleted, event.key)
        elif event.kind == "Pod":
            self._pod_changed(event.key, event.pod)
        elif event.kind == "Node":
            self._node_changed(event.deleted, event.key)
        if self.cache.capacity_version != self._capacity_seen and self.queue.failed:
            self.inbox.wake()

    def _podgroup_changed(self, deleted: bool, key: str) -> None:
        self.recorded.mark(key)
        if deleted:
            self.planner.domains.pop(key, None)
            self.replans.forget(key)
            self.parked.forget_group(key)
            self.inbox.deleted(key)  # the rest under the cycle's lock, by the requeue thread
        elif self.parked.waits_for_members(key):
            self.inbox.arrived(key)  # its PodGroup came: checked by the requeue thread

    def _pod_changed(self, uid: str, record: PodRecord | None) -> None:
        """``record`` None: the pod was deleted."""
        if record is None or not record.pod.group:
            self.recorded.mark_held()
        else:
            self.recorded.mark(record.pod.group)
        if record is None or record.pod.node:
            self.verdicts.forget([uid])  # deleted or bound
            self.parked.forget_pod(uid)
        if record is None:
            return
        group = record.pod.group
        if group and not record.pod.node and not record.gated and self.parked.waits_for_members(group):
            self.inbox.arrived(group)  # a group waiting for members got one
        if group and record.disrupted:
            self.planner.domains.pop(group, None)  # evicted or preempted: free to land anywhere
            self.recorded.abandon(group)  # and its record holds no room for it any more

    def _node_changed(self, deleted: bool, name: str) -> None:
        if deleted:
            self._nodes_seen.discard(name)
        elif name not in self._nodes_seen:  # new to phalanx (a re-list replays known ones)
            self._nodes_seen.add(name)
            self.verdicts.node_added(name)
        self.inbox.node_changed(name)

    # -- the passes --------------------------------------------------------------------------
    def invalidate_plans(self) -> None:
        """A plan whose node was deleted, cordoned or tainted is released before anyone binds to it
        (a plan's other nodes changing capacity is caught at filter: the node is no candidate)."""
        changed = self.inbox.take_changed_nodes()
        with self.lock:
            for node_name in changed:
                node = self.cache.nodes.get(node_name)
                if node is not None and not node.unschedulable and not any(
                        t.effect is not TaintEffect.PREFER_NO_SCHEDULE for t in node.taints):
                    continue
                why = "deleted" if node is None else "cordoned or tainted"
                for key, plan in list(self.book.items()):
                    if plan.state is PlanState.PLANNED and node_name in plan.assignments.values():
                        self.planner.release(key, replans.NODE_CHANGED, f"stale: node {node_name} was {why}")

    def members_arrived(self) -> None:
        """Members parked "waiting for members" while the cache lagged (a sibling's creation or
        ungating not yet seen): once the group has minCount schedulable members, touch them all,
        so kube-scheduler retries them. A group answered so at kube-scheduler's preemption call
        gets its cycle (and group preemption) run here: kube-scheduler retries a pod its own
        filters rejected only when they may pass now (victims gone), never for a touch."""
        for key in self.inbox.take_arrived():
            try:
                group = self.cache.podgroup(key)
            except InvalidInput:
                continue  # the group's own explanation says why
            if group is None or group.missing_members:
                continue
            self.inbox.nudge(self.parked.complete(key))
            if self.inbox.take_preempting(key) and group.pending:
                with self.lock:
                    self.planner.expire()
                    if key not in self.book and not self.preemption.waiting(key):
                        self.planner.cycle(group)

    def victims_cleared(self) -> None:
        """A nominated group's victims are all gone: touch its parked members, so kube-scheduler
        retries them now that the freed room is known here (see GroupPreemption._victim_gone)."""
        for key in self.preemption.take_cleared():
            self.inbox.nudge(self.parked.take_group(key))

    def touch_parked(self) -> None:
        """Touch the pods noted for it (off the cycle's lock)."""
        for namespace, name in self.inbox.take_nudges():
            self.status.nudge(namespace, name)

    def prune_step(self) -> None:
        """The thread's prune on each wake: the deletions noted, and at most every
        :data:`FULL_PRUNE_INTERVAL` seconds what a re-list dropped without an event; a partial prune
        of deletions makes the thread wake for the full one (see :meth:`_next_wake`)."""
        full = time.monotonic() - self._full_prune >= FULL_PRUNE_INTERVAL
        if full:
            self._full_prune = time.monotonic()
            self._full_prune_due = False
        elif self.inbox.has_deleted():
            self._full_prune_due = True
        self.prune(full)

    def prune(self, full: bool = True) -> None:
        """Forget everything kept for PodGroups that no longer exist — deleted (noted by the
        cache listener) or dropped by a re-list (which sends no event): every map keyed by group
        or pod returns to its size before the group. A plan of a gone group that still holds
        capacity is released (a gang already binding finishes on its own). ``full=False``: only
        the deletions noted; the scan of every map for what a re-list dropped costs as many
        groups as are kept, so the thread runs it at most every :data:`FULL_PRUNE_INTERVAL`
        seconds, not on every wake (a namespace's 10,000 waiting groups wake it on every call)."""
        deleted = self.inbox.take_deleted()
        planner = self.planner
        if not full:
            with self.lock:
                for key in deleted:
                    if key not in self.cache.podgroups:
                        self._forget_group(key)
                planner.release_throttled()
            return
        with self.lock:
            live = self.cache.podgroups
            gone = set(deleted)
            for table in (self.book, planner.explanations, planner.domains, self.capacity.waiting,
                          self.status.conditions, self.queue.failed, self.replans.groups):
                gone.update(k for k in table if k not in live)
            # a group whose member was parked moments ago without its PodGroup in the cache is
            # one the cache has not seen yet, not one a re-list dropped: kept (see cycle.parked)
            kept = set(live) | (self.parked.young() - set(deleted))
            for key in gone - kept:
                self._forget_group(key)
            self.parked.prune(kept)
            planner.policies.prune(set(live))
            self.status.prune(live)
            planner.smallest.prune(live)
            self.inbox.prune(kept)
            self.recorded.prune(live)
            self.tenants.prune(live)
            planner.provisioning.prune(live)
            planner.release_throttled()
            planner.refresh_records()
        for solves in (self.preemption.solves, planner.smallest.solves):  # off the lock: one pass over
            solves.prune(self.cache.pods)  # the pods sent to a worker (workers.py)

    def _forget_group(self, key: str) -> None:
        """PodGroup ``key`` is gone (lock held)."""
        plan = self.book.get(key)
        if plan is not None:
            if plan.state is PlanState.PLANNED or (plan.state is PlanState.BINDING and not plan.gang):
                self.book.transition(plan, PlanState.RELEASED, Change(why=f"podgroup {key} was deleted"))
            elif plan.state is PlanState.BOUND:
                self.book.transition(plan, PlanState.FORGOTTEN)
        for table in (self.planner.explanations, self.planner.domains, self.capacity.waiting, self.queue.failed):
            table.pop(key, None)
        self.planner.smallest.forget(key)
        self.replans.forget(key)
        self.parked.forget_group(key)

    def _still_pending(self, uid: str) -> bool | None:
        """For the verdict sweep: True while the pod waits for a node, None when unknown."""
        record = self.cache.pods.get(uid)
        return None if record is None else not record.pod.node and record.active

    def _next_wake(self, swept: float) -> float:
        """Seconds the thread may sleep unwoken: until the next sweep, the next end of a group's
        backoff or the heap's next look at the resident size, whichever comes first."""
        now = self.clock()
        with self.lock:
            ends = [a.retry_at for a in self.queue.failed.values() if a.retry_at > self._backoffs_seen]
        due = [FULL_PRUNE_INTERVAL - (time.monotonic() - self._full_prune)] if self._full_prune_due else []
        verdict_end = self.verdicts.next_end()
        if verdict_end is not None:
            ends.append(verdict_end)
        due.append(self.heap.next_look())
        return max(0.05, min([SWEEP_INTERVAL - (now - swept)] + [end - now for end in ends] + due))

    def requeue_ended_backoffs(self) -> None:
        """Groups whose backoff ended since the last look and that fit now: touch one pending
        member each. kube-scheduler keeps a pod phalanx turned away aside until a cluster event
        (or its own flush after minutes): a gang that backed off after its plans timed out at the
        barrier — members cut off from phalanx by the network, say — with nothing else changing
        in the cluster would otherwise wait that long although it fits."""
        now = self.clock()
        with self.lock:
            ended = [k for k, a in self.queue.failed.items() if self._backoffs_seen < a.retry_at <= now]
            self._backoffs_seen = now
        if ended:
            self.requeue_fitting(ended)

    def requeue_ended_verdicts(self) -> None:
        """Groups a transient verdict (a resource rejection by kube-scheduler) kept from a node,
        whose verdict just ended: touch one pending member of each that fits now. The event that
        made room (the pod on that node gone from kube-scheduler's cache) arrived while the verdict
        still held, so it retried nothing."""
        ended = self.verdicts.ended()
        if ended:
            self.requeue_fitting(ended)

    def requeue_fitting(self, keys: list[str] | None = None) -> None:
        """Room appeared (or, with ``keys``, those groups' backoff ended): touch one pending member
        of each group backing off that now fits — of each namespace's, at most its fair share per
        pass (tenants.py), so a namespace's 10,000 failed groups cost what 8 do; the rest wait for
        the next pass or their backoff."""
        work = []
        with self.lock:  # inputs under the lock, solves off it (a stale answer costs one touch)
            if keys is None:
                self._capacity_seen = self.cache.capacity_version
            failed = list(self.queue.failed) if keys is None else [k for k in keys if k in self.queue.failed]
            checked = self.tenants.share.take(failed)
            if len(checked) < len(failed):
                self.planner.metrics.namespace_limited.labels(limit="retries").inc(len(failed) - len(checked))
            for key in checked:
                pending = [m.pod for m in self.cache.members(key) if not m.pod.node and not m.gated]
                group = self.planner.group_view(key, pending[0]) if pending else "no pending members"
                if isinstance(group, str):
                    self.queue.succeeded(key)
                    continue
                snapshot, allowed = self.planner.check_inputs(key, group)
                work.append((key, group, snapshot, allowed, pending[0]))
        fitting = [(key, pod) for key, group, snapshot, allowed, pod in work
                   if self.planner.would_fit(snapshot, group, allowed)]
        with self.lock:
            for key, _ in fitting:
                self.queue.succeeded(key)
        for _, pod in fitting:
            self.status.nudge(pod.namespace, pod.name)

