"""Binding: the bind barrier of a gang (extender mode), and the placement record before any binding.

kube-scheduler's bind phase runs one goroutine per pod, so a gang member's bind call may wait:

- A gang member's call waits at the barrier until every planned member has arrived (or is already
  bound); the last to arrive leads. It writes the placement record on the PodGroup synchronously —
  before any member binds, so a restart finishes the gang, never splits it — then binds every
  member in parallel (``bind_workers``) and every waiter returns. On timeout nothing is bound, the
  plan is released and every waiter is answered an error (kube-scheduler requeues them).
- A Basic group's member binds at once, as planned: its plan is ``binding`` from the first member on
  and ``bound`` once every planned member is.
- A pod without a group binds at once; a gang member without a plan is refused (never a pod phalanx
  did not plan), and so is a member of a PodGroup phalanx has not seen. A bind call names only the
  pod, and phalanx's cache may not have seen the pod yet (its watch lagging kube-scheduler's, as
  under a slow API-server link): the group a filter call named is remembered by the pod's uid, so
  a member planned while unseen, whose plan was released before its bind call came, is refused
  rather than bound alone as a pod without a group.

Any exception while binding finishes the plan as ``failed``: no plan stays in ``binding``. The
barrier's deadline is on the injected clock; waiters sleep on the cycle's condition and wake on
every transition (no thundering herd: only an arrival can complete a gang, so only the arriving
call checks).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from cluster import names
from cluster.backend import ClusterWriter, WriteError
from cluster.cache import CacheEvent, ClusterCache
from cluster.convert import placement_text
from solver import Policy

from . import replans
from .lock import CycleLock
from .metrics import CycleMetrics
from .plans import Change, Plan, PlanBook, PlanState
from .status import StatusWriter, scheduled_message

log = logging.getLogger("phalanx.cycle")

#: how long the placement record waits for the PodGroup's earlier queued writes (a record removal
#: among them) to land; past it the record is not written and the gang not bound (it is planned
#: again), since a removal landing after the record would leave bound members unrecorded
RECORD_FLUSH_SECONDS = 5.0
#: group members whose filter call was answered and whose bind call has not come, remembered by uid
#: at most (the oldest forgotten first: ~150 bytes each; a forgotten one is remembered again at its
#: next filter call, which kube-scheduler makes before any bind)
MAX_FILTERED_MEMBERS = 50_000


class BindError(RuntimeError):
    """Binding refused or failed; kube-scheduler un-reserves the pod and retries it."""


class Binding:
    SIZE_CAPS = {"_filtered": MAX_FILTERED_MEMBERS}  # see cluster/sizes.py

    def __init__(self, lock: CycleLock, book: PlanBook, cache: ClusterCache, writer: ClusterWriter,
                 status: StatusWriter, metrics: CycleMetrics, clock: Callable[[], float],
                 barrier_timeout: float, bind_workers: int = 16) -> None:
        self.lock = lock
        self.book = book
        self.cache = cache
        self.writer = writer
        self.status = status
        self.metrics = metrics
        self.clock = clock
        self.barrier_timeout = barrier_timeout
        self._binder = ThreadPoolExecutor(max_workers=bind_workers, thread_name_prefix="phalanx-bind")
        self._filtered: OrderedDict[str, str] = OrderedDict()  # pod uid -> group key its filter call named
        self._filtered_lock = threading.Lock()  # a leaf: the cache's listener takes it, not the cycle's
        cache.subscribe(self._on_cache_change)

    def filtered(self, uid: str, group: str) -> None:
        """A group member's filter call was answered: its bind call is judged as a member's even if
        the cache has not seen the pod."""
        with self._filtered_lock:
            self._filtered[uid] = group
            self._filtered.move_to_end(uid)
            if len(self._filtered) > MAX_FILTERED_MEMBERS:
                self._filtered.popitem(last=False)

    def _on_cache_change(self, event: CacheEvent) -> None:
        """A pod the cache shows bound or deleted needs no remembered group (a re-list that drops
        one unseen leaves it to the bound on the map)."""
        if event.kind == "Pod" and (event.pod is None or event.pod.pod.node):
            with self._filtered_lock:
                self._filtered.pop(event.key, None)

    def pod_name(self, uid: str) -> str:
        record = self.cache.pods.get(uid)
        return record.pod.name if record else uid

    def arrived(self, plan: Plan) -> int:
        """Members at the barrier or bound."""
        return sum(1 for u in plan.assignments if u in plan.arrived or self.cache.bound_node(u))

    # the rules' one home (docs/design.md: KEP-6277/gang-bind-barrier, composite/tree-barrier)
    def complete(self, plan: Plan) -> bool:
        """Every planned member reached bind (or is bound) — for a composite's child, every member of
        every plan made with it, each still held (lock held)."""
        plans = self.book.tree_of(plan)
        if len(plans) < max(len(plan.tree), 1):
            return False  # a sibling's plan is gone: the composite is planned again, whole
        bound = self.cache.bound_node
        return all(u in p.arrived or bound(u) for p in plans for u in p.assignments)

    def start_binding(self, plan: Plan) -> list[Plan]:
        """The complete gang's plans (itself, or a composite's children together) moved to binding
        (lock held); [] when another call moved them already."""
        plans = self.book.tree_of(plan)
        if any(p.state is not PlanState.PLANNED for p in plans):
            return []
        for p in plans:
            self.book.transition(p, PlanState.BINDING)
        return plans

    # -- the verb ----------------------------------------------------------------------------
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """kube-scheduler's bind (binding cycle): returns once the Binding exists; raises
        :class:`BindError` otherwise."""
        with self.lock:
            plan = self.book.of_member(uid)
        with self._filtered_lock:
            named = self._filtered.pop(uid, "")
        if plan is None:
            record = self.cache.pods.get(uid)
            group = record.pod.group if record else named
            if group and group not in self.cache.podgroups:
                raise BindError(f"phalanx: pod {namespace}/{name} names podgroup {group}, which phalanx "
                                "has not seen; not binding")
            if group and self._is_gang(group):
                raise BindError(f"phalanx: pod {namespace}/{name} of podgroup {group} has no plan; not binding")
            self._bind_one(namespace, name, uid, node)  # pods without a group (or Basic groups)
            with self.lock:
                self.book.bump()  # capacity no plan held is taken: a solve in flight re-checks
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
        why = self._bind(namespace, name, uid, node)
        if why:
            raise BindError(f"phalanx: {why}")

    def _bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind one pod; "" or why it failed (whatever the writer raises, the caller gets an answer)."""
        try:
            self.writer.bind(namespace, name, uid, node)
        except WriteError as err:
            return f"binding {namespace}/{name} to {node} failed: {err}"
        except Exception as err:  # noqa: BLE001 - any writer failure fails the plan, never hangs it
            log.exception("binding %s/%s failed", namespace, name)
            return f"binding {namespace}/{name} to {node} failed: {type(err).__name__}: {err}"
        return ""

    def _bind_member(self, plan: Plan, namespace: str, name: str, uid: str, node: str) -> None:
        """A Basic group's member binds at once, as planned."""
        with self.lock:
            if plan.state is PlanState.PLANNED:
                self.book.transition(plan, PlanState.BINDING)
        self._bind_one(namespace, name, uid, node)
        with self.lock:
            plan.bound.add(uid)
            self.settle_basic(plan)

    def settle_basic(self, plan: Plan) -> None:
        """A Basic plan in ``binding`` whose every member is bound (by phalanx, or as the cache
        shows) is ``bound``. Lock held."""
        bound = self.cache.bound_node
        if plan.state is PlanState.BINDING and all(u in plan.bound or bound(u) for u in plan.assignments):
            self.book.transition(plan, PlanState.BOUND)

    # -- the barrier -------------------------------------------------------------------------
    def _barrier(self, plan: Plan, uid: str, namespace: str, name: str) -> None:
        """Wait until every planned member reached bind (or is bound); the last to arrive leads
        the binding of all. Holds no lock while bindings are made."""
        deadline = self.clock() + self.barrier_timeout
        lead: list[Plan] = []
        with self.lock:
            plan.arrived.add(uid)
            self.metrics.barrier_waiting.inc()
            try:
                if plan.state is PlanState.PLANNED and self.complete(plan):
                    lead = self.start_binding(plan)
                while plan.state is PlanState.PLANNED:
                    left = deadline - self.clock()
                    if left <= 0:
                        why = f"barrier timed out: {self.arrived(plan)} of {len(plan.assignments)} members reached bind"
                        self.time_out(plan, why)
                        raise BindError(f"phalanx: podgroup {plan.group}: {why}; nothing was bound")
                    self.lock.wait(min(left, 5.0))
                    plan.deadline = max(plan.deadline, self.clock() + 1.0)  # no expiry while waiting
            finally:
                self.metrics.barrier_waiting.dec()
        for leading in lead:  # a composite's children bind one after another, each whole
            self._bind_all(leading)
        with self.lock:
            while plan.state is PlanState.BINDING:
                self.lock.wait(1.0)
            # bound, or already forgotten because the cache showed every binding meanwhile
            if plan.state not in (PlanState.BOUND, PlanState.FORGOTTEN) or uid in plan.failed_uids:
                raise BindError(f"phalanx: podgroup {plan.group}: {plan.error or 'binding failed'}")

    def time_out(self, plan: Plan, why: str) -> None:
        """The gang's barrier timed out: its plan is released, counted and said. Lock held."""
        self.metrics.barrier.labels(outcome="timeout").inc()
        self.book.transition(plan, PlanState.RELEASED, Change(replans.BARRIER_TIMEOUT, why))
        self.status.event(plan.group, names.EVENT_BARRIER_TIMEOUT, why, "Warning")

    def _bind_all(self, plan: Plan) -> None:
        """The gang is complete at the barrier: bind everyone. Whatever goes wrong on the way
        finishes the plan as failed: the waiters are answered with the error."""
        try:
            self._bind_gang(plan)
        except Exception as err:  # noqa: BLE001 - a plan must never stay in binding
            log.exception("binding podgroup %s failed", plan.group)
            self._finish(plan, False, f"binding failed: {type(err).__name__}: {err}")

    def _bind_gang(self, plan: Plan) -> None:
        """Write the placement record (synchronously: before any binding), then bind everyone."""
        self.metrics.barrier.labels(outcome="released").inc()
        pending = {uid: node for uid, node in plan.assignments.items() if not self.cache.bound_node(uid)}
        error = self.record(plan)
        if error:
            self._finish(plan, False, error)
            return
        futures = {uid: self._binder.submit(self._bind_uid, uid, node) for uid, node in pending.items()}
        failed = {}
        for uid, future in futures.items():
            try:
                why = future.result()
            except Exception as err:  # noqa: BLE001 - counted as this member's failure
                why = f"binding {self.pod_name(uid)} failed: {type(err).__name__}: {err}"
            if why:
                failed[uid] = why
        if failed:
            plan.failed_uids = set(failed)
            self._finish(plan, False, "; ".join(failed.values()))
        else:
            self._finish(plan, True, "")

    def record(self, plan: Plan) -> str:
        """The placement record written before any member binds (both modes' barrier ends here);
        "" or why it could not be written (whatever the writer raises: the plan then fails, never
        hangs)."""
        try:
            self.write_record(plan)
        except WriteError as err:
            return f"could not write the placement record: {err}"
        except Exception as err:  # noqa: BLE001 - any writer failure fails the plan
            log.exception("writing the placement record of %s failed", plan.group)
            return f"could not write the placement record: {type(err).__name__}: {err}"
        return ""

    def write_record(self, plan: Plan) -> None:
        """The placement record on the plan's PodGroup, synchronously (before any member binds, so
        a restart finishes the gang, never splits it), with ``PodGroupInitiallyScheduled=True`` in
        the same write unless kube-scheduler writes it; raises what the writer raises."""
        text = placement_text(plan.domain, {self.pod_name(uid): n for uid, n in plan.assignments.items()})
        scheduled = None if plan.condition_by_scheduler else scheduled_message(len(plan.assignments), plan.domain)
        # an older queued write on the group (a record's abandonment) lands first, or none is written
        self.status.write_record(plan.group, text, scheduled, RECORD_FLUSH_SECONDS)

    def _bind_uid(self, uid: str, node: str) -> str:
        record = self.cache.pods.get(uid)
        if record is None:
            return f"pod {uid} is gone"
        return self._bind(record.pod.namespace, record.pod.name, uid, node)

    def _finish(self, plan: Plan, ok: bool, error: str) -> None:
        with self.lock:
            if plan.state is not PlanState.BINDING:
                return
            self.book.transition(plan, PlanState.BOUND if ok else PlanState.FAILED,
                                 Change("" if ok else replans.BIND_FAILED, error))

    def close(self) -> None:
        self._binder.shutdown(wait=False, cancel_futures=True)
