"""The CRD fallback on a cluster that does not serve scheduling.k8s.io Workload/PodGroup: a second
real control plane with GenericWorkload off, phalanx's CRDs from scheduler-config/crds applied,
pods linked by the label scheduling.phalanx.dev/pod-group, and kube-scheduler + phalanx placing a
gang all-or-nothing through them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from harness import GPU, ControlPlane, FakeKubelet, assert_none_bound, create_node, locate, pod, wait_for

from cluster.apiserver import detect_flavor
from cluster.kube import Kube
from cluster.names import LABEL_POD_GROUP
from extender.server import ServeOptions, build

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "scheduler-config" / "crds"


@pytest.fixture(scope="module")
def old_cluster():
    workdir = Path(tempfile.mkdtemp(prefix="phalanx-e2e-crd-"))
    plane = ControlPlane(workdir, locate(), apiserver_feature_gates=None, runtime_config=None,
                         controller_manager_feature_gates=None).start()
    kubelet = FakeKubelet(plane.rest)
    kubelet.start()
    try:
        for path in sorted(CRDS.glob("*.scheduling.phalanx.dev.yaml")):
            plane.rest.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(path.read_text()))
        wait_for(lambda: plane.rest.get_or_none("/apis/scheduling.phalanx.dev/v1beta1") is not None
                 and len(plane.rest.get("/apis/scheduling.phalanx.dev/v1beta1")["resources"]) >= 2,
                 timeout=60, message="CRDs served")
        yield plane
    finally:
        kubelet.stop()
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_builtin_api_absent_and_crds_accept_the_upstream_shape(old_cluster):
    rest = old_cluster.rest
    assert rest.get_or_none("/apis/scheduling.k8s.io/v1beta1") is None
    assert detect_flavor(Kube(str(old_cluster.admin_kubeconfig))) == "crd"
    group = {"apiVersion": "scheduling.phalanx.dev/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "shape", "namespace": "default"},
             "spec": {"schedulingPolicy": {"gang": {"minCount": 3}},
                      "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]},
                      "disruptionMode": {"all": {}}, "priority": 5}}
    created = rest.post("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups", group)
    assert created["spec"] == group["spec"]  # nothing pruned: the schema is the upstream one
    status = {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
                              "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    rest.patch("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/shape/status", {"status": status})
    got = rest.get("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/shape")
    assert got["status"]["conditions"][0]["reason"] == "Unschedulable"


def test_gang_all_or_nothing_through_the_crd_flavor(old_cluster):
    rest = old_cluster.rest
    phalanx = build(ServeOptions(http_addr="127.0.0.1:0", grpc_addr="", http_threads=64, barrier_timeout=8),
                    kubeconfig=str(old_cluster.admin_kubeconfig)).start()
    config = yaml.safe_load((ROOT / "scheduler-config" / "kube-scheduler-config.yaml").read_text())
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{phalanx.port}/scheduler"
    scheduler = old_cluster.start_scheduler(config)
    try:
        assert phalanx.cycle.writer.flavor == "crd"
        for i in range(2):
            create_node(rest, f"crd-{i}", gpu=2, rack="rc")
        rest.post("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups",
                  {"apiVersion": "scheduling.phalanx.dev/v1beta1", "kind": "PodGroup",
                   "metadata": {"name": "db"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 5}}}})
        for i in range(5):
            rest.post("/api/v1/namespaces/default/pods",
                      pod(f"db-{i}", None, {"cpu": "1", GPU: 1}, labels={LABEL_POD_GROUP: "db"}))
        assert_none_bound(rest, "default", seconds=8, label_selector=f"{LABEL_POD_GROUP}=db")
        create_node(rest, "crd-2", gpu=2, rack="rc")
        wait_for(lambda: all(p["spec"].get("nodeName") for p in rest.list(
            "/api/v1/namespaces/default/pods", labelSelector=f"{LABEL_POD_GROUP}=db")), timeout=60,
            message="gang bound whole")
        pg = rest.get("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/db")
        assert "scheduling.phalanx.dev/placement" in pg["metadata"]["annotations"]
        assert pg["status"]["conditions"][0]["status"] == "True"
    finally:
        scheduler.stop()
        phalanx.stop()
