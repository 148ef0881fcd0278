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

The cycle's side of each is a public method of :class:`WorkloadCycle` (``plan_for_member``,
``report_rejection``, ``reserve``, ``unreserve``, ``permit``, ``reservations_snapshot``), built on
the helpers its filter and bind use (the member's answer, re-slotting, the state machine's one
door, the placement record). This adapter keeps what only the plugin needs: converting the pod,
the answers' shape, the plan ids and change counter of the stream, the groups waiting for
members. Every call takes the cycle's lock briefly; the solve of a workload cycle runs off it as
always.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from cluster.cache import PodRecord
from solver import Policy

from .service import PermitAnswer, Plan, WorkloadCycle, convert_pod

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
        self._ids_lock = threading.RLock()  # PlanForPod replies and snapshots name plans at once
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
        with self._ids_lock:
            held = self._ids.get(plan.group)
            if held is not None and held[0] is plan:
                return held[1]
            self._ids[plan.group] = (plan, self._next_id)
            self._next_id += 1
            return self._next_id - 1

    # -- PreFilter -----------------------------------------------------------------------------
    def plan_for_pod(self, pod_json: Mapping[str, Any]) -> PlanAnswer:
        converted = convert_pod(pod_json)
        if isinstance(converted, str):
            return PlanAnswer("wait", reason=converted)
        pod, group = converted
        if not group:
            return PlanAnswer("not_a_member")
        key = f"{pod.namespace}/{group}"
        answer, plan = self.cycle.plan_for_member(pod, key)
        if answer.nodes:
            return PlanAnswer("planned", node=answer.nodes[0], plan=plan)
        reason = next(iter(answer.unresolvable.values()), "") or self.cycle.explanations.get(key, "") or (
            f"podgroup {key}: no placement")
        return PlanAnswer("wait", reason=reason, members_missing="waiting for members" in reason)

    # -- PostFilter ----------------------------------------------------------------------------
    def report_rejection(self, pod_json: Mapping[str, Any], node: str, plugin: str, reason: str) -> tuple[str, str]:
        """kube-scheduler's filters rejected ``node`` for the pod: learn it, then re-slot the member
        (another identical member's node of the same plan) or release the plan. Returns
        (outcome, node): ("reslotted", new node), ("released", "") or ("none", "")."""
        converted = convert_pod(pod_json)
        if isinstance(converted, str) or not converted[1]:
            return "none", ""
        pod, group = converted
        outcome, moved = self.cycle.report_rejection(pod, f"{pod.namespace}/{group}", node, plugin, reason)
        if outcome == "reslotted":
            self.changed()
        return outcome, moved

    # -- Reserve / Unreserve -------------------------------------------------------------------
    def reserve(self, uid: str, group: str, node: str) -> tuple[bool, str]:
        ok, reason = self.cycle.reserve(uid, group, node)
        if ok:
            self.changed()
        return ok, reason

    def unreserve(self, uid: str, group: str, reason: str) -> list[str]:
        """Returns the members the plugin should reject too (a gang never binds partially)."""
        outcome, others = self.cycle.unreserve(uid, group, reason)
        if outcome == "unreserved":
            self.changed()  # a release notifies through the cycle's listeners
        return others

    # -- Permit --------------------------------------------------------------------------------
    def permit(self, uid: str, group: str, reserved: tuple[str, ...] = (), node: str = "") -> PermitAnswer:
        """``reserved``: members the plugin reserved itself (each as if it had called reserve:
        the stream then stops counting their capacity as held)."""
        answer = self.cycle.permit(uid, group, reserved, node)
        if reserved:
            self.changed()
        return answer

    # -- the reservations stream ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        version = self._version
        plans, nodes = self.cycle.reservations_snapshot()
        with self._ids_lock:
            ids = {p.group: self.plan_id(p) for p in plans}
            live = {p.group for p in plans}
            for group in [g for g in self._ids if g not in live]:
                del self._ids[group]
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
