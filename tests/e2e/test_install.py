"""phalanx as a cluster admin installs it: ``kubectl apply -k scheduler-config/`` and
``helm install charts/phalanx`` against a real control plane that authorizes with RBAC.

Every object the install renders is created for real (not a dry run) and read back. Then the
installed Deployments are run the way their pods would run them: kube-scheduler, ``phalanx serve``
and ``phalanx controller`` as processes on this host (there is no container runtime), each with the
arguments of its container in the installed Deployment and with the credentials its pod would get —
the token of the pod's ServiceAccount (TokenRequest, as the kubelet's projected volume gets it) or,
for phalanx beside kube-scheduler, the token Secret its container mounts — never as admin. A gang
StatefulSet is then placed whole through them, in extender mode (kube-scheduler) and in plugin mode
(phalanx-scheduler, the locally built binary of the image phalanx-scheduler.Dockerfile builds; the
kustomize component scheduler-config/plugin/ and ``helm upgrade --set integration=plugin``). Only
what needs a pod network is changed: listen addresses become loopback ports, and the webhooks are
called by URL instead of through their Service.

This module starts its own control plane: the installs create cluster-wide RBAC and webhooks that
must not leak into other modules.
"""

from __future__ import annotations

import base64
import copy
import os
import ssl
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import (
    ControlPlane,
    create,
    create_node,
    podgroup_conditions,
    statefulset,
    wait_all_bound,
    wait_for,
    wait_gone,
)
from harness.faults import record_text
from harness.process import Component, free_port
from harness.tools import Tools, flag_value, override_flags, own_control_plane, plane_tools

from cluster.kube import Kube, KubeError, api_path
from tests.pod_specs import pod_templates, shipped_problems

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "scheduler-config"
PLUGIN_PROFILE = KUSTOMIZE / "kube-scheduler-plugin-config.yaml"  # the shipped plugin profile
CHART = ROOT / "charts" / "phalanx"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "PriorityClass"}
# chart renderings checked by helm lint/template and installed for real, beside the default one
SHAPES = {
    "main": ["--set", "mode=main"],
    "tls": ["--set", "tls.enabled=true"],
    "main-tls": ["--set", "mode=main", "--set", "tls.enabled=true"],
    "crds": ["--set", "flavor=crds", "--set", "controller.replicas=3"],
    "no-controller": ["--set", "controller.enabled=false"],
    "main-plugin": ["--set", "mode=main", "--set", "integration=plugin"],
    "main-plugin-tls": ["--set", "mode=main", "--set", "integration=plugin", "--set", "tls.enabled=true"],
}
# installed for real by the plugin-mode tests (helm upgrade of the default release), rendered here
PLUGIN = ["--set", "integration=plugin"]
PLUGIN_TLS = [*PLUGIN, "--set", "tls.enabled=true"]


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plane(request):
    yield from own_control_plane(request, "phalanx-e2e-install-", "phalanx e2e install")


@pytest.fixture(scope="module")
def tools(plane) -> Tools:
    return plane_tools(plane)


# -- objects -------------------------------------------------------------------------------------

def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind")]


def object_path(obj: dict) -> str:
    meta = obj["metadata"]
    namespace = None if obj["kind"] in CLUSTER_SCOPED else meta.get("namespace", "default")
    return api_path(obj["apiVersion"], obj["kind"].lower() + "s", namespace, meta["name"])


def missing_on_server(rest, objects: list[dict]) -> list[str]:
    return [object_path(o) for o in objects if rest.get_or_none(object_path(o)) is None]


def rules_of(objects: list[dict], suffix: str) -> list[dict]:
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith(suffix)]
    return role["rules"]


@dataclass
class Install:
    """What one install rendered, and the processes started from it."""

    objects: list[dict]
    processes: list[Component] = field(default_factory=list)
    notes: str = ""  # what helm printed

    def deployment(self, container: str) -> dict:
        (dep,) = [o for o in self.objects if o["kind"] == "Deployment"
                  and container in {c["name"] for c in o["spec"]["template"]["spec"]["containers"]}]
        return dep

    def webhook_configurations(self) -> list[dict]:
        return [o for o in self.objects if o["kind"].endswith("WebhookConfiguration")]

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


def container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def override(args: list[str], **flags: str) -> list[str]:
    """``args`` with the given ``--flag`` values replaced (``--flag=v`` or ``--flag v``), others appended."""
    return override_flags(args, {"--" + k.replace("_", "-"): v for k, v in flags.items()})


# -- credentials as the pods get them ---------------------------------------------------------------

def token_request(rest, namespace: str, service_account: str) -> str:
    """A ServiceAccount token from the TokenRequest API (what a projected token volume holds)."""
    review = rest.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}})
    return review["status"]["token"]


def mounted_token(rest, deployment: dict, container_name: str) -> tuple[str, str]:
    """(token, ServiceAccount name) of the token Secret ``container_name`` mounts at the token path."""
    spec = deployment["spec"]["template"]["spec"]
    (mount,) = [m for m in container(deployment, container_name).get("volumeMounts", []) if m["mountPath"] == SA_MOUNT]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    path = f"/api/v1/namespaces/{deployment['metadata']['namespace']}/secrets/{volume['secret']['secretName']}"
    secret = wait_for(lambda: (s := rest.get(path)).get("data", {}).get("token") and s, 30,
                      "the token controller fills in the token Secret")
    return base64.b64decode(secret["data"]["token"]).decode(), secret["metadata"]["annotations"][
        "kubernetes.io/service-account.name"]


def serve_identity(rest, scheduler_dep: dict, serve_dep: dict) -> tuple[str, str]:
    """(token, ServiceAccount) phalanx serve runs with: beside kube-scheduler, the token Secret its
    container mounts over the pod's; in a pod of its own (mTLS), its ServiceAccount's projected token."""
    if serve_dep["metadata"]["name"] == scheduler_dep["metadata"]["name"]:
        check_token_mounts(rest, scheduler_dep)
        return mounted_token(rest, scheduler_dep, "phalanx")
    service_account = serve_dep["spec"]["template"]["spec"]["serviceAccountName"]
    return token_request(rest, serve_dep["metadata"]["namespace"], service_account), service_account


def plugin_tls(plane: ControlPlane, plugin_args: dict, serve_args: list[str], namespace: str) -> dict[str, str]:
    """Check how the plugin dials phalanx serve and swap the Secrets' files for the test CA's: the
    plugin's args ``tls`` (in place) and serve's TLS flags (returned, for :func:`override`)."""
    tls = plugin_args.get("tls")
    if tls is None:  # phalanx serve beside it in the pod: loopback, plaintext
        assert plugin_args["address"] == flag_value(serve_args, "--grpc-addr")
        assert plugin_args["address"].startswith("127.0.0.1:")
        return {}
    # phalanx serve behind its Service: mTLS, the certificate names the Service
    host, _, port = plugin_args["address"].rpartition(":")
    assert host == tls["serverName"] and flag_value(serve_args, "--grpc-addr") == f"0.0.0.0:{port}"
    client = plane.pki.client(f"phalanx-scheduler-{namespace}", "phalanx-scheduler")
    tls.update(caFile=str(plane.pki.ca_cert), certFile=str(client.cert), keyFile=str(client.key))
    serving = plane.pki.server(f"phalanx-{namespace}", [f"DNS:{host}", "IP:127.0.0.1"])
    files = {"grpc_tls_cert": str(serving.cert), "grpc_tls_key": str(serving.key),
             "grpc_client_ca": str(plane.pki.ca_cert)}
    assert all(flag_value(serve_args, "--" + flag.replace("_", "-")) for flag in files)
    if flag_value(serve_args, "--client-ca"):  # the extender's port too (the chart's tls.enabled)
        files.update(tls_cert=str(serving.cert), tls_key=str(serving.key), client_ca=str(plane.pki.ca_cert))
    return files


def viewer_tokens(rest, install: Install, namespace: str) -> dict[str, str]:
    """Tokens of two new ServiceAccounts: ``viewer`` bound to the installed read-only ClusterRole,
    ``stranger`` to nothing (once RBAC answers for the binding)."""
    (role,) = [o["metadata"]["name"] for o in install.objects
               if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-viewer")]
    suffix = uuid.uuid4().hex[:6]
    tokens = {}
    for who in ("viewer", "stranger"):
        rest.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": f"{who}-{suffix}"}})
        tokens[who] = token_request(rest, namespace, f"{who}-{suffix}")
    rest.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"viewer-{suffix}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": f"viewer-{suffix}", "namespace": namespace}]})
    user = f"system:serviceaccount:{namespace}:viewer-{suffix}"
    wait_for(lambda: rest.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "nonResourceAttributes": {"path": "/phalanx/metrics", "verb": "get"}}})["status"].get(
        "allowed"), 30, "RBAC answers for the viewer's binding")
    return tokens


def answers(url: str, context: ssl.SSLContext | None, tokens: dict[str, str]) -> list[int]:
    """GET ``url``'s status without a token, with the stranger's, with the viewer's."""
    def status(token: str | None) -> int:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as resp:  # noqa: S310 (loopback)
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code

    return [status(None), status(tokens["stranger"]), status(tokens["viewer"])]


def check_no_open_door(plane: ControlPlane, tokens: dict[str, str], serve_args: list[str], http_port: int,
                       grpc_port: int | None) -> None:
    """The installed phalanx serve, with its ServiceAccount's RBAC, answers /metrics 401 without a
    token, 403 to a token without the installed viewer ClusterRole and 200 with it (with a client
    certificate where the port asks for one); where gRPC is mTLS a client without a certificate
    does not get through the handshake."""
    client = plane.pki.client("door-check", "door-check")
    if flag_value(serve_args, "--client-ca"):
        context = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
        context.check_hostname = False
        context.load_cert_chain(str(client.cert), str(client.key))
        url = f"https://127.0.0.1:{http_port}/metrics"
    else:
        context, url = None, f"http://127.0.0.1:{http_port}/metrics"
    assert answers(url, context, tokens) == [401, 403, 200]
    if grpc_port is not None and flag_value(serve_args, "--grpc-client-ca"):
        no_certificate = grpc.ssl_channel_credentials(plane.pki.ca_cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{grpc_port}", no_certificate) as channel:
            with pytest.raises(grpc.RpcError) as handshake:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert handshake.value.code() is grpc.StatusCode.UNAVAILABLE


def check_token_mounts(rest, deployment: dict) -> None:
    """In the pod the ReplicaSet controller created (admitted, never started: no kubelet), the
    ServiceAccount admission plugin gave kube-scheduler the pod's projected token and left the
    phalanx container's own token Secret mount alone."""
    labels = deployment["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    namespace = deployment["metadata"]["namespace"]
    pod = wait_for(lambda: (rest.list_items(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector) or [None])[0],
                   60, "the scheduler Deployment's pod is created")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    sources = {}
    for c in pod["spec"]["containers"]:
        (mount,) = [m for m in c.get("volumeMounts", []) if m["mountPath"] == SA_MOUNT]
        sources[c["name"]] = "secret" if "secret" in volumes[mount["name"]] else "projected"
    assert sources == {"kube-scheduler": "projected", "phalanx": "secret"}


def insecure_get(url: str) -> int:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:  # noqa: S310 (loopback)
        return resp.status


def forbidden(kube: Kube, method: str, path: str, body: Any = None) -> bool:
    try:
        kube.request(method, path, body)
    except KubeError as err:
        return err.status == 403
    return False


# -- running the installed components ---------------------------------------------------------------

def phalanx_plugin_args(config: dict) -> dict | None:
    """The args of the Phalanx plugin in a KubeSchedulerConfiguration (None: no profile configures it)."""
    for profile in config.get("profiles") or []:
        for entry in profile.get("pluginConfig") or []:
            if entry.get("name") == "Phalanx":
                return entry["args"]
    return None


def scheduler_binary(plane: ControlPlane, scheduler_container: dict) -> str:
    """What the scheduler container runs, found in the control plane's binary directory:
    kube-scheduler, or phalanx-scheduler (plugin mode; hack/build-plugin.sh builds it)."""
    binary = scheduler_container["command"][0]
    assert binary in ("kube-scheduler", "phalanx-scheduler"), binary
    if not os.access(plane.binaries.path(binary), os.X_OK):
        pytest.fail(f"{binary} not built in {plane.binaries.directory}: run `bash hack/build-plugin.sh`",
                    pytrace=False)
    return binary


def run_components(plane: ControlPlane, install: Install) -> dict[str, Any]:
    """Start kube-scheduler, phalanx serve and phalanx controller from the installed Deployments with
    their pods' credentials; point the installed webhooks at the controller. Returns what a test checks."""
    rest, phalanx_bin = plane.rest, str(Path(sys.executable).parent / "phalanx")
    scheduler_dep = rest.get(object_path(install.deployment("kube-scheduler")))
    controller_dep = rest.get(object_path(install.deployment("controller")))
    scheduler_ns = scheduler_dep["metadata"]["namespace"]
    scheduler_sa = scheduler_dep["spec"]["template"]["spec"]["serviceAccountName"]
    controller_ns = controller_dep["metadata"]["namespace"]
    controller_sa = controller_dep["spec"]["template"]["spec"]["serviceAccountName"]

    serve_dep = rest.get(object_path(install.deployment("phalanx")))  # the scheduler's pod, or one of its own
    serve_token, serve_sa = serve_identity(rest, scheduler_dep, serve_dep)
    assert serve_sa != scheduler_sa  # two identities
    # the scheduler's configuration: the installed ConfigMap its container mounts
    spec = scheduler_dep["spec"]["template"]["spec"]
    scheduler_container, serve_container = container(scheduler_dep, "kube-scheduler"), container(serve_dep, "phalanx")
    binary = scheduler_binary(plane, scheduler_container)
    config_file = next(a.split("=", 1)[1] for a in scheduler_container["command"] if a.startswith("--config="))
    config_mount = next(m for m in scheduler_container["volumeMounts"] if config_file.startswith(m["mountPath"] + "/"))
    config_map = next(v for v in spec["volumes"] if v["name"] == config_mount["name"])["configMap"]["name"]
    data = rest.get(f"/api/v1/namespaces/{scheduler_ns}/configmaps/{config_map}")["data"]
    config = yaml.safe_load(data[config_file.rsplit("/", 1)[1]])
    http_port, health_port, grpc_port = free_port(), free_port(), free_port()
    plugin_args = phalanx_plugin_args(config)
    tls_files: dict[str, str] = {}
    if plugin_args is None:  # extender mode: kube-scheduler calls the extender beside it on loopback
        assert binary == "kube-scheduler"
        extender = config["extenders"][0]
        assert extender["urlPrefix"].startswith("http://127.0.0.1:")  # the sidecar shape: loopback
        extender["urlPrefix"] = f"http://127.0.0.1:{http_port}/scheduler"
        grpc_addr = "off"
    else:  # plugin mode: phalanx-scheduler dials the gRPC endpoint of phalanx serve
        assert binary == "phalanx-scheduler" and "extenders" not in config
        tls_files = plugin_tls(plane, plugin_args, serve_container["args"], scheduler_ns)
        grpc_addr = plugin_args["address"] = f"127.0.0.1:{grpc_port}"

    serve_args = override(serve_container["args"],
                          kubeconfig=str(plane.token_kubeconfig(f"sa-{serve_sa}", serve_token)),
                          http_addr=f"127.0.0.1:{http_port}", health_addr=f"127.0.0.1:{health_port}",
                          grpc_addr=grpc_addr, **tls_files)
    serve = Component("phalanx-serve", [phalanx_bin, *serve_args], plane.workdir / "logs" / "phalanx-serve.log",
                      cwd=plane.workdir)
    install.processes.append(serve)
    serve.wait_ready(lambda: insecure_get(f"http://127.0.0.1:{health_port}/readyz") == 200, timeout=120)
    tokens = viewer_tokens(rest, install, "default")
    check_no_open_door(plane, tokens, serve_args, http_port, grpc_port if grpc_addr != "off" else None)

    # kube-scheduler (or phalanx-scheduler): the pod's ServiceAccount token, leader election on
    scheduler_kubeconfig = plane.token_kubeconfig(f"sa-{scheduler_sa}",
                                                  token_request(rest, scheduler_ns, scheduler_sa))
    scheduler = plane.start_scheduler(config, kubeconfig=scheduler_kubeconfig, leader_elect=True,
                                      name=f"{binary}-{scheduler_ns}", binary=binary)
    install.processes.append(scheduler.component)

    # phalanx controller: the pod's ServiceAccount token, a serving certificate from the test CA
    tls = plane.pki.server(f"controller-{controller_ns}", ["IP:127.0.0.1"])
    webhook_port = free_port()
    controller_args = override(container(controller_dep, "controller")["args"],
                               kubeconfig=str(plane.token_kubeconfig(
                                   f"sa-{controller_sa}", token_request(rest, controller_ns, controller_sa))),
                               webhook_addr=f"127.0.0.1:{webhook_port}", tls_cert=str(tls.cert), tls_key=str(tls.key))
    controller = Component("phalanx-controller", [phalanx_bin, *controller_args],
                           plane.workdir / "logs" / f"phalanx-controller-{controller_ns}.log", cwd=plane.workdir)
    install.processes.append(controller)
    controller.wait_ready(lambda: insecure_get(f"https://127.0.0.1:{webhook_port}/healthz") == 200, timeout=60)
    unverified = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    unverified.check_hostname = False
    assert answers(f"https://127.0.0.1:{webhook_port}/metrics", unverified, tokens) == [401, 403, 200]

    # the installed webhooks, called by URL (no pod network to reach their Service)
    ca_bundle = base64.b64encode(plane.pki.ca_cert.read_bytes()).decode()
    for rendered in install.webhook_configurations():
        live = rest.get(object_path(rendered))
        for hook in live["webhooks"]:
            assert hook["clientConfig"]["service"]["namespace"] == controller_ns
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle}
        rest.replace(object_path(rendered), live)
    wait_for(lambda: validation_active(rest), 30, "the installed webhooks are called by the API server")
    return {"scheduler_name": config["profiles"][0]["schedulerName"], "binary": binary,
            "lease": config["leaderElection"], "controller_ns": controller_ns,
            "logs": {"phalanx serve": serve.log, "phalanx controller": controller.log,
                     binary: scheduler.log},
            "tokens": {"phalanx serve": plane.token_kubeconfig(f"sa-{serve_sa}", serve_token),
                       binary: scheduler_kubeconfig}}


def restore_webhooks(rest, install: Install) -> None:
    """Undo run_components' URLs in the webhooks (a test's stand-in for the pod network), so that
    applying the manifests again merges as it would on a cluster."""
    for rendered in install.webhook_configurations():
        live = rest.get(object_path(rendered))
        for hook, shipped in zip(live["webhooks"], rendered["webhooks"], strict=True):
            hook["clientConfig"] = shipped["clientConfig"]
        rest.replace(object_path(rendered), live)


def validation_active(rest) -> bool:
    """True once the StatefulSet webhook rejects a malformed scheduling annotation (dry run)."""
    sts = statefulset("probe", 1, scheduling={"bogus": 1})
    try:
        rest.create("/apis/apps/v1/namespaces/default/statefulsets", sts, dryRun="All")
    except KubeError as err:
        return "unknown field" in str(err)
    return False


def place_a_gang(plane: ControlPlane, running: dict[str, Any]) -> None:
    """A user's gang StatefulSet: the controller makes its PodGroup, the webhook stamps and gates its
    pods, kube-scheduler + phalanx bind all three at once."""
    rest = plane.rest
    namespace = f"gang-{uuid.uuid4().hex[:6]}"
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    nodes = [f"{namespace}-n{i}" for i in range(3)]
    for name in nodes:
        create_node(rest, name, cpu="2")
    try:
        create(rest, statefulset("db", 3, scheduling={"schedulingPolicy": {"gang": {}}}, requests={"cpu": "2"},
                                 scheduler_name=running["scheduler_name"]), namespace)
        placement = wait_all_bound(rest, namespace, count=3, timeout=90, label_selector="app=db")
        assert len(set(placement.values())) == 3
        groups = rest.list_items(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups")
        assert len(groups) == 1 and groups[0]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3
        cond = podgroup_conditions(rest, namespace, groups[0]["metadata"]["name"])["PodGroupInitiallyScheduled"]
        assert cond["status"] == "True"
        assert record_text(rest.get(
            f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{groups[0]['metadata']['name']}"
        ))
    finally:
        rest.delete(f"/api/v1/namespaces/{namespace}", missing_ok=True)
        for name in nodes:
            rest.delete(f"/api/v1/nodes/{name}", missing_ok=True)


def check_identities(plane: ControlPlane, running: dict[str, Any]) -> None:
    rest = plane.rest
    lease = running["lease"]
    holder = rest.get(f"/apis/coordination.k8s.io/v1/namespaces/{lease['resourceNamespace']}/leases/"
                      f"{lease['resourceName']}")["spec"]["holderIdentity"]
    assert holder  # kube-scheduler led through its own Lease, with its own ServiceAccount
    assert rest.list_items(f"/apis/coordination.k8s.io/v1/namespaces/{running['controller_ns']}/leases")
    for who, kubeconfig in running["tokens"].items():  # not admin
        kube = Kube(str(kubeconfig))
        assert forbidden(kube, "GET", "/api/v1/namespaces/kube-system/secrets"), who
        assert forbidden(kube, "POST", "/api/v1/namespaces/default/configmaps",
                         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}), who
    for who, denied in denied_calls(running).items():  # every call the components made was allowed
        assert not denied, f"{who} was denied: {denied[:3]}"


#: a 403 that is not RBAC's: the NamespaceLifecycle admission plugin refusing new objects in a
#: namespace being deleted (a test's namespace goes while the controller still reconciles in it)
NAMESPACE_TERMINATING = "because it is being terminated"


def denied_calls(running: dict[str, Any]) -> dict[str, list[str]]:
    """Per component, the log lines of API calls RBAC refused."""
    return {who: [line for line in log.read_text(errors="replace").splitlines()
                  if ("forbidden" in line.lower() or "HTTP 403" in line) and NAMESPACE_TERMINATING not in line]
            for who, log in running["logs"].items()}


def place_a_gang_through(plane: ControlPlane, running: dict[str, Any]) -> None:
    try:
        place_a_gang(plane, running)
    except TimeoutError as err:  # name what RBAC refused, if that is why
        raise AssertionError(f"{err}; denied calls: {denied_calls(running)}") from None


def check_pod_security(rest, objects: list[dict]) -> None:
    """Every shipped pod not on the host network is admitted by Pod Security "restricted" (the
    upstream PodSecurity admission plugin, for real); the same pod with a probe host is refused."""
    namespace = f"psa-{uuid.uuid4().hex[:6]}"
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    try:
        checked = 0
        for where, spec in pod_templates(objects):
            if spec.get("hostNetwork"):
                continue
            spec = copy.deepcopy(spec)
            spec.pop("serviceAccountName", None)
            name = where.split("/", 1)[1].lower()[:50]
            create(rest, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}, namespace)
            checked += 1
            bad = copy.deepcopy(spec)
            bad["containers"][0].setdefault("livenessProbe", {"httpGet": {"port": 1}})["httpGet"]["host"] = "127.0.0.1"
            with pytest.raises(KubeError) as refused:
                create(rest, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name + "-host"}, "spec": bad},
                       namespace)
            assert refused.value.status == 403 and "probe" in str(refused.value).lower(), refused.value
        assert checked >= 2
    finally:
        rest.delete(f"/api/v1/namespaces/{namespace}", missing_ok=True)


# -- kubectl apply -k -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kustomize_install(plane, tools):
    tools.run("kubectl", "apply", "-k", str(KUSTOMIZE / "crds"))
    tools.run("kubectl", "apply", "-k", str(KUSTOMIZE))
    install = Install(documents(tools.run("kubectl", "kustomize", str(KUSTOMIZE)).stdout)
                      + documents(tools.run("kubectl", "kustomize", str(KUSTOMIZE / "crds")).stdout))
    yield install
    install.stop()


def test_kubectl_apply_k_creates_every_object(plane, kustomize_install):
    kinds = {o["kind"] for o in kustomize_install.objects}
    assert {"Deployment", "ClusterRole", "ServiceAccount", "Secret", "ConfigMap", "MutatingWebhookConfiguration",
            "CustomResourceDefinition"} <= kinds
    assert missing_on_server(plane.rest, kustomize_install.objects) == []
    assert shipped_problems(kustomize_install.objects) == {}
    check_pod_security(plane.rest, kustomize_install.objects)


def test_kubectl_install_runs_under_its_serviceaccounts_and_places_a_gang(plane, kustomize_install):
    running = run_components(plane, kustomize_install)
    place_a_gang_through(plane, running)
    check_identities(plane, running)


def plugin_kustomization(workdir: Path, *components: str) -> Path:
    """A kustomization of a user's own, as docs/install.md shows: scheduler-config/ with the
    components (default: plugin/)."""
    components = components or ("plugin",)
    where = workdir / f"kustomize-{'-'.join(components)}"
    where.mkdir(exist_ok=True)
    relative = os.path.relpath(KUSTOMIZE, where)
    (where / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [relative], "components": [f"{relative}/{c}" for c in components]}))
    return where


def check_plugin_profile(config: dict, scheduler_name: str, permit_timeout: str) -> None:
    """A plugin-mode configuration enables the shipped profile's plugins with its args, for the
    profile ``scheduler_name``, and nothing of the extender (over mTLS: the address and ``tls`` are
    the Service's, checked by the caller)."""
    shipped = yaml.safe_load(PLUGIN_PROFILE.read_text())
    (profile,), (shipped_profile,) = config["profiles"], shipped["profiles"]
    assert profile["schedulerName"] == scheduler_name and "extenders" not in config
    assert profile["plugins"] == shipped_profile["plugins"]
    # mode main also names the control plane's kubeconfig there (checked where it is rendered)
    assert {k: v for k, v in config["clientConnection"].items() if k != "kubeconfig"} == shipped["clientConnection"]
    args, shipped_args = phalanx_plugin_args(config), phalanx_plugin_args(shipped)
    assert args["permitTimeout"] == permit_timeout
    own = {"permitTimeout"} | ({"address", "tls"} if "tls" in args else set())
    assert {k: v for k, v in args.items() if k not in own} == {
        k: v for k, v in shipped_args.items() if k not in own}  # address without tls: serve's default, loopback


def check_plugin_deployment(objects: list[dict], image: str) -> dict:
    """The second scheduler's Deployment in plugin mode: phalanx-scheduler from ``image``, phalanx serve
    beside it serving gRPC on loopback. Returns its configuration."""
    (dep,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-scheduler")]
    scheduler = container(dep, "kube-scheduler")
    assert scheduler["image"] == image and scheduler["command"][0] == "phalanx-scheduler"
    config_file = next(a.split("=", 1)[1] for a in scheduler["command"] if a.startswith("--config="))
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if "configMap" in v)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"
                     and o["metadata"]["name"] == volume["configMap"]["name"]]
    config = yaml.safe_load(config_map["data"][config_file.rsplit("/", 1)[1]])
    assert phalanx_plugin_args(config)["address"] == flag_value(container(dep, "phalanx")["args"], "--grpc-addr")
    return config


def check_plugin_tls_deployments(objects: list[dict], image: str) -> dict:
    """Plugin mode over mTLS: phalanx-scheduler from ``image`` alone in its pod with the client
    certificate mounted where its args read it; phalanx serve in a Deployment of its own serving gRPC
    with TLS, behind a Service that exposes that port. Returns the scheduler's configuration."""
    (scheduler_dep,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-scheduler")]
    scheduler = container(scheduler_dep, "kube-scheduler")
    assert scheduler["image"] == image and [c["name"] for c in scheduler_dep["spec"]["template"]["spec"]["containers"]] == [
        "kube-scheduler"]
    config_file = next(a.split("=", 1)[1] for a in scheduler["command"] if a.startswith("--config="))
    volumes = {v["name"]: v for v in scheduler_dep["spec"]["template"]["spec"]["volumes"]}
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == next(
        v["configMap"]["name"] for v in volumes.values() if "configMap" in v)]
    config = yaml.safe_load(config_map["data"][config_file.rsplit("/", 1)[1]])
    tls = phalanx_plugin_args(config)["tls"]
    mounts = {m["mountPath"]: volumes[m["name"]] for m in scheduler["volumeMounts"]}
    for key in ("caFile", "certFile", "keyFile"):
        directory, _, name = tls[key].rpartition("/")
        assert "secret" in mounts[directory] and name in ("ca.crt", "tls.crt", "tls.key"), tls
    serve_dep = next(o for o in objects if o["kind"] == "Deployment" and o is not scheduler_dep
                     and "phalanx" in {c["name"] for c in o["spec"]["template"]["spec"]["containers"]})
    args = container(serve_dep, "phalanx")["args"]
    port = phalanx_plugin_args(config)["address"].rpartition(":")[2]
    assert flag_value(args, "--grpc-addr") == f"0.0.0.0:{port}" and flag_value(args, "--grpc-client-ca")
    services = [o for o in objects if o["kind"] == "Service"
                and o["spec"]["selector"].items() <= serve_dep["spec"]["template"]["metadata"]["labels"].items()]
    assert [p["port"] for s in services for p in s["spec"]["ports"] if p["name"] == "grpc"] == [int(port)]
    return config


@pytest.fixture
def kustomize_plugin_install(plane, tools, kustomize_install):
    """The kubectl install switched to plugin mode: ``kubectl apply -k`` of the kustomization with
    the component over it."""
    kustomize_install.stop()
    restore_webhooks(plane.rest, kustomize_install)
    where = plugin_kustomization(plane.workdir)
    tools.run("kubectl", "apply", "-k", str(where))
    install = Install(documents(tools.run("kubectl", "kustomize", str(where)).stdout))
    yield install
    install.stop()


def test_kubectl_plugin_component_runs_phalanx_scheduler_and_places_a_gang(plane, kustomize_plugin_install):
    objects = kustomize_plugin_install.objects
    assert missing_on_server(plane.rest, objects) == []
    assert shipped_problems(objects) == {}
    check_plugin_profile(check_plugin_deployment(objects, "phalanx-scheduler:0.1.0"), "phalanx", "30s")
    running = run_components(plane, kustomize_plugin_install)
    assert running["binary"] == "phalanx-scheduler"
    place_a_gang_through(plane, running)
    check_identities(plane, running)


@pytest.fixture
def kustomize_plugin_tls_install(plane, tools, kustomize_install):
    """The kubectl install switched to plugin mode over mTLS: the components plugin/ and plugin-tls/."""
    kustomize_install.stop()
    restore_webhooks(plane.rest, kustomize_install)
    where = plugin_kustomization(plane.workdir, "plugin", "plugin-tls")
    tools.run("kubectl", "apply", "-k", str(where))
    install = Install(documents(tools.run("kubectl", "kustomize", str(where)).stdout))
    yield install
    install.stop()


def test_kubectl_plugin_tls_component_places_a_gang_through_mtls(plane, kustomize_plugin_tls_install):
    """phalanx serve in a Deployment of its own behind its Service; phalanx-scheduler dials it with
    a client certificate, places a gang through it, and nothing answers without credentials."""
    objects = kustomize_plugin_tls_install.objects
    assert missing_on_server(plane.rest, objects) == []
    assert shipped_problems(objects) == {}
    (service,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["namespace"] == "kube-system"]
    config = check_plugin_tls_deployments(objects, "phalanx-scheduler:0.1.0")
    check_plugin_profile(config, "phalanx", "30s")
    assert phalanx_plugin_args(config)["tls"]["serverName"] == f"{service['metadata']['name']}.kube-system.svc"
    running = run_components(plane, kustomize_plugin_tls_install)
    place_a_gang_through(plane, running)
    check_identities(plane, running)


def test_kubectl_delete_k_removes_it(plane, tools, kustomize_install):
    kustomize_install.stop()
    # the token controller deletes the token Secret with its ServiceAccount, hence --ignore-not-found
    tools.run("kubectl", "delete", "-k", str(KUSTOMIZE), "--wait=false", "--ignore-not-found")
    cluster_wide = [o for o in kustomize_install.objects
                    if o["kind"] in CLUSTER_SCOPED - {"CustomResourceDefinition", "Namespace"}]
    assert missing_on_server(plane.rest, cluster_wide) == [object_path(o) for o in cluster_wide]
    for namespace in (o for o in kustomize_install.objects if o["kind"] == "Namespace"):  # finalized asynchronously
        assert (plane.rest.get_or_none(object_path(namespace)) or {"metadata": {"deletionTimestamp": "gone"}})[
            "metadata"].get("deletionTimestamp")


# -- helm ------------------------------------------------------------------------------------------

def helm_template(tools: Tools, *values: str, release: str = "phalanx", namespace: str = "phalanx") -> list[dict]:
    return documents(tools.run("helm", "template", release, str(CHART), "-n", namespace, *values).stdout)


def test_helm_lint_and_every_rendering(tools):
    for values in [[], *SHAPES.values(), PLUGIN, PLUGIN_TLS]:
        tools.run("helm", "lint", "--strict", str(CHART), *values)
        rendered = helm_template(tools, *values)
        assert shipped_problems(rendered) == {}, values
        assert pod_templates(rendered), values
    kustomized = documents((KUSTOMIZE / "rbac.yaml").read_text()) + documents(
        (KUSTOMIZE / "controller" / "rbac.yaml").read_text())
    default = helm_template(tools)
    assert rules_of(default, "-scheduler") == rules_of(kustomized, "phalanx-scheduler")
    assert rules_of(default, "-controller") == rules_of(kustomized, "phalanx-controller")
    assert rules_of(default, "-viewer") == rules_of(kustomized, "phalanx-viewer")
    for objects in (default, kustomized):  # serve and the controller create TokenReviews and SubjectAccessReviews
        bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].endswith(
            "-auth-delegator")]
        assert {b["roleRef"]["name"] for b in bindings} == {"system:auth-delegator"}
        assert sorted(b["subjects"][0]["name"] for b in bindings) == ["phalanx", "phalanx-controller"], bindings
    crds = [o for o in helm_template(tools, "--set", "flavor=crds") if o["kind"] == "CustomResourceDefinition"]
    shipped = [doc for p in sorted((KUSTOMIZE / "crds").glob("*.scheduling.phalanx.dev.yaml"))
               for doc in documents(p.read_text())]
    for crd in crds:
        assert crd["metadata"]["annotations"].pop("helm.sh/resource-policy") == "keep"
        if not crd["metadata"]["annotations"]:
            del crd["metadata"]["annotations"]
    assert sorted(crds, key=lambda o: o["metadata"]["name"]) == sorted(shipped, key=lambda o: o["metadata"]["name"])
    bad = tools.run("helm", "template", "x", str(CHART), "--set", "mode=sidecar", check=False)
    assert bad.returncode != 0 and "mode" in bad.stderr


def test_helm_plugin_mode_renderings(tools):
    """integration=plugin: phalanx-scheduler with the shipped plugin profile beside phalanx serve
    (mode second), or the profile for the control plane's phalanx-scheduler (mode main); plugin.args
    and serve.barrierTimeout reach the plugin; no extender; with tls.enabled the plugin dials serve's
    Service over mTLS; an unknown integration and plugin.args the chart sets are refused."""
    second = helm_template(tools, *PLUGIN, "--set", "serve.barrierTimeout=20")
    check_plugin_profile(check_plugin_deployment(second, "phalanx-scheduler:0.1.0"), "phalanx", "20s")
    # gRPC stays on the pod's loopback: the only Service is the controller's webhooks'
    assert [o["metadata"]["name"] for o in second if o["kind"] == "Service"] == ["phalanx-controller"]
    main = helm_template(tools, *SHAPES["main-plugin"])
    (config_map,) = [o for o in main if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-main-scheduler-config")]
    main_config = yaml.safe_load(config_map["data"]["kube-scheduler-config.yaml"])
    check_plugin_profile(main_config, "default-scheduler", "30s")
    # kube-scheduler ignores --kubeconfig with --config: the rendered file names it, in both integrations
    for shape in ("main", "main-plugin"):
        (cm,) = [o for o in helm_template(tools, *SHAPES[shape], "--set", "main.kubeconfig=/etc/k/s.conf")
                 if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-main-scheduler-config")]
        rendered = yaml.safe_load(cm["data"]["kube-scheduler-config.yaml"])
        assert rendered["clientConnection"]["kubeconfig"] == "/etc/k/s.conf", shape
    assert main_config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf", "qps": 500, "burst": 1000}
    (daemonset,) = [o for o in main if o["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["spec"]["hostNetwork"]  # the node's loopback, where phalanx-scheduler dials
    assert phalanx_plugin_args(main_config)["address"] == flag_value(container(daemonset, "phalanx")["args"],
                                                                     "--grpc-addr")
    tuned = helm_template(tools, *PLUGIN, "--set", "plugin.args.rpcTimeout=3s", "--set", "plugin.image=reg/ps:1")
    assert phalanx_plugin_args(check_plugin_deployment(tuned, "reg/ps:1"))["rpcTimeout"] == "3s"
    tls = helm_template(tools, *PLUGIN_TLS, release="x", namespace="ns")
    tls_config = check_plugin_tls_deployments(tls, "phalanx-scheduler:0.1.0")
    check_plugin_profile(tls_config, "phalanx", "30s")
    assert phalanx_plugin_args(tls_config)["address"] == "x-phalanx.ns.svc:50051"
    assert phalanx_plugin_args(tls_config)["tls"]["serverName"] == "x-phalanx.ns.svc"
    for bad, where in ((["--set", "integration=sidecar"], "/integration"),
                       ([*PLUGIN, "--set", "plugin.args.address=127.0.0.2:1"], "/plugin/args"),
                       ([*PLUGIN, "--set", "plugin.args.tls.caFile=/x"], "/plugin/args")):
        refused = tools.run("helm", "template", "x", str(CHART), *bad, check=False)
        assert refused.returncode != 0 and where in refused.stderr, refused.stderr


@pytest.fixture(scope="module")
def helm_install(plane, tools, kustomize_install):
    tools.run("helm", "install", "phalanx", str(CHART), "-n", "phalanx", "--create-namespace")
    install = Install(documents(tools.run("helm", "get", "manifest", "phalanx", "-n", "phalanx").stdout))
    yield install
    install.stop()
    tools.run("helm", "uninstall", "phalanx", "-n", "phalanx", check=False)


def test_helm_install_creates_every_object(plane, helm_install):
    assert {"Deployment", "ClusterRole", "ServiceAccount", "Secret", "ConfigMap"} <= {o["kind"] for o in helm_install.objects}
    assert missing_on_server(plane.rest, helm_install.objects) == []
    check_pod_security(plane.rest, helm_install.objects)


def test_helm_install_runs_under_its_serviceaccounts_and_places_a_gang(plane, helm_install):
    running = run_components(plane, helm_install)
    place_a_gang_through(plane, running)
    check_identities(plane, running)


@pytest.fixture
def helm_plugin_install(plane, tools, helm_install):
    """The Helm release switched to plugin mode: ``helm upgrade --set integration=plugin``."""
    helm_install.stop()
    restore_webhooks(plane.rest, helm_install)
    upgrade = tools.run("helm", "upgrade", "phalanx", str(CHART), "-n", "phalanx", *PLUGIN)
    install = Install(documents(tools.run("helm", "get", "manifest", "phalanx", "-n", "phalanx").stdout))
    install.notes = upgrade.stdout
    yield install
    install.stop()


def test_helm_plugin_mode_runs_phalanx_scheduler_and_places_a_gang(plane, helm_plugin_install):
    objects = helm_plugin_install.objects
    assert missing_on_server(plane.rest, objects) == []
    assert "plugin mode" in helm_plugin_install.notes and "phalanx-scheduler:0.1.0" in helm_plugin_install.notes
    check_plugin_profile(check_plugin_deployment(objects, "phalanx-scheduler:0.1.0"), "phalanx", "30s")
    running = run_components(plane, helm_plugin_install)
    assert running["binary"] == "phalanx-scheduler"
    place_a_gang_through(plane, running)
    check_identities(plane, running)


@pytest.fixture
def helm_plugin_tls_install(plane, tools, helm_install):
    """The Helm release switched to plugin mode over mTLS: ``helm upgrade --set integration=plugin
    --set tls.enabled=true``."""
    helm_install.stop()
    restore_webhooks(plane.rest, helm_install)
    tools.run("helm", "upgrade", "phalanx", str(CHART), "-n", "phalanx", *PLUGIN_TLS)
    install = Install(documents(tools.run("helm", "get", "manifest", "phalanx", "-n", "phalanx").stdout))
    yield install
    install.stop()


def test_helm_plugin_mode_with_tls_places_a_gang_through_mtls(plane, helm_plugin_tls_install):
    objects = helm_plugin_tls_install.objects
    assert missing_on_server(plane.rest, objects) == []
    check_plugin_profile(check_plugin_tls_deployments(objects, "phalanx-scheduler:0.1.0"), "phalanx", "30s")
    running = run_components(plane, helm_plugin_tls_install)
    assert running["binary"] == "phalanx-scheduler"
    place_a_gang_through(plane, running)
    check_identities(plane, running)


def check_scheduler_configs(plane: ControlPlane, objects: list[dict]) -> None:
    """kube-scheduler (strict decoding) starts from every KubeSchedulerConfiguration the chart
    renders, its client-certificate files swapped for the test CA's; phalanx-scheduler from every
    plugin-mode one (its plugin decodes its args and reads its TLS files at start)."""
    client = plane.pki.client("chart-scheduler-client", "kube-scheduler")
    files = {"caFile": str(plane.pki.ca_cert), "certFile": str(client.cert), "keyFile": str(client.key)}
    for config_map in (o for o in objects if o["kind"] == "ConfigMap"):
        config = yaml.safe_load(config_map["data"]["kube-scheduler-config.yaml"])
        for extender in config.get("extenders", []):
            if "tlsConfig" in extender:
                extender["tlsConfig"].update(files)
        if "tls" in (phalanx_plugin_args(config) or {}):  # the plugin reads its files when it starts
            phalanx_plugin_args(config)["tls"].update(files)
        binary = "kube-scheduler" if phalanx_plugin_args(config) is None else "phalanx-scheduler"
        plane.start_scheduler(config, name=f"check-{config_map['metadata']['name']}", binary=binary).stop()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_helm_install_every_shape_is_accepted(plane, tools, shape):
    rest, release = plane.rest, f"shape-{shape}"
    crds = [f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.scheduling.phalanx.dev"
            for plural in ("podgroups", "workloads", "compositepodgroups")]
    if shape == "crds":  # the kubectl install's CRDs go first, so this release installs its own
        for crd in crds:
            rest.delete(crd, missing_ok=True)
            wait_gone(rest, crd)
    tools.run("helm", "install", release, str(CHART), "-n", release, "--create-namespace", *SHAPES[shape])
    try:
        objects = documents(tools.run("helm", "get", "manifest", release, "-n", release).stdout)
        assert objects and missing_on_server(rest, objects) == []
        check_scheduler_configs(plane, objects)
        if shape == "crds":
            assert sum(o["kind"] == "CustomResourceDefinition" for o in objects) == len(crds)
            # a second release of the CRD flavor leaves the CRDs to the first instead of failing
            tools.run("helm", "install", f"{release}-2", str(CHART), "-n", f"{release}-2", "--create-namespace",
                      *SHAPES[shape])
            second = documents(tools.run("helm", "get", "manifest", f"{release}-2", "-n", f"{release}-2").stdout)
            assert not [o for o in second if o["kind"] == "CustomResourceDefinition"]
            tools.run("helm", "uninstall", f"{release}-2", "-n", f"{release}-2")
    finally:
        tools.run("helm", "uninstall", release, "-n", release)
    if shape == "crds":  # CRDs outlive the release (helm.sh/resource-policy: keep), with their objects
        assert all(rest.get_or_none(crd) for crd in crds)
