"""The HTTPS endpoint of ``phalanx controller``: admission webhooks, health and metrics.

Standard library only: a thread per connection (a pod admission may wait a few seconds for its
PodGroup, and must not hold up other admissions), TLS from the ``--tls-cert``/``--tls-key`` files,
the handshake done in the connection's thread so one slow client never blocks ``accept``.

    POST /validate-statefulsets   AdmissionReview v1 -> KEP-6277 admission rules
    POST /mutate-pods             AdmissionReview v1 -> PodGroup reference, ownerReference, gate
    POST /validate-leaderworkersets AdmissionReview v1 -> the LWS gang-scheduling guide's rules
    GET  /healthz                 "ok"
    GET  /metrics                 Prometheus text (statefulset_workload_creation_errors_total)
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry, generate_latest

from .admission import review_statefulset
from .lws_admission import review_leaderworkerset

log = logging.getLogger(__name__)

MAX_BODY = 8 << 20  # AdmissionReviews of large pods stay far below this


class WebhookServer:
    def __init__(self, addr: str, cert: str, key: str, mutate_pod: Callable[[Mapping[str, Any]], dict],
                 registry: CollectorRegistry | None = None):
        host, _, port = addr.rpartition(":")
        routes: dict[str, Callable[[Mapping[str, Any]], dict]] = {
            "/validate-statefulsets": review_statefulset, "/mutate-pods": mutate_pod,
            "/validate-leaderworkersets": review_leaderworkerset}
        self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), _handler(routes, registry))
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> "WebhookServer":
        self._thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(routes: Mapping[str, Callable[[Mapping[str, Any]], dict]],
             registry: CollectorRegistry | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError) as err:
                log.debug("TLS handshake: %s", err)
                self.close_connection = True
                raise

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/healthz":
                self._send(200, b"ok", "text/plain")
            elif self.path == "/metrics" and registry is not None:
                self._send(200, generate_latest(registry), "text/plain; version=0.0.4")
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:  # noqa: N802
            route = routes.get(self.path.split("?")[0])
            length = int(self.headers.get("Content-Length") or 0)
            if route is None or length > MAX_BODY:
                self._send(404 if route is None else 413, b"", "text/plain")
                return
            try:
                review = json.loads(self.rfile.read(length))
                answer = route(review)
            except Exception as err:  # noqa: BLE001 — answer, never crash: failurePolicy decides
                log.exception("admission %s", self.path)
                self._send(500, json.dumps({"error": str(err)}).encode(), "application/json")
                return
            self._send(200, json.dumps(answer).encode(), "application/json")

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("webhook: " + fmt, *args)

    return Handler
