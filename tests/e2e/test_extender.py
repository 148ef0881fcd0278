"""phalanx with the real kube-scheduler v1.37 (as its extender, and in plugin mode), against the
real API server.

The fixtures ``phalanx`` and ``phalanx_scheduler`` (conftest.py) run phalanx in this process and,
once per mode, kube-scheduler with the shipped scheduler-config/kube-scheduler-config.yaml and
phalanx-scheduler with scheduler-config/kube-scheduler-plugin-config.yaml.
"""

from __future__ import annotations

import json
import time

from harness import GPU, RACK, assert_none_bound, create, job, pod, podgroup, pods, wait_all_bound, wait_for
from harness.faults import record_text


def gang_pods(rest, namespace, name, count, gpu=1, cpu="1"):
    for i in range(count):
        create(rest, pod(f"{name}-{i}", name, {"cpu": cpu, GPU: gpu}), namespace)


def bound_nodes(rest, namespace, prefix):
    items = rest.list_items(f"/api/v1/namespaces/{namespace}/pods")
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items
            if p["metadata"]["name"].startswith(prefix + "-")}


def test_story1_gang_of_five_waits_whole_then_binds_whole(rest, namespace, nodes, phalanx_scheduler):
    nodes.add("s1-a", gpu=2, rack="ra")
    nodes.add("s1-b", gpu=2, rack="ra")
    create(rest, podgroup("db", min_count=5), namespace)
    gang_pods(rest, namespace, "db", 5)
    assert_none_bound(rest, namespace, seconds=10, podgroup="db")
    pg = rest.get(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/db")
    cond = next(c for c in pg["status"]["conditions"] if c["type"] == "PodGroupInitiallyScheduled")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"
    assert "needs 5 nvidia.com/gpu, 4 free" in cond["message"]
    nodes.add("s1-c", gpu=2, rack="ra")
    placement = wait_all_bound(rest, namespace, count=5, timeout=60, podgroup="db")
    assert len(placement) == 5
    pg = rest.get(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/db")
    assert set(json.loads(record_text(pg))["pods"]) == set(placement)  # the record, with the condition
    cond = next(c for c in pg["status"]["conditions"] if c["type"] == "PodGroupInitiallyScheduled")
    assert cond["status"] == "True"


def test_story3_trainers_land_in_one_rack_or_not_at_all(rest, namespace, nodes, phalanx_scheduler):
    for rack in ("r1", "r2"):
        for i in range(3):
            nodes.add(f"s3-{rack}-{i}", gpu=2, rack=rack)  # 6 GPUs per rack
    create(rest, podgroup("train", min_count=8, topology_key=RACK), namespace)
    gang_pods(rest, namespace, "train", 8)
    assert_none_bound(rest, namespace, seconds=10, podgroup="train")  # 12 GPUs in the cluster, 6 per rack
    for i in range(2):
        nodes.add(f"s3-r2-x{i}", gpu=1, rack="r2")
    placement = wait_all_bound(rest, namespace, count=8, timeout=60, podgroup="train")
    racks = {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in placement.values()}
    assert racks == {"r2"}


def test_pods_without_groups_schedule_normally_beside_gangs(rest, namespace, nodes, phalanx_scheduler):
    nodes.add("plain-a", gpu=0, cpu="4")
    create(rest, pod("loner", None, {"cpu": "1"}), namespace)
    wait_for(lambda: rest.get(f"/api/v1/namespaces/{namespace}/pods/loner")["spec"].get("nodeName"),
             timeout=30, message="loner bound")


def test_two_gangs_that_fit_alone_but_not_together(rest, namespace, nodes, phalanx_scheduler):
    for i in range(2):
        nodes.add(f"two-{i}", gpu=2, rack="rt")
    for name in ("left", "right"):
        create(rest, podgroup(name, min_count=4), namespace)
    gang_pods(rest, namespace, "left", 4)
    gang_pods(rest, namespace, "right", 4)

    def one_whole():
        left, right = bound_nodes(rest, namespace, "left"), bound_nodes(rest, namespace, "right")
        done = [g for g in (left, right) if all(g.values())]
        return done if done else None

    wait_for(one_whole, timeout=60, message="one gang bound whole")
    time.sleep(3)
    left, right = bound_nodes(rest, namespace, "left"), bound_nodes(rest, namespace, "right")
    counts = sorted(sum(1 for v in g.values() if v) for g in (left, right))
    assert counts == [0, 4]  # one whole, the other waits whole: no deadlock, no half gangs


def test_barrier_timeout_binds_nothing_then_retries(rest, namespace, nodes, phalanx_scheduler):
    for i in range(2):
        nodes.add(f"bt-{i}", gpu=4, rack="rb")
    create(rest, podgroup("bt", min_count=3), namespace)
    # two members only carry a scheduling gate, so kube-scheduler never sends them to bind:
    for i in range(3):
        obj = pod(f"bt-{i}", "bt", {"cpu": "1", GPU: 1})
        if i == 2:
            obj["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
        create(rest, obj, namespace)
    assert_none_bound(rest, namespace, seconds=8, podgroup="bt")
    rest.patch(f"/api/v1/namespaces/{namespace}/pods/bt-2", {"spec": {"schedulingGates": None}})
    placement = wait_all_bound(rest, namespace, count=3, timeout=90, podgroup="bt")
    assert len(placement) == 3


def test_basic_group_with_a_topology_key_stays_in_one_rack(rest, namespace, nodes, phalanx_scheduler):
    # rbb is the tightest fit both for one pod and for all three: members of a Basic group may be
    # planned one at a time (each is eligible alone), and must still all land in one rack
    nodes.add("basic-a", gpu=4, rack="rba")
    nodes.add("basic-b", gpu=3, rack="rbb")
    create(rest, podgroup("web", topology_key=RACK), namespace)  # Basic: no minCount
    gang_pods(rest, namespace, "web", 3)
    placement = wait_all_bound(rest, namespace, count=3, timeout=60, podgroup="web")
    assert {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in placement.values()} == {"rbb"}


def test_indexed_job_in_a_gang_podgroup_waits_whole_then_binds_whole_in_one_rack(rest, namespace, nodes,
                                                                                  phalanx_scheduler):
    """A Job as gang (WorkloadWithJob is off, so no controller makes its Workload: the user creates
    the PodGroup and the pod template names it; the real Job controller creates the pods)."""
    for rack in ("ja", "jb"):
        for i in range(3):
            nodes.add(f"job-{rack}-{i}", gpu=1, rack=rack)  # 3 GPUs per rack, the gang needs 4 in one
    create(rest, podgroup("train", min_count=4, topology_key=RACK), namespace)
    create(rest, job("train", 4, "train", {"cpu": "1", GPU: 1}), namespace)
    created = wait_for(lambda: (items := pods(rest, namespace, podgroup="train")) and len(items) == 4 and items, 60,
                       "the Job controller created 4 pods in the PodGroup")
    indexes = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in created}
    assert indexes == {"0", "1", "2", "3"}
    assert_none_bound(rest, namespace, seconds=8, podgroup="train")
    nodes.add("job-jb-3", gpu=1, rack="jb")
    placement = wait_all_bound(rest, namespace, count=4, timeout=60, podgroup="train")
    assert {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in placement.values()} == {"jb"}
