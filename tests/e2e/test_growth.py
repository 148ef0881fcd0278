"""A gang that grows, on the real control plane, side by side with kube-scheduler's in-tree gang
scheduling (``GenericWorkload`` and ``TopologyAwareWorkloadScheduling`` on) on the same shapes.

Two racks: ``a`` of two 2-GPU nodes, ``b`` of two 4-GPU nodes. A StatefulSet of 2-GPU pods that
must sit in one rack starts with 3 replicas (only rack ``b`` holds 6 GPUs) and is scaled up:

1. to 4: the new member fits beside the others in ``b`` and binds there;
2. to 5: rack ``b`` is full; the new member alone would fit in ``a``, which would split the gang
   across racks. phalanx keeps it pending (the gang's required rack is the one its running members
   hold), and the PodGroup's ``MembersScheduled`` condition says what rack ``b`` lacks;
3. a 2-GPU node joins rack ``b``: the pending member binds there.

phalanx's side is the product path: the StatefulSet carries phalanx's scheduling annotation, phalanx's
controller and the real StatefulSet controller make the PodGroup and pods and sync minCount on
scale; before each scale-up ``WhatIf`` is asked for the scaled manifest, and its answer (the new
members only, in the held rack; does-not-fit when the rack is full) must come true; the running
members never move. In-tree does the same on its side (the 4th member in rack b, the 5th pending
while rack b is full), which the test checks too. In-tree's side
gets what KEP-6277's controller would make (in-tree has no StatefulSet integration in v1.37.2): a
Workload and PodGroup, minCount raised before the replicas, as the KEP orders it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness import (
    GPU,
    RACK,
    ZONE,
    create,
    path,
    podgroup,
    podgroup_conditions,
    podgroup_template,
    statefulset,
    wait_for,
    workload,
)

from cluster import names
from proto.phalanx.v1 import workload_cycle_pb2 as pb

from .conftest import in_tree_beside, start_in_tree, start_phalanx_scheduler

IN_TREE, PHALANX = "in-tree", "phalanx"
SCHEDULER = {IN_TREE: "growth-in-tree", PHALANX: "growth-phalanx"}
REQUESTS = {"cpu": "1", GPU: 2}
GANG_IN_A_RACK = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}
SETTLE_SECONDS = 8.0  # how long a member that must not bind is watched


@pytest.fixture(scope="module")
def in_tree(start_scheduler):
    return start_in_tree(start_scheduler, SCHEDULER[IN_TREE], "growth-in-tree")


@pytest.fixture(scope="module")
def ours(control_plane, scheduler_mode, whatif_serve):
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, whatif_serve, scheduler_name=SCHEDULER[PHALANX],
                                        name=f"growth-phalanx-{scheduler_mode}")
    yield scheduler
    scheduler.stop()


def racks(nodes, prefix: str) -> dict[str, str]:
    """Rack a (2 x 2 GPUs) and rack b (2 x 4 GPUs); node name -> rack."""
    out = {}
    for rack, gpus in (("a", 2), ("b", 4)):
        for i in range(2):
            name = f"{prefix}-{rack}{i}"
            nodes.add(name, gpu=gpus, rack=f"{prefix}-{rack}")
            out[name] = f"{prefix}-{rack}"
    return out


def members(rest, namespace: str) -> dict[str, str]:
    """pod name -> node ("" while pending) of the StatefulSet's live pods."""
    return {p["metadata"]["name"]: p["spec"].get("nodeName") or ""
            for p in rest.list_items(f"/api/v1/namespaces/{namespace}/pods")
            if p["metadata"]["name"].startswith("grow-") and not p["metadata"].get("deletionTimestamp")}


def wait_members(rest, namespace: str, count: int, bound: int, what: str) -> dict[str, str]:
    def probe() -> dict[str, str] | None:
        now = members(rest, namespace)
        return now if len(now) == count and sum(1 for n in now.values() if n) == bound else None
    return wait_for(probe, 90, f"{what}: {count} members, {bound} bound", interval=0.3)


def watch_pending(rest, namespace: str, pod_name: str) -> str:
    """Watch ``pod_name`` for SETTLE_SECONDS; the node it was bound to, or "" if it stayed pending."""
    try:
        return wait_for(lambda: members(rest, namespace).get(pod_name) or None, SETTLE_SECONDS,
                        f"{pod_name} bound", interval=0.3)
    except TimeoutError:
        return ""


def scale(rest, namespace: str, replicas: int, podgroup_name: str | None = None) -> None:
    """Scale the StatefulSet; ``podgroup_name``: in-tree's side, its PodGroup's minCount first (what
    KEP-6277's controller does before it creates pods)."""
    if podgroup_name:
        rest.patch(path("scheduling.k8s.io/v1beta1", "PodGroup", namespace, podgroup_name),
                   {"spec": {"schedulingPolicy": {"gang": {"minCount": replicas}}}})
    rest.patch(path("apps/v1", "StatefulSet", namespace, "grow"), {"spec": {"replicas": replicas}})


def what_if(stub, namespace: str, replicas: int) -> pb.WhatIfGroup:
    sts = statefulset("grow", replicas, requests=REQUESTS, scheduling=GANG_IN_A_RACK,
                      scheduler_name=SCHEDULER[PHALANX])
    reply = stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(sts)], namespace=namespace), timeout=60)
    [group] = reply.groups
    return group


def run_in_tree(rest, namespace: str, nodes) -> dict[str, Any]:
    """In-tree's side; what it did at each step."""
    rack_of = racks(nodes, "gi")
    create(rest, workload("grow", [podgroup_template("grow", min_count=3, topology_key=RACK)],
                          controller_ref={"apiGroup": "apps", "kind": "StatefulSet", "name": "grow"}), namespace)
    create(rest, podgroup("grow", min_count=3, workload_name="grow", template_name="grow", topology_key=RACK),
           namespace)
    sts = statefulset("grow", 3, requests=REQUESTS, scheduler_name=SCHEDULER[IN_TREE])
    sts["spec"]["template"]["spec"]["schedulingGroup"] = {"podGroupName": "grow"}
    create(rest, sts, namespace)
    first = wait_members(rest, namespace, 3, 3, "in-tree: the gang of 3")
    scale(rest, namespace, 4, "grow")
    second = wait_members(rest, namespace, 4, 4, "in-tree: scaled to 4")
    scale(rest, namespace, 5, "grow")
    fifth = watch_pending(rest, namespace, "grow-4")
    return {"first": {rack_of[n] for n in first.values()}, "fourth": rack_of[second["grow-3"]],
            "fifth": rack_of.get(fifth, "pending")}


def test_a_gang_scaled_up_grows_inside_its_rack_or_waits_whole(rest, namespace, nodes, in_tree, ours, scheduler_mode,
                                                              whatif_stub, registered_controller):
    theirs = in_tree_beside(rest, nodes, namespace, lambda other: run_in_tree(rest, other, nodes))
    print(f"\n  in-tree: gang of 3 in {theirs['first']}, 4th member in {theirs['fourth']}, "
          f"5th member (its rack full): {theirs['fifth']}")

    rack_of = racks(nodes, "gp")
    create(rest, statefulset("grow", 3, requests=REQUESTS, scheduling=GANG_IN_A_RACK,
                             scheduler_name=SCHEDULER[PHALANX]), namespace)
    first = wait_members(rest, namespace, 3, 3, "phalanx: the gang of 3")
    assert {rack_of[n] for n in first.values()} == {"gp-b"}  # the only rack with 6 GPUs

    grown = what_if(whatif_stub, namespace, 4)
    assert (grown.verdict, grown.running, grown.members, grown.domain) == ("fits", 3, 4, "gp-b"), grown
    assert sorted(grown.nodes) == ["grow-3"]
    scale(rest, namespace, 4)
    second = wait_members(rest, namespace, 4, 4, "phalanx: scaled to 4")
    assert rack_of[second["grow-3"]] == "gp-b" and second["grow-3"] == grown.nodes["grow-3"]
    assert {n: second[n] for n in first} == first  # the running members never moved

    full = what_if(whatif_stub, namespace, 5)
    assert (full.verdict, full.running, full.members) == ("does-not-fit", 4, 5), full
    assert "gp-b" in full.explanation and "gp-a" not in full.explanation, full.explanation
    group_name = next(iter(phalanx_groups(rest, namespace)))
    scale(rest, namespace, 5)
    assert watch_pending(rest, namespace, "grow-4") == "", "phalanx bound the 5th member outside its rack"

    def short() -> dict | None:
        condition = podgroup_conditions(rest, namespace, group_name).get(names.CONDITION_MEMBERS_SCHEDULED)
        return condition if condition and condition["status"] == "False" and "gp-b" in condition["message"] else None
    condition = wait_for(short, 30, "MembersScheduled says what rack gp-b lacks")
    assert "nvidia.com/gpu" in condition["message"], condition
    assert podgroup_conditions(rest, namespace, group_name)[names.CONDITION_INITIALLY_SCHEDULED]["status"] == "True"

    nodes.add("gp-b2", gpu=2, rack="gp-b")  # room in the held rack: the member binds there
    third = wait_members(rest, namespace, 5, 5, "phalanx: the 5th member once its rack has room")
    assert third["grow-4"] == "gp-b2"
    print(f"  phalanx ({scheduler_mode}): gang of 3 in gp-b, 4th member in gp-b, 5th pending "
          f"until gp-b had room, then gp-b")
    # in-tree on the same shapes: the 4th member beside the others, the 5th kept out of rack a too
    assert (theirs["first"], theirs["fourth"], theirs["fifth"]) == ({"gi-b"}, "gi-b", "pending"), theirs


def phalanx_groups(rest, namespace: str) -> list[str]:
    return [g["metadata"]["name"]
            for g in rest.list_items(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups")]


PREFERRED = {"schedulingPolicy": {"gang": {}}}  # no required key: the StatefulSet prefers rack, then zone


def test_a_gang_with_only_preferred_keys_grows_into_the_zone_its_members_hold(rest, namespace, nodes, in_tree, ours,
                                                                               scheduler_mode, registered_controller):
    """A gang of 2 one-GPU pods, no required key, ``preferred-topology: rack,zone`` on its
    StatefulSet (inherited by the PodGroup phalanx's controller makes), runs on the one node of
    rack z1-r0 (zone z1, 2 GPUs). Then a 4-GPU node joins zone z1 in rack z1-r1 and a 2-GPU node
    appears in zone z2. Scaled to 4, the two new members fit exactly on z2's node, which best fit
    alone prefers; phalanx grows the gang into the nearest domain upward its members hold — zone
    z1 (`phalanx/grow-upward`). In-tree, beside, knows no preferred keys (phalanx's annotation):
    its gang without a key grows wherever its scoring puts the new members; the test prints where."""
    def layout(prefix: str) -> dict[str, str]:
        return {f"{prefix}-z1-r0": "z1"}

    def grow_nodes(prefix: str) -> dict[str, str]:
        nodes.add(f"{prefix}-z1-r1", gpu=4, zone=f"{prefix}-z1", rack=f"{prefix}-z1-r1")
        nodes.add(f"{prefix}-z2-r2", gpu=2, zone=f"{prefix}-z2", rack=f"{prefix}-z2-r2")
        return {f"{prefix}-z1-r1": "z1", f"{prefix}-z2-r2": "z2"}

    one_gpu = {"cpu": "1", GPU: 1}

    def run_in_tree_side(other: str) -> dict[str, str]:
        nodes.add("gi-z1-r0", gpu=2, zone="gi-z1", rack="gi-z1-r0")
        zone_of = layout("gi")
        create(rest, workload("grow", [podgroup_template("grow", min_count=2)],
                              controller_ref={"apiGroup": "apps", "kind": "StatefulSet", "name": "grow"}), other)
        create(rest, podgroup("grow", min_count=2, workload_name="grow", template_name="grow"), other)
        sts = statefulset("grow", 2, requests=one_gpu, scheduler_name=SCHEDULER[IN_TREE])
        sts["spec"]["template"]["spec"]["schedulingGroup"] = {"podGroupName": "grow"}
        create(rest, sts, other)
        wait_members(rest, other, 2, 2, "in-tree: the gang of 2")
        zone_of |= grow_nodes("gi")
        scale(rest, other, 4, "grow")
        grown = wait_members(rest, other, 4, 4, "in-tree: scaled to 4")
        return {pod: zone_of[node] for pod, node in grown.items()}

    theirs = in_tree_beside(rest, nodes, namespace, run_in_tree_side)
    print(f"\n  in-tree (no preferred keys): members by zone {theirs}")

    nodes.add("gq-z1-r0", gpu=2, zone="gq-z1", rack="gq-z1-r0")
    zone_of = layout("gq")
    sts = statefulset("grow", 2, requests=one_gpu, scheduling=PREFERRED, scheduler_name=SCHEDULER[PHALANX])
    sts["metadata"].setdefault("annotations", {})[names.ANNOTATION_PREFERRED_TOPOLOGY] = f"{RACK},{ZONE}"
    create(rest, sts, namespace)
    first = wait_members(rest, namespace, 2, 2, "phalanx: the gang of 2")
    assert set(first.values()) == {"gq-z1-r0"}
    [group_name] = phalanx_groups(rest, namespace)
    group = rest.get(path("scheduling.k8s.io/v1beta1", "PodGroup", namespace, group_name))
    assert group["metadata"]["annotations"][names.ANNOTATION_PREFERRED_TOPOLOGY] == f"{RACK},{ZONE}"
    zone_of |= grow_nodes("gq")
    scale(rest, namespace, 4)
    grown = wait_members(rest, namespace, 4, 4, "phalanx: scaled to 4")
    assert {n: grown[n] for n in first} == first  # the running members never moved
    assert {grown["grow-2"], grown["grow-3"]} == {"gq-z1-r1"}, grown  # zone z1's other rack, not z2's exact fit
    print(f"  phalanx ({scheduler_mode}): members by zone "
          f"{ {pod: zone_of[node] for pod, node in grown.items()} }")
    assert len(theirs) == 4  # in-tree bound all four too, where its scoring put them


def test_a_gang_scaled_4_to_8_gets_its_4_new_members_whole_or_none(rest, namespace, nodes, ours, scheduler_mode,
                                                                    registered_controller):
    """The increment is all-or-nothing: a gang of 4 two-GPU members runs in rack b (2 nodes of 6
    GPUs: 4 free after it); scaled to 8, its 4 new members need 8 GPUs there. Two would fit, and
    rack a's 4 free GPUs two more: none binds (the gang's rack is the one its members hold), and
    MembersScheduled says what rack b lacks. A 4-GPU node joins rack b: all 4 bind there, in one
    planning pass. (The side by side with in-tree is the test above: in-tree keeps a member whose
    rack is full pending too; this one is the increment's atomicity.)"""
    for rack, gpus in (("a", 2), ("b", 6)):
        for i in range(2):
            nodes.add(f"g8-{rack}{i}", gpu=gpus, rack=f"g8-{rack}")
    create(rest, statefulset("grow", 4, requests=REQUESTS, scheduling=GANG_IN_A_RACK,
                             scheduler_name=SCHEDULER[PHALANX]), namespace)
    first = wait_members(rest, namespace, 4, 4, "phalanx: the gang of 4")
    assert {n.rsplit("-", 1)[1][0] for n in first.values()} == {"b"}
    [group_name] = phalanx_groups(rest, namespace)
    scale(rest, namespace, 8)
    wait_for(lambda: len(members(rest, namespace)) == 8 or None, 60, "the 4 new members created")
    assert watch_pending(rest, namespace, "grow-4") == "", "a new member bound before the whole increment could"
    now = members(rest, namespace)
    assert [now[f"grow-{i}"] for i in range(4, 8)] == [""] * 4, now  # none of the four, after the settle time

    def short() -> dict | None:
        condition = podgroup_conditions(rest, namespace, group_name).get(names.CONDITION_MEMBERS_SCHEDULED)
        return condition if condition and condition["status"] == "False" and "g8-b" in condition["message"] else None
    condition = wait_for(short, 30, "MembersScheduled says what rack g8-b lacks")
    assert "nvidia.com/gpu" in condition["message"], condition
    nodes.add("g8-b2", gpu=4, rack="g8-b")
    grown = wait_members(rest, namespace, 8, 8, "phalanx: the 4 new members once rack b has room")
    assert {n.rsplit("-", 1)[1][0] for n in grown.values()} == {"b"}, grown
    assert {n: grown[n] for n in first} == first  # the running members never moved
    print(f"\n  phalanx ({scheduler_mode}): 4 -> 8, the increment waited whole, then bound in rack b")
