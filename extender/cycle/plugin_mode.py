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
  nominations, and the gang groups still waiting for members.

Every call takes the cycle's lock briefly; the solve of a workload cycle runs off it as always.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from cluster import names
from cluster.backend import WriteError
from cluster.cache import PodRecord
from cluster.convert import placement_annotation
from solver import Policy
from solver.model import add_resources, placement_usage

from . import replans
from .service import HOLDING, Plan, PlanState, WorkloadCycle, _convert

#: how often the reservations stream may send (changes inside the window are coalesced); members
#: never wait for it (a plan reaches the plugin in the PlanForPod reply), plain pods and PreEnqueue do
COALESCE_SECONDS = 0.05


@dataclass(frozen=True)
class PlanAnswer:
    verdict: str  # planned | wait | not_a_member
    node: str = ""
    reason: str = ""
    plan: Plan | None = None
    members_missing: bool = False


@dataclass(frozen=True)
class PermitAnswer:
    decision: str  # allow | wait | reject
    reason: str = ""
    allow: tuple[str, ...] = ()
    wait_seconds: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    version: int
    plans: tuple[Plan, ...]
    nodes: Mapping[str, Mapping[str, int]]
    waiting_groups: tuple[str, ...]
    plan_ids: Mapping[str, int] = field(default_factory=dict)  # group -> id of its plan


class PluginEnforcement:
    """The plugin's contract over one running :class:`WorkloadCycle`."""

    def __init__(self, cycle: WorkloadCycle) -> None:
        self.cycle = cycle
        self.cache = cycle.cache
        self._ids: dict[str, tuple[Plan, int]] = {}  # group -> (plan object, its id)
        self._next_id = 1
        self._changed = threading.Condition(threading.Lock())
        self._version = 0
        cycle.subscribe(lambda kind, data: self.changed())
        self.cache.subscribe(self._on_cache_change)

    # -- change notification for the stream --------------------------------------------------
    def changed(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def _on_cache_change(self, kind: str, event_type: str, record: Any) -> None:
        # members arriving, binding or going, groups appearing; a plain pod changes nothing the
        # stream carries (a deleted pod is only a uid: it may have been a member)
        if kind == "PodGroup" or (kind == "Pod" and (not isinstance(record, PodRecord) or record.pod.group)):
            self.changed()

    def wait_change(self, seen: int, timeout: float) -> int:
        """Block until the change counter passes ``seen`` (or ``timeout``); returns it."""
        with self._changed:
            if self._version == seen:
                self._changed.wait(timeout)
            return self._version

    def plan_id(self, plan: Plan) -> int:
        """A number naming this plan object (a re-plan of the group gets a new one)."""
        held = self._ids.get(plan.group)
        if held is not None and held[0] is plan:
            return held[1]
        self._ids[plan.group] = (plan, self._next_id)
        self._next_id += 1
        return self._next_id - 1

    # -- PreFilter -----------------------------------------------------------------------------
    def plan_for_pod(self, pod_json: Mapping[str, Any]) -> PlanAnswer:
        converted = _convert(pod_json)
        if isinstance(converted, str):
            return PlanAnswer("wait", reason=converted)
        pod, group = converted
        if not group:
            return PlanAnswer("not_a_member")
        key = f"{pod.namespace}/{group}"
        cycle = self.cycle
        with cycle._lock:
            cycle._expire()
            answer = cycle._filter_member(pod, key, frozenset(self.cache.nodes.keys()))
            if answer.nodes:
                return PlanAnswer("planned", node=answer.nodes[0], plan=cycle.plans.get(key))
        reason = next(iter(answer.unresolvable.values()), "") or cycle.explanations.get(key, "") or (
            f"podgroup {key}: no placement")
        return PlanAnswer("wait", reason=reason, members_missing="waiting for members" in reason)

    # -- PostFilter ----------------------------------------------------------------------------
    def report_rejection(self, pod_json: Mapping[str, Any], node: str, plugin: str, reason: str) -> tuple[str, str]:
        """kube-scheduler's filters rejected ``node`` for the pod: learn it, then re-slot the member
        (another identical member's node of the same plan) or release the plan. Returns
        (outcome, node): ("reslotted", new node), ("released", "") or ("none", "")."""
        converted = _convert(pod_json)
        if isinstance(converted, str) or not converted[1]:
            return "none", ""
        pod, group = converted
        key = f"{pod.namespace}/{group}"
        cycle = self.cycle
        known = cycle.verdicts.get(pod.uid)
        excluded = (known.excluded if known else frozenset()) | {node}
        cycle.verdicts.learn(pod, frozenset(excluded))
        with cycle._lock:
            plan = cycle.plans.get(key)
            if plan is None or plan.assignments.get(pod.uid) != node or plan.state is not PlanState.PLANNED:
                return "none", ""
            candidates = frozenset(self.cache.nodes.keys() - excluded)
            moved = cycle._reslot(plan, pod, candidates)
            if moved:
                plan.answered.add(pod.uid)
                self.changed()
                return "reslotted", moved
            by = f" by {plugin}" if plugin else ""
            cycle._release(key, replans.FILTERED_OUT,
                           f"stale: planned node {node} was rejected{by} for {pod.key}: {reason}", pod.name, node)
        return "released", ""

    # -- Reserve / Unreserve -------------------------------------------------------------------
    def reserve(self, uid: str, group: str, node: str) -> tuple[bool, str]:
        cycle = self.cycle
        with cycle._lock:
            plan = cycle.plans.get(group)
            if plan is None or uid not in plan.assignments:
                return False, f"phalanx: podgroup {group} holds no plan for pod {uid}; re-planning"
            if plan.assignments[uid] != node:
                return False, f"phalanx: pod {uid} is planned on {plan.assignments[uid]}, not {node}"
            plan.arrived.add(uid)
            # no expiry while members wait at Permit (they are rejected at the barrier timeout)
            plan.deadline = max(plan.deadline, cycle.clock() + cycle.barrier_timeout + 5.0)
            # no generation bump: what a solve of another group sees (the plan's capacity for its
            # members not bound) does not change when one arrives, so solves in flight stay valid
        self.changed()
        return True, ""

    def unreserve(self, uid: str, group: str, reason: str) -> list[str]:
        """Returns the members the plugin should reject too (a gang never binds partially)."""
        cycle = self.cycle
        with cycle._lock:
            plan = cycle.plans.get(group)
            if plan is None or uid not in plan.assignments:
                return []
            plan.arrived.discard(uid)  # the plan's capacity is unchanged (see reserve)
            if not plan.gang or plan.state is not PlanState.PLANNED or reason != "rejected":
                self.changed()
                return []
            others = sorted(u for u in plan.arrived if u != uid)
            why = (f"barrier timed out: {len(plan.arrived)} of {len(plan.assignments)} members reserved "
                   f"when {cycle._pod_name(uid)} was rejected at Permit")
            cycle.metrics.barrier.labels(outcome="timeout").inc()
            cycle._transition(plan, PlanState.RELEASED, replans.BARRIER_TIMEOUT, why)
            cycle._event_key(group, names.EVENT_BARRIER_TIMEOUT, why, "Warning")
        return others

    # -- Permit --------------------------------------------------------------------------------
    def permit(self, uid: str, group: str, reserved: tuple[str, ...] = ()) -> PermitAnswer:
        """``reserved``: members the plugin reserved itself (each as if it had called reserve)."""
        cycle = self.cycle
        with cycle._lock:
            plan = cycle.plans.get(group)
            if plan is None or uid not in plan.assignments:
                return PermitAnswer("reject", f"phalanx: podgroup {group} holds no plan for pod {uid}; re-planning")
            if reserved and plan.state is PlanState.PLANNED:
                plan.arrived.update(u for u in reserved if u in plan.assignments)
            if not plan.gang:
                if plan.state is PlanState.PLANNED:
                    cycle._transition(plan, PlanState.BINDING)
                plan.bound.add(uid)
                if all(u in plan.bound or cycle._bound_node(u) for u in plan.assignments):
                    cycle._transition(plan, PlanState.BOUND)
                return PermitAnswer("allow", allow=(uid,))
            if plan.state is PlanState.BOUND:
                return PermitAnswer("allow", allow=(uid,))
            if plan.state is PlanState.BINDING:  # the completing member's call is writing the record
                return PermitAnswer("wait", f"phalanx: podgroup {group}: writing the placement record",
                                    wait_seconds=cycle.barrier_timeout)
            if not cycle._complete(plan):
                have = sum(1 for u in plan.assignments if u in plan.arrived or cycle._bound_node(u))
                return PermitAnswer("wait", f"phalanx: podgroup {group}: {have} of {len(plan.assignments)} "
                                    "members reserved", wait_seconds=cycle.barrier_timeout)
            cycle.metrics.barrier.labels(outcome="released").inc()
            cycle._transition(plan, PlanState.BINDING)
        error = self._write_record(plan)
        with cycle._lock:
            if error:
                cycle._transition(plan, PlanState.FAILED, replans.BIND_FAILED, error)
                return PermitAnswer("reject", f"phalanx: podgroup {group}: {error}")
            allow = tuple(sorted(plan.arrived))
            cycle._transition(plan, PlanState.BOUND)  # kube-scheduler binds; held until the cache shows it
        return PermitAnswer("allow", allow=allow)

    def _write_record(self, plan: Plan) -> str:
        """The placement record on the PodGroup, before any member binds ("" or the error)."""
        cycle = self.cycle
        ns, name = plan.group.split("/", 1)
        cycle.dispatcher.flush(f"PodGroup/{plan.group}", timeout=5.0)  # an older record removal lands first
        try:
            cycle.writer.annotate_podgroup(ns, name, {names.ANNOTATION_PLACEMENT: placement_annotation(
                plan.domain, {cycle._pod_name(uid): n for uid, n in plan.assignments.items()})})
        except WriteError as err:
            return f"could not write the placement record: {err}"
        except Exception as err:  # noqa: BLE001 - any writer failure fails the plan, never hangs it
            return f"could not write the placement record: {type(err).__name__}: {err}"
        return ""

    # -- the reservations stream ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        cycle = self.cycle
        version = self._version
        with cycle._lock:
            cycle._expire()
            plans = tuple(p for p in cycle.plans.values() if p.state in HOLDING)
            held = [placement_usage({u: n for u, n in p.assignments.items()
                                     if u not in p.arrived and not cycle._bound_node(u)}, p.requests)
                    for p in plans if p.state is PlanState.PLANNED or not p.gang]
            held += cycle.preemption.reservations()
            ids = {p.group: self.plan_id(p) for p in plans}
            for group in [g for g in self._ids if g not in cycle.plans]:
                del self._ids[group]
        nodes: dict[str, dict[str, int]] = {}
        for usage in held:
            for node, amounts in usage.items():
                nodes[node] = add_resources(nodes.get(node, {}), amounts)
        return Snapshot(version, plans, nodes, tuple(self._waiting_groups()), ids)

    def _waiting_groups(self) -> Iterator[str]:
        by_group, pods = self.cache.pods_by_group, self.cache.pods
        for key, record in list(self.cache.podgroups.items()):
            spec = record.spec
            if spec.policy is not Policy.GANG or spec.min_count <= 1:
                continue
            uids = list(by_group.get(key, ()))  # a copy: the cache's thread may add members meanwhile
            live = sum(1 for r in map(pods.get, uids) if r is not None and r.active and not r.terminating)
            if uids and live < spec.min_count:
                yield key
