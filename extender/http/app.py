"""The HTTP scheduler extender: filter, prioritize, bind and preempt as kube-scheduler speaks them.

Every verb says which kube-scheduler phase calls it:

- ``POST /scheduler/filter`` — scheduling cycle, after the in-tree Filter plugins;
- ``POST /scheduler/prioritize`` — scheduling cycle, scoring (skipped when one node is feasible);
- ``POST /scheduler/bind`` — binding cycle, one goroutine per pod (may wait at the gang barrier);
- ``POST /scheduler/preempt`` — PostFilter, after a FitError, on the dry-run candidates.

Bad requests get 400 with a message, never 500: kube-scheduler never sends them, but a fuzzer or
a misconfigured client must not crash the process. Results of the service are reported in the
reply (``Error``, failed-node reasons), never as HTTP errors, because kube-scheduler treats a
non-200 as a failure of the whole cycle.
"""

from __future__ import annotations

from typing import Any, Callable

from flask import Flask
from prometheus_client import CollectorRegistry

from cluster import names
from cluster.whatif import Compile
from cycle import BindError, WorkloadCycle
from extender.dashboard import dashboard_blueprint
from extender.dashboard.history import GROUP_CAPACITY
from web import Gate, RequestMetrics, add_health_routes, json_endpoint, new_app, require_token

from .. import verbs
from . import wire

#: Request bodies above this are refused (kube-scheduler without nodeCacheCapable sends every
#: candidate Node object; 10,000 nodes is ~60 MiB).
MAX_BODY_BYTES = 128 * 2**20
VERBS = ("filter", "prioritize", "bind", "preempt")


def create_app(cycle: WorkloadCycle, ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
               extra_registries: tuple[CollectorRegistry, ...] = (), gate: Gate | None = None,
               compile_manifest: Compile | None = None, history_groups: int = GROUP_CAPACITY) -> Flask:
    """The extender's verbs, /healthz, /readyz, /metrics and the dashboard. With a ``gate``, every
    path but the verbs needs a bearer token it accepts (the verbs are kube-scheduler's: protected
    by client certificates or by listening on the pod's loopback, see :mod:`extender.server`).
    ``compile_manifest`` serves the dashboard's what-if (:mod:`extender.dashboard.whatif`);
    ``history_groups``: the groups the dashboard's history keeps."""
    app = new_app("phalanx", MAX_BODY_BYTES, too_large_status=400)
    if gate is not None:
        require_token(app, gate, lambda path: path.startswith("/scheduler/"))
    registry = cycle.metrics.registry
    metrics = RequestMetrics(registry, names.METRIC_EXTENDER_REQUESTS, names.METRIC_EXTENDER_LATENCY, "Extender",
                             label="verb")

    def do_filter(data: Any) -> dict:
        args = wire.ExtenderArgs(data, "filter")
        answer = verbs.filter(cycle, args.pod, args.node_names)
        return wire.filter_result(args, answer.nodes, answer.failed, answer.unresolvable)

    def do_prioritize(data: Any) -> list:
        args = wire.ExtenderArgs(data, "prioritize")
        return wire.host_priorities(verbs.prioritize(cycle, args.pod, args.node_names))

    def do_bind(data: Any) -> dict:
        args = wire.BindingArgs(data)
        try:
            cycle.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        except BindError as err:
            return wire.binding_result(str(err))
        return wire.binding_result()

    def do_preempt(data: Any) -> dict:
        args = wire.PreemptionArgs(data)
        return wire.preemption_result(verbs.preempt(cycle, args.pod, args.meta_victims))

    for name, handler in zip(VERBS, (do_filter, do_prioritize, do_bind, do_preempt), strict=False):
        json_endpoint(app, f"/scheduler/{name}", name, handler, metrics, invalid=(wire.WireError,), oversize_status=400)
    add_health_routes(app, (registry, *extra_registries), ready)
    # the dashboard at / and its JSON API
    app.register_blueprint(dashboard_blueprint(cycle, compile_manifest=compile_manifest,
                                               history_groups=history_groups))
    return app
