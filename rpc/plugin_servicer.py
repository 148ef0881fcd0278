"""The phalanx.v1.SchedulerPlugin gRPC service: the contract of phalanx's kube-scheduler framework
plugin (plugin/), over :class:`cycle.plugin_mode.PluginEnforcement`.

Errors are gRPC status codes like the WorkloadCycle service's: FAILED_PRECONDITION for a contract
version this service does not speak, INVALID_ARGUMENT for a pod that is not JSON, INTERNAL
(logged) for anything unexpected. A pod phalanx cannot read is no error: it is answered WAIT with
the reason, as the extender answers it.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterator

import grpc

from cluster.convert import read_pod
from cycle.plans import Plan
from cycle.plugin_mode import COALESCE_SECONDS, PlanAnswer, PluginEnforcement, Snapshot
from proto.phalanx.v1 import scheduler_plugin_pb2 as pb
from proto.phalanx.v1 import scheduler_plugin_pb2_grpc as pb_grpc
from solver import Pod

from .servicer import Refusal, answered

log = logging.getLogger("phalanx.grpc")

SUPPORTED = (pb.CONTRACT_VERSION_1,)
VERDICTS = {"planned": pb.PlanForPodReply.PLANNED, "wait": pb.PlanForPodReply.WAIT,
            "not_a_member": pb.PlanForPodReply.NOT_A_MEMBER}
DECISIONS = {"allow": pb.PermitReply.ALLOW, "wait": pb.PermitReply.WAIT, "reject": pb.PermitReply.REJECT}


def _checked(request: Any) -> None:
    if request.version not in SUPPORTED:
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                      f"phalanx: contract version {request.version} is not served (serving {list(SUPPORTED)})")


def _pod(raw: bytes) -> Pod | str:
    """The request's pod, read once at the border: the pod, or why phalanx cannot read it."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"pod_json is not JSON: {err}") from None
    return read_pod(obj)


def group_plan(plan: Plan, plan_id: int) -> pb.GroupPlan:
    return pb.GroupPlan(group=plan.group, id=plan_id, state=plan.state.value if plan.state else "",
                        assignments=plan.assignments, gang=plan.gang, reserved=sorted(plan.arrived),
                        trade_classes=plan.trade_classes())


def snapshot_message(snap: Snapshot) -> pb.Reservations:
    message = pb.Reservations(version=snap.version, waiting_groups=list(snap.waiting_groups),
                              reject_uids=list(snap.left), preempting_groups=list(snap.preempting),
                              untried_groups=list(snap.untried))
    for plan in snap.plans:
        message.plans.append(group_plan(plan, snap.plan_ids.get(plan.group, 0)))
    for node, amounts in snap.nodes.items():
        message.nodes[node].amounts.update(amounts)
    return message


class SchedulerPluginServicer(pb_grpc.SchedulerPluginServicer):
    def __init__(self, enforcement: PluginEnforcement) -> None:
        self.enforcement = enforcement

    @answered
    def PlanForPod(self, request: pb.PlanForPodRequest, context: grpc.ServicerContext) -> pb.PlanForPodReply:
        _checked(request)
        pod = _pod(request.pod_json)
        answer = PlanAnswer("wait", reason=pod) if isinstance(pod, str) else self.enforcement.plan_for_pod(pod)
        reply = pb.PlanForPodReply(verdict=VERDICTS[answer.verdict], node=answer.node, reason=answer.reason,
                                   members_missing=answer.members_missing)
        if answer.plan is not None:
            reply.plan.CopyFrom(group_plan(answer.plan, self.enforcement.plan_id(answer.plan)))
        return reply

    @answered
    def ReportRejection(self, request: pb.ReportRejectionRequest, context: grpc.ServicerContext
                        ) -> pb.ReportRejectionReply:
        _checked(request)
        pod = _pod(request.pod_json)
        outcome, node = ("none", "") if isinstance(pod, str) else self.enforcement.report_rejection(
            pod, request.node, request.plugin, request.reason)
        return pb.ReportRejectionReply(outcome=outcome, node=node)

    @answered
    def Reserve(self, request: pb.ReserveRequest, context: grpc.ServicerContext) -> pb.ReserveReply:
        _checked(request)
        ok, reason = self.enforcement.reserve(request.pod_uid, request.group, request.node, request.traded_with,
                                              request.simulation)
        return pb.ReserveReply(ok=ok, reason=reason)

    @answered
    def Unreserve(self, request: pb.UnreserveRequest, context: grpc.ServicerContext) -> pb.UnreserveReply:
        _checked(request)
        return pb.UnreserveReply(reject_uids=self.enforcement.unreserve(request.pod_uid, request.group,
                                                                        request.reason))

    @answered
    def Permit(self, request: pb.PermitRequest, context: grpc.ServicerContext) -> pb.PermitReply:
        _checked(request)
        answer = self.enforcement.permit(request.pod_uid, request.group, tuple(request.reserved_uids), request.node,
                                         request.condition_by_scheduler, dict(request.reserved_nodes))
        return pb.PermitReply(decision=DECISIONS[answer.decision], reason=answer.reason,
                              allow_uids=list(answer.allow), wait_seconds=answer.wait_seconds)

    @answered
    def WatchReservations(self, request: pb.WatchReservationsRequest, context: grpc.ServicerContext
                          ) -> Iterator[pb.Reservations]:
        _checked(request)
        return self._snapshots(context)

    def _snapshots(self, context: grpc.ServicerContext) -> Iterator[pb.Reservations]:
        """A full snapshot now, then one after each change (coalesced), unless it is unchanged;
        while the snapshot can change with time alone (``timed``), recomputed every second too.
        The first is sent even when its encoding is empty (nothing held, no change yet): the
        plugin retries its pending members when it arrives."""
        seen = -1
        last: bytes | None = None
        while context.is_active():
            version = self.enforcement.wait_change(seen, timeout=1.0)
            if version == seen and not self.enforcement.timed():
                continue
            if seen >= 0 and version != seen:
                time.sleep(COALESCE_SECONDS)  # let a burst of changes land in one snapshot
            seen = version
            message = snapshot_message(self.enforcement.snapshot())
            body = message.SerializeToString(deterministic=True)
            if body == last:
                continue
            last = body
            yield message
