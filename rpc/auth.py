"""Bearer tokens on the gRPC read calls (``phalanx.v1.WorkloadCycle``, what ``phalanx explain`` uses).

The call's ``authorization: Bearer <token>`` metadata goes to the same gate as the HTTP ports': the
method's full name is the non-resource path (``/phalanx.v1.WorkloadCycle/ExplainGroup``), ``get`` the
verb of a read and ``create`` that of ``PlaceGroup`` (it runs a workload cycle). UNAUTHENTICATED
without a token the gate accepts, PERMISSION_DENIED when its user may not. The plugin's service
(``phalanx.v1.SchedulerPlugin``) and gRPC health are left to the transport: client certificates
(``--grpc-client-ca``) or the pod's loopback.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc

from web import Gate, bearer_token

WRITES = frozenset({"PlaceGroup"})


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, why: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that answers every call with ``code``."""
    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, why)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)


class TokenInterceptor(grpc.ServerInterceptor):
    """Checks the bearer token of every call to ``service`` (a full service name) with ``gate``."""

    def __init__(self, gate: Gate, service: str) -> None:
        self.gate, self.prefix = gate, f"/{service}/"

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        method = details.method
        if handler is None or not method.startswith(self.prefix):
            return handler
        header = next((str(v) for k, v in details.invocation_metadata if k == "authorization"), None)
        verb = "create" if method.removeprefix(self.prefix) in WRITES else "get"
        status, why = self.gate(bearer_token(header), method, verb)
        if status == 200:
            return handler
        code = grpc.StatusCode.UNAUTHENTICATED if status == 401 else grpc.StatusCode.PERMISSION_DENIED
        return _refusal(handler, code, f"phalanx: {why}")
