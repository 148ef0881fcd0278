"""The workload-cycle service over gRPC (proto/phalanx/v1/workload_cycle.proto), with the
standard gRPC health service. No Flask here: the HTTP extender lives in extender/http."""

from .events import EventHub
from .server import SERVICE_NAME, GrpcServer, start_grpc_server
from .servicer import WorkloadCycleServicer
from .tls import GrpcTls

__all__ = ["SERVICE_NAME", "EventHub", "GrpcServer", "GrpcTls", "WorkloadCycleServicer", "start_grpc_server"]
