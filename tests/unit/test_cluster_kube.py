"""cluster.kube.Kube against a loopback stand-in for the API server: what goes on the wire (method,
path, query, content type, token, body) and what comes back (JSON, text, KubeError), for the
requests the e2e harness and the tools make through it."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest

from cluster.kube import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, Kube, KubeError

NOT_FOUND = {"kind": "Status", "code": 404, "reason": "NotFound", "message": 'pods "x" not found'}


class ApiServer:
    """Answers every request with the next (status, content type, body) queued for its path;
    records what it was sent."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[int, str, bytes, dict[str, str]]]] = {}
        self.seen: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.seen.append({"method": self.command, "path": url.path, "query": dict(parse_qsl(url.query)),
                                    "content_type": self.headers.get("Content-Type"),
                                    "authorization": self.headers.get("Authorization"),
                                    "body": json.loads(body) if body else None})
                status, content_type, payload, headers = (
                    server.answers.get(url.path) or [(200, "application/json", b"", {})]).pop(0)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def answer(self, path: str, status: int = 200, body: object = None, text: str | None = None,
               headers: dict[str, str] | None = None) -> None:
        payload = text.encode() if text is not None else json.dumps(body).encode() if body is not None else b""
        self.answers.setdefault(path, []).append((status, "text/plain" if text is not None else "application/json",
                                                  payload, headers or {}))


@pytest.fixture
def api(tmp_path):
    server = ApiServer()
    yield server
    server.http.shutdown()


@pytest.fixture
def kube(api, tmp_path):
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{api.http.server_address[1]}"}}],
              "users": [{"name": "u", "user": {"token": "secret-token"}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return Kube(str(path))


def test_text_returns_a_plain_text_answer(api, kube):
    api.answer("/readyz", text="ok")
    assert kube.text("/readyz", verbose=None) == "ok"
    assert api.seen[0]["method"] == "GET" and api.seen[0]["query"] == {}
    assert api.seen[0]["authorization"] == "Bearer secret-token"


def test_text_raises_kube_error_on_a_non_2xx(api, kube):
    api.answer("/readyz", 500, text="[-]etcd failed")
    with pytest.raises(KubeError) as err:
        kube.text("/readyz")
    assert err.value.status == 500 and "[-]etcd failed" in str(err.value)


def test_list_items_is_one_get_with_the_query(api, kube):
    api.answer("/api/v1/pods", body={"kind": "PodList", "items": [{"metadata": {"name": "a"}}]})
    api.answer("/api/v1/nodes", body={"kind": "NodeList", "items": None})
    assert kube.list_items("/api/v1/pods", fieldSelector="spec.nodeName!=", labelSelector=None) == [
        {"metadata": {"name": "a"}}]
    assert kube.list_items("/api/v1/nodes") == []
    assert api.seen[0]["query"] == {"fieldSelector": "spec.nodeName!="}


def test_create_and_replace_send_json_with_query_parameters(api, kube):
    api.answer("/api/v1/namespaces/ns/pods", 201, body={"metadata": {"name": "p", "uid": "1"}})
    api.answer("/api/v1/namespaces/ns/pods/p", body={"metadata": {"name": "p", "uid": "1"}})
    assert kube.create("/api/v1/namespaces/ns/pods", {"metadata": {"name": "p"}}, dryRun="All")["metadata"]["uid"] == "1"
    kube.replace("/api/v1/namespaces/ns/pods/p", {"metadata": {"name": "p"}})
    (post, put) = api.seen
    assert (post["method"], post["query"], post["content_type"]) == ("POST", {"dryRun": "All"}, "application/json")
    assert post["body"] == {"metadata": {"name": "p"}}
    assert (put["method"], put["query"], put["body"]) == ("PUT", {}, {"metadata": {"name": "p"}})


@pytest.mark.parametrize("content_type, body", [
    (MERGE_PATCH, {"spec": {"replicas": 2}}),
    (STRATEGIC_MERGE_PATCH, {"status": {"phase": "Running"}}),
    (JSON_PATCH, [{"op": "replace", "path": "/spec/replicas", "value": 2}]),
])
def test_patch_sends_its_content_type_and_query(api, kube, content_type, body):
    kube.patch("/apis/apps/v1/namespaces/ns/statefulsets/s", body, content_type, fieldManager="phalanx")
    sent = api.seen[0]
    assert (sent["method"], sent["content_type"], sent["body"]) == ("PATCH", content_type, body)
    assert sent["query"] == {"fieldManager": "phalanx"}


def test_delete_of_a_missing_object_raises_unless_missing_ok(api, kube):
    path = "/api/v1/namespaces/ns/pods/x"
    api.answer(path, 404, body=NOT_FOUND)
    api.answer(path, 404, body=NOT_FOUND)
    with pytest.raises(KubeError) as err:
        kube.delete(path)
    assert (err.value.status, err.value.reason) == (404, "NotFound")
    assert kube.delete(path, missing_ok=True) is None


def test_delete_with_a_body_and_query_and_other_errors_raised_even_when_missing_ok(api, kube):
    path = "/api/v1/namespaces/ns/pods"
    api.answer(path, body={"kind": "PodList", "items": []})
    api.answer(path, 403, body={"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"})
    assert kube.delete(path, {"propagationPolicy": "Background"}, gracePeriodSeconds=0) == {"kind": "PodList",
                                                                                            "items": []}
    assert api.seen[0]["body"] == {"propagationPolicy": "Background"}
    assert api.seen[0]["query"] == {"gracePeriodSeconds": "0"}
    with pytest.raises(KubeError, match="HTTP 403: no"):
        kube.delete(path, missing_ok=True)


def test_the_token_check_runs_at_most_once_per_interval_and_requests_still_carry_the_token(api, kube, monkeypatch):
    """The official client re-reads the kubeconfig's credentials before every request (and puts
    its hook back each time); phalanx does it once per TOKEN_CHECK_SECONDS, so an expired exec or
    in-cluster token is still renewed."""
    from kubernetes.config import kube_config

    from cluster import kube as kube_module

    clock = [100.0]
    monkeypatch.setattr(kube_module.time, "monotonic", lambda: clock[0])
    checks = []
    set_config = kube_config.KubeConfigLoader._set_config
    monkeypatch.setattr(kube_config.KubeConfigLoader, "_set_config",
                        lambda loader, configuration: (checks.append(clock[0]), set_config(loader, configuration)))
    for _ in range(3):
        kube.get("/api/v1/pods")
    clock[0] += kube_module.TOKEN_CHECK_SECONDS
    kube.get("/api/v1/pods")
    kube.get("/api/v1/pods")
    assert checks == [100.0, 100.0 + kube_module.TOKEN_CHECK_SECONDS]
    assert [s["authorization"] for s in api.seen] == ["Bearer secret-token"] * 5


TOO_MANY = {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "too many requests"}


def test_a_429_with_retry_after_is_retried_after_the_wait_and_the_write_lands_once(api, kube):
    """client-go's rule: a throttled answer naming Retry-After is tried again after that many
    seconds; the body is sent again, whole."""
    waits: list[float] = []
    kube.sleep = waits.append
    path = "/api/v1/namespaces/ns/pods/p"
    api.answer(path, 429, TOO_MANY, headers={"Retry-After": "2"})
    api.answer(path, 503, {"kind": "Status", "code": 503}, headers={"Retry-After": "1"})
    api.answer(path, 200, {"metadata": {"name": "p"}})
    assert kube.patch(path, {"metadata": {"annotations": {"a": "b"}}}) == {"metadata": {"name": "p"}}
    assert waits == [2, 1] and kube.throttled == 2
    assert [s["body"] for s in api.seen] == [{"metadata": {"annotations": {"a": "b"}}}] * 3


@pytest.mark.parametrize("retry_after, answers, waits", [("1", 12, [1] * 10), ("12", 5, [12, 12])])
def test_throttling_gives_up_after_client_gos_ten_retries_or_thirty_seconds_of_waits(api, kube, retry_after,
                                                                                      answers, waits):
    """client-go's ten retries; and waits add up to at most max_retry_wait (30 s): the wait that
    would pass it is not waited, and the error goes to the caller."""
    waited: list[float] = []
    kube.sleep = waited.append
    path = "/api/v1/namespaces/ns/events"
    for _ in range(answers):
        api.answer(path, 429, TOO_MANY, headers={"Retry-After": retry_after})
    with pytest.raises(KubeError) as err:
        kube.create(path, {"kind": "Event"})
    assert kube.max_retry_wait == 30 and err.value.status == 429
    assert waited == waits and len(api.seen) == len(waits) + 1


@pytest.mark.parametrize("status, headers", [(429, {}), (429, {"Retry-After": "soon"}), (409, {"Retry-After": "1"}),
                                             (500, {})])
def test_no_retry_without_an_integer_retry_after_on_a_429_or_5xx(api, kube, status, headers):
    """A PDB-blocked eviction is a 429 without Retry-After: refused at once, as client-go does."""
    waits: list[float] = []
    kube.sleep = waits.append
    path = "/api/v1/namespaces/ns/pods/p/eviction"
    api.answer(path, status, {"kind": "Status", "code": status}, headers=headers)
    with pytest.raises(KubeError) as err:
        kube.create(path, {"kind": "Eviction"})
    assert err.value.status == status and waits == [] and len(api.seen) == 1


def test_a_kubeconfig_that_cannot_be_loaded_is_one_line_naming_it(tmp_path):
    import subprocess
    import sys

    missing = tmp_path / "nope.kubeconfig"
    with pytest.raises(ValueError, match=f"kubeconfig {missing}: "):
        Kube(str(missing))
    for argv in (["serve", "--kubeconfig", str(missing)],
                 ["controller", "--kubeconfig", str(missing), "--tls-cert", str(missing), "--tls-key", str(missing)]):
        done = subprocess.run([sys.executable, "-m", "phalanx_cli.main", *argv], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert f"kubeconfig {missing}:" in done.stderr.strip().splitlines()[-1]


def test_every_valid_json_document_decodes_and_malformed_json_stays_an_error():
    """The API server's answers and watch lines are decoded by orjson, and by the standard library
    where orjson refuses a valid document (NaN, a lone surrogate); an integer past 64 bits becomes
    the float the API server itself stores for it (its JSON decoder keeps int64 or float64)."""
    from cluster.kube import loads

    docs = [b'{"metadata": {"name": "a", "resourceVersion": "7"}, "spec": {"priority": -5, "x": 1.5e3}}',
            '{"s": "caf\\u00e9 \u00e9", "n": null, "t": true, "l": []}',
            b'{"a": 1, "a": 2}', b'{"lone": "\\ud800"}']
    for doc in docs:
        assert loads(doc) == json.loads(doc)
    assert math.isnan(loads(b'{"x": NaN}')["x"])
    assert loads(b'{"big": 123456789012345678901234567890}')["big"] == float(123456789012345678901234567890)
    for bad in (b'{"a": ', b"\xff\xfe", b"nope", b""):
        with pytest.raises(ValueError):
            loads(bad)
