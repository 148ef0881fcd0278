"""web/, the HTTP stack of the extender and the controller: JSON endpoints that answer a bad body
with 400 (413 when too large) and a crash with 500, request metrics, health routes, and cheroot
servers with TLS and client certificates."""

from __future__ import annotations

import http.client
import shutil
import ssl
import subprocess

import pytest
from prometheus_client import CollectorRegistry, Counter

from web import Listener, RequestMetrics, add_health_routes, json_endpoint, new_app, split_addr, wsgi_server


class Refused(Exception):
    pass


def echo(body):
    if body == "refuse":
        raise Refused("no thanks")
    if body == "crash":
        raise RuntimeError("boom")
    return {"got": body}


def make_app(oversize_status: int = 413, max_body: int = 64):
    registry = CollectorRegistry()
    app = new_app("test", max_body, too_large_status=oversize_status)
    metrics = RequestMetrics(registry, "test_requests_total", "test_request_duration_seconds", "Test")
    json_endpoint(app, "/echo", "echo", echo, metrics, invalid=(Refused,), oversize_status=oversize_status)
    ready = {"ok": True}
    add_health_routes(app, (registry,), lambda: (ready["ok"], "ok" if ready["ok"] else "caches not synced"))
    return app, registry, ready


def count(registry, code: str) -> float:
    return registry.get_sample_value("test_requests_total", {"endpoint": "echo", "code": code}) or 0.0


def test_a_json_body_is_handled_and_answered_as_json():
    app, registry, _ = make_app()
    resp = app.test_client().post("/echo", data=b'{"a": 1}', content_type="application/json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    assert resp.get_json() == {"got": {"a": 1}}
    assert count(registry, "200") == 1
    assert registry.get_sample_value("test_request_duration_seconds_count", {"endpoint": "echo"}) == 1


@pytest.mark.parametrize("data, says", [
    (b"{not json", "request body is not JSON"),
    (b"", "empty request body"),
    (b"\xff\xfe", "request body is not JSON"),
    (b'"refuse"', "no thanks"),
])
def test_a_bad_body_gets_400_with_a_message(data, says):
    app, registry, _ = make_app()
    resp = app.test_client().post("/echo", data=data, content_type="application/json")
    assert resp.status_code == 400, resp.data
    assert resp.get_data(as_text=True).startswith("phalanx: bad echo request: ") and says in resp.get_data(as_text=True)
    assert count(registry, "400") == 1


@pytest.mark.parametrize("oversize_status", [413, 400])
def test_an_oversize_body_gets_the_endpoints_status(oversize_status):
    app, registry, _ = make_app(oversize_status)
    resp = app.test_client().post("/echo", data=b'"' + b"x" * 100 + b'"', content_type="application/json")
    assert resp.status_code == oversize_status
    assert "request body too large (limit 64 bytes)" in resp.get_data(as_text=True)
    assert count(registry, str(oversize_status)) == 1


def test_a_crashing_handler_gets_500_and_the_app_keeps_serving():
    app, registry, _ = make_app()
    client = app.test_client()
    resp = client.post("/echo", data=b'"crash"')
    assert resp.status_code == 500 and resp.get_data(as_text=True) == "phalanx: internal error in echo\n"
    assert client.post("/echo", data=b"1").status_code == 200
    assert count(registry, "500") == 1 and count(registry, "200") == 1


def test_http_errors_are_one_line_of_text():
    app, _, _ = make_app()
    client = app.test_client()
    missing = client.post("/nowhere", data=b"{}")
    assert missing.status_code == 404 and missing.mimetype == "text/plain"
    assert missing.get_data(as_text=True).startswith("phalanx: ")
    assert client.get("/echo").status_code == 405


def test_health_readiness_and_metrics():
    app, registry, ready = make_app()
    Counter("test_other", "another metric", registry=registry).inc()
    client = app.test_client()
    assert (client.get("/healthz").status_code, client.get("/healthz").get_data(as_text=True)) == (200, "ok\n")
    assert client.get("/readyz").status_code == 200
    ready["ok"] = False
    not_ready = client.get("/readyz")
    assert (not_ready.status_code, not_ready.get_data(as_text=True)) == (503, "caches not synced\n")
    client.post("/echo", data=b"1")
    text = client.get("/metrics").get_data(as_text=True)
    assert 'test_requests_total{code="200",endpoint="echo"} 1.0' in text and "test_other_total 1.0" in text


def test_readyz_is_only_served_with_a_readiness_check():
    app = new_app("bare", 64)
    add_health_routes(app, (), healthy="ok")
    client = app.test_client()
    assert client.get("/healthz").get_data(as_text=True) == "ok"
    assert client.get("/readyz").status_code == 404


@pytest.mark.parametrize("addr, parsed", [("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:8443", ("::1", 8443)),
                                          ("0.0.0.0:0", ("0.0.0.0", 0))])
def test_split_addr(addr, parsed):
    assert split_addr(addr) == parsed


@pytest.mark.parametrize("addr", ["8080", ":8080", "host:", "host:http"])
def test_split_addr_refuses_what_is_not_host_port(addr):
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_addr(addr)


def test_a_certificate_needs_its_key():
    app, _, _ = make_app()
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        wsgi_server("127.0.0.1:0", app, 2, tls_cert="server.crt")
    with pytest.raises(ValueError, match="go together"):
        wsgi_server("127.0.0.1:0", app, 2, client_ca="ca.crt")


def self_signed(directory, name: str):
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def post(port: int, context: ssl.SSLContext | None, body: bytes = b'{"a": 1}') -> tuple[int, bytes]:
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10) if context
            else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.request("POST", "/echo", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_listener_serves_plain_http_until_stopped():
    app, _, _ = make_app()
    listener = Listener(wsgi_server("127.0.0.1:0", app, 2), "test-http").start()
    try:
        assert listener.serving() and listener.port > 0
        assert post(listener.port, None) == (200, b'{"got":{"a":1}}')
    finally:
        listener.stop()
    assert not listener.serving()


@needs_openssl
def test_tls_with_client_certificates(tmp_path):
    server_cert, server_key = self_signed(tmp_path, "server")
    client_cert, client_key = self_signed(tmp_path, "client")
    app, _, _ = make_app()
    listener = Listener(wsgi_server("127.0.0.1:0", app, 2, str(server_cert), str(server_key), str(client_cert)),
                        "test-https").start()
    try:
        trusting = ssl.create_default_context(cafile=str(server_cert))
        with pytest.raises((ssl.SSLError, ConnectionError)):  # no client certificate: refused
            post(listener.port, trusting)
        trusting.load_cert_chain(str(client_cert), str(client_key))
        assert post(listener.port, trusting) == (200, b'{"got":{"a":1}}')
    finally:
        listener.stop()
