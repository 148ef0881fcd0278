"""``kubectl phalanx``: its arguments, the kubeconfig as kubectl reads it, finding serve's pod (against
a fake API server: a local HTTP server answering the few paths the plugin reads), and each
command's output against serve's real HTTP API in memory (Flask's test client over a simulated
cluster). The port-forward itself runs in tests/e2e/test_kubectl_plugin.py."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from cluster import names
from extender.http import create_app
from phalanx_cli.kubectl import main as plugin
from phalanx_cli.kubectl.kubeconfig import KubeconfigError, KubeContext, load
from phalanx_cli.kubectl.output import age, table
from phalanx_cli.kubectl.transport import Reply, ServeLocation, ServeUnreachable, find_pod

from .k8s_objects import pod, podgroup


# -- a fake API server -----------------------------------------------------------------------------
class FakeApiServer:
    """A stand-in for the API server: a local HTTP server answering GETs from ``objects`` (path ->
    JSON), lists filtered by ``labelSelector`` ``k=v``, 404 otherwise; ``forbidden`` paths get 403.
    It records every path asked."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.forbidden: set[str] = set()
        self.asked: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                url = urlparse(self.path)
                fake.asked.append(url.path)
                if url.path in fake.forbidden:
                    return self._send(403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
                found = fake.objects.get(url.path)
                if found is None:
                    return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                if selector and "items" in found:
                    key, _, value = selector.partition("=")
                    found = {**found, "items": [i for i in found["items"]
                                                if i["metadata"].get("labels", {}).get(key) == value]}
                self._send(200, found)

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def apiserver():
    fake = FakeApiServer()
    yield fake
    fake.close()


def write_kubeconfig(path, server: str, current: str = "viewer") -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "e2e", "cluster": {"server": server}}],
        "users": [{"name": "viewer", "user": {"token": "tok-viewer"}},
                  {"name": "admin", "user": {"username": "admin", "password": "pw"}}],
        "contexts": [{"name": "viewer", "context": {"cluster": "e2e", "user": "viewer", "namespace": "team-a"}},
                     {"name": "admin", "context": {"cluster": "e2e", "user": "admin"}}],
    }))
    return str(path)


def api_pod(name: str, phase: str, labels: dict | None = None, group: str = "") -> dict:
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "kube-system", "labels": labels or {"app": "phalanx-scheduler"}},
           "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": phase}}
    if group:
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


# -- arguments -------------------------------------------------------------------------------------
def test_defaults_match_the_shipped_install():
    args = plugin.build_parser().parse_args(["top"])
    assert (args.phalanx_namespace, args.phalanx_selector, args.phalanx_port) == ("kube-system",
                                                                                   "app=phalanx-scheduler", 8888)
    assert args.output == "table" and not args.all_namespaces and args.namespace is None


def test_kubectl_style_flags_parse():
    args = plugin.build_parser().parse_args(["plans", "-A", "-o", "wide", "--context", "c", "--kubeconfig", "k"])
    assert (args.all_namespaces, args.output, args.context, args.kubeconfig) == (True, "wide", "c", "k")
    args = plugin.build_parser().parse_args(["whatif", "-f", "a.yaml", "-f", "b.yaml", "-n", "ns", "-o", "yaml"])
    assert (args.filename, args.namespace, args.output) == (["a.yaml", "b.yaml"], "ns", "yaml")


@pytest.mark.parametrize("argv", [["top", "-o", "xml"], ["whatif"], ["explain"], ["explain", "x", "-A"],
                                  ["frobnicate"]])
def test_bad_arguments_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as done:
        plugin.build_parser().parse_args(argv)
    assert done.value.code == 2


@pytest.mark.parametrize("words, expected", [
    (["db"], ("", "db")), (["pod/db-0"], ("pod", "db-0")), (["po", "db-0"], ("pod", "db-0")),
    (["podgroup/db"], ("podgroup", "db")), (["pg", "db"], ("podgroup", "db")), (["PodGroup/db"], ("podgroup", "db")),
])
def test_explain_targets(words, expected):
    assert plugin._target(words) == expected


@pytest.mark.parametrize("words, needle", [
    (["node/n1"], "neither a pod nor a podgroup"), (["pod/ns/x"], "names no object"), (["a", "b", "c"], "one target"),
])
def test_bad_explain_targets_say_why(words, needle):
    with pytest.raises(plugin.CommandError, match=needle):
        plugin._target(words)


# -- kubeconfig ------------------------------------------------------------------------------------
def test_the_current_context_its_namespace_and_token(tmp_path):
    context = load(write_kubeconfig(tmp_path / "config", "https://127.0.0.1:6443"))
    assert (context.context, context.namespace, context.token) == ("viewer", "team-a", "tok-viewer")
    assert context.api.configuration.host == "https://127.0.0.1:6443"


def test_context_flag_picks_another_context_without_namespace_or_token(tmp_path):
    context = load(write_kubeconfig(tmp_path / "config", "https://127.0.0.1:6443"), context="admin")
    assert (context.context, context.namespace, context.token) == ("admin", "default", None)


def test_kubeconfig_env_is_read_and_merged(tmp_path, monkeypatch):
    first = write_kubeconfig(tmp_path / "a", "https://a:6443", current="admin")
    (tmp_path / "b").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [],
                                                "contexts": [{"name": "other", "context": {"cluster": "e2e",
                                                                                           "user": "viewer"}}]}))
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'b'}")
    assert load().context == "admin"
    assert load(context="other").token == "tok-viewer"  # a context of the second file, a user of the first


def test_a_missing_context_or_file_is_a_clear_error(tmp_path):
    path = write_kubeconfig(tmp_path / "config", "https://127.0.0.1:6443")
    with pytest.raises(KubeconfigError, match="context 'nope' not found"):
        load(path, context="nope")
    with pytest.raises(KubeconfigError, match="cannot use kubeconfig"):
        load(str(tmp_path / "absent"))


# -- finding serve ---------------------------------------------------------------------------------
def test_serve_is_the_running_pod_the_selector_picks(apiserver, tmp_path):
    apiserver.objects["/api/v1/namespaces/kube-system/pods"] = {"kind": "PodList", "items": [
        api_pod("phalanx-scheduler-old", "Failed"), api_pod("phalanx-scheduler-b", "Running"),
        api_pod("unrelated", "Running", labels={"app": "other"})]}
    context = load(write_kubeconfig(tmp_path / "config", apiserver.url))
    assert find_pod(context.api, ServeLocation()) == "phalanx-scheduler-b"
    assert find_pod(context.api, ServeLocation(pod="named")) == "named"


def test_of_several_replicas_the_lease_holder_is_chosen(apiserver, tmp_path):
    apiserver.objects["/api/v1/namespaces/kube-system/pods"] = {"kind": "PodList", "items": [
        api_pod("phalanx-scheduler-a", "Running"), api_pod("phalanx-scheduler-b", "Running")]}
    apiserver.objects["/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"] = {"kind": "LeaseList", "items": [
        {"metadata": {"name": "phalanx"}, "spec": {"holderIdentity": "phalanx-scheduler-b_1234-abcd"}}]}
    context = load(write_kubeconfig(tmp_path / "config", apiserver.url))
    assert find_pod(context.api, ServeLocation()) == "phalanx-scheduler-b"


def test_no_serve_pod_or_no_permission_says_so(apiserver, tmp_path):
    apiserver.objects["/api/v1/namespaces/kube-system/pods"] = {"kind": "PodList", "items": [
        api_pod("phalanx-scheduler-a", "Pending")]}
    context = load(write_kubeconfig(tmp_path / "config", apiserver.url))
    with pytest.raises(ServeUnreachable, match="no Running pod matches 'app=phalanx-scheduler'.*1 pods match"):
        find_pod(context.api, ServeLocation())
    apiserver.forbidden.add("/api/v1/namespaces/kube-system/pods")
    with pytest.raises(ServeUnreachable, match="HTTP 403: your user may not"):
        find_pod(context.api, ServeLocation())


# -- the commands against serve's HTTP API ---------------------------------------------------------
class InMemoryServe:
    """A transport to serve's real Flask app in this process (Flask's test client), recording calls."""

    def __init__(self, app) -> None:
        self.client = app.test_client()
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str, path: str, body: bytes | None = None) -> Reply:
        self.calls.append((method, path))
        answer = self.client.open(path, method=method, data=body, content_type="application/json")
        return Reply(answer.status_code, answer.data)


class CannedServe:
    """A stand-in serve answering every request with one canned reply (what-if before serve has it)."""

    def __init__(self, status: int, body: dict | str) -> None:
        self.reply = Reply(status, (body if isinstance(body, str) else json.dumps(body)).encode())
        self.sent: list[tuple[str, str, bytes | None]] = []

    def request(self, method: str, path: str, body: bytes | None = None) -> Reply:
        self.sent.append((method, path, body))
        return self.reply


def run(argv: list[str], serve, api=None, namespace: str = "default") -> str:
    out = io.StringIO()
    args = plugin.build_parser().parse_args(argv)
    plugin.run(args, KubeContext(api, "test", namespace, None), serve, out)
    return out.getvalue()


@pytest.fixture
def serve(sim, cycle):
    app = create_app(cycle)  # first: its history hears the plans made below
    sim.create(podgroup("db", 2, key=names.LABEL_RACK))
    for i in range(2):
        sim.create(pod(f"db-{i}", "db", gpu=2))
    sim.create(podgroup("huge", 3, key=names.LABEL_RACK, namespace="team-b"))
    for i in range(3):
        sim.create(pod(f"huge-{i}", "huge", gpu=4, namespace="team-b"))  # 12 GPUs; a rack has 8
    assert not isinstance(cycle.place_group("default/db"), str)
    assert isinstance(cycle.place_group("team-b/huge"), str)
    return InMemoryServe(app)


def test_top_is_a_kubectl_table_of_the_namespace(serve):
    text = run(["top"], serve)
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "DOMAIN", "BOUND", "MIN", "COUNT", "AGE"]
    assert len(lines) == 2 and lines[1].split()[:4] == ["db", "planned", lines[1].split()[2], "0/2"]
    assert lines[1].split()[2] in ("r0", "r1")


def test_top_all_namespaces_adds_the_namespace_column_and_orders_by_state(serve):
    lines = run(["top", "-A"], serve).splitlines()
    assert lines[0].startswith("NAMESPACE")
    assert [line.split()[:3] for line in lines[1:]] == [["default", "db", "planned"],
                                                        ["team-b", "huge", "unschedulable"]]
    assert "<none>" in lines[2]  # an unplaced gang has no domain


def test_top_wide_and_documents(serve):
    header = run(["top", "-o", "wide"], serve).splitlines()[0]
    assert "OWNER" in header and "TOPOLOGY KEY" in header and "HELD DOMAIN" in header
    doc = json.loads(run(["top", "-A", "-o", "json"], serve))
    assert [r["key"] for r in doc["podgroups"]] == ["default/db", "team-b/huge"]
    assert doc["states"] == {"planned": 1, "unschedulable": 1}
    assert yaml.safe_load(run(["top", "-n", "team-b", "-o", "yaml"], serve))["podgroups"][0]["name"] == "huge"


def test_top_in_an_empty_namespace_says_no_resources(serve):
    assert run(["top", "-n", "empty"], serve).strip() == "No resources found in empty namespace."


def test_plans_lists_held_plans_and_their_nodes(serve, cycle):
    plan = cycle.plans["default/db"]
    lines = run(["plans", "-o", "wide"], serve).splitlines()
    assert lines[0].split()[:5] == ["NAME", "STATE", "DOMAIN", "PODS", "NODES"]
    row = lines[1].split()
    assert row[:4] == ["db", "planned", plan.domain, "2"]
    assert row[-1] == ",".join(sorted(set(plan.assignments.values())))
    doc = json.loads(run(["plans", "-o", "json"], serve))["plans"][0]
    assert doc["assignments"] == {serve_pod: node for serve_pod, node in
                                  zip(["db-0", "db-1"], [plan.assignments[u] for u in sorted(
                                      plan.assignments, key=lambda u: cycle.cache.pods[u].pod.name)], strict=True)}
    assert ("GET", "/api/v1/plans?namespace=default") in serve.calls
    assert run(["plans", "-n", "team-b"], serve).strip() == "No resources found in team-b namespace."


def test_explain_a_podgroup_says_what_phalanx_explain_says(serve):
    text = run(["explain", "huge", "-n", "team-b"], serve)
    assert text.startswith("podgroup team-b/huge: unschedulable\n  members: 3 exist, 0 bound (minCount 3)")
    assert "why: " in text and "needs 12 nvidia.com/gpu, 8 free" in text
    planned = run(["explain", "podgroup/db"], serve)
    assert "plan: planned, 2 pods on" in planned and "in domain r" in planned


def test_explain_a_pod_reads_its_group_from_the_api_server(serve, apiserver, tmp_path):
    apiserver.objects["/api/v1/namespaces/team-b/pods/huge-1"] = api_pod("huge-1", "Pending", group="huge")
    apiserver.objects["/api/v1/namespaces/team-b/pods/loner"] = api_pod("loner", "Pending")
    api = load(write_kubeconfig(tmp_path / "config", apiserver.url)).api
    assert run(["explain", "pod/huge-1", "-n", "team-b"], serve, api).startswith("podgroup team-b/huge:")
    assert run(["explain", "huge-1", "-n", "team-b"], serve, api).startswith("podgroup team-b/huge:")  # bare name
    with pytest.raises(plugin.CommandError, match="belongs to no PodGroup"):
        run(["explain", "pod/loner", "-n", "team-b"], serve, api)
    with pytest.raises(plugin.CommandError, match="HTTP 404"):
        run(["explain", "pod/absent", "-n", "team-b"], serve, api)


def test_explain_json_is_serves_document(serve):
    doc = json.loads(run(["explain", "db", "-o", "json"], serve))
    assert doc["key"] == "default/db" and doc["plan_state"] == "planned"


def manifest(tmp_path, *docs) -> str:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


STS = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"}, "spec": {"replicas": 2}}


def test_whatif_posts_the_objects_with_the_namespace_and_renders_groups(tmp_path):
    reply = {"groups": [
        {"namespace": "team-a", "name": "db", "verdict": "fits", "domain": "r3", "nodes": ["a", "b"],
         "message": "fits now (exact, optimal)", "new_field": {"x": 1}},
        {"name": "team-a/big", "verdict": "does not fit", "nodes": [], "message": "rack r7 lacks 2 nodes"}]}
    serve = CannedServe(200, reply)
    path = manifest(tmp_path, STS, {**STS, "metadata": {"name": "web", "namespace": "other"}})
    lines = run(["whatif", "-f", path, "-n", "team-a"], serve).splitlines()
    method, url, body = serve.sent[0]
    assert (method, url) == ("POST", "/phalanx/api/whatif")
    sent = json.loads(body)["objects"]
    assert [(o["metadata"]["name"], o["metadata"]["namespace"]) for o in sent] == [("db", "team-a"), ("web", "other")]
    assert lines[0].split() == ["PODGROUP", "VERDICT", "DOMAIN", "NODES", "MESSAGE"]
    assert lines[1].split()[:4] == ["team-a/db", "fits", "r3", "a,b"]
    assert lines[2].startswith("team-a/big") and "<none>" in lines[2] and "rack r7 lacks 2 nodes" in lines[2]
    assert json.loads(run(["whatif", "-f", path, "-o", "json"], serve))["groups"][0]["new_field"] == {"x": 1}


def test_whatif_renders_serves_reply_shape(tmp_path):
    """serve's reply as the what-if endpoint writes it: nodes pod -> node, the message in
    ``explanation``, victims of a preemption."""
    reply = {"groups": [
        {"namespace": "default", "name": "train", "verdict": "fits after preemption", "domain": "r1",
         "nodes": {"train-0": "n-1-0", "train-1": "n-1-1", "train-2": "n-1-0", "train-3": "n-1-2", "train-4": "n-1-3"},
         "victims": [{"pod": "default/low-0", "priority": 1, "unit": "default/low"}], "explanation": ""},
        {"namespace": "default", "name": "huge", "verdict": "does not fit", "nodes": {},
         "explanation": "rack r1: needs 12 nvidia.com/gpu, 8 free"}]}
    lines = run(["whatif", "-f", manifest(tmp_path, STS), "-o", "wide"], CannedServe(200, reply)).splitlines()
    assert lines[0].split() == ["PODGROUP", "VERDICT", "DOMAIN", "NODES", "VICTIMS", "MESSAGE"]
    assert "n-1-0,n-1-1,n-1-2,n-1-3" in lines[1] and lines[1].split()[-2:] == ["1", "<none>"]
    assert lines[2].endswith("rack r1: needs 12 nvidia.com/gpu, 8 free")
    narrow = run(["whatif", "-f", manifest(tmp_path, STS)], CannedServe(200, reply)).splitlines()
    assert "4 nodes" in narrow[1]
    reply["groups"][1].update(verdict="fits", nodes={"huge-0": "n-0"}, explanation="", waiting=["huge-1", "huge-2"],
                              waitingWhy="rack r0: needs 4 nvidia.com/gpu, 0 free")
    lines = run(["whatif", "-f", manifest(tmp_path, STS)], CannedServe(200, reply)).splitlines()
    assert lines[2].endswith("2 would wait: rack r0: needs 4 nvidia.com/gpu, 0 free")


def test_whatif_against_a_serve_without_the_endpoint_says_so(tmp_path):
    serve = CannedServe(404, "phalanx: The requested URL was not found on the server.\n")
    with pytest.raises(plugin.CommandError, match=r"does not offer what-if \(POST /phalanx/api/whatif answered HTTP 404"):
        run(["whatif", "-f", manifest(tmp_path, STS)], serve)


def test_whatif_against_a_serve_started_without_it_says_so_with_serves_words(tmp_path):
    serve = CannedServe(501, {"error": "phalanx: this serve was started without what-if"})
    with pytest.raises(plugin.CommandError, match=r"does not offer what-if \(POST /phalanx/api/whatif answered "
                                                  r"HTTP 501: phalanx: this serve was started without what-if\)"):
        run(["whatif", "-f", manifest(tmp_path, STS)], serve)


def test_whatif_passes_serves_field_messages_through(tmp_path):
    serve = CannedServe(400, {"error": "spec.scheduling: Forbidden: field is immutable"})
    with pytest.raises(plugin.CommandError, match="HTTP 400: spec.scheduling: Forbidden: field is immutable"):
        run(["whatif", "-f", manifest(tmp_path, STS)], serve)


@pytest.mark.parametrize("text, needle", [("a: [", "is not YAML"), ("- 1\n- 2\n", "must be a Kubernetes object"),
                                          ("", "no objects")])
def test_bad_manifests_are_refused_before_anything_is_sent(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    serve = CannedServe(200, {"groups": []})
    with pytest.raises(plugin.CommandError, match=needle):
        run(["whatif", "-f", str(path)], serve)
    with pytest.raises(plugin.CommandError, match="cannot read"):
        run(["whatif", "-f", str(tmp_path / "absent.yaml")], serve)
    assert serve.sent == []


def test_a_list_is_unwrapped(tmp_path):
    serve = CannedServe(200, {"groups": []})
    out = run(["whatif", "-f", manifest(tmp_path, {"apiVersion": "v1", "kind": "List", "items": [STS, STS]})], serve)
    assert len(json.loads(serve.sent[0][2])["objects"]) == 2 and out.strip() == "No groups."


@pytest.mark.parametrize("status, needle", [(401, "give --token-file"), (403, "phalanx-viewer")])
def test_refusals_name_the_fix(status, needle):
    with pytest.raises(plugin.CommandError, match=needle):
        run(["top"], CannedServe(status, "phalanx: no"))


def test_main_reports_a_bad_kubeconfig_on_stderr(tmp_path, capsys):
    assert plugin.main(["top", "--kubeconfig", str(tmp_path / "absent")]) == 1
    assert capsys.readouterr().err.startswith("kubectl phalanx top: cannot use kubeconfig")


def test_table_and_age_follow_kubectl():
    assert table(["name", "domain"], [["db", ""], ["web-long", "r1"]]) == (
        "NAME       DOMAIN\ndb         <none>\nweb-long   r1")
    assert [age(s) for s in (5, 130, 700, 4000, 90000)] == ["5s", "2m10s", "11m", "1h6m", "1d1h"]


# -- HTTP over the forwarded stream ----------------------------------------------------------------
class FakePortForward:
    """A stand-in for the client library's port-forward: ``socket(port)`` is one end of a socket
    pair whose other end ``answer`` serves (one request), ``error(port)`` what the kubelet said."""

    def __init__(self, answer, error=None) -> None:
        import socket

        self.mine, theirs = socket.socketpair()
        self.error_text, self.closed, self.request = error, False, b""
        threading.Thread(target=self._serve, args=(theirs, answer), daemon=True).start()

    def _serve(self, sock, answer) -> None:
        with sock:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += sock.recv(4096)
            self.request = head + b"\r\n\r\n" + body
            if answer is not None:
                sock.sendall(answer)

    def socket(self, port):
        return self.mine

    def error(self, port):
        return self.error_text

    def close(self) -> None:
        self.closed = True
        self.mine.close()


def forwarded(monkeypatch, fake: FakePortForward, token: str | None = "tok"):
    from phalanx_cli.kubectl import transport

    asked = []

    def portforward(connect, name, namespace, ports):
        asked.append((name, namespace, ports))
        return fake

    monkeypatch.setattr(transport, "portforward", portforward)
    return transport.PortForwardTransport(None, "kube-system", "phalanx-scheduler-0", 8888, token, timeout=5), asked


def test_a_request_goes_over_the_forwarded_stream_with_the_token(monkeypatch):
    body = b'{"plans": []}'
    fake = FakePortForward(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                           + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    serve, asked = forwarded(monkeypatch, fake)
    reply = serve.request("POST", "/phalanx/api/whatif", b'{"objects": []}')
    assert (reply.status, reply.json()) == (200, {"plans": []})
    assert asked == [("phalanx-scheduler-0", "kube-system", "8888")] and fake.closed
    head = fake.request.decode()
    assert head.startswith("POST /phalanx/api/whatif HTTP/1.1\r\n")
    assert "Authorization: Bearer tok\r\n" in head and head.endswith('{"objects": []}')


def test_a_stream_the_kubelet_closes_is_reported_with_its_error(monkeypatch):
    fake = FakePortForward(None, error="error forwarding port 8888: connection refused")
    serve, _ = forwarded(monkeypatch, fake, token=None)
    with pytest.raises(ServeUnreachable, match="GET /api/v1/plans through the port-forward to pod "
                                               "kube-system/phalanx-scheduler-0 port 8888: error forwarding port "
                                               "8888: connection refused"):
        serve.request("GET", "/api/v1/plans")
    assert "Authorization" not in fake.request.decode() and fake.closed


def test_a_reply_that_is_not_json_is_said_so():
    with pytest.raises(ServeUnreachable, match="answered HTTP 502 with no JSON: '<html>bad gateway'"):
        Reply(502, b"<html>bad gateway").json()


def test_token_and_manifest_cannot_both_come_from_standard_input(capsys):
    assert plugin.main(["whatif", "-f", "-", "--token-file", "-"]) == 2
    assert "cannot both read standard input" in capsys.readouterr().err
