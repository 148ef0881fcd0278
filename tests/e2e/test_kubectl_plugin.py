"""``kubectl phalanx`` from the built kubectl, against the real API server, reaching phalanx serve
the way it does on a cluster: a ``pods/portforward`` stream through the API server to serve's pod.

serve runs in this process (token reviews on, as installed) behind kube-scheduler with the shipped
extender configuration. A pod stands for serve's: ``phalanx-serve-0``, labelled as the shipped
Deployment's pod, on a node of its own (``kubectl-serve-host``, InternalIP 127.0.0.1, tainted so no
gang lands there). That node's "kubelet" is a second KWOK managing it alone, whose kubelet API
(port-forward included) is where the node's status sends the API server; its ``PortForward`` rule
forwards the pod's port 8888 to serve's loopback port, as the kubelet forwards into the pod's
network namespace where serve listens on 127.0.0.1:8888. The user is a ServiceAccount whose token
kubeconfig gives it the rules docs/kubectl-plugin.md lists, and the shipped phalanx-viewer role.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from harness import GPU, RACK, create, pod, podgroup, wait_all_bound, wait_for
from harness.kwok import stages
from harness.process import Component, free_port
from harness.tools import locate_tools

from extender.server import ServeOptions, build

from .conftest import PHALANX_BARRIER_SECONDS, start_phalanx_scheduler

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "scheduler-config" / "rbac.yaml"
HOST = "kubectl-serve-host"
HOST_TAINT = {"key": "phalanx.dev/kubectl-e2e-serve-host", "value": "true", "effect": "NoSchedule"}
SERVE_POD = "phalanx-serve-0"
SERVE_PORT_IN_POD = 8888  # the plugin's default --phalanx-port: serve's port in the shipped pod
UNSERVED = "kubectl-e2e-unserved"  # a schedulerName no kube-scheduler runs: phalanx plans ahead, nothing binds
PLUGIN = Path(sys.executable).parent / "kubectl-phalanx"


def what_if() -> dict:
    """serve's what-if compiler, as ``phalanx serve`` composes it, once serve has one (the option
    ``compile_manifest``); nothing before (the plugin then meets a serve without what-if)."""
    if "compile_manifest" not in {f.name for f in dataclasses.fields(ServeOptions)}:
        return {}
    from controller.whatif import compile_objects

    return {"compile_manifest": compile_objects}


@pytest.fixture(scope="module")
def served(control_plane):
    """serve (token reviews on) and kube-scheduler calling it; gangs of ``UNSERVED`` are planned
    ahead and their plans held (nothing asks to bind them)."""
    service = build(ServeOptions(http_addr="127.0.0.1:0", grpc_addr="off", http_threads=64,
                                 barrier_timeout=PHALANX_BARRIER_SECONDS, plan_ttl=600.0, plan_ahead=(UNSERVED,),
                                 **what_if()),
                    kubeconfig=str(control_plane.admin_kubeconfig)).start()
    scheduler = start_phalanx_scheduler(control_plane, "extender", service)
    yield service
    scheduler.stop()
    service.stop()


@pytest.fixture(scope="module")
def serve_pod(control_plane, served, tmp_path_factory):
    """serve's stand-in pod in its own namespace, on a node whose kubelet API is a second KWOK that
    forwards the pod's port 8888 to serve. Yields the namespace."""
    rest = control_plane.rest
    namespace = f"phalanx-kubectl-{uuid.uuid4().hex[:5]}"
    port = free_port()
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    config = tmp_path_factory.mktemp("kwok-host") / "kwok.yaml"
    forward = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "PortForward",
               "metadata": {"name": SERVE_POD, "namespace": namespace},
               "spec": {"forwards": [{"ports": [SERVE_PORT_IN_POD],
                                      "target": {"port": served.port, "address": "127.0.0.1"}}]}}
    config.write_text(yaml.safe_dump_all([*stages(), forward], sort_keys=False))
    kubeconfig = control_plane.component_kubeconfig("kwok-serve-host", "system:kwok-controller")
    kwok = Component("kwok-serve-host", [
        str(control_plane.binaries.kwok), f"--kubeconfig={kubeconfig}", f"--config={config}",
        f"--manage-single-node={HOST}", f"--server-address=127.0.0.1:{port}", "--node-ip=127.0.0.1",
        f"--node-port={port}", "--node-lease-duration-seconds=20"],
        control_plane.workdir / "logs" / "kwok-serve-host.log", cwd=control_plane.workdir)
    try:
        kwok.wait_ready(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200,
                        timeout=60)
        rest.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": HOST, "labels": {"kubernetes.io/hostname": HOST}},
                                      "spec": {"taints": [HOST_TAINT]}})
        rest.patch(f"/api/v1/nodes/{HOST}/status", {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"}}})
        rest.create(f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": SERVE_POD, "labels": {"app": "phalanx-scheduler"}},
            "spec": {"nodeName": HOST, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "phalanx", "image": "phalanx:0.1.0"}]}})
        wait_for(lambda: (rest.get(f"/api/v1/namespaces/{namespace}/pods/{SERVE_POD}").get("status") or {})
                 .get("phase") == "Running", 60, "serve's pod Running (KWOK)")
        yield namespace
    finally:
        rest.delete(f"/api/v1/namespaces/{namespace}", missing_ok=True)
        rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": 0})
        rest.delete(f"/api/v1/nodes/{HOST}", missing_ok=True)
        kwok.stop()


@pytest.fixture(scope="module")
def user(control_plane, serve_pod, tmp_path_factory):
    """A token kubeconfig of a ServiceAccount holding what the plugin needs: the shipped
    phalanx-viewer role, and (docs/kubectl-plugin.md) pods get/list and pods/portforward get/create in
    serve's namespace, pods get where it explains pods."""
    rest = control_plane.rest
    suffix = uuid.uuid4().hex[:5]
    home, rbac = f"kubectl-user-{suffix}", "/apis/rbac.authorization.k8s.io/v1"
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": home}})
    rest.create(f"/api/v1/namespaces/{home}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "me"}})
    subject = [{"kind": "ServiceAccount", "name": "me", "namespace": home}]
    (viewer,) = [d for d in yaml.safe_load_all(RBAC.read_text())
                 if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "phalanx-viewer"]
    # what-if is a POST, which serve authorizes as "create" on its path (what the what-if endpoint's
    # phalanx-viewer grants; given here too while the shipped role predates it)
    whatif = {"nonResourceURLs": ["/phalanx/phalanx/api/whatif"], "verbs": ["create"]}
    roles = {f"phalanx-viewer-{suffix}": [*viewer["rules"], whatif],
             f"kubectl-phalanx-{suffix}": [
                 {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                 {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get", "create"]},
                 {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}]}
    for name, rules in roles.items():
        rest.create(f"{rbac}/clusterroles", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                             "metadata": {"name": name}, "rules": rules})
        rest.create(f"{rbac}/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subject})
    token = rest.create(f"/api/v1/namespaces/{home}/serviceaccounts/me/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": 3600}})["status"]["token"]
    wait_for(lambda: rest.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": f"system:serviceaccount:{home}:me",
                 "resourceAttributes": {"namespace": serve_pod, "verb": "create", "resource": "pods",
                                        "subresource": "portforward"}}})["status"].get("allowed"),
             30, "RBAC sees the user's bindings")
    yield control_plane.token_kubeconfig(f"kubectl-user-{suffix}", token)
    for name in roles:
        rest.delete(f"{rbac}/clusterrolebindings/{name}", missing_ok=True)
        rest.delete(f"{rbac}/clusterroles/{name}", missing_ok=True)
    rest.delete(f"/api/v1/namespaces/{home}", missing_ok=True)


@pytest.fixture(scope="module")
def kubectl(control_plane, serve_pod, user, tmp_path_factory):
    """``kubectl(*args)``: the built kubectl as the user, with kubectl-phalanx (as installed with the
    package) on PATH and nothing else of the virtualenv."""
    tools = locate_tools(user, tmp_path_factory.mktemp("kubectl-home"))
    bin_dir = tmp_path_factory.mktemp("plugin-path")
    assert PLUGIN.exists(), f"{PLUGIN} missing: make install puts it there ([project.scripts])"
    (bin_dir / "kubectl-phalanx").symlink_to(PLUGIN)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "KUBECONFIG": str(user), "HOME": str(tools.home)}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([str(tools.kubectl), *args], capture_output=True, text=True, env=env, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    run.bin_dir = bin_dir  # type: ignore[attr-defined]
    return run


def where(serve_namespace: str) -> list[str]:
    return ["--phalanx-namespace", serve_namespace]


def test_kubectl_finds_the_plugin(kubectl):
    listed = kubectl("plugin", "list")
    assert str(kubectl.bin_dir / "kubectl-phalanx") in listed.stdout
    assert "kubectl phalanx" in kubectl("phalanx", "--help").stdout


def test_top_explain_and_plans_of_a_placed_gang(kubectl, control_plane, served, serve_pod, namespace, nodes):
    rest = control_plane.rest
    for rack in ("r1", "r2"):
        for i in range(2):
            nodes.add(f"kp-{rack}-{i}", gpu=2, rack=rack)
    create(rest, podgroup("train", min_count=4, topology_key=RACK), namespace)
    for i in range(4):
        create(rest, pod(f"train-{i}", "train", {"cpu": "1", GPU: 1}), namespace)
    placed = wait_all_bound(rest, namespace, count=4, timeout=60, podgroup="train")
    (rack,) = {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in placed.values()}
    wait_for(lambda: served.cycle.group_state(f"{namespace}/train") == "scheduled", 30, "serve sees it bound")

    table = kubectl("phalanx", "top", "-n", namespace, *where(serve_pod)).stdout.splitlines()
    assert table[0].split() == ["NAME", "STATE", "DOMAIN", "BOUND", "MIN", "COUNT", "AGE"]
    assert table[1].split()[:5] == ["train", "scheduled", rack, "4/4", "4"]
    everything = json.loads(kubectl("phalanx", "top", "-A", "-o", "json", *where(serve_pod)).stdout)
    assert f"{namespace}/train" in {r["key"] for r in everything["podgroups"]}

    text = kubectl("phalanx", "explain", "podgroup/train", "-n", namespace, *where(serve_pod)).stdout
    assert text.startswith(f"podgroup {namespace}/train: scheduled\n  members: 4 exist, 4 bound (minCount 4)")
    assert all(f"train-{i}  {placed[f'train-{i}']}" in text for i in range(4))
    by_pod = kubectl("phalanx", "explain", "pod/train-2", "-n", namespace, *where(serve_pod)).stdout
    assert by_pod.startswith(f"podgroup {namespace}/train: scheduled")

    # a gang of a profile no kube-scheduler runs: planned ahead, its plan held
    create(rest, podgroup("held", min_count=2, topology_key=RACK), namespace)
    for i in range(2):
        create(rest, pod(f"held-{i}", "held", {"cpu": "1", GPU: 1}, scheduler_name=UNSERVED), namespace)
    key = f"{namespace}/held"
    wait_for(lambda: served.cycle.plan_of(key) is not None, 30, "phalanx plans the held gang ahead")
    plan = served.cycle.plan_of(key)
    rows = kubectl("phalanx", "plans", "-n", namespace, "-o", "wide", *where(serve_pod)).stdout.splitlines()
    assert rows[0].split()[:5] == ["NAME", "STATE", "DOMAIN", "PODS", "NODES"]
    (held,) = [r.split() for r in rows[1:] if r.startswith("held ")]
    assert held[:4] == ["held", "planned", plan.domain, "2"]
    assert held[-1] == ",".join(sorted(set(plan.assignments.values())))
    doc = yaml.safe_load(kubectl("phalanx", "plans", "-n", namespace, "-o", "yaml", *where(serve_pod)).stdout)
    (mine,) = [p for p in doc["plans"] if p["name"] == "held"]
    assert sorted(mine["assignments"]) == ["held-0", "held-1"]


def test_errors_are_clear_and_exit_1(kubectl, serve_pod, tmp_path):
    gone = kubectl("phalanx", "explain", "podgroup/no-such-group", *where(serve_pod), check=False)
    assert gone.returncode == 1 and "podgroup default/no-such-group: HTTP 404: podgroup default/no-such-group not found" \
        in gone.stderr
    elsewhere = kubectl("phalanx", "top", "--phalanx-namespace", "nowhere", check=False)
    assert elsewhere.returncode == 1 and "no Running pod matches 'app=phalanx-scheduler' in namespace nowhere" \
        in elsewhere.stderr
    (tmp_path / "bad-token").write_text("not-a-token")
    refused = kubectl("phalanx", "top", "--token-file", str(tmp_path / "bad-token"), *where(serve_pod), check=False)
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr


def test_whatif_posts_through_the_same_stream(kubectl, serve_pod, tmp_path):
    """What-if over the same stream: serve's answer as a table, or, from a serve without the
    endpoint, the plugin says so (HTTP 404)."""
    manifest = tmp_path / "gang.yaml"
    manifest.write_text(yaml.safe_dump_all([podgroup("wi", min_count=2),
                                            *(pod(f"wi-{i}", "wi", {"cpu": "1"}) for i in range(2))]))
    done = kubectl("phalanx", "whatif", "-f", str(manifest), "-n", "default", *where(serve_pod), check=False)
    if done.returncode == 0:
        lines = done.stdout.splitlines()
        assert lines[0].split()[:3] == ["PODGROUP", "VERDICT", "DOMAIN"]
        assert any(line.startswith("default/wi ") for line in lines[1:]), done.stdout
    else:
        assert done.returncode == 1 and what_if() == {}, done.stderr
        assert "does not offer what-if (POST /phalanx/api/whatif answered HTTP 404" in done.stderr


# -- installed by krew, as a user installs it ---------------------------------------------------------

KREW_MANIFEST = ROOT / "plugins" / "krew" / "phalanx.yaml"


@pytest.fixture(scope="module")
def krew_kubectl(control_plane, serve_pod, user, tmp_path_factory):
    """``kubectl(*args)`` with krew (built pinned, as ``kubectl-krew``) on PATH and its own KREW_ROOT;
    nothing of phalanx on PATH until krew installs it. The launcher krew installs runs the package
    with the interpreter ``PHALANX_PYTHON`` names (this one, which has phalanx installed)."""
    import importlib.util

    tools = locate_tools(user, tmp_path_factory.mktemp("krew-home"))
    spec = importlib.util.spec_from_file_location("krew_archive", ROOT / "hack" / "krew_archive.py")
    assert spec is not None and spec.loader is not None
    krew_archive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(krew_archive)
    work = tmp_path_factory.mktemp("krew")
    archive = work / "kubectl-phalanx.tar.gz"
    archive.write_bytes(krew_archive.archive_bytes())  # what `make krew-archive` builds
    tool_bin, root = work / "bin", work / "krew-root"
    tool_bin.mkdir()
    (tool_bin / "kubectl-krew").symlink_to(tools.krew)  # how krew installs itself: a kubectl plugin
    env = {"PATH": f"{root / 'bin'}:{tool_bin}:/usr/bin:/bin", "KUBECONFIG": str(user), "HOME": str(tools.home),
           "KREW_ROOT": str(root), "KREW_NO_UPGRADE_CHECK": "1", "PHALANX_PYTHON": sys.executable}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([str(tools.kubectl), *args], capture_output=True, text=True, env=env, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    # krew's own commands (list, uninstall) want a plugin index, a git clone; with no network, a
    # local index holding phalanx's manifest, added the way krew adds any index (`krew index add`)
    index = work / "index"
    (index / "plugins").mkdir(parents=True)
    (index / "plugins" / "phalanx.yaml").write_bytes(KREW_MANIFEST.read_bytes())
    git = ["git", "-C", str(index), "-c", "user.name=phalanx-e2e", "-c", "user.email=e2e@phalanx.invalid"]
    for args in (["init", "-q"], ["add", "plugins"], ["commit", "-q", "-m", "phalanx's manifest"]):
        subprocess.run([*git, *args], check=True, capture_output=True, env={**env, "GIT_CONFIG_GLOBAL": "/dev/null"},
                       timeout=60)
    run("krew", "index", "add", "local", str(index))
    run.root, run.archive = root, archive  # type: ignore[attr-defined]
    return run


def test_krew_installs_the_plugin_from_the_built_archive_and_it_answers(krew_kubectl, serve_pod):
    kubectl = krew_kubectl
    before = kubectl("phalanx", "--help", check=False)
    assert before.returncode != 0 and "unknown command" in before.stderr  # not there before krew puts it there
    installed = kubectl("krew", "install", f"--manifest={KREW_MANIFEST}", f"--archive={kubectl.archive}")
    assert 'Installed plugin: phalanx' in installed.stderr + installed.stdout, installed
    assert kubectl("krew", "list").stdout.split() == ["detached/phalanx"]  # installed from a manifest, not an index
    receipt = yaml.safe_load((kubectl.root / "receipts" / "phalanx.yaml").read_text())  # krew's record of it
    assert receipt["metadata"]["name"] == "phalanx" and receipt["status"]["source"]["name"] == "detached"
    bin_link = kubectl.root / "bin" / "kubectl-phalanx"
    assert bin_link.is_symlink() and str(bin_link) in kubectl("plugin", "list").stdout
    assert "kubectl phalanx" in kubectl("phalanx", "--help").stdout
    # the krew-installed launcher reaches serve through the API server like the package's own
    doc = json.loads(kubectl("phalanx", "top", "-A", "-o", "json", *where(serve_pod)).stdout)
    assert "podgroups" in doc
    gone = kubectl("phalanx", "explain", "podgroup/no-such-group", *where(serve_pod), check=False)
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr
    kubectl("krew", "uninstall", "phalanx")
    assert not bin_link.exists() and not (kubectl.root / "receipts" / "phalanx.yaml").exists()
    assert kubectl("phalanx", "--help", check=False).returncode != 0


def test_krew_refuses_an_archive_that_is_not_the_manifest_s(krew_kubectl, tmp_path):
    """The manifest's sha256 is checked: an archive that differs by a byte is refused, nothing installed."""
    other = tmp_path / "other.tar.gz"
    other.write_bytes(krew_kubectl.archive.read_bytes() + b"\0")
    refused = krew_kubectl("krew", "install", f"--manifest={KREW_MANIFEST}", f"--archive={other}", check=False)
    assert refused.returncode != 0 and "checksum" in (refused.stderr + refused.stdout).lower(), refused
    assert not (krew_kubectl.root / "bin" / "kubectl-phalanx").exists()
