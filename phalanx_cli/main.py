"""The ``phalanx`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from cluster import names
from cluster.names import GRPC_PORT


def _without_tcache() -> None:
    """Re-execute this process once with glibc's per-thread cache of freed chunks off, which it
    reads only at start (see cycle.heap): serve's resident size then grows a quarter as fast (the
    soaks in docs/benchmarks.md), and a benchmark measures serve as it runs. Nothing happens where
    it is set already or the C library is not glibc."""
    import os

    from cycle.heap import allocator_env, libc_name

    env = allocator_env(dict(os.environ), libc_name())
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)


def _bench(args: argparse.Namespace) -> int:
    import importlib

    from bench import SUITES

    module = importlib.import_module(SUITES[args.suite])
    if args.workloads and args.suite != "scheduler-perf":
        raise SystemExit(f"phalanx bench {args.suite}: --workloads is for scheduler-perf only")
    if (args.trace or args.cluster) and args.suite != "trace":
        raise SystemExit(f"phalanx bench {args.suite}: --trace and --cluster are for trace only")
    if (args.duration or args.real) and args.suite != "soak":
        raise SystemExit(f"phalanx bench {args.suite}: --duration and --real are for soak only")
    if args.memory_trace and not (args.suite == "soak" and args.real):
        raise SystemExit("phalanx bench: --memory-trace is for soak --real only")
    if args.duration is not None and args.duration <= 0:
        raise SystemExit("phalanx bench soak: --duration must be a positive number of minutes")
    extra: dict = {"workloads_arg": args.workloads} if args.suite == "scheduler-perf" else {}
    if args.suite == "soak":
        extra = {"duration": args.duration * 60 if args.duration else None, "real": args.real,
                 "memory_trace": args.memory_trace}
    if args.trace or args.cluster:
        extra.update(_given_trace(args.trace, args.cluster))
    if args.whole_process:
        _without_tcache()
    return module.main(quick=args.quick, json_path=args.json, seeds=args.seeds, **extra)


def _given_trace(trace: str | None, cluster: str | None) -> dict:
    """``--trace FILE [--cluster SPEC]``, read and checked before anything runs (no ``--cluster``:
    racks sized to each load)."""
    import pathlib

    from bench.traces import cluster_spec, trace_file

    if not trace:
        raise SystemExit("phalanx bench trace: --cluster is the cluster for --trace FILE: give the trace too")
    path = pathlib.Path(trace)
    try:
        trace_file(path)
        return {"trace": path, "cluster": cluster_spec(cluster) if cluster else None}
    except ValueError as err:
        raise SystemExit(f"phalanx bench trace: {err}") from None


def _demo(args: argparse.Namespace) -> int:
    if args.solver_only:
        from .solver_demo import run_solver_demo

        return run_solver_demo()
    from .demo import run_demo

    return run_demo(port=args.port, duration=args.duration, headless=args.headless, grpc_port=args.grpc_port)


def _log_to_stderr(level: int) -> None:
    """Log records at ``level`` and above to stderr, each with its time, level and logger."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _serve(args: argparse.Namespace) -> int:
    from controller.whatif import compile_objects
    from cycle.karpenter import KarpenterOptions
    from extender.server import ServeOptions, serve

    if bool(args.kubeconfig) == bool(args.sim):
        raise SystemExit("phalanx serve: give exactly one of --kubeconfig PATH or --sim FILE")
    if args.whole_process:
        _without_tcache()
    _log_to_stderr(logging.WARNING)
    if args.history_groups < 1:
        raise SystemExit("phalanx serve: --history-groups must be >= 1")
    if args.memory_trace:
        _memory_trace(args)
    options = ServeOptions(http_addr=args.http_addr, http_threads=args.http_threads, tls_cert=args.tls_cert,
                           tls_key=args.tls_key, client_ca=args.client_ca, barrier_timeout=args.barrier_timeout,
                           plan_ttl=args.plan_ttl, solver_path=args.solver, grpc_addr=args.grpc_addr,
                           health_addr=args.health_addr, queue_policy=_queue_policy(args),
                           plan_ahead=tuple(args.plan_ahead_for or ()), namespace_limits=_namespace_limits(args),
                           provisioning=args.provisioning, history_groups=args.history_groups,
                           solver_workers=args.solver_workers == "on", leader_lease=args.leader_lease,
                           leader_identity=args.leader_identity)
    options.grpc_tls_cert, options.grpc_tls_key = args.grpc_tls_cert, args.grpc_tls_key
    options.grpc_client_ca, options.insecure_loopback_no_auth = args.grpc_client_ca, args.insecure_loopback_no_auth
    options.compile_manifest = compile_objects  # what-if compiles with the controller's own code
    if args.provisioner == names.PROVISIONER_KARPENTER:
        if not 0 < args.provisioning_timeout < float("inf"):  # (NaN fails too)
            raise SystemExit("phalanx serve: --provisioning-timeout must be a number of seconds > 0")
        options.karpenter = KarpenterOptions(args.karpenter_nodepool, args.provisioning_timeout)
    from cluster.apiserver import FlavorUnavailable

    try:
        return serve(options, kubeconfig=args.kubeconfig, sim_file=args.sim)
    except (FlavorUnavailable, ValueError, OSError) as err:  # OSError: a --sim file that cannot be read
        raise SystemExit(f"phalanx serve: {err}") from None


def _queue_policy(args: argparse.Namespace):
    from cycle.queue import QueuePolicy

    for flag in ("hold_after_duration", "hold_after", "lost_work_budget"):
        if getattr(args, flag) < 0:
            raise SystemExit(f"phalanx serve: --{flag.replace('_', '-')} must be >= 0")
    return QueuePolicy(starvation_factor=args.hold_after_duration or None, starvation_after=args.hold_after or None,
                       fragmentation_aware=args.fragmentation_aware,
                       lost_work_budget=args.lost_work_budget or None)


def _namespace_limits(args: argparse.Namespace):
    from cycle import NamespaceLimits

    for flag in ("namespace_max_plans", "namespace_max_retries", "namespace_cycles_per_second"):
        if getattr(args, flag) < 0:
            raise SystemExit(f"phalanx serve: --{flag.replace('_', '-')} must be >= 0")
    return NamespaceLimits(max_plans=args.namespace_max_plans, max_retries=args.namespace_max_retries,
                           cycles_per_second=args.namespace_cycles_per_second)


def _credentials(args: argparse.Namespace, command: str):
    """The token and TLS files of a gRPC client command (explain, whatif), read."""
    from .explain import Credentials

    try:
        return Credentials.from_files(args.token_file, args.grpc_ca, args.grpc_cert, args.grpc_key,
                                      args.grpc_server_name)
    except (OSError, ValueError) as err:
        raise SystemExit(f"phalanx {command}: {err}") from None


def _explain(args: argparse.Namespace) -> int:
    from .explain import explain

    return explain(args.group, args.grpc_addr, sys.stdout, _credentials(args, "explain"))


def _whatif(args: argparse.Namespace) -> int:
    from .whatif import whatif

    return whatif(args.filename, args.grpc_addr, sys.stdout, _credentials(args, "whatif"), args.output,
                  args.namespace, with_exit_code=args.exit_code)


def _controller(args: argparse.Namespace) -> int:
    from controller import run

    _log_to_stderr(logging.INFO)
    from cluster.apiserver import FlavorUnavailable

    try:
        return run(args.kubeconfig, args.webhook_addr, args.tls_cert, args.tls_key, args.lease_namespace,
                   workers=args.workers, scheduling_settle=args.scheduling_settle)
    except (FlavorUnavailable, ValueError) as err:  # ValueError: a kubeconfig that cannot be loaded
        raise SystemExit(f"phalanx controller: {err}") from None


def _add_serve_access(serve: argparse.ArgumentParser) -> None:
    """serve's flags of who may reach it: gRPC mTLS and the explicit loopback-without-token."""
    serve.add_argument("--grpc-tls-cert", metavar="FILE",
                       help="serve gRPC over mTLS with this certificate (re-read when the file changes)")
    serve.add_argument("--grpc-tls-key", metavar="FILE", help="private key of --grpc-tls-cert")
    serve.add_argument("--grpc-client-ca", metavar="FILE",
                       help="require gRPC client certificates signed by this CA (with --grpc-tls-cert, --grpc-tls-key)")
    serve.add_argument("--insecure-loopback-no-auth", action="store_true",
                       help="serve the dashboard, /metrics and the gRPC read calls without a token (loopback "
                            "listeners only; default: a bearer token the API server authenticates and authorizes)")


def _add_grpc_client(parser: argparse.ArgumentParser) -> None:
    """How a client command reaches a running serve's gRPC service (explain, whatif)."""
    parser.add_argument("--grpc-addr", default=f"127.0.0.1:{GRPC_PORT}", help="the serve's gRPC address")
    parser.add_argument("--token-file", metavar="FILE",
                        help="send the bearer token in FILE (e.g. from `kubectl create token`; '-': stdin)")
    parser.add_argument("--grpc-ca", metavar="FILE", help="dial over TLS, trusting this CA for serve's certificate")
    parser.add_argument("--grpc-cert", metavar="FILE", help="client certificate for mTLS (with --grpc-key)")
    parser.add_argument("--grpc-key", metavar="FILE", help="private key of --grpc-cert")
    parser.add_argument("--grpc-server-name", metavar="NAME",
                        help="the name the server's certificate must carry (default: the host of --grpc-addr)")


def _add_explain(sub: argparse._SubParsersAction) -> None:
    explain = sub.add_parser("explain", help="print a PodGroup's state, explanation and plan from a running serve")
    explain.add_argument("group", metavar="NAMESPACE/NAME", help="the PodGroup (NAME alone means default/NAME)")
    _add_grpc_client(explain)
    explain.set_defaults(func=_explain)


def _add_whatif(sub: argparse._SubParsersAction) -> None:
    from .whatif import OUTPUTS

    whatif = sub.add_parser("whatif", help="where a manifest's PodGroups would go if it were applied now "
                                           "(asks a running serve; reserves and writes nothing)")
    whatif.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="a YAML or JSON manifest, several documents allowed ('-': stdin; repeatable: the "
                             "files are planned together)")
    whatif.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format (default table)")
    whatif.add_argument("-n", "--namespace", default="",
                        help="the namespace of objects that name none (default: default)")
    whatif.add_argument("--exit-code", action="store_true",
                        help="exit 0 when every group fits now, whole; 3 when one fits only by preempting; 4 when "
                             "one does not fit or members of one would wait (1: no answer)")
    _add_grpc_client(whatif)
    whatif.set_defaults(func=_whatif)


def _add_queue_policies(serve: argparse.ArgumentParser) -> None:
    """``phalanx serve``'s queue policies (docs/solver.md, "Queue policies")."""
    from cycle.queue import DEFAULT_LOST_WORK_BUDGET, DEFAULT_STARVATION_AFTER, DEFAULT_STARVATION_FACTOR

    serve.add_argument("--hold-after-duration", type=float, default=DEFAULT_STARVATION_FACTOR, metavar="FACTOR",
                       help="a gang waiting FACTOR x its declared expected-duration holds the nodes it needs in "
                            f"the domain nearest to fitting it (default {DEFAULT_STARVATION_FACTOR:g}; 0: never by "
                            "this rule)")
    serve.add_argument("--hold-after", type=float, default=DEFAULT_STARVATION_AFTER, metavar="SECONDS",
                       help="the same for a gang that declares no duration, after SECONDS "
                            f"(default {DEFAULT_STARVATION_AFTER:.0f}; 0: never)")
    serve.add_argument("--fragmentation-aware", action="store_true",
                       help="choose among fitting domains the one that keeps queued gang shapes fitting (default off)")
    serve.add_argument("--lost-work-budget", type=float, default=DEFAULT_LOST_WORK_BUDGET, metavar="SHARE",
                       help="a preemptor declaring its duration evicts victims losing at most SHARE x its own work "
                            f"(default {DEFAULT_LOST_WORK_BUDGET:g}; 0: no budget)")


#: the dashboard history's default size (extender.dashboard.history.GROUP_CAPACITY, which a unit
#: test holds equal: importing it here would load the solver for every command's parser)
HISTORY_GROUPS = 20000


def _add_history(serve: argparse.ArgumentParser) -> None:
    """``phalanx serve``'s bound on the dashboard's memory, and the memory diagnostic (docs/cli.md)."""
    serve.add_argument("--history-groups", type=int, default=HISTORY_GROUPS, metavar="N",
                       help=f"groups the dashboard's history remembers, the oldest forgotten first (default "
                            f"{HISTORY_GROUPS}; each costs a few KiB)")
    serve.add_argument("--memory-trace", metavar="DIR",
                       help="a diagnostic, slows serve: write Python allocation snapshots and the allocators' "
                            "counters to DIR (docs/operations.md, \"Memory\")")
    serve.add_argument("--memory-trace-every", type=float, default=300.0, metavar="SECONDS",
                       help="seconds between the memory trace's looks (default 300)")
    serve.add_argument("--memory-trace-frames", type=int, default=8, metavar="N",
                       help="frames kept per traced allocation (default 8; 0: the allocators' counters only)")


def _memory_trace(args: argparse.Namespace) -> None:
    from cycle.memtrace import MemoryTrace

    if args.memory_trace_every <= 0 or args.memory_trace_frames < 0:
        raise SystemExit("phalanx serve: --memory-trace-every must be > 0 and --memory-trace-frames >= 0")
    try:
        MemoryTrace(args.memory_trace, args.memory_trace_every, args.memory_trace_frames).start()
    except OSError as err:
        raise SystemExit(f"phalanx serve: --memory-trace {args.memory_trace}: {err.strerror or err}") from None


def _add_namespace_limits(serve: argparse.ArgumentParser) -> None:
    """``phalanx serve``'s per-namespace limits on its own work (docs/operations.md, "Tenants")."""
    from cycle.tenants import DEFAULT_CYCLES_PER_SECOND, DEFAULT_MAX_PLANS, DEFAULT_MAX_RETRIES

    serve.add_argument("--namespace-max-plans", type=int, default=DEFAULT_MAX_PLANS, metavar="N",
                       help="a namespace holds at most N open plans at once; its further groups wait their turn "
                            f"(default {DEFAULT_MAX_PLANS}; 0: no limit)")
    serve.add_argument("--namespace-cycles-per-second", type=float, default=DEFAULT_CYCLES_PER_SECOND, metavar="RATE",
                       help="failed workload cycles (solves that placed nothing) a namespace may run per second, "
                            "in bursts of 10 seconds' worth "
                            f"(default {DEFAULT_CYCLES_PER_SECOND:g}; 0: no limit)")
    serve.add_argument("--namespace-max-retries", type=int, default=DEFAULT_MAX_RETRIES, metavar="N",
                       help="when room appears, at most N of a namespace's backing-off groups are checked per "
                            f"pass, in turn (default {DEFAULT_MAX_RETRIES}; 0: no limit)")


def _add_bench(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """``phalanx bench``'s arguments."""
    bench = sub.add_parser("bench", help="run a benchmark suite")
    from bench import SUITES

    bench.add_argument("suite", choices=sorted(SUITES), help="which benchmark")
    bench.add_argument("--quick", action="store_true", help="the short version that `make bench` runs")
    bench.add_argument("--json", metavar="FILE", help="write results as JSON (and a markdown table beside it)")
    bench.add_argument("--seeds", type=int, help="seeds per case (default: 20 full, 3 quick)")
    bench.add_argument("--workloads", metavar="CASE/NAME,...",
                       help="scheduler-perf: upstream workloads to run (default: the published table's)")
    bench.add_argument("--trace", metavar="FILE",
                       help="trace: replay this trace (a CSV in the Pollux, Tiresias or Acme format) instead of the "
                            "shipped ones, every policy at 70, 90 and 110%% offered load")
    bench.add_argument("--cluster", metavar="RACKSxNODES|pai",
                       help="trace: the cluster for --trace (racks of 8-GPU nodes, e.g. 2x8; or pai), arrivals "
                            "scaled to each load; without it, 2 racks sized to each load")
    bench.add_argument("--duration", type=float, metavar="MINUTES",
                       help="soak: how long to churn (default: 60 full, 5 quick)")
    bench.add_argument("--real", action="store_true",
                       help="soak: on the real loopback control plane of the e2e tests, not the simulated cluster")
    bench.add_argument("--memory-trace", metavar="DIR",
                       help="soak --real: run serve with its memory trace into DIR (a diagnostic, slows serve) and "
                            "report what grew")
    bench.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx", description="All-or-nothing PodGroup placement for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"phalanx {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_bench(sub)

    serve = sub.add_parser("serve", help="run the cache, the workload-cycle service and the HTTP extender")
    serve.add_argument("--kubeconfig", metavar="PATH",
                       help="the API server to serve (in-cluster config if 'in-cluster')")
    serve.add_argument("--sim", metavar="FILE", help="a YAML file of objects for the simulated cluster instead")
    serve.add_argument("--http-addr", default="127.0.0.1:8888", help="extender address (default 127.0.0.1:8888)")
    serve.add_argument("--http-threads", type=int, default=1100,
                       help="HTTP worker threads; must exceed the largest gang (default 1100)")
    serve.add_argument("--tls-cert", help="serve HTTPS with this certificate")
    serve.add_argument("--tls-key", help="private key of --tls-cert")
    serve.add_argument("--client-ca", help="require client certificates signed by this CA (mTLS)")
    serve.add_argument("--barrier-timeout", type=float, default=30.0,
                       help="seconds a gang waits at bind for all members (default 30; keep below httpTimeout)")
    serve.add_argument("--plan-ttl", type=float, default=60.0, help="seconds a plan holds its reservation (default 60)")
    serve.add_argument("--solver", choices=["exact", "greedy"], default="exact", help="solver path (default exact)")
    serve.add_argument("--solver-workers", choices=["on", "off"], default="on",
                       help="'on': group preemption plans and smallest-change searches run in solver worker "
                            "processes, so the verbs never wait behind them; 'off': in serve's own interpreter "
                            "(default on)")
    serve.add_argument("--plan-ahead-for", action="append", metavar="SCHEDULER",
                       help="plan a gang as soon as it is complete, before kube-scheduler asks, when its pods' "
                            "schedulerName is SCHEDULER (repeatable; the profile(s) running phalanx; default: none)")
    serve.add_argument("--provisioning", choices=[names.PROVISIONING_NONE, names.PROVISIONING_ATOMIC],
                       default=names.PROVISIONING_NONE,
                       help="'atomic': a gang that lacks capacity gets a ProvisioningRequest "
                            "(best-effort-atomic-scale-up) for the missing pods in its nearest domain, unless its "
                            "PodGroup says scheduling.phalanx.dev/provisioning: none (default: none, only PodGroups "
                            "annotated atomic)")
    serve.add_argument("--provisioner", choices=[names.PROVISIONER_CLUSTER_AUTOSCALER, names.PROVISIONER_KARPENTER],
                       default=names.PROVISIONER_CLUSTER_AUTOSCALER,
                       help="who gets a gang's ask for the nodes it lacks: 'cluster-autoscaler' (a "
                            "ProvisioningRequest) or 'karpenter' (NodeClaims of a NodePool, made by phalanx in the "
                            "gang's domain and kept from consolidation while the gang needs them; docs/autoscaling.md) "
                            "(default: cluster-autoscaler)")
    serve.add_argument("--karpenter-nodepool", default="default", metavar="NAME",
                       help="with --provisioner karpenter: the NodePool whose template a gang's NodeClaims copy, "
                            "unless the node phalanx takes as their model belongs to another (default: default)")
    serve.add_argument("--provisioning-timeout", type=float, default=600.0, metavar="SECONDS",
                       help="with --provisioner karpenter: how long a gang's nodes may take to register before all "
                            "its NodeClaims are deleted and it stops asking (default: 600)")
    serve.add_argument("--grpc-addr", default=f"127.0.0.1:{GRPC_PORT}",
                       help="WorkloadCycle gRPC address (default 127.0.0.1:50051; '' or 'off' to disable)")
    serve.add_argument("--leader-lease", default="", metavar="NAMESPACE/NAME",
                       help="several scheduler replicas: act (plan ahead, write) only while the kube-scheduler "
                            "beside this serve holds this Lease (its leaderElection's resourceNamespace/"
                            "resourceName); otherwise stand by, caches warm, writing nothing (default: one "
                            "replica, always act)")
    serve.add_argument("--leader-identity", default="", metavar="ID",
                       help="the start of this replica's kube-scheduler's identity on the Lease (kube-scheduler "
                            "uses HOSTNAME_UUID; default: this host's name, which a pod's containers share)")
    _add_serve_access(serve)
    serve.add_argument("--health-addr", default="",
                       help="HOST:PORT of a listener serving only /healthz and /readyz, for the kubelet's probes "
                            "(e.g. 0.0.0.0:8889; default: none)")
    _add_history(serve)
    _add_queue_policies(serve)
    _add_namespace_limits(serve)
    serve.set_defaults(func=_serve)

    _add_explain(sub)
    _add_whatif(sub)

    demo = sub.add_parser("demo", help="phalanx, a simulated kube-scheduler and the dashboard on a simulated cluster: "
                                       "KEP-6277 stories, LWS groups, a gang that cannot fit, preemption, a trace")
    demo.add_argument("--port", type=int, default=8080, help="dashboard and extender HTTP port (default 8080; 0: any)")
    demo.add_argument("--grpc-port", type=int, default=GRPC_PORT,
                      help="gRPC port on 127.0.0.1 that `phalanx explain` and `phalanx whatif` reach (default 50051, "
                           "their default; 0: any)")
    demo.add_argument("--duration", type=float, metavar="SECONDS", help="stop after SECONDS (default: until Ctrl-C)")
    demo.add_argument("--headless", action="store_true", help="no browser hint (for scripts and CI)")
    demo.add_argument("--solver-only", action="store_true",
                      help="the solver alone on a generated cluster, printed (no service, no dashboard)")
    demo.set_defaults(func=_demo)

    ctl = sub.add_parser("controller", help="run the StatefulSet controller (KEP-6277) and its admission webhooks")
    ctl.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    ctl.add_argument("--webhook-addr", default="0.0.0.0:9443", help="HOST:PORT the HTTPS webhooks listen on")
    ctl.add_argument("--tls-cert", required=True, help="PEM certificate of the webhook server")
    ctl.add_argument("--tls-key", required=True, help="PEM private key of the webhook server")
    ctl.add_argument("--lease-namespace", default="kube-system", help="namespace of the leader-election Lease")
    ctl.add_argument("--workers", type=int, default=16, help="concurrent StatefulSet reconciles")
    ctl.add_argument("--scheduling-settle", type=float, default=5.0, metavar="SECONDS",
                     help="a StatefulSet whose scheduling annotation keeps changing is reconciled at most once per "
                          "SECONDS for it, the last value winning (default 5; 0: at once)")
    ctl.set_defaults(func=_controller)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("phalanx")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # this process's own command line (not a caller's argv, as in tests): serve and bench may
    # re-execute it (see _without_tcache)
    args.whole_process = argv is None
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (`phalanx whatif -o json | head`): not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not fail again
        return 0


if __name__ == "__main__":
    sys.exit(main())
