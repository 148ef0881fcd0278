"""What upstream Kubernetes (the pinned release) really does with Workload-Aware Scheduling: the
anchor phalanx is compared to. Each test observes one behaviour recorded in tests/e2e/README.md.

Two schedulers run side by side, told apart by schedulerName: one with GenericWorkload and
TopologyAwareWorkloadScheduling (the full in-tree feature set), one with GenericWorkload only.
"""

from __future__ import annotations

import uuid

import pytest
from harness import (
    RACK,
    SCHEDULING_API,
    assert_none_bound,
    bound,
    create,
    deletions_held,
    path,
    pod,
    podgroup,
    podgroup_conditions,
    pods,
    priority_class,
    scheduler_config,
    wait_all_bound,
    wait_for,
)

from cluster.kube import KubeError

TOPO = "topology-scheduler"
GANG_ONLY = "gang-only-scheduler"


@pytest.fixture(scope="module", autouse=True)
def schedulers(start_scheduler):
    return {
        TOPO: start_scheduler(scheduler_config(TOPO), name="topology", feature_gates={
            "GenericWorkload": True, "TopologyAwareWorkloadScheduling": True}),
        GANG_ONLY: start_scheduler(scheduler_config(GANG_ONLY), name="gang-only",
                                   feature_gates={"GenericWorkload": True}),
    }


@pytest.fixture
def priorities(rest):
    """Two PriorityClasses, low and high, unique to the test."""
    suffix = uuid.uuid4().hex[:5]
    names = {"low": f"low-{suffix}", "high": f"high-{suffix}"}
    create(rest, priority_class(names["low"], 100))
    create(rest, priority_class(names["high"], 1000))
    yield names
    for name in names.values():
        rest.delete(path("scheduling.k8s.io/v1", "PriorityClass", name=name), missing_ok=True)


def gang(rest, namespace: str, name: str, size: int, scheduler: str, min_count: int | None = None,
         cpu: str = "1", **group_kwargs) -> None:
    """A standalone gang PodGroup and ``size`` pods in it (priorityClassName shared with the group)."""
    create(rest, podgroup(name, min_count=min_count or size, **group_kwargs), namespace)
    for i in range(size):
        create(rest, pod(f"{name}-{i}", podgroup_name=name, requests={"cpu": cpu},
                         scheduler_name=scheduler,
                         priority_class_name=group_kwargs.get("priority_class_name")), namespace)


def racks(nodes, layout: dict[str, int], cpu: str = "1") -> None:
    for rack, count in layout.items():
        for i in range(count):
            nodes.add(f"{rack}-n{i}", cpu=cpu, rack=rack, zone="z1")


def rack_of(rest, node_name: str) -> str:
    return rest.get(f"/api/v1/nodes/{node_name}")["metadata"]["labels"][RACK]


# --- topology ----------------------------------------------------------------------------------

def test_topology_gang_lands_in_one_rack(rest, namespace, nodes):
    racks(nodes, {"ra": 2, "rb": 3, "rc": 2})
    gang(rest, namespace, "db", 3, TOPO, topology_key=RACK)
    where = wait_all_bound(rest, namespace, 3, podgroup="db")
    assert {rack_of(rest, n) for n in where.values()} == {"rb"}


def test_topology_gang_that_fits_no_single_rack_stays_pending(rest, namespace, nodes):
    racks(nodes, {"ra": 2, "rb": 3, "rc": 2})  # 7 free CPUs in total, at most 3 in one rack
    gang(rest, namespace, "db", 4, TOPO, topology_key=RACK)
    assert_none_bound(rest, namespace, seconds=15, podgroup="db")
    cond = wait_for(lambda: podgroup_conditions(rest, namespace, "db").get("PodGroupInitiallyScheduled"),
                    30, "PodGroupInitiallyScheduled condition written")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")


def test_without_the_topology_gate_the_constraint_is_not_enforced(rest, namespace, nodes):
    racks(nodes, {"ra": 2, "rb": 2})
    gang(rest, namespace, "db", 4, GANG_ONLY, topology_key=RACK)
    where = wait_all_bound(rest, namespace, 4, podgroup="db")
    assert {rack_of(rest, n) for n in where.values()} == {"ra", "rb"}


# --- preemption --------------------------------------------------------------------------------

def _fill(rest, namespace, nodes, priorities, disruption_mode: str) -> None:
    """4 one-CPU nodes, full with a low-priority gang of 4 (minCount 4)."""
    nodes.add_many(4, prefix="pre", cpu="1")
    gang(rest, namespace, "batch", 4, TOPO, disruption_mode=disruption_mode,
         priority_class_name=priorities["low"])
    wait_all_bound(rest, namespace, 4, podgroup="batch")


def _preemptor(rest, namespace, priorities) -> None:
    """A high-priority gang of 2 (minCount 2) that fits only by preemption."""
    gang(rest, namespace, "urgent", 2, TOPO, priority_class_name=priorities["high"])


def _terminating(rest, namespace: str, group: str) -> list[dict]:
    return [p for p in pods(rest, namespace, podgroup=group) if p["metadata"].get("deletionTimestamp")]


def test_preemption_disruption_mode_all_evicts_the_whole_victim_group(
        rest, namespace, nodes, priorities):
    _fill(rest, namespace, nodes, priorities, "all")
    with deletions_held(rest, pods(rest, namespace, podgroup="batch")):
        _preemptor(rest, namespace, priorities)
        victims = wait_for(lambda: (v := _terminating(rest, namespace, "batch")) and len(v) == 4 and v,
                           60, "all 4 pods of the disruptionMode=all group being evicted")
        assert_none_bound(rest, namespace, seconds=2, podgroup="urgent")  # waits for the victims
    for victim in victims:
        cond = {c["type"]: c for c in victim["status"].get("conditions") or []}
        assert cond["DisruptionTarget"]["reason"] == "PreemptionByScheduler"
    # The victim PodGroup itself gets no DisruptionTarget condition in this release.
    assert "DisruptionTarget" not in podgroup_conditions(rest, namespace, "batch")
    wait_all_bound(rest, namespace, 2, podgroup="urgent", timeout=60)
    wait_for(lambda: not pods(rest, namespace, podgroup="batch"), 30, "victims gone")


def test_preemption_disruption_mode_single_evicts_only_what_is_needed(rest, namespace, nodes, priorities):
    _fill(rest, namespace, nodes, priorities, "single")
    _preemptor(rest, namespace, priorities)
    wait_all_bound(rest, namespace, 2, podgroup="urgent", timeout=60)
    wait_for(lambda: len(pods(rest, namespace, podgroup="batch")) == 2, 30, "exactly 2 victims evicted")
    # The rest of the gang keeps running below its minCount: single means per-pod disruption.
    assert len(bound(pods(rest, namespace, podgroup="batch"))) == 2


def test_api_defaults_and_accepts_basic_with_disruption_mode_all(rest, namespace):
    """The API server defaults disruptionMode to single and priority to 0, and (unlike the KEP
    text) does not reject disruptionMode all on a Basic group."""
    plain = create(rest, podgroup("gang", min_count=2), namespace)
    assert plain["spec"]["disruptionMode"] == {"single": {}}
    assert plain["spec"]["priority"] == 0
    basic_all = create(rest, podgroup("basic-all", min_count=None, disruption_mode="all"), namespace)
    assert basic_all["spec"]["disruptionMode"] == {"all": {}}


def test_podgroup_fields_are_immutable(rest, namespace):
    create(rest, podgroup("frozen", min_count=2, topology_key=RACK), namespace)
    with pytest.raises(KubeError) as err:
        rest.patch(path(SCHEDULING_API, "PodGroup", namespace, "frozen"),
                   {"spec": {"schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]}}})
    assert err.value.status == 422
