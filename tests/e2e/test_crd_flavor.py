"""The CRD fallback on a cluster that does not serve scheduling.k8s.io Workload/PodGroup: a second
real control plane with GenericWorkload off, phalanx's CRDs from scheduler-config/crds applied,
pods linked by the label scheduling.phalanx.dev/pod-group, and kube-scheduler + phalanx placing a
gang all-or-nothing through them, in both scheduler modes (extender, plugin). (The controller's
StatefulSet path on this control plane is in test_product_path.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import GPU, assert_none_bound, create_node, delete_node, pod, wait_for
from harness.faults import record_text

from cluster.apiserver import detect_flavor
from cluster.kube import Kube, KubeError
from cluster.names import LABEL_POD_GROUP
from extender.server import ServeOptions, build

from .conftest import PHALANX_BARRIER_SECONDS, PHALANX_SCHEDULER_MODES, start_phalanx_scheduler

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "scheduler-config" / "crds"


@pytest.fixture(scope="module")
def old_cluster(crd_control_plane):
    """The session's control plane without GenericWorkload, phalanx's CRDs applied (conftest)."""
    return crd_control_plane


def test_builtin_api_absent_and_crds_accept_the_upstream_shape(old_cluster):
    rest = old_cluster.rest
    assert rest.get_or_none("/apis/scheduling.k8s.io/v1beta1") is None
    assert detect_flavor(Kube(str(old_cluster.admin_kubeconfig))) == "crd"
    group = {"apiVersion": "scheduling.phalanx.dev/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "shape", "namespace": "default"},
             "spec": {"schedulingPolicy": {"gang": {"minCount": 3}},
                      "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]},
                      "disruptionMode": {"all": {}}, "priority": 5}}
    created = rest.create("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups", group)
    assert created["spec"] == group["spec"]  # nothing pruned: the schema is the upstream one
    status = {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
                              "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    rest.patch("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/shape/status", {"status": status})
    got = rest.get("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/shape")
    assert got["status"]["conditions"][0]["reason"] == "Unschedulable"


@pytest.mark.parametrize("scheduler_mode", PHALANX_SCHEDULER_MODES)
def test_gang_all_or_nothing_through_the_crd_flavor(old_cluster, scheduler_mode):
    rest = old_cluster.rest
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0", http_threads=64,
                                 barrier_timeout=PHALANX_BARRIER_SECONDS),
                    kubeconfig=str(old_cluster.admin_kubeconfig)).start()
    scheduler = start_phalanx_scheduler(old_cluster, scheduler_mode, phalanx, name=f"crd-gang-{scheduler_mode}")
    try:
        assert phalanx.cycle.writer.flavor == "crd"
        for i in range(2):
            create_node(rest, f"crd-{i}", gpu=2, rack="rc")
        rest.create("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups",
                  {"apiVersion": "scheduling.phalanx.dev/v1beta1", "kind": "PodGroup",
                   "metadata": {"name": "db"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 5}}}})
        for i in range(5):
            rest.create("/api/v1/namespaces/default/pods",
                      pod(f"db-{i}", None, {"cpu": "1", GPU: 1}, labels={LABEL_POD_GROUP: "db"}))
        assert_none_bound(rest, "default", seconds=8, label_selector=f"{LABEL_POD_GROUP}=db")
        create_node(rest, "crd-2", gpu=2, rack="rc")
        wait_for(lambda: all(p["spec"].get("nodeName") for p in rest.list_items(
            "/api/v1/namespaces/default/pods", labelSelector=f"{LABEL_POD_GROUP}=db")), timeout=60,
            message="gang bound whole")
        pg = rest.get("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/db")
        assert set(json.loads(record_text(pg))["pods"]) == {f"db-{i}" for i in range(5)}
        scheduled = next(c for c in pg["status"]["conditions"] if c["type"] == "PodGroupInitiallyScheduled")
        assert scheduled["status"] == "True"
    finally:
        scheduler.stop()
        phalanx.stop()
        # the control plane is shared with test_product_path.py: leave it as found
        rest.request("DELETE", "/api/v1/namespaces/default/pods", params={
            "labelSelector": f"{LABEL_POD_GROUP}=db", "gracePeriodSeconds": 0})
        rest.delete("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/db", missing_ok=True)
        for i in range(3):
            delete_node(rest, f"crd-{i}")


def test_the_crd_rejects_a_podgroup_name_no_label_value_can_hold(old_cluster):
    """In this flavor pods name their PodGroup in a label: a name over 63 characters is refused
    at creation, saying why, instead of every member pod failing later."""
    group = {"apiVersion": "scheduling.phalanx.dev/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "g" * 64}, "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}
    with pytest.raises(KubeError) as refused:
        old_cluster.rest.create("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups", group)
    assert refused.value.status == 422
    assert "at most 63 characters" in str(refused.value) and LABEL_POD_GROUP in str(refused.value)
    group["metadata"]["name"] = "g" * 63
    old_cluster.rest.create("/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups", group)
    old_cluster.rest.delete(f"/apis/scheduling.phalanx.dev/v1beta1/namespaces/default/podgroups/{'g' * 63}", missing_ok=True)
