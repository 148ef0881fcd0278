"""``phalanx explain NAMESPACE/NAME``: a gRPC client of a running ``phalanx serve`` that prints a
PodGroup's state, the last reason it did not fit, and the plan it holds, if any."""

from __future__ import annotations

import sys
from typing import TextIO

import grpc

from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc

CALL_TIMEOUT = 10.0  # seconds: a server that does not answer is reported, not waited for


def render(reply: pb.ExplainGroupReply, plan: pb.Plan | None) -> str:
    lines = [f"podgroup {reply.namespace}/{reply.name}: {reply.state}",
             f"  members: {reply.members_existing} exist, {reply.members_bound} bound"
             + (f" (minCount {reply.min_count})" if reply.min_count else "")]
    if reply.owner_kind:
        lines.append(f"  owner: {reply.owner_kind} {reply.namespace}/{reply.owner_name}"
                     + (f" ({reply.owner_level})" if reply.owner_level else ""))
    if reply.explanation:
        lines.append(f"  why: {reply.explanation}")
    if plan is not None:
        p = plan.placement
        how = p.path + (", optimal" if p.optimal else (f", gap {p.gap:.1%}" if p.HasField("gap") else ""))
        where = f" in domain {p.domain}" if p.domain else ""
        lines.append(f"  plan: {plan.state}, {len(p.assignments)} pods{where} ({how}), "
                     f"{plan.members_at_barrier} at the bind barrier, expires in {plan.expires_in_seconds:.0f} s")
        width = max(len(name) for name in p.assignments) if p.assignments else 0
        lines += [f"    {name:<{width}}  {node}" for name, node in sorted(p.assignments.items())]
    return "\n".join(lines)


def explain(group: str, addr: str, out: TextIO) -> int:
    namespace, _, name = group.partition("/")
    if not name:
        namespace, name = "default", group
    with grpc.insecure_channel(addr) as channel:
        stub = pb_grpc.WorkloadCycleStub(channel)
        try:
            reply = stub.ExplainGroup(pb.ExplainGroupRequest(namespace=namespace, name=name), timeout=CALL_TIMEOUT)
            try:
                plan = stub.GetPlan(pb.GetPlanRequest(namespace=namespace, name=name), timeout=CALL_TIMEOUT)
            except grpc.RpcError as err:
                if err.code() is not grpc.StatusCode.NOT_FOUND:
                    raise
                plan = None
        except grpc.RpcError as err:
            print(f"phalanx explain: {err.code().name.lower()}: {err.details()} (server {addr})", file=sys.stderr)
            return 1
    print(render(reply, plan), file=out)
    return 0
