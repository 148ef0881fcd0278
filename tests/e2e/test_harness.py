"""The harness itself, against upstream only: the plain kube-scheduler places StatefulSets, KWOK
makes them progress and takes nodes NotReady, garbage collection works, and upstream's in-tree gang scheduling
(GenericWorkload on the scheduler) holds a PodGroup until all of it fits."""

from __future__ import annotations

import pytest
from harness import (
    SCHEDULING_API,
    assert_none_bound,
    create,
    path,
    pod,
    podgroup,
    podgroup_conditions,
    podgroup_template,
    pods,
    scheduler_config,
    statefulset,
    wait_all_bound,
    wait_for,
    workload,
)

PLAIN = "plain-scheduler"
GANG = "gang-scheduler"


@pytest.fixture(scope="module", autouse=True)
def schedulers(start_scheduler):
    """One stock scheduler and one with upstream's gang scheduling, told apart by schedulerName."""
    return {
        PLAIN: start_scheduler(scheduler_config(PLAIN), name="plain"),
        GANG: start_scheduler(scheduler_config(GANG), feature_gates={"GenericWorkload": True}, name="gang"),
    }


def test_workload_api_is_served(rest):
    resources = {r["name"] for r in rest.get(f"/apis/{SCHEDULING_API}")["resources"]}
    assert {"workloads", "podgroups"} <= resources


def test_parallel_statefulset_of_5_on_8_nodes_is_all_bound(rest, namespace, nodes):
    nodes.add_many(8, prefix="par", cpu="4")
    create(rest, statefulset("db", 5, "Parallel", scheduler_name=PLAIN), namespace)
    where = wait_all_bound(rest, namespace, 5, label_selector="app=db")
    assert set(where.values()) <= set(nodes.names)
    wait_for(lambda: rest.get(path("apps/v1", "StatefulSet", namespace, "db"))["status"]
             .get("readyReplicas") == 5, 30, "statefulset db has 5 ready replicas")


def test_ordered_ready_statefulset_progresses_on_kwok(rest, namespace, nodes):
    nodes.add_many(3, prefix="ord", cpu="2")
    create(rest, statefulset("zk", 3, "OrderedReady", scheduler_name=PLAIN), namespace)
    wait_for(lambda: rest.get(path("apps/v1", "StatefulSet", namespace, "zk"))["status"]
             .get("readyReplicas") == 3, 60, "OrderedReady statefulset zk has 3 ready replicas")


def test_deleting_the_statefulset_garbage_collects_its_pods(rest, namespace, nodes):
    nodes.add_many(3, prefix="gc", cpu="2")
    create(rest, statefulset("web", 3, scheduler_name=PLAIN), namespace)
    wait_all_bound(rest, namespace, 3, label_selector="app=web")
    rest.delete(path("apps/v1", "StatefulSet", namespace, "web"), missing_ok=True)
    wait_for(lambda: not pods(rest, namespace, "app=web"), 60, "pods of deleted statefulset web gone")


def _gang(rest, namespace: str, size: int, min_count: int) -> None:
    """A hand-made Workload + PodGroup (gang) and ``size`` pods pointing at the PodGroup."""
    create(rest, workload("train", [podgroup_template("workers", min_count=min_count)]), namespace)
    create(rest, podgroup("train-workers", min_count=min_count, workload_name="train",
                          template_name="workers"), namespace)
    for i in range(size):
        create(rest, pod(f"worker-{i}", podgroup_name="train-workers", requests={"cpu": "1"},
                         scheduler_name=GANG, labels={"app": "train"}), namespace)


def test_in_tree_gang_binds_nothing_until_all_fit(rest, namespace, nodes):
    nodes.add_many(4, prefix="gang", cpu="1")  # room for 4 of the 5 one-CPU workers
    _gang(rest, namespace, size=5, min_count=5)
    assert_none_bound(rest, namespace, seconds=15, podgroup="train-workers")
    waiting = wait_for(lambda: podgroup_conditions(rest, namespace, "train-workers")
                       .get("PodGroupInitiallyScheduled"),
                       30, "PodGroupInitiallyScheduled written while the gang waits")
    assert (waiting["status"], waiting["reason"]) == ("False", "Unschedulable")

    nodes.add("gang-4", cpu="1")
    where = wait_all_bound(rest, namespace, 5, podgroup="train-workers", timeout=120)
    assert len(set(where.values())) == 5
    scheduled = podgroup_conditions(rest, namespace, "train-workers")["PodGroupInitiallyScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("True", "Scheduled")



def test_podgroup_protection_keeps_a_podgroup_while_its_pods_live(rest, namespace, nodes):
    nodes.add("prot-0", cpu="2")
    create(rest, podgroup("solo", min_count=1), namespace)
    create(rest, pod("solo-0", podgroup_name="solo", scheduler_name=GANG), namespace)
    wait_all_bound(rest, namespace, 1, podgroup="solo")
    group_path = path(SCHEDULING_API, "PodGroup", namespace, "solo")
    assert "scheduling.k8s.io/podgroup-protection" in rest.get(group_path)["metadata"]["finalizers"]

    rest.delete(group_path, missing_ok=True)
    assert rest.get(group_path)["metadata"].get("deletionTimestamp")  # held by the finalizer
    rest.delete(path("v1", "Pod", namespace, "solo-0"), missing_ok=True)
    wait_for(lambda: rest.get_or_none(group_path) is None, 60,
             "PodGroup released by podgroup-protection-controller once its pod is gone")
