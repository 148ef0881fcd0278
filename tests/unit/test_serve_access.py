"""No unauthenticated door: the gRPC endpoint's mTLS (certificates re-read on change), the bearer-token
gate on the HTTP and gRPC read paths, the TokenReview/SubjectAccessReview reviewer, and the start-up
refusal of a listener that would be open. The gate here is a table of tokens (the reviewer against
a real API server is tests/e2e/test_access.py)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster.access import AccessReviewer
from cluster.kube import KubeError
from controller.webhook import webhook_app
from extender.http import create_app
from extender.server import ServeOptions, check_doors
from phalanx_cli.main import main
from proto.phalanx.v1 import scheduler_plugin_pb2 as plugin_pb
from proto.phalanx.v1 import scheduler_plugin_pb2_grpc as plugin_pb_grpc
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from rpc import GrpcTls, start_grpc_server
from tests.e2e.harness.pki import make_pki
from web import Listener, wsgi_server

from .k8s_objects import pod, podgroup

TOKENS = {"viewer-token": "viewer", "nobody-token": "nobody"}  # token -> user; the viewer may read


def table_gate(token: str | None, path: str, verb: str) -> tuple[int, str]:
    user = TOKENS.get(token or "")
    if user is None:
        return 401, "who are you"
    return (200, "ok") if user == "viewer" and verb == "get" else (403, f"{user} may not {verb} {path}")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki-2"))


def served_files(pki, directory: Path) -> GrpcTls:
    """The server's files as a Secret volume has them: copies in a directory of their own."""
    serving = pki.server("phalanx-grpc", ["IP:127.0.0.1", "DNS:localhost"])
    directory.mkdir(parents=True, exist_ok=True)
    for src, name in ((serving.cert, "tls.crt"), (serving.key, "tls.key"), (pki.ca_cert, "ca.crt")):
        shutil.copy(src, directory / name)
    return GrpcTls(str(directory / "tls.crt"), str(directory / "tls.key"), str(directory / "ca.crt"))


def health(addr: str, credentials: grpc.ChannelCredentials | None) -> int:
    """The gRPC health check's status through a channel with ``credentials`` (None: plaintext)."""
    channel = grpc.insecure_channel(addr) if credentials is None else grpc.secure_channel(addr, credentials)
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


def client_credentials(pki, trusted_ca: Path | None = None) -> grpc.ChannelCredentials:
    client = pki.client("phalanx-scheduler", "phalanx-scheduler")
    return grpc.ssl_channel_credentials((trusted_ca or pki.ca_cert).read_bytes(), client.key.read_bytes(),
                                        client.cert.read_bytes())


# -- gRPC mTLS ------------------------------------------------------------------------------------

def test_grpc_mtls_admits_a_client_certificate_and_refuses_none(cycle, pki, tmp_path):
    running = start_grpc_server(cycle, "127.0.0.1:0", tls=served_files(pki, tmp_path / "tls"))
    addr = f"127.0.0.1:{running.port}"
    try:
        assert health(addr, client_credentials(pki)) == health_pb2.HealthCheckResponse.SERVING
        no_cert = grpc.ssl_channel_credentials(pki.ca_cert.read_bytes())
        with pytest.raises(grpc.RpcError) as refused:
            health(addr, no_cert)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE  # the handshake failed
        with pytest.raises(grpc.RpcError) as plain:
            health(addr, None)
        assert plain.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(grace=0)


def test_grpc_certificates_are_reloaded_when_the_files_change(cycle, pki, other_pki, tmp_path):
    """The server's certificate and client CA swapped on disk (as a Secret volume swaps them) are
    used for the next handshake, without a restart; half-written files keep the old ones."""
    files = served_files(pki, tmp_path / "tls")
    running = start_grpc_server(cycle, "127.0.0.1:0", tls=files)
    addr = f"127.0.0.1:{running.port}"
    try:
        old, new = client_credentials(pki), client_credentials(other_pki)
        assert health(addr, old) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError):
            health(addr, new)  # trusts only the other CA, and its certificate is the other CA's
        Path(files.cert).write_text("not a certificate")  # caught half-written
        assert health(addr, old) == health_pb2.HealthCheckResponse.SERVING
        rotated = served_files(other_pki, tmp_path / "tls-2")
        for name in ("tls.crt", "tls.key", "ca.crt"):
            os.replace(Path(rotated.cert).parent / name, Path(files.cert).parent / name)
        assert health(addr, new) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError):
            health(addr, old)
        assert running.certificates is not None and running.certificates.reloads == 1
    finally:
        running.stop(grace=0)


def test_grpc_tls_refuses_a_key_that_does_not_fit_at_start(cycle, pki, other_pki, tmp_path):
    files = served_files(pki, tmp_path / "tls")
    shutil.copy(other_pki.ca_key, files.key)
    with pytest.raises(Exception, match="(?i)key"):
        start_grpc_server(cycle, "127.0.0.1:0", tls=files)


def test_explain_dials_mtls_with_a_token(sim, cycle, pki, tmp_path, capsys):
    running = start_grpc_server(cycle, "127.0.0.1:0", tls=served_files(pki, tmp_path / "tls"), gate=table_gate)
    sim.create(podgroup("g", 1))
    sim.create(pod("g-0", "g"))
    client = pki.client("explain", "explain")
    token = tmp_path / "token"
    token.write_text("viewer-token\n")
    tls = ["--grpc-ca", str(pki.ca_cert), "--grpc-cert", str(client.cert), "--grpc-key", str(client.key)]
    addr = ["--grpc-addr", f"127.0.0.1:{running.port}"]
    try:
        assert main(["explain", "default/g", *addr, *tls, "--token-file", str(token)]) == 0
        assert capsys.readouterr().out.startswith("podgroup default/g: ")
        assert main(["explain", "default/g", *addr, *tls]) == 1  # no token
        assert "unauthenticated" in capsys.readouterr().err
        assert main(["explain", "default/g", *addr, "--grpc-ca", str(pki.ca_cert), "--token-file", str(token)]) == 1
        assert "unavailable" in capsys.readouterr().err  # no client certificate: no handshake
    finally:
        running.stop(grace=0)


# -- the token gate -------------------------------------------------------------------------------

def test_http_gate_401_403_200_and_the_verbs_left_to_the_transport(cycle):
    client = create_app(cycle, gate=table_gate).test_client()
    for path in ("/", "/metrics", "/api/v1/podgroups", "/healthz", "/nowhere"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer nobody-token"}).status_code == 403
    answer = client.get("/metrics", headers={"Authorization": "Bearer nobody-token"})
    assert "nobody may not get /metrics" in answer.text
    assert client.get("/metrics").headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", headers={"Authorization": "Bearer viewer-token"}).status_code == 200
    assert client.get("/api/v1/podgroups", headers={"Authorization": "Bearer viewer-token"}).status_code == 200
    # kube-scheduler's verbs: no token asked (client certificates or loopback guard them)
    assert client.post("/scheduler/filter", data=b"{}").status_code == 400


def test_grpc_gate_guards_the_read_calls_not_the_plugins(sim, cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0", gate=table_gate)
    sim.create(podgroup("g", 1))
    request = pb.ExplainGroupRequest(namespace="default", name="g")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkloadCycleStub(channel)
            for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED),
                                   ((("authorization", "Bearer nobody-token"),), grpc.StatusCode.PERMISSION_DENIED)):
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ExplainGroup(request, metadata=metadata, timeout=5)
                assert refused.value.code() is code
            with pytest.raises(grpc.RpcError) as stream:  # a streaming call is refused the same way
                next(iter(stub.WatchEvents(pb.WatchEventsRequest(), timeout=5)))
            assert stream.value.code() is grpc.StatusCode.UNAUTHENTICATED
            viewer = (("authorization", "Bearer viewer-token"),)
            assert stub.ExplainGroup(request, metadata=viewer, timeout=5).name == "g"
            with pytest.raises(grpc.RpcError) as write:  # PlaceGroup is a create: not the viewer's
                stub.PlaceGroup(pb.PlaceGroupRequest(namespace="default", name="g"), metadata=viewer, timeout=5)
            assert write.value.code() is grpc.StatusCode.PERMISSION_DENIED
            plugin = plugin_pb_grpc.SchedulerPluginStub(channel)
            with pytest.raises(grpc.RpcError) as reached:  # no token asked: the servicer itself answers
                plugin.ReportRejection(plugin_pb.ReportRejectionRequest(), timeout=5)
            assert reached.value.code() is grpc.StatusCode.FAILED_PRECONDITION  # contract version 0
    finally:
        running.stop(grace=0)


# -- the reviewer --------------------------------------------------------------------------------

class RecordingApiServer:
    """Stands in for Kube.create: answers TokenReviews and SubjectAccessReviews from tables and
    records each request (a fake, for the reviewer's bodies and its cache)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.down = False

    def create(self, path: str, body: dict) -> dict:
        self.calls.append((path, body))
        if self.down:
            raise KubeError("POST", path, 0, "transport error")
        if body["kind"] == "TokenReview":
            user = TOKENS.get(body["spec"]["token"])
            return {"status": {"authenticated": True, "user": {"username": user, "uid": "u1", "groups": ["g"],
                                                               "extra": {"k": ["v"]}}} if user else {}}
        spec = body["spec"]
        return {"status": {"allowed": spec["user"] == "viewer" and spec["nonResourceAttributes"]["verb"] == "get"}}


def test_reviewer_asks_token_then_access_and_caches_both_briefly():
    now = [0.0]
    api = RecordingApiServer()
    reviewer = AccessReviewer(api, ttl=10, clock=lambda: now[0])  # type: ignore[arg-type]
    assert reviewer.check("viewer-token", "/metrics", "get").allowed
    (token_path, token_body), (sar_path, sar_body) = api.calls
    assert token_path == "/apis/authentication.k8s.io/v1/tokenreviews" and token_body["spec"] == {"token": "viewer-token"}
    assert sar_path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    assert sar_body["spec"] == {"user": "viewer", "uid": "u1", "groups": ["g"], "extra": {"k": ["v"]},
                                "nonResourceAttributes": {"path": "/phalanx/metrics", "verb": "get"}}
    assert reviewer.check("viewer-token", "/metrics", "get").allowed and len(api.calls) == 2  # cached
    denied = reviewer.check("nobody-token", "/metrics", "get")
    assert denied.authenticated and not denied.allowed and "nobody" in denied.reason
    refused = reviewer.check("stolen", "/metrics", "get")
    assert not refused.authenticated
    calls = len(api.calls)
    reviewer.check("stolen", "/metrics", "get")
    assert len(api.calls) == calls  # a refused token is remembered too
    now[0] = 11
    reviewer.check("viewer-token", "/metrics", "get")
    assert len(api.calls) == calls + 2  # expired: asked again
    assert not reviewer.check(None, "/metrics", "get").authenticated
    api.down = True
    failed = reviewer.check("viewer-token", "/", "get")
    assert not failed.allowed and "cannot review" in failed.reason  # denied, said why; not cached
    api.down = False
    assert reviewer.check("viewer-token", "/", "get").allowed


# -- no open listener -----------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "sim", "why"), [
    (ServeOptions(http_addr="0.0.0.0:8888"), False, "--client-ca"),
    (ServeOptions(grpc_addr="0.0.0.0:50051"), False, "--grpc-tls-cert"),
    (ServeOptions(grpc_tls_cert="c", grpc_tls_key="k"), False, "go together"),
    (ServeOptions(insecure_loopback_no_auth=True, http_addr="0.0.0.0:8888", client_ca="ca"), False, "loopback only"),
    (ServeOptions(), True, "--insecure-loopback-no-auth"),
])
def test_serve_refuses_an_open_door(options, sim, why):
    with pytest.raises(ValueError, match=why):
        check_doors(options, sim)


def test_serve_accepts_loopback_and_mtls():
    check_doors(ServeOptions(), sim=False)
    check_doors(ServeOptions(insecure_loopback_no_auth=True, http_addr="[::1]:0", grpc_addr="localhost:1"), sim=True)
    check_doors(ServeOptions(http_addr="0.0.0.0:8888", client_ca="ca", grpc_addr="0.0.0.0:50051",
                             grpc_tls_cert="c", grpc_tls_key="k", grpc_client_ca="ca"), sim=False)


def test_controller_port_guards_metrics_not_the_webhooks_or_the_probe():
    client = webhook_app(lambda review: {"allowed": True}, gate=table_gate).test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer nobody-token"}).status_code == 403
    assert client.get("/metrics", headers={"Authorization": "Bearer viewer-token"}).status_code == 200
    assert client.get("/healthz").status_code == 200  # the kubelet's probe
    assert client.post("/validate-statefulsets", data=b"{}").status_code == 200  # the API server's call: answered


def test_https_listener_presents_a_renewed_certificate_without_a_restart(pki, tmp_path):
    """The extender's HTTPS (--tls-cert, --client-ca) re-reads its files on change, like gRPC."""
    files = served_files(pki, tmp_path / "tls")

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    listener = Listener(wsgi_server("127.0.0.1:0", app, 2, files.cert, files.key, files.client_ca), "t").start()
    client = pki.client("https-probe", "https-probe")
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(client.cert), str(client.key))

    def presented() -> bytes:
        with socket.create_connection(("127.0.0.1", listener.port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)

    try:
        assert presented() == ssl.PEM_cert_to_DER_cert(Path(files.cert).read_text())
        renewed = pki.server("phalanx-https-renewed", ["IP:127.0.0.1"])
        shutil.copy(renewed.cert, tmp_path / "new.crt")
        shutil.copy(renewed.key, tmp_path / "new.key")
        os.replace(tmp_path / "new.crt", files.cert)
        os.replace(tmp_path / "new.key", files.key)
        assert presented() == ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
        assert listener.server.ssl_adapter.reloads == 1
    finally:
        listener.stop()


def test_a_barrier_shorter_than_kube_schedulers_longest_backoff_is_warned_about():
    from extender.server import barrier_advice
    assert barrier_advice(ServeOptions()) == ""  # the default, 30 s
    assert barrier_advice(ServeOptions(barrier_timeout=10.0)) == ""
    advice = barrier_advice(ServeOptions(barrier_timeout=8.0))
    assert "--barrier-timeout 8s" in advice and "podMaxBackoffSeconds" in advice
