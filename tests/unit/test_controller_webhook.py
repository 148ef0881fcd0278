"""The controller's HTTPS endpoint: the admission webhooks, /healthz and /metrics on phalanx's one
HTTP stack. Bad bodies get 400 (413 when too large) with a message, never 500; a pod admission
waiting for its PodGroup does not hold up other admissions."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter

from cluster import names
from controller import WebhookServer
from controller.webhook import MAX_BODY, webhook_app
from tests.unit.controller_fakes import statefulset

GANG = {"schedulingPolicy": {"gang": {}}}


def allow_pod(review):
    request = review["request"]
    if (request.get("object") or {}).get("crash"):
        raise RuntimeError("mutator broke")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": request["uid"], "allowed": True}}


def sts_review(sts, uid="u1"):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "namespace": "ns", "object": sts}}


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def client(registry):
    return webhook_app(allow_pod, registry).test_client()


def requests_counted(registry, path, code):
    return registry.get_sample_value(names.METRIC_WEBHOOK_REQUESTS, {"path": path, "code": code}) or 0.0


def test_statefulset_validation_answers_an_admission_review(client, registry):
    resp = client.post("/validate-statefulsets", json=sts_review(statefulset(scheduling=GANG, policy="OrderedReady")))
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    answer = resp.get_json()["response"]
    assert answer["uid"] == "u1" and answer["allowed"] is False and "Parallel" in answer["status"]["message"]
    assert client.post("/validate-statefulsets", json=sts_review(statefulset(scheduling=GANG))).get_json()[
        "response"]["allowed"] is True
    assert requests_counted(registry, "validate-statefulsets", "200") == 2


def test_each_webhook_call_asks_for_its_own_connection_and_the_probes_keep_theirs(client):
    """An idle connection the server closes as the API server reuses it would fail the call with
    EOF and, under failurePolicy Ignore, admit a gang's pod unstamped: webhook answers close it."""
    for path, body in (("/mutate-pods", sts_review({"kind": "Pod"}, "p1")),
                       ("/validate-statefulsets", sts_review(statefulset(scheduling=GANG))),
                       ("/validate-leaderworkersets", sts_review({"kind": "LeaderWorkerSet"}, "l1"))):
        assert client.post(path, json=body).headers.get("Connection") == "close", path
    assert client.post("/mutate-pods", data=b"{not json", content_type="application/json").headers.get(
        "Connection") == "close"  # an error answer too
    assert client.get("/healthz").headers.get("Connection") != "close"


def test_pods_go_to_the_mutator_and_lws_to_their_rules(client):
    assert client.post("/mutate-pods?timeout=10s", json=sts_review({"kind": "Pod"}, "p1")).get_json() == {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "p1", "allowed": True}}
    lws = client.post("/validate-leaderworkersets", json=sts_review({"kind": "LeaderWorkerSet"}, "l1"))
    assert lws.status_code == 200 and lws.get_json()["response"]["uid"] == "l1"


@pytest.mark.parametrize("body, says", [
    (b"{not json", "request body is not JSON"),
    (b"", "empty request body"),
    (b"[1, 2]", "not an AdmissionReview: AdmissionReview must be an object"),
    (b'{"request": "x"}', "not an AdmissionReview: AdmissionReview: request must be an object"),
    (b'{"request": {"uid": "u", "operation": "CREATE", "object": [1]}}', "request.object must be an object"),
    (b'{"request": {"uid": "u", "operation": "UPDATE", "object": {}, "oldObject": 3}}', "request.oldObject"),
])
@pytest.mark.parametrize("path", ["/validate-statefulsets", "/mutate-pods", "/validate-leaderworkersets"])
def test_a_bad_body_gets_400_with_a_message(client, registry, path, body, says):
    resp = client.post(path, data=body, content_type="application/json")
    assert resp.status_code == 400
    assert says in resp.get_data(as_text=True)
    assert requests_counted(registry, path.lstrip("/"), "400") == 1


def test_an_oversize_body_gets_413(client, registry):
    resp = client.post("/mutate-pods", data=b" " * (MAX_BODY + 1), content_type="application/json")
    assert resp.status_code == 413 and "too large" in resp.get_data(as_text=True)
    assert requests_counted(registry, "mutate-pods", "413") == 1


def test_a_review_that_raises_gets_500_and_the_server_keeps_answering(client, registry):
    resp = client.post("/mutate-pods", json=sts_review({"crash": True}))
    assert resp.status_code == 500 and "internal error in mutate-pods" in resp.get_data(as_text=True)
    assert client.post("/mutate-pods", json=sts_review({})).status_code == 200


def test_unknown_paths_get_404(client):
    assert client.post("/validate-pods", json=sts_review({})).status_code == 404
    assert client.get("/nothing").status_code == 404


def test_healthz_and_metrics(client, registry):
    Counter(names.METRIC_STS_WORKLOAD_ERRORS.removesuffix("_total"), "errors", registry=registry).inc()
    assert (client.get("/healthz").status_code, client.get("/healthz").get_data(as_text=True)) == (200, "ok")
    client.post("/mutate-pods", json=sts_review({}))
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and metrics.mimetype == "text/plain"
    text = metrics.get_data(as_text=True)
    assert f"{names.METRIC_STS_WORKLOAD_ERRORS} 1.0" in text
    assert f'{names.METRIC_WEBHOOK_REQUESTS}{{code="200",path="mutate-pods"}} 1.0' in text
    assert f"{names.METRIC_WEBHOOK_LATENCY}_count" in text


# -- over HTTPS --------------------------------------------------------------------------------------

@pytest.fixture
def tls(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "webhook.crt", tmp_path / "webhook.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=webhook",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def post(port, cert, path, review):
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=cert), timeout=20)
    try:
        conn.request("POST", path, body=json.dumps(review), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_waiting_pod_admission_does_not_hold_up_others(tls):
    cert, key = tls
    release, waiting = threading.Event(), threading.Semaphore(0)

    def slow_mutator(review):  # a pod whose PodGroup is not there yet
        waiting.release()
        release.wait(20)
        return allow_pod(review)

    server = WebhookServer("127.0.0.1:0", cert, key, slow_mutator).start()
    try:
        held = [threading.Thread(target=post, args=(server.port, cert, "/mutate-pods", sts_review({}, f"p{i}")))
                for i in range(8)]
        for t in held:
            t.start()
        for _ in held:
            assert waiting.acquire(timeout=20), "every pod admission is being served at once"
        status, answer = post(server.port, cert, "/validate-statefulsets", sts_review(statefulset(scheduling=GANG)))
        assert status == 200 and answer["response"]["allowed"] is True
        assert all(t.is_alive() for t in held)  # answered while the eight pods still wait
    finally:
        release.set()
        for t in held:
            t.join(20)
        server.stop()
