"""Shared ResourceClaims (KEP-6277 story 4) on a control plane without KEP-5729 (the
DRAWorkloadResourceClaims gate is off, as by default in 1.37): phalanx creates one ResourceClaim per
PodGroup from the ResourceClaimTemplate, owned by the PodGroup, and its pod webhook points every
exactly matching pod claim entry at it. No DRA driver runs here, so nothing is allocated and no pod
is scheduled: these tests check the objects only.
"""

from __future__ import annotations

import pytest
from harness import create, pods, statefulset, wait_for, wait_gone
from test_controller import API, one_each, phalanx, sts_path  # noqa: F401 — phalanx is the fixture

from cluster import names
from cluster.kube import KubeError

RESOURCE = "/apis/resource.k8s.io/v1"
DEVICE_CLASS = "phalanx-e2e-accelerator"
SHARED = {"name": "accel", "resourceClaimTemplateName": "shared-accelerator"}
PER_POD = {"name": "scratch", "resourceClaimTemplateName": "shared-accelerator"}  # same source, other name


@pytest.fixture(scope="module")
def device_class(rest):
    """A minimal DeviceClass for the template's request to name (no driver publishes devices)."""
    rest.delete(f"{RESOURCE}/deviceclasses/{DEVICE_CLASS}", missing_ok=True)
    rest.create(f"{RESOURCE}/deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                            "metadata": {"name": DEVICE_CLASS}, "spec": {}})
    yield DEVICE_CLASS
    rest.delete(f"{RESOURCE}/deviceclasses/{DEVICE_CLASS}", missing_ok=True)


@pytest.fixture
def claim_template(rest, namespace, device_class):
    return rest.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": SHARED["resourceClaimTemplateName"]},
        "spec": {"metadata": {"labels": {"team": "ml"}},
                 "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": device_class}}]}}}})


def make(rest, ns, name, replicas):
    body = statefulset(name, replicas, scheduling={"schedulingPolicy": {"gang": {}}, "resourceClaims": [SHARED]})
    spec = body["spec"]["template"]["spec"]
    spec["resourceClaims"] = [dict(SHARED), dict(PER_POD)]
    spec["containers"][0]["resources"]["claims"] = [{"name": "accel"}, {"name": "scratch"}]
    return create(rest, body, ns)


def group_claims(rest, ns):
    """The ResourceClaims owned by a PodGroup (the per-pod ones are owned by pods)."""
    return [c for c in rest.list_items(f"{RESOURCE}/namespaces/{ns}/resourceclaims")
            if any(r["kind"] == "PodGroup" for r in c["metadata"].get("ownerReferences") or [])]


def released_pods(rest, ns, count):
    items = [p for p in pods(rest, ns) if not p["metadata"].get("deletionTimestamp")]
    gated = any(names.GATE_PODGROUP_SYNC in {g["name"] for g in p["spec"].get("schedulingGates") or []}
                for p in items)
    if len(items) != count or gated:
        return None
    return items


def test_the_cluster_serves_dra_without_podgroup_claims(rest):
    served = {r["name"] for r in rest.get(RESOURCE)["resources"]}
    assert {"resourceclaims", "resourceclaimtemplates", "deviceclasses"} <= served


def test_one_claim_per_podgroup_owned_by_it_and_matching_pod_entries_point_at_it(rest, namespace, phalanx,
                                                                                 claim_template):
    make(rest, namespace, "db", 3)
    _, group = wait_for(lambda: one_each(rest, namespace), 30, "one Workload and one PodGroup")
    assert not group["spec"].get("resourceClaims")  # dropped by the API server: no KEP-5729 here
    (claim,) = wait_for(lambda: group_claims(rest, namespace) or None, 30, "the PodGroup's ResourceClaim")
    meta = claim["metadata"]
    assert meta["name"] == f"{group['metadata']['name']}-accel"
    assert meta["ownerReferences"] == [{"apiVersion": API, "kind": "PodGroup", "name": group["metadata"]["name"],
                                        "uid": group["metadata"]["uid"], "controller": True,
                                        "blockOwnerDeletion": True}]
    assert meta["annotations"][names.ANNOTATION_MANAGED_BY] == names.MANAGED_BY_VALUE
    assert meta["labels"] == {"team": "ml", names.LABEL_PODGROUP_CLAIM: "accel"}
    assert claim["spec"] == claim_template["spec"]["spec"]

    items = wait_for(lambda: released_pods(rest, namespace, 3), 60, "3 pods, sync gate lifted")
    for p in items:
        assert p["spec"]["schedulingGroup"] == {"podGroupName": group["metadata"]["name"]}
        assert p["spec"]["resourceClaims"] == [{"name": "accel", "resourceClaimName": meta["name"]}, PER_POD]
    assert len(group_claims(rest, namespace)) == 1
    reasons = {e["reason"] for e in rest.list_items(f"/api/v1/namespaces/{namespace}/events")}
    assert names.EVENT_RESOURCECLAIM_CREATED in reasons

    make(rest, namespace, "web", 2)  # a second StatefulSet: its own PodGroup, its own claim
    wait_for(lambda: len(group_claims(rest, namespace)) == 2, 30, "a claim for the second PodGroup")
    assert len({c["metadata"]["ownerReferences"][0]["uid"] for c in group_claims(rest, namespace)}) == 2


def test_deleting_the_statefulset_collects_the_claim(rest, namespace, phalanx, claim_template):
    make(rest, namespace, "db", 2)
    (claim,) = wait_for(lambda: group_claims(rest, namespace) or None, 30, "the PodGroup's ResourceClaim")
    wait_for(lambda: released_pods(rest, namespace, 2), 60, "pods released")
    rest.delete(sts_path(namespace, "db"), {"propagationPolicy": "Background"}, missing_ok=True)
    wait_gone(rest, f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim['metadata']['name']}", 90)
    assert group_claims(rest, namespace) == []


def test_missing_template_keeps_the_pods_gated(rest, namespace, phalanx, device_class):
    make(rest, namespace, "db", 2)
    wait_for(lambda: one_each(rest, namespace), 30, "the PodGroup")
    wait_for(lambda: len(pods(rest, namespace)) == 2, 30, "2 pods created")
    reasons = wait_for(lambda: names.EVENT_RESOURCECLAIM_FAILED in (
        r := {e["reason"] for e in rest.list_items(f"/api/v1/namespaces/{namespace}/events")}) and r, 30, "a failure event")
    assert names.EVENT_RESOURCECLAIM_CREATED not in reasons
    assert all(names.GATE_PODGROUP_SYNC in {g["name"] for g in p["spec"].get("schedulingGates") or []}
               for p in pods(rest, namespace))
    with pytest.raises(KubeError):
        rest.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates/{SHARED['resourceClaimTemplateName']}")
