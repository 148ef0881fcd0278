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

import logging
import time
from typing import Any, Callable

import orjson
from flask import Flask, Response, request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from cluster import names
from cycle import BindError, WorkloadCycle
from extender.dashboard import dashboard_blueprint

from .. import verbs
from . import wire

log = logging.getLogger("phalanx.extender")

#: Request bodies above this are refused (kube-scheduler without nodeCacheCapable sends every
#: candidate Node object; 10,000 nodes is ~60 MiB).
MAX_BODY_BYTES = 128 * 2**20
VERBS = ("filter", "prioritize", "bind", "preempt")


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(names.METRIC_EXTENDER_REQUESTS.removesuffix("_total"),
                                "Extender requests by verb and HTTP code", ["verb", "code"], registry=registry)
        self.latency = Histogram(names.METRIC_EXTENDER_LATENCY, "Extender request latency by verb", ["verb"],
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30, 120),
                                 registry=registry)


def create_app(cycle: WorkloadCycle, ready: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
               extra_registries: tuple[CollectorRegistry, ...] = ()) -> Flask:
    app = Flask("phalanx")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    registry = cycle.metrics.registry
    metrics = ExtenderMetrics(registry)

    def body() -> Any:
        try:
            raw = request.get_data(cache=False)
        except RequestEntityTooLarge:
            raise wire.WireError(f"request body too large (limit {MAX_BODY_BYTES} bytes)") from None
        if not raw:
            raise wire.WireError("empty request body")
        try:
            return orjson.loads(raw)
        except (orjson.JSONDecodeError, ValueError, UnicodeDecodeError) as err:
            raise wire.WireError(f"request body is not JSON: {err}") from None

    def reply(payload: Any, code: int = 200) -> Response:
        return Response(orjson.dumps(payload), status=code, mimetype="application/json")

    def verb(name: str, handler: Callable[[Any], Any]):
        def view() -> Response:
            started = time.perf_counter()
            try:
                response = reply(handler(body()))
            except wire.WireError as err:
                response = Response(f"phalanx: bad {name} request: {err}\n", status=400, mimetype="text/plain")
            except Exception:  # noqa: BLE001 - never crash on a request; say so instead
                log.exception("%s failed", name)
                response = Response(f"phalanx: internal error in {name}\n", status=500, mimetype="text/plain")
            metrics.requests.labels(verb=name, code=str(response.status_code)).inc()
            metrics.latency.labels(verb=name).observe(time.perf_counter() - started)
            return response

        view.__name__ = f"verb_{name}"
        app.add_url_rule(f"/scheduler/{name}", view_func=view, methods=["POST"])

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
        verb(name, handler)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        code = 400 if err.code == 413 else err.code or 400
        text = "request body too large" if err.code == 413 else err.description
        return Response(f"phalanx: {text}\n", status=code, mimetype="text/plain")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", mimetype="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        ok, why = ready()
        return Response(f"{why}\n", status=200 if ok else 503, mimetype="text/plain")

    @app.get("/metrics")
    def prometheus() -> Response:
        text = generate_latest(registry) + b"".join(generate_latest(r) for r in extra_registries)
        return Response(text, mimetype=CONTENT_TYPE_LATEST)

    app.register_blueprint(dashboard_blueprint(cycle))  # the dashboard at / and its JSON API
    return app
