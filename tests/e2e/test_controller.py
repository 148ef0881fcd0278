"""phalanx's StatefulSet controller (KEP-6277) against the real control plane: the real StatefulSet
controller creates the pods, the real garbage collector deletes, phalanx's webhooks are called by
the real kube-apiserver. These tests check the controller's objects, not placement.

Pods of StatefulSets with ``schedulerName: default-scheduler`` stay Pending (no scheduler of that
name runs in this module), which keeps the evidence of the sync gate: the API server marks a pod
created with scheduling gates ``PodScheduled=False/SchedulingGated``. Tests that need pods Running
(OrderedReady, rolling update) use the module's kube-scheduler and KWOK's nodes.
"""

from __future__ import annotations

import json
import time

import pytest
from harness import STATEFULSET_SCHEDULING_ANNOTATION, create, path, pods, statefulset, wait_for, wait_gone
from phalanx_controller import PhalanxController

from cluster import names
from cluster.kube import KubeError
from controller.config import MSG_DISRUPTION_ALL_BASIC, MSG_GANG_ORDERED_READY, MSG_MIN_COUNT, MSG_PARTITION

SCHEDULER = "phalanx-e2e-controller-scheduler"
GANG = {"schedulingPolicy": {"gang": {}}}
API = "scheduling.k8s.io/v1beta1"


@pytest.fixture(scope="module")
def phalanx(control_plane, start_scheduler):
    start_scheduler({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                     "profiles": [{"schedulerName": SCHEDULER}]}, name="controller-tests")
    running = PhalanxController(control_plane)
    running.start()
    running.register()
    yield running
    running.close()


def sts_path(ns, name=None):
    return path("apps/v1", "StatefulSet", ns, name)


def workloads(rest, ns):
    return rest.list_items(f"/apis/{API}/namespaces/{ns}/workloads")


def podgroups(rest, ns):
    return rest.list_items(f"/apis/{API}/namespaces/{ns}/podgroups")


def one_each(rest, ns):
    """(workload, podgroup) once exactly one of each exists."""
    w, g = workloads(rest, ns), podgroups(rest, ns)
    return (w[0], g[0]) if len(w) == 1 and len(g) == 1 else None


def min_counts(rest, ns):
    (w, g) = one_each(rest, ns)
    return (w["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"],
            g["spec"]["schedulingPolicy"]["gang"]["minCount"])


def stamped_and_released(rest, ns, count, group):
    """All ``count`` pods exist, name ``group``, are owned by it, and carry no sync gate."""
    items = [p for p in pods(rest, ns) if not p["metadata"].get("deletionTimestamp")]
    if len(items) != count:
        return None
    for p in items:
        refs = {r["kind"]: r for r in p["metadata"].get("ownerReferences") or []}
        if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") != group["metadata"]["name"]:
            return None
        if refs.get("PodGroup", {}).get("uid") != group["metadata"]["uid"]:
            return None
        if any(g["name"] == names.GATE_PODGROUP_SYNC for g in p["spec"].get("schedulingGates") or []):
            return None
    return items


def make(rest, ns, name, replicas, scheduling=GANG, **kwargs):
    return create(rest, statefulset(name, replicas, scheduling=scheduling, **kwargs), ns)


def scale(rest, ns, name, replicas):
    rest.patch(sts_path(ns, name), {"spec": {"replicas": replicas}})


def test_gang_statefulset_gets_one_workload_one_podgroup_and_gated_then_released_pods(rest, namespace, phalanx):
    sts = make(rest, namespace, "db", 3)
    workload, group = wait_for(lambda: one_each(rest, namespace), 30, "one Workload and one PodGroup")
    uid = sts["metadata"]["uid"]
    assert workload["spec"]["controllerRef"] == {"apiGroup": "apps", "kind": "StatefulSet", "name": "db"}
    assert workload["metadata"]["annotations"][names.ANNOTATION_MANAGED_BY] == names.MANAGED_BY_VALUE
    assert workload["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": uid,
        "controller": True, "blockOwnerDeletion": True}]
    owners = {r["kind"]: r for r in group["metadata"]["ownerReferences"]}
    assert owners["StatefulSet"]["uid"] == uid and owners["StatefulSet"]["controller"] is True
    assert owners["Workload"]["uid"] == workload["metadata"]["uid"] and not owners["Workload"].get("controller")
    assert names.FINALIZER_PODGROUP_PROTECTION in group["metadata"]["finalizers"]
    assert group["spec"]["workloadRef"]["workloadName"] == workload["metadata"]["name"]
    assert min_counts(rest, namespace) == (3, 3)
    items = wait_for(lambda: stamped_and_released(rest, namespace, 3, group), 30, "3 pods stamped, gate lifted")
    for p in items:  # created gated: the API server said so, and no scheduler has run since
        scheduled = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["reason"] == "SchedulingGated"
    reasons = {e["reason"] for e in rest.list_items(f"/api/v1/namespaces/{namespace}/events")
               if e["involvedObject"].get("uid") == uid}
    assert {names.EVENT_WORKLOAD_CREATED, names.EVENT_PODGROUP_CREATED} <= reasons
    assert "minCount" not in rest.get(sts_path(namespace, "db"))["metadata"]["annotations"][
        STATEFULSET_SCHEDULING_ANNOTATION]


def test_statefulset_without_scheduling_is_left_alone(rest, namespace, phalanx):
    make(rest, namespace, "plain", 2, scheduling=None)
    items = wait_for(lambda: (p := pods(rest, namespace)) and len(p) == 2 and p, 30, "2 pods")
    assert all("schedulingGroup" not in p["spec"] and not p["spec"].get("schedulingGates") for p in items)
    time.sleep(1)
    assert workloads(rest, namespace) == [] and podgroups(rest, namespace) == []


def test_scale_up_down_to_zero_and_back_keeps_the_podgroup(rest, namespace, phalanx):
    make(rest, namespace, "db", 3)
    _, group = wait_for(lambda: one_each(rest, namespace), 30, "objects")
    for replicas in (5, 2, 0, 3):
        scale(rest, namespace, "db", replicas)
        expected = max(1, replicas)
        wait_for(lambda: min_counts(rest, namespace) == (expected, expected), 30, f"minCount {expected}")
        wait_for(lambda: stamped_and_released(rest, namespace, replicas, group) is not None, 60,
                 f"{replicas} pods in the same PodGroup")
        _, now = one_each(rest, namespace)
        assert now["metadata"]["uid"] == group["metadata"]["uid"]


def test_rolling_update_keeps_the_podgroup(rest, namespace, phalanx, nodes):
    nodes.add_many(2, prefix=f"{namespace}-n")
    make(rest, namespace, "web", 2, scheduler_name=SCHEDULER)
    _, group = wait_for(lambda: one_each(rest, namespace), 30, "objects")
    wait_for(lambda: stamped_and_released(rest, namespace, 2, group), 30, "pods")
    old = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(rest, namespace)}
    rest.patch(sts_path(namespace, "web"), {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}})

    def rolled():
        items = stamped_and_released(rest, namespace, 2, group) or []
        fresh = [p for p in items if p["metadata"]["uid"] not in old.values()
                 and p["metadata"].get("annotations", {}).get("rev") == "2"]
        return len(fresh) == 2
    wait_for(rolled, 90, "both pods replaced, in the same PodGroup")
    assert one_each(rest, namespace)[1]["metadata"]["uid"] == group["metadata"]["uid"]


def test_deleting_the_statefulset_collects_workload_podgroup_and_pods(rest, namespace, phalanx):
    make(rest, namespace, "db", 2)
    workload, group = wait_for(lambda: one_each(rest, namespace), 30, "objects")
    wait_for(lambda: stamped_and_released(rest, namespace, 2, group), 30, "pods")
    rest.delete(sts_path(namespace, "db"), {"propagationPolicy": "Background"}, missing_ok=True)
    wait_gone(rest, f"/apis/{API}/namespaces/{namespace}/workloads/{workload['metadata']['name']}", 60)
    wait_gone(rest, f"/apis/{API}/namespaces/{namespace}/podgroups/{group['metadata']['name']}", 60)
    wait_for(lambda: pods(rest, namespace) == [], 60, "pods collected")


def test_ordered_ready_with_basic_keeps_sequential_creation(rest, namespace, phalanx, nodes):
    nodes.add_many(2, prefix=f"{namespace}-n")
    make(rest, namespace, "seq", 3, scheduling={"schedulingPolicy": {"basic": {}}},
         pod_management_policy="OrderedReady", scheduler_name=SCHEDULER)
    deadline = time.monotonic() + 90
    while True:  # invariant at every observation: pod k exists only once pod k-1 is Ready
        by_ordinal = {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in pods(rest, namespace)}
        for k in by_ordinal:
            if k > 0:
                before = by_ordinal.get(k - 1)
                assert before is not None and _ready(before), f"seq-{k} exists before seq-{k - 1} is Ready"
        if len(by_ordinal) == 3 and all(_ready(p) for p in by_ordinal.values()):
            break
        assert time.monotonic() < deadline, f"OrderedReady did not finish: {sorted(by_ordinal)}"
        time.sleep(0.1)
    workload, group = one_each(rest, namespace)
    assert group["spec"]["schedulingPolicy"] == {"basic": {}}
    assert stamped_and_released(rest, namespace, 3, group)


def _ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions") or [])


@pytest.mark.parametrize("case,kwargs,message", [
    ("gang-ordered", {"scheduling": GANG, "pod_management_policy": "OrderedReady"}, MSG_GANG_ORDERED_READY),
    ("mincount", {"scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}}}, MSG_MIN_COUNT),
    ("all-basic", {"scheduling": {"disruptionMode": {"all": {}}}}, MSG_DISRUPTION_ALL_BASIC),
    ("claims", {"scheduling": {"resourceClaims": [{"name": f"c{i}", "resourceClaimName": "x"} for i in range(5)]}},
     "spec.scheduling.resourceClaims: Too many: 5: must have at most 4 items"),
    ("partition", {"scheduling": GANG, "updateStrategy": {"type": "RollingUpdate",
                                                            "rollingUpdate": {"partition": 1}}}, MSG_PARTITION),
])
def test_admission_rejects_on_create(rest, namespace, phalanx, case, kwargs, message):
    body = statefulset(case, 2, scheduling=kwargs.pop("scheduling"),
                       pod_management_policy=kwargs.pop("pod_management_policy", "Parallel"))
    body["spec"].update(kwargs)
    with pytest.raises(KubeError) as err:
        create(rest, body, namespace)
    assert message in str(err.value)


def test_admission_rejects_partition_and_scheduling_changes_on_update(rest, namespace, phalanx):
    make(rest, namespace, "db", 1)
    make(rest, namespace, "plain", 1, scheduling=None)
    with pytest.raises(KubeError, match="partitioned rollouts are not supported"):
        rest.patch(sts_path(namespace, "db"), {"spec": {"updateStrategy": {"rollingUpdate": {"partition": 1}}}})
    for target, value in [("db", json.dumps({"schedulingPolicy": {"basic": {}}})),  # gang -> basic
                          ("db", None),  # remove
                          ("plain", json.dumps(GANG))]:  # add after create
        with pytest.raises(KubeError, match="field is immutable"):
            rest.patch(sts_path(namespace, target),
                       {"metadata": {"annotations": {STATEFULSET_SCHEDULING_ANNOTATION: value}}})
    scale(rest, namespace, "db", 2)  # other updates pass


def test_controller_killed_between_workload_and_podgroup_converges_to_one_of_each(rest, namespace, phalanx):
    phalanx.stop()

    class CrashAfterWorkload:
        """The API as the first replica sees it: it dies on its way to creating the PodGroup."""

        def __getattr__(self, attr):
            return getattr(phalanx.kube, attr)

        def create(self, api_path, body):
            if api_path.endswith("/podgroups") and api_path.startswith(f"/apis/{API}/namespaces/{namespace}/"):
                phalanx.controller.stop(release_lease=False)  # like a crash: the Lease just expires
                raise KubeError("POST", api_path, 503, '{"message": "replica killed"}')
            return phalanx.kube.create(api_path, body)

    phalanx.start(CrashAfterWorkload())
    make(rest, namespace, "db", 2)
    wait_for(lambda: len(workloads(rest, namespace)) == 1, 30, "the Workload")
    wait_for(lambda: phalanx.controller is not None and phalanx.controller._halt.is_set(), 30, "replica killed")
    assert podgroups(rest, namespace) == []
    assert pods(rest, namespace) == []  # held by the pod webhook: no PodGroup yet
    phalanx.controller = None
    phalanx.start()
    _, group = wait_for(lambda: one_each(rest, namespace), 60, "exactly one Workload and one PodGroup")
    wait_for(lambda: stamped_and_released(rest, namespace, 2, group), 90, "pods stamped after the restart")
    assert len(workloads(rest, namespace)) == 1 and len(podgroups(rest, namespace)) == 1
