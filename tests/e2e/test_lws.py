"""LeaderWorkerSets under the real LWS controller (sigs.k8s.io/lws at LWS_VERSION, built by
hack/build-lws.sh): LWS creates the leader StatefulSet, one worker StatefulSet per group and the
pods, its own webhooks label them; phalanx's controller and webhooks turn an annotated LWS into the
LWS gang-scheduling guide's Workload and PodGroups, and kube-scheduler + phalanx place them.

The last tests (``test_handmade_*``) place LWS-*shaped* PodGroups that the test creates by hand,
without the LWS controller: unit-level cases of the group shapes, not of LWS.
"""

from __future__ import annotations

import pytest
from harness import (
    GPU,
    RACK,
    assert_none_bound,
    create,
    pod,
    podgroup,
    podgroup_template,
    pods,
    scheduler_config,
    wait_all_bound,
    workload,
)
from harness.lws import LWS_API, LwsManager, leaderworkerset

from cluster.names import GATE_LWS_GROUP_REPLACEMENT

PLAIN = "lws-e2e-plain"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


@pytest.fixture(scope="module")
def lws(control_plane):
    manager = LwsManager(control_plane).start()
    yield manager
    manager.stop()


def make_lws(rest, namespace, obj):
    return rest.post(f"{LWS_API}/namespaces/{namespace}/leaderworkersets", obj)


def test_lws_without_annotation_runs_as_lws_runs_it(rest, namespace, nodes, lws, start_scheduler):
    """The anchor: LWS alone, a plain kube-scheduler, no phalanx object anywhere."""
    start_scheduler(scheduler_config(PLAIN), name="lws-plain")
    nodes.add_many(4, prefix="plain", cpu="4")
    make_lws(rest, namespace, leaderworkerset("plain", size=3, replicas=2, scheduler_name=PLAIN))
    placed = wait_all_bound(rest, namespace, count=6, timeout=60, label_selector=f"{LWS_NAME}=plain")
    assert sorted(placed) == ["plain-0", "plain-0-1", "plain-0-2", "plain-1", "plain-1-1", "plain-1-2"]
    sets = {s["metadata"]["name"]: s for s in rest.list(f"/apis/apps/v1/namespaces/{namespace}/statefulsets")}
    assert sorted(sets) == ["plain", "plain-0", "plain-1"]  # leaders, then one worker set per group
    assert sets["plain-0"]["metadata"]["ownerReferences"][0]["kind"] == "Pod"  # owned by its leader
    for p in pods(rest, namespace):
        labels = p["metadata"]["labels"]
        name = p["metadata"]["name"]
        assert labels["leaderworkerset.sigs.k8s.io/group-index"] == name.split("-")[1]
        assert labels["leaderworkerset.sigs.k8s.io/worker-index"] == (name.split("-") + ["0"])[2]
        assert "schedulingGroup" not in p["spec"] and not p["spec"].get("schedulingGates")


# -- hand-made LWS-shaped PodGroups (no LWS controller): unit-level cases of the shapes -------------

def lws_replica(rest, namespace, group, size, gpu=1, leader_group=None, worker_group=None):
    """One LWS replica: the gated leader, the gate lifted, then size-1 workers."""
    leader = pod(f"{group}-leader", leader_group or group, {"cpu": "1", GPU: gpu},
                 labels={"leaderworkerset.sigs.k8s.io/name": "lws"})
    leader["spec"]["schedulingGates"] = [{"name": GATE_LWS_GROUP_REPLACEMENT}]
    create(rest, leader, namespace)
    rest.patch(f"/api/v1/namespaces/{namespace}/pods/{group}-leader", {"spec": {"schedulingGates": None}})
    for i in range(1, size):
        create(rest, pod(f"{group}-worker-{i}", worker_group or group, {"cpu": "1", GPU: gpu}), namespace)


def rack_of(rest, node):
    return rest.get(f"/api/v1/nodes/{node}")["metadata"]["labels"][RACK]


def test_handmade_replica_level_each_replica_whole_and_independent(rest, namespace, nodes, phalanx_scheduler):
    for rack in ("la", "lb"):
        for i in range(2):
            nodes.add(f"lws-{rack}-{i}", gpu=2, rack=rack)  # 4 GPUs per rack
    create(rest, workload("lws", [podgroup_template("replica", min_count=4, topology_key=RACK)]), namespace)
    for r in range(3):
        create(rest, podgroup(f"lws-{r}", min_count=4, workload_name="lws", template_name="replica",
                              topology_key=RACK), namespace)
        lws_replica(rest, namespace, f"lws-{r}", 4)
    placements = [wait_all_bound(rest, namespace, count=4, timeout=60, podgroup=f"lws-{r}") for r in (0, 1)]
    for placement in placements:
        assert len({rack_of(rest, n) for n in placement.values()}) == 1
    assert_none_bound(rest, namespace, seconds=5, podgroup="lws-2")  # no room: waits whole, others unaffected


def test_handmade_whole_lws_level_is_all_or_nothing(rest, namespace, nodes, phalanx_scheduler):
    for i in range(7):
        nodes.add(f"whole-{i}", gpu=1, rack="lw")
    create(rest, workload("lws-all", [podgroup_template("all", min_count=8)]), namespace)
    create(rest, podgroup("lws-all", min_count=8, workload_name="lws-all", template_name="all"), namespace)
    for r in range(2):  # 2 replicas x 4 pods share the one PodGroup
        leader = pod(f"lws-all-{r}-leader", "lws-all", {"cpu": "1", GPU: 1})
        create(rest, leader, namespace)
        for i in range(1, 4):
            create(rest, pod(f"lws-all-{r}-worker-{i}", "lws-all", {"cpu": "1", GPU: 1}), namespace)
    assert_none_bound(rest, namespace, seconds=8, podgroup="lws-all")  # 7 GPUs for 8 pods
    nodes.add("whole-7", gpu=1, rack="lw")
    assert len(wait_all_bound(rest, namespace, count=8, timeout=60, podgroup="lws-all")) == 8


def test_handmade_role_level_leader_and_worker_groups_are_placed_separately(rest, namespace, nodes, phalanx_scheduler):
    nodes.add("role-0", gpu=2, rack="lr")
    create(rest, workload("lws-role", [podgroup_template("leader"), podgroup_template("worker", min_count=3)]),
           namespace)
    create(rest, podgroup("lws-role-0-leader", workload_name="lws-role", template_name="leader"), namespace)
    create(rest, podgroup("lws-role-0-worker", min_count=3, workload_name="lws-role", template_name="worker"),
           namespace)
    lws_replica(rest, namespace, "lws-role-0", 4, leader_group="lws-role-0-leader", worker_group="lws-role-0-worker")
    # the leader's basic group fits on its own; the 3-worker gang (3 GPUs) does not fit in 1 free GPU
    assert len(wait_all_bound(rest, namespace, count=1, timeout=60, podgroup="lws-role-0-leader")) == 1
    assert_none_bound(rest, namespace, seconds=6, podgroup="lws-role-0-worker")
    nodes.add("role-1", gpu=2, rack="lr")
    assert len(wait_all_bound(rest, namespace, count=3, timeout=60, podgroup="lws-role-0-worker")) == 3
