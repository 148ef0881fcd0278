"""The HTTPS endpoint of ``phalanx controller``: admission webhooks, health and metrics.

A Flask app on phalanx's one HTTP stack (:mod:`web`: cheroot, TLS from the ``--tls-cert``/``--tls-key``
files, request logging and request metrics as the extender has them).

    POST /validate-statefulsets   AdmissionReview v1 -> KEP-6277 admission rules
    POST /mutate-pods             AdmissionReview v1 -> PodGroup reference, ownerReference, gate
    POST /validate-leaderworkersets AdmissionReview v1 -> the LWS gang-scheduling guide's rules
    GET  /healthz                 "ok"
    GET  /metrics                 Prometheus text (statefulset_workload_creation_errors_total, the
                                  webhook requests by path and code, their latency)

A body that is not JSON, not an AdmissionReview, or larger than ``MAX_BODY`` is answered 400 (413)
with a message; an exception inside a review is answered 500 and logged. The API server then
applies the webhook's ``failurePolicy``; the process never goes down for a request.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from flask import Flask, Response, request
from prometheus_client import CollectorRegistry

from cluster import names
from cluster.kinds import MalformedObject, review_request
from web import (
    BadBody,
    Gate,
    Listener,
    RequestMetrics,
    add_health_routes,
    json_endpoint,
    new_app,
    require_token,
    wsgi_server,
)

from .admission import review_statefulset
from .lws_admission import review_leaderworkerset

Review = Callable[[Mapping[str, Any]], dict[str, Any]]

MAX_BODY = 8 << 20  # AdmissionReviews of large pods stay far below this
#: A pod admission may wait up to a few seconds for its PodGroup (``PodMutator.wait``) and must not
#: hold up other admissions: the API server sends a StatefulSet's pods one at a time, but many
#: StatefulSets (and every validation) at once. 64 threads let 60 pods wait at once and leave room
#: for validations and the probes.
THREADS = 64
#: The socket timeout of a connection. cheroot completes the TLS handshake on its accepting thread,
#: so a client that stalls mid-handshake holds up new connections for at most this long; the API
#: server's own webhook timeouts (``timeoutSeconds``) are 5-10 s.
SOCKET_TIMEOUT = 10


def checked(review: Any) -> Mapping[str, Any]:
    """``review`` if it has the shape of an AdmissionReview v1 request (read by cluster.kinds), else
    :class:`BadBody`."""
    try:
        review_request(review)
    except MalformedObject as err:
        raise BadBody(f"not an AdmissionReview: {err}") from None
    body: Mapping[str, Any] = review  # checked: each handler reads its own kind from it
    return body


def _checked_by(review: Review) -> Callable[[Any], dict[str, Any]]:
    """``review`` of a body checked to be an AdmissionReview first."""
    return lambda body: review(checked(body))


def webhook_app(mutate_pod: Review, registry: CollectorRegistry | None = None, gate: Gate | None = None) -> Flask:
    """The webhooks, /healthz and /metrics (``registry``, or one of its own), as a WSGI application.
    With a ``gate``, /metrics needs a bearer token it accepts; the webhooks (the API server's calls)
    and /healthz (the probes') do not."""
    app = new_app("phalanx-controller", MAX_BODY)
    registry = registry if registry is not None else CollectorRegistry()
    metrics = RequestMetrics(registry, names.METRIC_WEBHOOK_REQUESTS, names.METRIC_WEBHOOK_LATENCY, "Admission webhook",
                             label="path")
    routes: dict[str, Review] = {"validate-statefulsets": review_statefulset, "mutate-pods": mutate_pod,
                                 "validate-leaderworkersets": review_leaderworkerset}
    for name, review in routes.items():
        json_endpoint(app, f"/{name}", name, _checked_by(review), metrics)
    add_health_routes(app, (registry,), healthy="ok")
    webhook_paths = {f"/{name}" for name in routes}

    @app.after_request
    def one_call_per_connection(response: Response) -> Response:
        # The API server keeps its webhook connections alive for up to 90 s (Go's transport), this
        # server closes an idle one after SOCKET_TIMEOUT (10 s, its bound on a stalled handshake):
        # a call sent as the server closes the connection fails with EOF and, under
        # failurePolicy Ignore, admits the pod unstamped — one member of a gang then binds alone
        # (seen in the upgrade e2e test, about one run in twelve). A new connection per call
        # (one TLS handshake, about a millisecond) never meets a closing one.
        if request.path in webhook_paths:
            response.headers.set("Connection", "close")
        return response

    if gate is not None:
        open_paths = {"/healthz", *webhook_paths}
        require_token(app, gate, open_paths.__contains__)
    return app


class WebhookServer:
    """The webhook app served over HTTPS on ``addr`` (``HOST:PORT``; port 0 picks a free one)."""

    def __init__(self, addr: str, cert: str, key: str, mutate_pod: Review, registry: CollectorRegistry | None = None,
                 gate: Gate | None = None):
        host, _, port = addr.rpartition(":")
        server = wsgi_server(f"{host or '0.0.0.0'}:{port}", webhook_app(mutate_pod, registry, gate), THREADS, cert,
                             key, timeout=SOCKET_TIMEOUT)
        self.listener = Listener(server, "webhook")

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> "WebhookServer":
        self.listener.start()
        return self

    def stop(self) -> None:
        self.listener.stop()
