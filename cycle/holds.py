"""The queue policies of :mod:`.queue` applied in the live workload cycle.

Each cycle's snapshot goes through :meth:`QueuePolicies.restrict`: the waiting groups are the
queue's failed attempts (waiting since their first failure), the running groups are the PodGroups
with bound members (their usage per node, and when they bound — seen by this process — plus their
declared ``scheduling.phalanx.dev/expected-duration``). Holds are recomputed at most every
:data:`REFRESH` seconds (injected clock), from the whole cluster, only when some failed group has
waited past its threshold (else nothing is converted), and shown on the dashboard. A restarted process knows no
bind times: running groups then have no expected end and nothing backfills through them until
they bind again — conservative, never a guess.

Preemption asks :meth:`QueuePolicies.victim_contexts` for the contexts to try: victim groups
offered cheapest lost work first (pod-seconds since they bound; no checkpoint interval is known to
phalanx), in growing prefixes.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from cluster.cache import ClusterCache
from solver import PodGroup, PreemptionContext, Snapshot

from .queue import (
    Hold,
    PodGroupQueue,
    QueuePolicy,
    Running,
    Waiting,
    plan_holds,
    preemptor_work,
    restrict,
    victim_budget,
    victim_prefixes,
)
from .status import StatusWriter

REFRESH = 5.0


class QueuePolicies:
    def __init__(self, cache: ClusterCache, clock: Callable[[], float], queue: PodGroupQueue, status: StatusWriter,
                 policy: QueuePolicy) -> None:
        self.cache = cache
        self.clock = clock
        self.queue = queue
        self.policy = policy
        self.holds: list[Hold] = []
        self.bound_at: dict[str, float] = {}  # group -> when this process saw it bind
        self._refreshed = -np.inf
        self._lock = threading.Lock()
        status.subscribe(self._on_event)

    def _on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        if kind == "bound" and data.get("group"):
            self.bound_at[str(data["group"])] = self.clock()

    def prune(self, keys: set[str]) -> None:
        """Forget groups that no longer exist."""
        for key in list(self.bound_at):
            if key not in keys:
                self.bound_at.pop(key, None)  # (the requeue pass and a holds refresh both prune)

    def held_domain(self, key: str) -> str:
        """``key=value`` of the domain ``key`` holds, or ""."""
        for h in self.holds:
            if h.holder == key:
                return f"{h.key}={h.domain}" if h.key else "(cluster)"
        return ""

    def _hint(self, key: str) -> float | None:
        record = self.cache.podgroups.get(key)
        return record.spec.expected_duration if record is not None else None

    def _due(self, now: float) -> bool:
        """Whether any failed group has waited long enough to hold (cheap: no conversion)."""
        policy = self.policy
        for key, attempt in self.queue.failed.items():
            hint = self._hint(key)
            limit = (policy.starvation_factor * hint if policy.starvation_factor is not None else None) \
                if hint is not None else policy.starvation_after
            if limit is not None and now - attempt.since >= limit:
                return True
        return False

    def _waiting(self) -> list[Waiting]:
        cache = self.cache
        waiting = []
        for key, attempt in self.queue.failed.items():
            try:
                group = cache.podgroup(key)
            except Exception:  # noqa: BLE001 - a group that does not convert holds nothing
                continue
            if group is not None and group.pending:
                waiting.append(Waiting(group, attempt.since, self._hint(key)))
        waiting.sort(key=lambda w: (-w.group.priority, w.since, w.group.key))
        return waiting

    def _running(self, snapshot: Snapshot) -> list[Running]:
        cache = self.cache
        running = []
        for key in {r.pod.group for r in cache.pods.values() if r.pod.node and r.pod.group and r.active}:
            usage: dict[int, np.ndarray] = {}
            for record in cache.members(key):
                i = snapshot.index.get(record.pod.node or "")
                if i is not None:
                    usage[i] = usage.get(i, 0) + snapshot.request_vector(record.pod.spec.requests)[0]
            hint, since = self._hint(key), self.bound_at.get(key)
            group_record = cache.podgroups.get(key)
            priority = (group_record.spec.priority or 0) if group_record is not None else 0
            running.append(Running(key, usage, since + hint if hint is not None and since is not None else None,
                                   priority))
        return running

    def _refresh(self, snapshot: Snapshot, now: float) -> None:
        """Recompute the holds, at most every REFRESH seconds, and only when a group is due."""
        if now - self._refreshed < REFRESH:
            return
        self._refreshed = now
        self.prune(set(self.cache.podgroups))
        if not self._due(now):
            self.holds = []
            return
        self.holds = plan_holds(snapshot, self._waiting(), self._running(snapshot), now, self.policy)

    def restrict(self, group: PodGroup, snapshot: Snapshot) -> tuple[Snapshot, str]:
        """The snapshot ``group``'s cycle solves on, and a note of what the policies did."""
        policy = self.policy
        holding = policy.starvation_after is not None or policy.starvation_factor is not None
        if not holding and not policy.fragmentation_aware:
            return snapshot, ""
        now = self.clock()
        with self._lock:
            if holding:
                self._refresh(snapshot, now)
            holds = list(self.holds)
            queue = [w.group for w in self._waiting() if w.group.key != group.key] \
                if policy.fragmentation_aware else []
        if not holds and not queue:
            return snapshot, ""
        return restrict(snapshot, group, self._hint(group.key), now, holds, queue, policy)

    def victim_contexts(self, group: PodGroup, context: PreemptionContext) -> Iterator[PreemptionContext]:
        """``context`` with only the cheapest victim groups preemptible, in growing prefixes (all
        at once when lost-work preemption is off)."""
        if not self.policy.lost_work_preemption or len(context.victims) == 0:
            yield context
            return
        now = self.clock()
        pods: dict[str, int] = {}
        priorities: dict[str, int] = {}
        for info in context.victims.values():
            if info.priority < group.priority and info.group:
                pods[info.group] = pods.get(info.group, 0) + 1
                priorities[info.group] = max(priorities.get(info.group, info.priority), info.priority)
        costs = {key: n * (now - self.bound_at.get(key, now - 1e9)) for key, n in pods.items()}
        if not costs:
            yield context
            return
        budget = victim_budget(self.policy, preemptor_work(len(group.pending), self._hint(group.key)))
        for prefix in victim_prefixes(costs, budget, priorities):
            offered = set(prefix)
            yield replace(context, victims={
                uid: info if not info.group or info.group in offered or info.priority >= group.priority
                else replace(info, priority=group.priority) for uid, info in context.victims.items()})
