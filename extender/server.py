"""``phalanx serve``: cache, workload-cycle service and HTTP extender in one process.

The HTTP server is phalanx's one stack (:mod:`web`: cheroot, a threaded production WSGI server with
TLS and client-certificate verification), a thread per call (``--http-threads``, default 1100). A
gang of N holds N-1 bind calls open at the barrier while kube-scheduler keeps sending filter calls
for the rest, and several gangs do so at once; so the workload cycle is told the pool's *barrier
capacity* (the threads minus a reserve for filter, prioritize and the probes,
:func:`cycle.barrier_capacity`) and never plans more unbound gang members than that: gangs
beyond it wait their turn instead of deadlocking the pool.
``--health-addr`` adds a listener for the kubelet's probes that serves only /healthz and /readyz
(:mod:`extender.http.health`), so the extender itself can stay on loopback.

No unauthenticated door: kube-scheduler's calls (the extender's verbs, the plugin's gRPC service)
come either over the pod's loopback or with a client certificate (``--client-ca``,
``--grpc-client-ca``: serve refuses to listen elsewhere without one); everything else on those ports
(the dashboard, ``/metrics``, the gRPC read calls of ``phalanx explain``) needs a bearer token that
the API server authenticates and authorizes (:mod:`cluster.access`, as kube-rbac-proxy does), unless
``--insecure-loopback-no-auth`` says loopback alone is enough. Only the probe listener is open.
Everything (watch threads, service, servers) starts inside this one process; nothing forks.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Callable

from cheroot import wsgi

from cluster import names
from cluster.access import AccessReviewer
from cluster.apiserver import ApiServerBackend
from cluster.cache import ClusterCache
from cluster.kube import Kube
from cluster.leadership import LeaseFollower, parse_lease_ref
from cluster.sim import SimCluster
from cluster.whatif import Compile
from cycle import InProcess, NamespaceLimits, WorkloadCycle, barrier_capacity
from cycle.karpenter import KarpenterOptions
from cycle.queue import QueuePolicy
from extender.dashboard.history import GROUP_CAPACITY
from extender.http import create_app, health_app
from rpc import GrpcServer, GrpcTls, start_grpc_server
from solver import SolveOptions
from web import Gate, Listener, split_addr, wsgi_server

log = logging.getLogger("phalanx.serve")


@dataclass
class ServeOptions:
    http_addr: str = "127.0.0.1:8888"
    http_threads: int = 1100
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    barrier_timeout: float = 30.0
    plan_ttl: float = 60.0
    solver_path: str = "exact"
    grpc_addr: str = f"127.0.0.1:{names.GRPC_PORT}"  # the WorkloadCycle gRPC service; "" or "off": none
    health_addr: str = ""  # HOST:PORT of the probe listener (/healthz, /readyz only); "": none
    queue_policy: QueuePolicy = QueuePolicy()  # starvation holds, fragmentation, lost-work preemption
    plan_ahead: tuple[str, ...] = ()  # kube-scheduler profiles whose complete gangs are planned before they ask
    grpc_tls_cert: str | None = None  # mTLS of the gRPC endpoint: its certificate and key,
    grpc_tls_key: str | None = None
    grpc_client_ca: str | None = None  # and the CA that signs its clients' certificates
    insecure_loopback_no_auth: bool = False  # loopback listeners serve the dashboard, metrics, explain without a token
    namespace_limits: NamespaceLimits = NamespaceLimits()  # per-namespace limits on phalanx's work (tenants)
    provisioning: str = names.PROVISIONING_NONE  # "atomic": gangs short of capacity get a ProvisioningRequest
    # who is asked: cluster-autoscaler (a ProvisioningRequest) or Karpenter (NodeClaims of this NodePool)
    karpenter: KarpenterOptions | None = None
    # how a what-if manifest becomes PodGroups: the controller's compiler, handed in by the command
    # (serve's entry points never import the controller); None: what-if is not served
    compile_manifest: Compile | None = None
    history_groups: int = GROUP_CAPACITY  # groups the dashboard's history remembers (oldest forgotten first)
    solver_workers: bool = True  # preemption plans and smallest-change searches in worker processes
    leader_lease: str = ""  # NAMESPACE/NAME of the Lease the kube-scheduler beside serve elects on; "": act always
    leader_identity: str = ""  # the start of that kube-scheduler's identity ("": this host's name)

    @property
    def grpc_tls(self) -> GrpcTls | None:
        """The gRPC endpoint's mTLS files, None for plaintext; ValueError when only some are given."""
        cert, key, ca = self.grpc_tls_cert, self.grpc_tls_key, self.grpc_client_ca
        if cert and key and ca:
            return GrpcTls(cert, key, ca)
        if cert or key or ca:
            raise ValueError("--grpc-tls-cert, --grpc-tls-key and --grpc-client-ca go together (mTLS)")
        return None


def is_loopback(addr: str) -> bool:
    """Whether ``HOST:PORT`` listens on loopback only (127.0.0.0/8, ::1, localhost)."""
    host, _ = split_addr(addr)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: kube-scheduler's longest backoff of a pod that failed (KubeSchedulerConfiguration
#: ``podMaxBackoffSeconds``, 10 s by default)
POD_MAX_BACKOFF_SECONDS = 10.0


def barrier_advice(options: ServeOptions) -> str:
    """A warning for a bind barrier shorter than kube-scheduler's longest pod backoff, "" otherwise.
    Members whose extender call failed (a reset link) come back after that backoff, and a barrier
    that times out sends the members already at bind back with a longer one: with a barrier shorter
    than the backoff, their arrivals can keep spreading wider than it (seen in the network-fault
    benchmark with an 8 s barrier)."""
    if options.barrier_timeout >= POD_MAX_BACKOFF_SECONDS:
        return ""
    return (f"--barrier-timeout {options.barrier_timeout:g}s is shorter than kube-scheduler's longest pod backoff "
            f"(podMaxBackoffSeconds, {POD_MAX_BACKOFF_SECONDS:g} s by default): gang members it backed off after "
            "an error can miss the barrier again and again; the default is 30 s")


def check_doors(options: ServeOptions, sim: bool) -> None:
    """Refuse a configuration with an unauthenticated door, or a Lease a simulated cluster cannot
    have (ValueError saying which)."""
    if options.leader_lease:
        parse_lease_ref(options.leader_lease)
        if sim:
            raise ValueError("--leader-lease follows a Lease on the API server: not with --sim")
    grpc_on = options.grpc_addr not in ("", "off")
    if not options.client_ca and not is_loopback(options.http_addr):
        raise ValueError(f"--http-addr {options.http_addr} is not loopback: the extender's verbs need --client-ca "
                         "(mTLS) there")
    if grpc_on and options.grpc_tls is None and not is_loopback(options.grpc_addr):
        raise ValueError(f"--grpc-addr {options.grpc_addr} is not loopback: the plugin's calls need "
                         "--grpc-tls-cert, --grpc-tls-key and --grpc-client-ca (mTLS) there")
    if options.insecure_loopback_no_auth:
        open_doors = [a for a in (options.http_addr, options.grpc_addr if grpc_on else "") if a and not is_loopback(a)]
        if open_doors:
            raise ValueError(f"--insecure-loopback-no-auth serves loopback only, not {', '.join(open_doors)}")
    elif sim:
        raise ValueError("tokens are reviewed by the API server: a simulated cluster needs --insecure-loopback-no-auth")


def http_server(app, options: ServeOptions) -> wsgi.Server:
    return wsgi_server(options.http_addr, app, options.http_threads, options.tls_cert, options.tls_key,
                       options.client_ca)


class Phalanx:
    """The running service: backend + cache + cycle + HTTP server (+ gRPC server)."""

    def __init__(self, cycle: WorkloadCycle, server: wsgi.Server, ready: Callable[[], tuple[bool, str]],
                 stop_backend: Callable[[], None] = lambda: None, grpc_addr: str = "",
                 grpc_tls: GrpcTls | None = None, gate: Gate | None = None,
                 compile_manifest: Compile | None = None) -> None:
        self.cycle, self.server, self.ready = cycle, server, ready
        self.compile_manifest = compile_manifest
        self._stop_backend = stop_backend
        self._http = Listener(server, "phalanx-http")
        self.grpc_addr = "" if grpc_addr == "off" else grpc_addr
        self.grpc: GrpcServer | None = None
        self.grpc_tls, self.gate = grpc_tls, gate
        self.health: Listener | None = None

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def health_port(self) -> int | None:
        return None if self.health is None else self.health.port

    def live(self) -> tuple[bool, str]:
        """Liveness for the probe listener: the extender's HTTP server is up and serving."""
        if self._http.serving():
            return True, "ok"
        return False, "the extender's HTTP server is not serving"

    def serve_health(self, addr: str) -> "Phalanx":
        """Start the probe listener on ``addr`` (a few threads: the kubelet probes one at a time)."""
        server = wsgi_server(addr, health_app(self.live, self.ready), threads=4, queue=16, timeout=10)
        self.health = Listener(server, "phalanx-health").start()
        return self

    def start(self) -> "Phalanx":
        if self.grpc_addr:  # first: an address that cannot be bound fails before anything serves
            self.grpc = start_grpc_server(self.cycle, self.grpc_addr, tls=self.grpc_tls, gate=self.gate,
                                          compile_manifest=self.compile_manifest)
        self._http.start()
        return self

    def stop(self) -> None:
        if self.grpc is not None:
            self.grpc.stop()
        if self.health is not None:
            self.health.stop()
        self.server.stop()
        self._stop_backend()
        self.cycle.close()


def build(options: ServeOptions, kubeconfig: str | None = None, sim: SimCluster | None = None) -> Phalanx:
    check_doors(options, sim is not None)
    if advice := barrier_advice(options):
        log.warning("%s", advice)
    grpc_tls = options.grpc_tls
    solve = SolveOptions(path=options.solver_path)
    gate: Gate | None = None
    if sim is not None:
        cycle = WorkloadCycle(sim.cache, sim, solve, options.barrier_timeout, options.plan_ttl,
                              barrier_capacity=barrier_capacity(options.http_threads),
                              queue_policy=options.queue_policy, plan_ahead=frozenset(options.plan_ahead),
                              namespace_limits=options.namespace_limits, provisioning=options.provisioning,
                              karpenter=options.karpenter,
                              solves=None if options.solver_workers else InProcess())
        def ready() -> tuple[bool, str]:
            return (True, "ok (simulated cluster)")
        def stop_backend() -> None:
            return None
    else:
        cache = ClusterCache()
        kube = Kube(None if kubeconfig == "in-cluster" else kubeconfig)
        if not options.insecure_loopback_no_auth:
            gate = AccessReviewer(kube).answer
        backend = ApiServerBackend(kube, cache, karpenter=options.karpenter is not None)
        backend.start()
        if not backend.wait_synced(120):
            log.warning("caches not synced after 120 s; serving anyway, /readyz says why")
        follower = None
        if options.leader_lease:  # several replicas: act only beside the kube-scheduler that leads
            follower = LeaseFollower.on(kube, options.leader_lease, options.leader_identity or socket.gethostname())
        cycle = WorkloadCycle(cache, backend, solve, options.barrier_timeout, options.plan_ttl,
                              barrier_capacity=barrier_capacity(options.http_threads),
                              queue_policy=options.queue_policy, plan_ahead=frozenset(options.plan_ahead),
                              namespace_limits=options.namespace_limits, provisioning=options.provisioning,
                              karpenter=options.karpenter,
                              solves=None if options.solver_workers else InProcess(), leadership=follower)
        ready, stop_backend = backend.ready, backend.stop
        if follower is not None:
            follower.start()  # once the cycle listens: its first renewal seen makes it act
            log.warning("phalanx serve is %s", follower.describe())
            ready, stop_backend = _with_role(backend.ready, follower), _stopping(follower, backend.stop)
    cycle.heap.settle()  # the synced caches are long-lived: out of the collector's full passes
    cycle.start()  # its requeue and broken-unit threads, once the caches are listed
    app = create_app(cycle, ready, gate=gate, compile_manifest=options.compile_manifest,
                     history_groups=options.history_groups)
    return Phalanx(cycle, http_server(app, options), ready, stop_backend, grpc_addr=options.grpc_addr,
                   grpc_tls=grpc_tls, gate=gate, compile_manifest=options.compile_manifest)


def _with_role(ready: Callable[[], tuple[bool, str]], follower: LeaseFollower) -> Callable[[], tuple[bool, str]]:
    """/readyz with the replica's role said: a standby is ready (it serves, warm, if asked)."""
    def answer() -> tuple[bool, str]:
        ok, message = ready()
        return ok, f"{message}; {follower.describe()}"
    return answer


def _stopping(follower: LeaseFollower, stop: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        follower.close()
        stop()
    return both


def serve(options: ServeOptions, kubeconfig: str | None = None, sim_file: str | None = None) -> int:
    sim = None
    if sim_file:
        sim = SimCluster()
        with open(sim_file) as f:
            sim.load_yaml(f.read())
    phalanx = build(options, kubeconfig, sim).start()
    if options.health_addr:
        phalanx.serve_health(options.health_addr)
    scheme = "https" if options.tls_cert else "http"
    http_addr = f"{options.http_addr.rpartition(':')[0]}:{phalanx.port}"  # the port bound (0: any)
    print(f"phalanx serving the extender on {scheme}://{http_addr}/scheduler "
          f"({'simulated cluster ' + sim_file if sim_file else 'API server'})", flush=True)
    print(f"phalanx dashboard: {scheme}://{http_addr}/", flush=True)
    if phalanx.health is not None:
        print(f"phalanx serving /healthz and /readyz on http://{options.health_addr}", flush=True)
    if phalanx.grpc is not None:
        print(f"phalanx serving gRPC phalanx.v1.WorkloadCycle on "
              f"{phalanx.grpc_addr.rpartition(':')[0]}:{phalanx.grpc.port}"
              f"{' (mTLS)' if phalanx.grpc_tls else ''}", flush=True)
    print("phalanx: the dashboard, /metrics and explain "
          + ("need no token (--insecure-loopback-no-auth)" if phalanx.gate is None
             else "need a bearer token the API server authorizes"), flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    phalanx.stop()
    return 0
