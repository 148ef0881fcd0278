"""No unauthenticated door, against the real API server: phalanx serve with gRPC mTLS and token
reviews on (its default), phalanx-scheduler dialling it with a client certificate.

- the dashboard, /metrics and ``phalanx explain``: no token 401 (UNAUTHENTICATED), a ServiceAccount
  token without the shipped ClusterRole phalanx-viewer 403 (PERMISSION_DENIED), with it 200;
- a client without a certificate does not get through the gRPC handshake;
- serve's certificate renewed on disk is served from the next handshake on, without a restart,
  while phalanx-scheduler's connection goes on placing gangs.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import GPU, create, phalanx_scheduler_config, pod, podgroup, wait_all_bound, wait_for

from extender.server import ServeOptions, build
from phalanx_cli.main import main

RBAC = Path(__file__).resolve().parents[2] / "scheduler-config" / "rbac.yaml"
BARRIER = 8.0


def serve_files(control_plane, directory: Path, name: str) -> dict[str, str]:
    """A serving certificate for 127.0.0.1 in ``directory`` (tls.crt, tls.key, ca.crt), as a Secret
    volume holds it."""
    serving = control_plane.pki.server(name, ["IP:127.0.0.1"])
    directory.mkdir(parents=True, exist_ok=True)
    for src, dst in ((serving.cert, "tls.crt"), (serving.key, "tls.key"), (control_plane.pki.ca_cert, "ca.crt")):
        shutil.copy(src, directory / dst)
    return {"grpc_tls_cert": str(directory / "tls.crt"), "grpc_tls_key": str(directory / "tls.key"),
            "grpc_client_ca": str(directory / "ca.crt")}


@pytest.fixture(scope="module")
def secure_phalanx(control_plane, tmp_path_factory):
    files = serve_files(control_plane, tmp_path_factory.mktemp("serve-tls"), "phalanx-grpc-access")
    service = build(ServeOptions(http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0", http_threads=64,
                                 barrier_timeout=BARRIER, **files),
                    kubeconfig=str(control_plane.admin_kubeconfig)).start()
    yield service, files
    service.stop()


@pytest.fixture(scope="module")
def tokens(control_plane, secure_phalanx):
    """ServiceAccount tokens (TokenRequest): ``viewer`` bound to the shipped phalanx-viewer rules,
    ``stranger`` to nothing."""
    rest = control_plane.rest
    suffix = uuid.uuid4().hex[:6]
    namespace, role = f"access-{suffix}", f"phalanx-viewer-{suffix}"
    (shipped,) = [d for d in yaml.safe_load_all(RBAC.read_text())
                  if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "phalanx-viewer"]
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    rest.create(f"{rbac}/clusterroles", {**shipped, "metadata": {"name": role}})
    rest.create(f"{rbac}/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}]})
    out = {}
    for name in ("viewer", "stranger"):
        rest.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        out[name] = rest.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                 "spec": {"expirationSeconds": 3600}})["status"]["token"]
    user = f"system:serviceaccount:{namespace}:viewer"
    wait_for(lambda: rest.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "nonResourceAttributes": {"path": "/phalanx/metrics", "verb": "get"}}})["status"].get("allowed"),
        30, "RBAC sees the viewer's binding")  # before phalanx caches an answer
    yield out
    rest.delete(f"{rbac}/clusterrolebindings/{role}", missing_ok=True)
    rest.delete(f"{rbac}/clusterroles/{role}", missing_ok=True)
    rest.delete(f"/api/v1/namespaces/{namespace}", missing_ok=True)


def get_status(port: int, path: str, token: str | None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 (loopback)
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_dashboard_and_metrics_answer_401_403_200(secure_phalanx, tokens):
    """Every authenticated user holds upstream's system:discovery (/api/*) and
    system:public-info-viewer (/healthz, /readyz): none of that opens phalanx's paths."""
    service, _ = secure_phalanx
    for path in ("/", "/metrics", "/api/v1/podgroups", "/dashboard/static/app.js", "/healthz", "/readyz"):
        assert get_status(service.port, path, None) == 401, path
        assert get_status(service.port, path, "not-a-token") == 401, path
        assert get_status(service.port, path, tokens["stranger"]) == 403, path
        assert get_status(service.port, path, tokens["viewer"]) == 200, path


def test_explain_needs_certificate_and_token_with_the_role(control_plane, secure_phalanx, tokens, tmp_path, capsys):
    service, _ = secure_phalanx
    client = control_plane.pki.client("explain-access", "explain")
    tls = ["--grpc-addr", f"127.0.0.1:{service.grpc.port}", "--grpc-ca", str(control_plane.pki.ca_cert),
           "--grpc-cert", str(client.cert), "--grpc-key", str(client.key)]
    for who in ("viewer", "stranger"):
        (tmp_path / who).write_text(tokens[who])
    assert main(["explain", "default/nothing-here", *tls, "--token-file", str(tmp_path / "viewer")]) == 1
    assert "not_found: podgroup default/nothing-here does not exist" in capsys.readouterr().err  # the service's answer
    assert main(["explain", "default/nothing-here", *tls, "--token-file", str(tmp_path / "stranger")]) == 1
    assert "permission_denied" in capsys.readouterr().err
    assert main(["explain", "default/nothing-here", *tls]) == 1
    assert "unauthenticated" in capsys.readouterr().err


def test_a_client_without_a_certificate_cannot_reach_the_grpc_port(control_plane, secure_phalanx):
    service, _ = secure_phalanx
    for credentials in (grpc.ssl_channel_credentials(control_plane.pki.ca_cert.read_bytes()), None):
        channel = (grpc.insecure_channel if credentials is None else
                   lambda a, c=credentials: grpc.secure_channel(a, c))(f"127.0.0.1:{service.grpc.port}")
        with channel, pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE  # no handshake, no call


def served_certificate(control_plane, port: int) -> bytes:
    """The DER certificate serve presents to a client with a certificate, in a fresh handshake."""
    client = control_plane.pki.client("rotation-probe", "rotation-probe")
    context = ssl.create_default_context(cafile=str(control_plane.pki.ca_cert))
    context.load_cert_chain(str(client.cert), str(client.key))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.getpeercert(binary_form=True)


def place_gang(rest, namespace: str, name: str, scheduler_name: str) -> None:
    create(rest, podgroup(name, min_count=2), namespace)
    for i in range(2):
        create(rest, pod(f"{name}-{i}", name, {"cpu": "1", GPU: 1}, scheduler_name=scheduler_name), namespace)
    assert len(wait_all_bound(rest, namespace, count=2, timeout=60, podgroup=name)) == 2


def test_plugin_mode_through_mtls_and_a_renewed_certificate(rest, namespace, nodes, control_plane, secure_phalanx,
                                                           tmp_path):
    service, files = secure_phalanx
    client = control_plane.pki.client("phalanx-scheduler-access", "phalanx-scheduler")
    config = phalanx_scheduler_config("plugin", service.port, service.grpc.port, BARRIER, "phalanx-mtls")
    config["profiles"][0]["pluginConfig"][0]["args"]["tls"] = {
        "caFile": str(control_plane.pki.ca_cert), "certFile": str(client.cert), "keyFile": str(client.key)}
    scheduler = control_plane.start_scheduler(config, binary="phalanx-scheduler", name="phalanx-scheduler-mtls")
    try:
        nodes.add("mtls-0", gpu=4, rack="rm")
        place_gang(rest, namespace, "before", "phalanx-mtls")

        renewed = serve_files(control_plane, tmp_path / "renewed", "phalanx-grpc-renewed")
        expected = ssl.PEM_cert_to_DER_cert(Path(renewed["grpc_tls_cert"]).read_text())
        assert served_certificate(control_plane, service.grpc.port) != expected
        for key in ("grpc_tls_cert", "grpc_tls_key"):  # swapped in place, as a Secret volume does
            shutil.move(renewed[key], files[key])
        assert served_certificate(control_plane, service.grpc.port) == expected  # the next handshake
        assert service.grpc.certificates.reloads == 1
        place_gang(rest, namespace, "after", "phalanx-mtls")  # the plugin's connection goes on
    finally:
        scheduler.stop()
