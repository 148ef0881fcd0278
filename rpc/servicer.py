"""The phalanx.v1.WorkloadCycle gRPC service over a running :class:`WorkloadCycle`.

Every RPC runs on a gRPC worker thread beside kube-scheduler's HTTP calls; it reads the cycle and
its cache through their own locks and never raises into gRPC: a malformed name is
INVALID_ARGUMENT, a group (or plan) that does not exist is NOT_FOUND, anything unexpected is
logged and answered INTERNAL.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any, Callable, Iterator, Mapping

import grpc

from cluster.convert import GroupOwner, placement_domain
from cluster.whatif import MAX_MANIFEST_BYTES, Compile, manifest_too_large
from cycle import Plan, WhatIfAnswer, WorkloadCycle
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from solver import InvalidInput, Placement

from .events import CycleEvent, EventHub, EventStream, TooManyStreams

log = logging.getLogger("phalanx.grpc")

# Kubernetes names: a namespace is a DNS label, a PodGroup name a DNS subdomain.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

CATEGORIES = {
    "planned": pb.Event.CATEGORY_PLAN,
    "plan_released": pb.Event.CATEGORY_PLAN,
    "bound": pb.Event.CATEGORY_BIND,
    "bind_failed": pb.Event.CATEGORY_BIND,
    "unschedulable": pb.Event.CATEGORY_STATUS,
}


class Refusal(Exception):
    """An RPC answered with a non-OK status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def answered(method: Callable) -> Callable:
    """An RPC method's answer on every path: a :class:`Refusal` becomes its status code, anything
    else INTERNAL (logged); a request never takes the server down."""
    @functools.wraps(method)
    def rpc(self: "WorkloadCycleServicer", request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Refusal as err:
            context.abort(err.code, err.message)
        except Exception as err:  # noqa: BLE001 - a request must never take the server down
            log.exception("%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"phalanx: {method.__name__} failed: {err}")
    return rpc


def checked_namespace(namespace: str) -> str:
    if not _DNS_LABEL.fullmatch(namespace):
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"namespace must be a DNS label, got {namespace!r}")
    return namespace


def group_key(namespace: str, name: str) -> str:
    """``namespace/name`` of a well-formed group name; Refusal(INVALID_ARGUMENT) otherwise."""
    checked_namespace(namespace)
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"name must be a DNS subdomain, got {name!r}")
    return f"{namespace}/{name}"


def objective_message(placement: Placement) -> pb.Objective | None:
    o = placement.objective
    if o is None:
        return None
    return pb.Objective(unplaced=o.unplaced, spread=list(o.spread), nodes=o.nodes, stranded=o.stranded,
                        domain_free=o.domain_free, preference=o.preference)


def whatif_message(answer: WhatIfAnswer) -> pb.WhatIfGroup:
    namespace, name = answer.group.split("/", 1)
    message = pb.WhatIfGroup(
        namespace=namespace, name=name, source=answer.source, verdict=answer.verdict, members=answer.members,
        min_count=answer.min_count, policy=answer.policy, topology_key=answer.topology_key, domain=answer.domain,
        nodes=dict(answer.nodes), path=answer.path, optimal=answer.optimal,
        victims=[pb.WhatIfVictim(pod=v.pod, priority=v.priority, unit=v.unit) for v in answer.victims],
        pdb_violations=answer.pdb_violations, explanation=answer.explanation, order=answer.order,
        advice=answer.advice,
        waiting=list(answer.waiting), waiting_why=answer.waiting_why, running=answer.running,
        composite=answer.composite)
    if answer.gap is not None:
        message.gap = answer.gap
    return message


class WorkloadCycleServicer(pb_grpc.WorkloadCycleServicer):
    def __init__(self, cycle: WorkloadCycle, hub: EventHub, compile_manifest: Compile | None = None) -> None:
        """``compile_manifest``: how a what-if manifest becomes PodGroups (the controller's compiler,
        handed in by the command that composes serve: the servicers never import the controller);
        None answers WhatIf UNIMPLEMENTED."""
        self.cycle = cycle
        self.cache = cycle.cache
        self.hub = hub
        self.compile_manifest = compile_manifest

    # -- RPCs ----------------------------------------------------------------------------------
    @answered
    def PlaceGroup(self, request: pb.PlaceGroupRequest, context: grpc.ServicerContext) -> pb.PlaceGroupReply:
        key = self._existing(request.namespace, request.name)
        answer = self.cycle.place_group(key)
        if isinstance(answer, str):
            return pb.PlaceGroupReply(placed=False, explanation=answer)
        return pb.PlaceGroupReply(placed=True, placement=self._placement(answer.assignments, answer.domain, answer))

    @answered
    def GetPlan(self, request: pb.GetPlanRequest, context: grpc.ServicerContext) -> pb.Plan:
        key = self._existing(request.namespace, request.name)
        plan = self.cycle.plan_of(key)
        if plan is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND,
                          f"podgroup {key} holds no plan (state: {self.cycle.group_state(key)})")
        return self._plan(request.namespace, request.name, plan)

    @answered
    def ExplainGroup(self, request: pb.ExplainGroupRequest, context: grpc.ServicerContext) -> pb.ExplainGroupReply:
        key = group_key(request.namespace, request.name)
        members = self.cache.members(key)
        if key not in self.cache.podgroups and not members:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"podgroup {key} does not exist and no pod names it")
        summary = self._summary(key, members)
        record = self.cache.podgroups.get(key)
        owner = record.owner if record is not None else GroupOwner("", "")
        return pb.ExplainGroupReply(namespace=request.namespace, name=request.name, state=summary.state,
                                    explanation=summary.explanation, members_existing=summary.members_existing,
                                    members_bound=summary.members_bound, min_count=summary.min_count,
                                    members_finished=summary.members_finished,
                                    owner_kind=owner.kind, owner_name=owner.name, owner_level=owner.level,
                                    smallest_change=self.cycle.smallest.texts.get(key, ""),
                                    **self._composite(key))

    def _composite(self, key: str) -> dict:
        of = self.cycle.composite_of(key)
        if of is None:
            return {}
        return {"composite": of.root, "composite_groups": list(of.groups), "composite_how": of.how,
                "composite_why": of.why}

    @answered
    def ListGroups(self, request: pb.ListGroupsRequest, context: grpc.ServicerContext) -> pb.ListGroupsReply:
        if request.namespace:
            checked_namespace(request.namespace)
        keys = sorted(key for key, record in dict(self.cache.podgroups).items()
                      if not request.namespace or record.namespace == request.namespace)
        return pb.ListGroupsReply(groups=[self._summary(key, self.cache.members(key)) for key in keys])

    @answered
    def WatchEvents(self, request: pb.WatchEventsRequest, context: grpc.ServicerContext) -> Iterator[pb.Event]:
        if request.name and not request.namespace:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "name needs namespace")
        if request.name:
            key = group_key(request.namespace, request.name)
            def accept(e: CycleEvent) -> bool:
                return e.group == key
        else:
            prefix = f"{checked_namespace(request.namespace)}/" if request.namespace else ""
            def accept(e):
                return e.group.startswith(prefix)
        try:
            stream = self.hub.open(accept)
        except TooManyStreams as err:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err)) from None
        context.add_callback(stream.close)  # the client went away (or the server stops)
        context.send_initial_metadata(())  # tells the client the stream is subscribed
        return self._events(stream, context)

    @answered
    def WhatIf(self, request: pb.WhatIfRequest, context: grpc.ServicerContext) -> pb.WhatIfReply:
        if self.compile_manifest is None:
            raise Refusal(grpc.StatusCode.UNIMPLEMENTED, "phalanx: this serve was started without what-if")
        if request.namespace:
            checked_namespace(request.namespace)
        size = sum(len(text) for text in request.objects_json)
        if size > MAX_MANIFEST_BYTES:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, manifest_too_large(size))
        objects = []
        for i, text in enumerate(request.objects_json):
            try:
                objects.append(json.loads(text))
            except ValueError as err:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"objects_json[{i}]: not JSON: {err}") from None
        if not objects:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "objects_json: Required value: no object to plan")
        drafts = self.compile_manifest(objects, request.namespace or "default")
        if drafts.errors:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "\n".join(e.describe() for e in drafts.errors))
        try:
            answers = self.cycle.what_if(drafts.groups, drafts.composites)
        except InvalidInput as err:  # a group the solver cannot take as drafted: the manifest's fault
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
        return pb.WhatIfReply(groups=[whatif_message(a) for a in answers])

    # -- answers -------------------------------------------------------------------------------
    def _existing(self, namespace: str, name: str) -> str:
        key = group_key(namespace, name)
        if key not in self.cache.podgroups:
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"podgroup {key} does not exist")
        return key

    def _pod_name(self, uid: str) -> str:
        record = self.cache.pods.get(uid)
        return record.pod.name if record else uid

    def _placement(self, assignments: Mapping[str, str], domain: str, solved: Placement | None) -> pb.Placement:
        message = pb.Placement(assignments={self._pod_name(uid): node for uid, node in assignments.items()},
                               domain=domain)
        if solved is not None:
            message.path, message.optimal = solved.path, solved.optimal
            if solved.gap is not None:
                message.gap = solved.gap
            objective = objective_message(solved)
            if objective is not None:
                message.objective.CopyFrom(objective)
        return message

    def _plan(self, namespace: str, name: str, plan: Plan) -> pb.Plan:
        return pb.Plan(namespace=namespace, name=name, state=plan.state,
                       placement=self._placement(plan.assignments, plan.domain, plan.placement),
                       members_at_barrier=len(plan.arrived),
                       expires_in_seconds=max(0.0, plan.deadline - self.cycle.clock()))

    def _summary(self, key: str, members: list) -> pb.GroupSummary:
        namespace, name = key.split("/", 1)
        summary = pb.GroupSummary(namespace=namespace, name=name, state=self.cycle.group_state(key),
                                  members_existing=len(members),
                                  members_bound=sum(1 for m in members if m.pod.node),
                                  members_finished=len(self.cache.finished_members(key)),
                                  explanation=self.cycle.explanations.get(key, ""))
        try:
            group = self.cache.podgroup(key, members)
        except InvalidInput as err:
            summary.explanation = summary.explanation or f"phalanx: {err}"
            return summary
        if group is not None:
            summary.policy, summary.min_count, summary.topology_key = (group.policy.value, group.min_count,
                                                                       group.topology_key)
        summary.domain = self._domain(key)
        return summary

    def _domain(self, key: str) -> str:
        """The held plan's domain, else the one in the placement record on the PodGroup."""
        plan = self.cycle.plan_of(key)
        if plan is not None:
            return plan.domain
        record = self.cache.podgroups.get(key)
        return placement_domain(record.placement) if record else ""

    def _events(self, stream: EventStream, context: grpc.ServicerContext) -> Iterator[pb.Event]:
        try:
            while not stream.closed and context.is_active():
                event = stream.next(timeout=1.0)
                if event is not None:
                    yield self._event(event, stream.dropped)
        finally:
            self.hub.detach(stream)

    def _event(self, event: CycleEvent, dropped: int) -> pb.Event:
        data = dict(event.data)
        if isinstance(data.get("assignments"), Mapping):
            data["assignments"] = {self._pod_name(uid): node for uid, node in data["assignments"].items()}
        category = CATEGORIES.get(event.kind) or (
            pb.Event.CATEGORY_PREEMPT if "preempt" in event.kind or "evict" in event.kind else pb.Event.CATEGORY_STATUS)
        message = pb.Event(group=event.group, category=category, kind=event.kind,
                           payload_json=json.dumps(data, sort_keys=True, default=str), dropped=dropped)
        message.time.FromNanoseconds(event.time_ns)
        return message
