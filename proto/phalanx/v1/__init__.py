"""phalanx.v1: the workload-cycle service contract. The modules here are generated from
workload_cycle.proto by hack/gen-proto.sh; do not edit them by hand."""

from . import workload_cycle_pb2, workload_cycle_pb2_grpc

__all__ = ["workload_cycle_pb2", "workload_cycle_pb2_grpc"]
