"""Group preemption, actuated: evict a minimal victim set for a PodGroup that does not fit, hold
the freed room for it, and keep ``disruptionMode: all`` groups whole when anyone disrupts them.

Life cycle of a nomination (one per preemptor group)::

    cycle infeasible --plan_preemption helps--> evictions sent, Nomination(victims, placement)
    Nomination --every victim gone--> dropped; the group's next cycle plans on the freed room
    Nomination --deadline / group gone or placed--> dropped (its reservation released)

While a nomination stands, its planned placement is reserved (nobody else takes the freed room)
and no new preemption starts for that group. Victims are evicted through ``policy/v1`` Eviction
when the plan respects every PodDisruptionBudget; when the plan had to accept a violation they are
deleted instead — both with the ``DisruptionTarget`` / ``PreemptionByScheduler`` condition.

A broken ``all`` unit — a member carrying ``DisruptionTarget`` (evicted or preempted by anyone,
kube-scheduler included) — loses its remaining members too, so its capacity really returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from cluster.backend import WriteError
from cluster.cache import PodRecord
from solver import DisruptionMode, InvalidInput, PodGroup, PreemptionPlan, plan_preemption
from solver.model import PreemptionPolicy, placement_usage

if TYPE_CHECKING:
    from .service import WorkloadCycle

log = logging.getLogger("phalanx.preemption")


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


class GroupPreemption:
    def __init__(self, cycle: "WorkloadCycle", grace: float = 120.0) -> None:
        self.cycle = cycle
        self.grace = grace
        self.nominations: dict[str, Nomination] = {}
        self._broken: queue.Queue[str] = queue.Queue()
        self._worker = threading.Thread(target=self._evict_broken_units, name="phalanx-broken-units", daemon=True)
        self._worker.start()
        cycle.cache.subscribe(self._on_cache_event)

    # -- nominations (called under the cycle's lock) -------------------------------------------
    def waiting(self, key: str) -> str:
        """Why the group must wait for its victims, or "" when it may be planned."""
        nomination = self.nominations.get(key)
        if nomination is None:
            return ""
        cache = self.cycle.cache
        nomination.victims = {u for u in nomination.victims if u in cache.pods and cache.pods[u].active}
        if not nomination.victims or nomination.deadline < self.cycle.clock():
            del self.nominations[key]
            return ""
        return (f"podgroup {key}: waiting for {len(nomination.victims)} preempted pods to terminate "
                f"({', '.join(nomination.evicted_units[:3])}{'...' if len(nomination.evicted_units) > 3 else ''})")

    def reservations(self, exclude_group: str = "") -> list[dict[str, dict[str, int]]]:
        return [n.reservations() for k, n in self.nominations.items() if k != exclude_group]

    def release(self, key: str) -> None:
        self.nominations.pop(key, None)

    def try_preempt(self, group: PodGroup) -> str:
        """Plan and start a preemption for ``group``, which does not fit. Returns a message for
        operators ("" when preemption cannot help)."""
        metrics = self.cycle.metrics
        if group.preemption_policy is PreemptionPolicy.NEVER:
            return ""
        cache = self.cycle.cache
        snapshot = cache.snapshot(self.cycle.reservations(exclude_group=group.key), with_bound=True)
        try:
            plan = plan_preemption(snapshot, group, cache.preemption_context())
        except InvalidInput as err:
            metrics.preemption_attempts.labels(result="error").inc()
            log.warning("preemption planning for %s failed: %s", group.key, err)
            return ""
        if not plan.helps or not plan.victims:
            metrics.preemption_attempts.labels(result="unschedulable").inc()
            return ""
        metrics.preemption_attempts.labels(result="scheduled").inc()
        metrics.preemption_victims.observe(len(plan.victims))
        by_uid = {p.uid: p for p in group.pending}
        nomination = Nomination(
            group=group.key, victims=set(plan.victims), placement=dict(plan.placement),
            requests={uid: by_uid[uid].spec.requests for uid in plan.placement if uid in by_uid},
            deadline=self.cycle.clock() + self.grace, plan=plan,
            evicted_units=[u.describe() for u in plan.units],
        )
        self.nominations[group.key] = nomination
        note = (f"preempting {len(plan.victims)} pods in {len(plan.units)} units "
                f"({', '.join(nomination.evicted_units[:5])}) to place {len(plan.placement)} pods"
                f"{' in ' + plan.domain if plan.domain else ''}; PDB violations: {plan.pdb_violations}")
        self.cycle._event(group, "Preempting", note)
        self.cycle._emit("preempting", group=group.key, victims=list(plan.victims), units=nomination.evicted_units)
        respect_pdb = plan.pdb_violations == 0
        threading.Thread(target=self._evict, args=(group.key, list(plan.victims), respect_pdb),
                         name="phalanx-preempt", daemon=True).start()
        return note

    def _evict(self, preemptor: str, uids: list[str], respect_pdb: bool) -> None:
        for uid in uids:
            record = self.cycle.cache.pods.get(uid)
            if record is None:
                continue
            pod = record.pod
            message = f"preempted by podgroup {preemptor}"
            try:
                self.cycle.writer.evict(pod.namespace, pod.name, uid, message, respect_pdb)
            except WriteError as err:
                log.warning("evicting %s for %s failed: %s", pod.key, preemptor, err)
                continue
            self._victim_event(record, "Preempted", message)

    def _victim_event(self, record: PodRecord, reason: str, note: str) -> None:
        pod = record.pod
        try:
            self.cycle.writer.event({"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
                                    reason, note, "Normal")
        except WriteError:
            pass

    # -- broken `all` units --------------------------------------------------------------------
    def _on_cache_event(self, kind: str, event_type: str, record: Any) -> None:
        if kind == "Pod" and isinstance(record, PodRecord) and record.disrupted and record.pod.group:
            self._broken.put(record.pod.group)

    def _evict_broken_units(self) -> None:
        while True:
            key = self._broken.get()
            try:
                self._break_unit(key)
            except Exception:  # noqa: BLE001 - keep the worker alive
                log.exception("evicting the rest of broken unit %s failed", key)

    def _break_unit(self, key: str) -> None:
        cache = self.cycle.cache
        group = cache.podgroups.get(key)
        if group is None or group.spec.disruption_mode is not DisruptionMode.ALL:
            return
        rest = [r for r in cache.members(key) if r.pod.node and not r.disrupted]
        if not rest:
            return
        message = f"podgroup {key} has disruptionMode all and lost a member: the unit goes as a whole"
        log.info("%s; evicting %d members", message, len(rest))
        self.cycle._event_key(key, "UnitBroken", message, "Warning")
        for record in rest:
            try:
                self.cycle.writer.evict(record.pod.namespace, record.pod.name, record.pod.uid, message, False)
            except WriteError as err:
                log.warning("evicting %s of broken unit %s failed: %s", record.pod.key, key, err)
