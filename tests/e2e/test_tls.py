"""phalanx over HTTPS with client certificates (mTLS), as scheduler-config/kube-scheduler-config-tls.yaml
sets it up, with the real kube-scheduler as the client; and the second-scheduler config file
accepted by kube-scheduler's strict decoder."""

from __future__ import annotations

import http.client
import ssl
from pathlib import Path

import pytest
import yaml
from harness import GPU, create, pod, podgroup, wait_all_bound

from extender.server import ServeOptions, build

CONFIGS = Path(__file__).resolve().parents[2] / "scheduler-config"


@pytest.fixture(scope="module")
def tls_phalanx(control_plane):
    serving = control_plane.pki.server("phalanx-extender", ["IP:127.0.0.1", "DNS:localhost"])
    service = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="", http_threads=64, barrier_timeout=8,
                                 tls_cert=str(serving.cert), tls_key=str(serving.key),
                                 client_ca=str(control_plane.pki.ca_cert)),
                    kubeconfig=str(control_plane.admin_kubeconfig)).start()
    yield service
    service.stop()


def test_kube_scheduler_places_a_gang_through_mtls(rest, namespace, nodes, control_plane, tls_phalanx,
                                                   start_scheduler):
    client = control_plane.pki.client("scheduler-extender-client", "kube-scheduler")
    config = yaml.safe_load((CONFIGS / "kube-scheduler-config-tls.yaml").read_text())
    ext = config["extenders"][0]
    ext["urlPrefix"] = f"https://127.0.0.1:{tls_phalanx.port}/scheduler"
    ext["tlsConfig"] = {"caFile": str(control_plane.pki.ca_cert), "certFile": str(client.cert),
                        "keyFile": str(client.key), "serverName": "127.0.0.1"}
    config["profiles"] = [{"schedulerName": "phalanx-tls"}]
    start_scheduler(config)
    nodes.add("tls-0", gpu=4, rack="rt")
    create(rest, podgroup("secure", min_count=3), namespace)
    for i in range(3):
        create(rest, pod(f"secure-{i}", "secure", {"cpu": "1", GPU: 1}, scheduler_name="phalanx-tls"), namespace)
    assert len(wait_all_bound(rest, namespace, count=3, timeout=60, podgroup="secure")) == 3


def test_a_client_without_a_certificate_is_refused(control_plane, tls_phalanx):
    context = ssl.create_default_context(cafile=str(control_plane.pki.ca_cert))
    conn = http.client.HTTPSConnection("127.0.0.1", tls_phalanx.port, context=context, timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError)):
        conn.request("POST", "/scheduler/bind", body=b"{}")
        conn.getresponse().read()


def test_second_scheduler_config_is_accepted_by_kube_scheduler(start_scheduler):
    config = yaml.safe_load((CONFIGS / "kube-scheduler-second.yaml").read_text())
    config["profiles"] = [{"schedulerName": "phalanx-second-check"}]
    scheduler = start_scheduler(config)  # strict decoding: a bad key would stop it from starting
    assert scheduler.metrics()
