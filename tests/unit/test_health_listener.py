"""The probe listener of ``phalanx serve --health-addr``: /healthz and /readyz only, liveness
following the extender's own HTTP server, and nothing of the extender reachable through it."""

from __future__ import annotations

import http.client

import pytest

from cluster.sim import SimCluster
from extender.server import ServeOptions, build


def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=b"{}" if method == "POST" else None)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


@pytest.fixture
def phalanx():
    service = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="", http_threads=8), sim=SimCluster()).start()
    service.serve_health("127.0.0.1:0")
    yield service
    service.stop()


def test_probes_answer_on_their_own_port(phalanx):
    assert phalanx.health_port not in (None, phalanx.port)
    assert get(phalanx.health_port, "/healthz") == (200, "ok\n")
    assert get(phalanx.health_port, "/readyz") == (200, "ok (simulated cluster)\n")


@pytest.mark.parametrize(("method", "path"), [("POST", "/scheduler/bind"), ("POST", "/scheduler/filter"),
                                              ("GET", "/metrics"), ("GET", "/"), ("POST", "/healthz")])
def test_nothing_of_the_extender_is_served_there(phalanx, method, path):
    status, text = get(phalanx.health_port, path, method)
    assert status == 404 and "/healthz and /readyz only" in text


def test_liveness_fails_once_the_extender_stops_serving(phalanx):
    phalanx.server.stop()
    status, text = get(phalanx.health_port, "/healthz")
    assert status == 503 and "not serving" in text
