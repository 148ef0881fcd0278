"""Which rack a gang takes, on the real control plane, side by side with kube-scheduler's in-tree gang
scheduling (``GenericWorkload`` and ``TopologyAwareWorkloadScheduling`` on) on the same shapes.

Two racks: ``o1`` of two 8-CPU nodes and ``o2`` of two 2-CPU nodes. One manifest holds two gang
StatefulSets, each required in one rack: ``small`` (2 pods x 2 CPU: fits either rack) first, ``big``
(4 pods x 4 CPU: fits only all of ``o1``) second, created one right after the other as ``kubectl
apply -f`` of the file creates them.

phalanx takes the tightest rack that fits (docs/solver.md, "Objective"): ``small`` goes to ``o2``
although one node of ``o1`` would hold it, so ``big`` fits in ``o1``. Ranking fewest nodes first, as
phalanx once did, put ``small`` on one node of ``o1`` and ``big`` waited for ever. Before applying,
``WhatIf`` is asked for the manifest; its answer (both fit, ``small`` in ``o2`` and ``big`` in
``o1``, in the manifest's order) must come true. In-tree's placement score (MostAllocated over the
placement's nodes) prefers the fuller rack too: the test checks it lands the same, so the two
schedulers agree here. In-tree's side gets what KEP-6277's controller would make (a Workload and
PodGroup per StatefulSet, the template naming it).
"""

from __future__ import annotations

import json

import pytest
from harness import RACK, create, podgroup, podgroup_template, statefulset, wait_for, workload

from proto.phalanx.v1 import workload_cycle_pb2 as pb

from .conftest import in_tree_beside, settle, start_in_tree, start_phalanx_scheduler

IN_TREE, PHALANX = "in-tree", "phalanx"
SCHEDULER = {IN_TREE: "domain-in-tree", PHALANX: "domain-phalanx"}
GANG_IN_A_RACK = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}
#: name -> (replicas, CPUs per pod)
GANGS = {"small": (2, 2), "big": (4, 4)}


@pytest.fixture(scope="module")
def in_tree(start_scheduler):
    return start_in_tree(start_scheduler, SCHEDULER[IN_TREE], "domain-in-tree")


@pytest.fixture(scope="module")
def ours(control_plane, scheduler_mode, whatif_serve):
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, whatif_serve, scheduler_name=SCHEDULER[PHALANX],
                                        name=f"domain-phalanx-{scheduler_mode}")
    yield scheduler
    scheduler.stop()


def racks(nodes, prefix: str) -> dict[str, str]:
    """Rack o1 (2 x 8 CPU) and rack o2 (2 x 2 CPU); node name -> rack."""
    out = {}
    for rack, cpu in (("o1", 8), ("o2", 2)):
        for i in range(2):
            name = f"{prefix}-{rack}-{i}"
            nodes.add(name, cpu=cpu, rack=f"{prefix}-{rack}")
            out[name] = f"{prefix}-{rack}"
    return out


def manifest(scheduler: str, phalanx_annotation: bool = True) -> list[dict]:
    """The two StatefulSets in the file's order; with phalanx's scheduling annotation (the product
    path) or without (in-tree's side, whose templates name their PodGroups)."""
    return [statefulset(name, replicas, requests={"cpu": str(cpu)}, scheduler_name=scheduler,
                        scheduling=GANG_IN_A_RACK if phalanx_annotation else None)
            for name, (replicas, cpu) in GANGS.items()]


def placed(rest, namespace: str, rack_of: dict[str, str]) -> dict[str, set[str]] | None:
    """StatefulSet -> the racks of its bound pods, once every pod of both is bound."""
    pods = [p for p in rest.list_items(f"/api/v1/namespaces/{namespace}/pods")
            if not p["metadata"].get("deletionTimestamp")]
    if len(pods) != sum(r for r, _ in GANGS.values()) or not all(p["spec"].get("nodeName") for p in pods):
        return None
    out: dict[str, set[str]] = {}
    for p in pods:
        out.setdefault(p["metadata"]["name"].rsplit("-", 1)[0], set()).add(rack_of[p["spec"]["nodeName"]])
    return out


def run_in_tree(rest, namespace: str, nodes, prefix: str) -> dict[str, set[str]]:
    rack_of = racks(nodes, prefix)
    objects = manifest(SCHEDULER[IN_TREE], phalanx_annotation=False)
    for name, (replicas, _) in GANGS.items():
        create(rest, workload(name, [podgroup_template(name, min_count=replicas, topology_key=RACK)],
                              controller_ref={"apiGroup": "apps", "kind": "StatefulSet", "name": name}), namespace)
        create(rest, podgroup(name, min_count=replicas, workload_name=name, template_name=name, topology_key=RACK),
               namespace)
    for sts in objects:
        sts["spec"]["template"]["spec"]["schedulingGroup"] = {"podGroupName": sts["metadata"]["name"]}
        create(rest, sts, namespace)
    return wait_for(lambda: placed(rest, namespace, rack_of), 90, "in-tree: both gangs bound", interval=0.3)


def test_a_small_gang_takes_the_tight_rack_so_the_big_one_after_it_fits(rest, namespace, nodes, in_tree, ours,
                                                                        scheduler_mode, whatif_serve, whatif_stub,
                                                                        registered_controller):
    # node names of their own per side and mode: a pod of an earlier run still leaving (its namespace
    # terminating) cannot sit on a node of this one
    mine, other_side = f"dp{scheduler_mode[0]}", f"di{scheduler_mode[0]}"
    theirs = in_tree_beside(rest, nodes, namespace, lambda other: run_in_tree(rest, other, nodes, other_side))
    print(f"\n  in-tree: small in {sorted(theirs['small'])}, big in {sorted(theirs['big'])}")

    rack_of = racks(nodes, mine)
    settle(rest, whatif_serve.cycle.cache, list(rack_of))  # what-if plans on the nodes serve's cache holds
    objects = manifest(SCHEDULER[PHALANX])
    reply = whatif_stub.WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(o) for o in objects], namespace=namespace),
                        timeout=60)
    answer = {g.source.rsplit("/", 1)[1]: g for g in reply.groups}
    assert {n: (g.verdict, g.domain, g.order) for n, g in answer.items()} == {
        "small": ("fits", f"{mine}-o2", 1), "big": ("fits", f"{mine}-o1", 2)}, reply
    for obj in objects:  # in the file's order, one right after the other
        create(rest, obj, namespace)
    ours_placed = wait_for(lambda: placed(rest, namespace, rack_of), 90, "phalanx: both gangs bound", interval=0.3)
    assert ours_placed == {"small": {f"{mine}-o2"}, "big": {f"{mine}-o1"}}, ours_placed
    print(f"  phalanx ({scheduler_mode}): small in {mine}-o2, big in {mine}-o1, as what-if said")
    # in-tree's placement score prefers the fuller rack too: the same racks on its side
    assert theirs == {"small": {f"{other_side}-o2"}, "big": {f"{other_side}-o1"}}, theirs
