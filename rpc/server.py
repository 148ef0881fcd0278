"""Serve the WorkloadCycle gRPC service and the standard gRPC health service in this process."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from cluster.whatif import MAX_MANIFEST_BYTES, Compile
from cycle import WorkloadCycle
from cycle.plugin_mode import PluginEnforcement
from proto.phalanx.v1 import scheduler_plugin_pb2 as plugin_pb
from proto.phalanx.v1 import scheduler_plugin_pb2_grpc as plugin_pb_grpc
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from web import Gate

from .auth import TokenInterceptor
from .events import EventHub
from .plugin_servicer import SchedulerPluginServicer
from .servicer import WorkloadCycleServicer
from .tls import GrpcTls, ServerCertificates, server_credentials

log = logging.getLogger("phalanx.grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["WorkloadCycle"].full_name  # phalanx.v1.WorkloadCycle
# phalanx.v1.SchedulerPlugin: the contract of the kube-scheduler framework plugin (plugin mode)
PLUGIN_SERVICE_NAME = plugin_pb.DESCRIPTOR.services_by_name["SchedulerPlugin"].full_name


class GrpcServer:
    """A started gRPC server: its bound port, and stop()."""

    def __init__(self, server: grpc.Server, port: int, hub: EventHub, health_servicer: health.HealthServicer,
                 certificates: ServerCertificates | None = None) -> None:
        self.server, self.port, self.hub, self.health = server, port, hub, health_servicer
        self.certificates = certificates  # mTLS: the files it follows; None: plaintext

    def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()  # health checks say NOT_SERVING from now on
        self.hub.close()  # ends the WatchEvents streams
        self.server.stop(grace).wait()


def start_grpc_server(cycle: WorkloadCycle, addr: str, workers: int = 32, max_watchers: int = 16,
                      queue_size: int = 1024, tls: GrpcTls | None = None, gate: Gate | None = None,
                      compile_manifest: Compile | None = None) -> GrpcServer:
    """Serve ``cycle`` on ``addr`` (HOST:PORT; port 0 picks a free one). Each WatchEvents stream
    holds a worker thread, so at most ``max_watchers`` (fewer than ``workers``) are allowed at
    once and unary calls always find a thread. With ``tls``, only clients with a certificate its
    client CA signed get in (:mod:`rpc.tls`); with a ``gate``, WorkloadCycle calls need a bearer
    token it accepts (:mod:`rpc.auth`). ``compile_manifest`` serves WhatIf (see
    :class:`WorkloadCycleServicer`). Raises RuntimeError when ``addr`` cannot be bound."""
    if not 0 < max_watchers < workers:
        raise ValueError(f"need 0 < max_watchers ({max_watchers}) < workers ({workers})")
    hub = EventHub(queue_size, max_watchers)
    # no SO_REUSEPORT: a second serve on the same port must fail, not silently share its calls
    interceptors = [] if gate is None else [TokenInterceptor(gate, SERVICE_NAME)]
    # a what-if manifest up to MAX_MANIFEST_BYTES is taken (the envelope on top); the servicer
    # refuses a larger one by name
    server = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="phalanx-grpc"),
                         options=[("grpc.so_reuseport", 0),
                                  ("grpc.max_receive_message_length", 2 * MAX_MANIFEST_BYTES)],
                         interceptors=interceptors)
    pb_grpc.add_WorkloadCycleServicer_to_server(WorkloadCycleServicer(cycle, hub, compile_manifest), server)
    plugin_pb_grpc.add_SchedulerPluginServicer_to_server(SchedulerPluginServicer(PluginEnforcement(cycle)), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    certificates = None
    if tls is None:
        port = server.add_insecure_port(addr)
    else:
        credentials, certificates = server_credentials(tls)
        port = server.add_secure_port(addr, credentials)
    cycle.subscribe(hub.publish)
    server.start()
    for service in ("", SERVICE_NAME, PLUGIN_SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC %s serving on %s (port %d%s)", SERVICE_NAME, addr, port, ", mTLS" if tls else "")
    return GrpcServer(server, port, hub, health_servicer, certificates)
