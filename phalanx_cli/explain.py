"""``phalanx explain NAMESPACE/NAME``: a gRPC client of a running ``phalanx serve`` that prints a
PodGroup's state, the last reason it did not fit, and the plan it holds, if any.

serve asks for a bearer token (``--token-file``; unless it runs with ``--insecure-loopback-no-auth``)
and, when its gRPC endpoint is mTLS, for a client certificate (``--grpc-ca``, ``--grpc-cert``,
``--grpc-key``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

import grpc

from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc

from .composite_text import composite_line

CALL_TIMEOUT = 10.0  # seconds: a server that does not answer is reported, not waited for


def render(reply: pb.ExplainGroupReply, plan: pb.Plan | None) -> str:
    lines = [f"podgroup {reply.namespace}/{reply.name}: {reply.state}",
             f"  members: {reply.members_existing} exist, {reply.members_bound} bound"
             + (f", {reply.members_finished} finished" if reply.members_finished else "")
             + (f" (minCount {reply.min_count})" if reply.min_count else "")]
    if reply.owner_kind:
        lines.append(f"  owner: {reply.owner_kind} {reply.namespace}/{reply.owner_name}"
                     + (f" ({reply.owner_level})" if reply.owner_level else ""))
    if reply.composite:
        lines.append("  composite: " + composite_line(reply.composite, list(reply.composite_groups),
                                                      f"{reply.namespace}/{reply.name}", reply.composite_how,
                                                      reply.composite_why))
    if reply.explanation:
        lines.append(f"  why: {reply.explanation}")
    if reply.smallest_change:
        lines.append("  smallest change:")
        lines += [f"    {part}" for part in reply.smallest_change.split(" | ")]
    if plan is not None:
        p = plan.placement
        how = p.path + (", optimal" if p.optimal else (f", gap {p.gap:.1%}" if p.HasField("gap") else ""))
        where = f" in domain {p.domain}" if p.domain else ""
        lines.append(f"  plan: {plan.state}, {len(p.assignments)} pods{where} ({how}), "
                     f"{plan.members_at_barrier} at the bind barrier, expires in {plan.expires_in_seconds:.0f} s")
        width = max(len(name) for name in p.assignments) if p.assignments else 0
        lines += [f"    {name:<{width}}  {node}" for name, node in sorted(p.assignments.items())]
    return "\n".join(lines)


@dataclass(frozen=True)
class Credentials:
    """What explain shows serve: a bearer token, and for an mTLS endpoint the CA and a client pair."""

    token: str | None = None
    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_files(cls, token_file: str | None = None, ca: str | None = None, cert: str | None = None,
                   key: str | None = None, server_name: str | None = None) -> "Credentials":
        if bool(cert) != bool(key):
            raise ValueError("--grpc-cert and --grpc-key go together")
        if (cert or server_name) and not ca:
            raise ValueError("--grpc-cert and --grpc-server-name are for TLS: give --grpc-ca too")
        token = None
        if token_file:
            token = (sys.stdin.read() if token_file == "-" else _read(token_file).decode()).strip()
            if not token:
                raise ValueError(f"no token in {token_file}")
        return cls(token, _read(ca), _read(cert), _read(key), server_name)

    def channel(self, addr: str, max_message: int | None = None) -> grpc.Channel:
        """A channel to ``addr``; ``max_message``: the largest message it may send (gRPC's 4 MiB
        default otherwise)."""
        options = [("grpc.max_send_message_length", max_message)] if max_message else []
        if self.ca is None:
            return grpc.insecure_channel(addr, options=options)
        options += [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
        return grpc.secure_channel(addr, grpc.ssl_channel_credentials(self.ca, self.key, self.cert), options=options)

    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}")] if self.token else []


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def explain(group: str, addr: str, out: TextIO, credentials: Credentials = Credentials()) -> int:
    namespace, _, name = group.partition("/")
    if not name:
        namespace, name = "default", group
    metadata = credentials.metadata()
    with credentials.channel(addr) as channel:
        stub = pb_grpc.WorkloadCycleStub(channel)
        try:
            reply = stub.ExplainGroup(pb.ExplainGroupRequest(namespace=namespace, name=name), timeout=CALL_TIMEOUT,
                                      metadata=metadata)
            try:
                plan = stub.GetPlan(pb.GetPlanRequest(namespace=namespace, name=name), timeout=CALL_TIMEOUT,
                                    metadata=metadata)
            except grpc.RpcError as err:
                if err.code() is not grpc.StatusCode.NOT_FOUND:
                    raise
                plan = None
        except grpc.RpcError as err:
            print(f"phalanx explain: {err.code().name.lower()}: {err.details()} (server {addr})", file=sys.stderr)
            return 1
    print(render(reply, plan), file=out)
    return 0
