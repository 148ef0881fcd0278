"""What every phalanx Flask application does the same way: read a JSON body under a size limit,
answer a bad one with 400 (413 when too large, if the endpoint says so) and a message instead of
500, count and time each request, log it, and serve /healthz, /readyz and /metrics.

A request that cannot be read is the client's fault and is said so in the answer; an exception
inside a handler is phalanx's and is answered 500 and logged with its traceback. Neither ever
takes the process down.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

import orjson
from flask import Flask, Response, request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

log = logging.getLogger("phalanx.web")

Check = Callable[[], tuple[bool, str]]
#: who may call: ``gate(bearer token or None, path, verb)`` -> (200, "ok"), or (401 or 403, why)
Gate = Callable[[str | None, str, str], tuple[int, str]]
#: the verb of an HTTP method, as the API server and kube-rbac-proxy name it for authorization
HTTP_VERBS = {"GET": "get", "HEAD": "get", "OPTIONS": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
              "DELETE": "delete"}
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30, 120)


class BadBody(ValueError):
    """A request body the endpoint cannot read (answered 400, or ``status``)."""

    status = 400


class BodyTooLarge(BadBody):
    status = 413


class RequestMetrics:
    """Requests by endpoint and HTTP code (a counter) and their latency by endpoint (a histogram)."""

    def __init__(self, registry: CollectorRegistry, requests_name: str, latency_name: str, what: str,
                 label: str = "endpoint") -> None:
        self.label = label
        self.requests = Counter(requests_name.removesuffix("_total"), f"{what} requests by {label} and HTTP code",
                                [label, "code"], registry=registry)
        self.latency = Histogram(latency_name, f"{what} request latency by {label}", [label],
                                 buckets=LATENCY_BUCKETS, registry=registry)

    def observe(self, name: str, code: int, seconds: float) -> None:
        self.requests.labels(**{self.label: name, "code": str(code)}).inc()
        self.latency.labels(**{self.label: name}).observe(seconds)


def new_app(name: str, max_body: int, too_large_status: int = 413) -> Flask:
    """A Flask app refusing bodies over ``max_body`` bytes, answering HTTP errors (unknown path,
    wrong method, too large) as one line of text."""
    app = Flask(name)
    app.config["MAX_CONTENT_LENGTH"] = max_body

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        if err.code == 413:
            return text("phalanx: request body too large\n", too_large_status)
        return text(f"phalanx: {err.description}\n", err.code or 400)

    return app


def read_json(limit: int) -> Any:
    """The current request's body as JSON; :class:`BadBody` when it is empty, not JSON or over
    ``limit`` bytes (the app's MAX_CONTENT_LENGTH)."""
    try:
        raw = request.get_data(cache=False)
    except RequestEntityTooLarge:
        raise BodyTooLarge(f"request body too large (limit {limit} bytes)") from None
    if not raw:
        raise BadBody("empty request body")
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, ValueError, UnicodeDecodeError) as err:
        raise BadBody(f"request body is not JSON: {err}") from None


def text(body: str, status: int = 200) -> Response:
    return Response(body, status=status, mimetype="text/plain")


def json_reply(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype="application/json")


def json_endpoint(app: Flask, rule: str, name: str, handler: Callable[[Any], Any], metrics: RequestMetrics,
                  invalid: tuple[type[Exception], ...] = (), oversize_status: int = 413) -> None:
    """POST ``rule``: ``handler(body)`` answered as JSON. A body that cannot be read, or one the
    handler refuses by raising one of ``invalid``, gets 400 (an oversize one ``oversize_status``);
    any other exception gets 500. Every request is counted, timed and logged under ``name``."""
    limit = int(app.config["MAX_CONTENT_LENGTH"])
    refused: tuple[type[Exception], ...] = (BadBody, *invalid)

    def view() -> Response:
        started = time.perf_counter()
        try:
            response = json_reply(handler(read_json(limit)))
        except refused as err:
            status = oversize_status if isinstance(err, BodyTooLarge) else 400
            response = text(f"phalanx: bad {name} request: {err}\n", status)
        except Exception:  # noqa: BLE001 - never crash on a request; say so instead
            log.exception("%s failed", name)
            response = text(f"phalanx: internal error in {name}\n", 500)
        elapsed = time.perf_counter() - started
        metrics.observe(name, response.status_code, elapsed)
        log.debug("%s %s -> %d in %.1f ms", request.method, request.path, response.status_code, elapsed * 1e3)
        return response

    view.__name__ = f"post_{name}"
    app.add_url_rule(rule, view_func=view, methods=["POST"])


def add_health_routes(app: Flask, registries: Iterable[CollectorRegistry], ready: Check | None = None,
                      healthy: str = "ok\n") -> None:
    """GET /healthz (``healthy``), /readyz when given a ``ready`` check (503 with its reason when
    not ready), and /metrics (the Prometheus text of ``registries``)."""
    registries = tuple(registries)

    @app.get("/healthz")
    def healthz() -> Response:
        return text(healthy)

    if ready is not None:
        @app.get("/readyz")
        def readyz() -> Response:
            ok, why = ready()
            return text(f"{why}\n", 200 if ok else 503)

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(b"".join(generate_latest(r) for r in registries), mimetype=CONTENT_TYPE_LATEST)


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, None without one."""
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def require_token(app: Flask, gate: Gate, open_path: Callable[[str], bool]) -> None:
    """Every request but those ``open_path`` lets through must carry a bearer token ``gate`` accepts
    for its path and verb: 401 without one or with one the gate cannot authenticate, 403 when its
    user may not."""

    @app.before_request
    def authorize() -> Response | None:
        if open_path(request.path):
            return None
        verb = HTTP_VERBS.get(request.method, request.method.lower())
        status, why = gate(bearer_token(request.headers.get("Authorization")), request.path, verb)
        if status == 200:
            return None
        response = text(f"phalanx: {why}\n", status)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="phalanx"'
        log.info("%s %s refused (%d): %s", request.method, request.path, status, why)
        return response
