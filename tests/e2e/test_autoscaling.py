"""Gang-aware autoscaling against the real control plane, phalanx in extender mode, with
cluster-autoscaler's own ProvisioningRequest CRD installed and requests answered by a STAND-IN
for cluster-autoscaler's atomic class (harness/provisioner.py: it creates the requested nodes in
one rack all at once as KWOK nodes, or fails a request past its node group's maximum).

- a rack gang of 8 one-CPU pods, with room for 2 in either rack: exactly one ProvisioningRequest,
  for the 6 missing pods in one rack; the stand-in's nodes arrive in that rack; the gang is bound
  whole there; the request and its PodTemplates are deleted;
- a gang needing more nodes than the node group's maximum: the request fails, and the PodGroup's
  condition says so;
- a bound gang of 2 that grows to 4 (minCount raised, two members added) while the other rack has
  room for both: one request, of its own name, for the 2 new members in the rack the gang holds;
  the gang is bound whole there, its first members unmoved.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from harness import RACK, ZONE, create, placement, pod, podgroup, podgroup_conditions, pods, wait_all_bound, wait_for
from harness.controlplane import ControlPlane, Scheduler
from harness.provisioner import API, StandInProvisioner, install_crd

from cluster import names
from cluster.kube import Kube

from .conftest import NodePool, start_phalanx_scheduler

MAX_NODES = 8  # the stand-in's node group maximum, per rack
CPU1 = {"cpu": "1"}


@pytest.fixture(scope="module", autouse=True)
def provisioning_crd(control_plane: ControlPlane) -> None:
    """Installed before this module's phalanx starts, so its watch finds the requests served."""
    install_crd(control_plane.rest)


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane, phalanx: Any) -> Iterator[Scheduler]:
    scheduler = start_phalanx_scheduler(control_plane, "extender", phalanx)
    yield scheduler
    scheduler.stop()


@pytest.fixture
def stand_in(rest: Kube) -> Iterator[StandInProvisioner]:
    provisioner = StandInProvisioner(rest, max_nodes=MAX_NODES, node_cpu=1).start()
    yield provisioner
    provisioner.stop()


def racks(nodes: NodePool, per_rack: int) -> None:
    for rack in ("ra", "rb"):
        for i in range(per_rack):
            nodes.add(f"{rack}-{i}", cpu="1", rack=rack)


def atomic_gang(rest: Kube, namespace: str, name: str, size: int) -> None:
    """A PodGroup of ``size`` (one rack required) opted in to ProvisioningRequests, and its pods."""
    group = podgroup(name, min_count=size, topology_key=RACK)
    group["metadata"]["annotations"] = {names.ANNOTATION_PROVISIONING: names.PROVISIONING_ATOMIC}
    create(rest, group, namespace)
    for i in range(size):
        create(rest, pod(f"{name}-{i}", name, requests=CPU1), namespace)


def requests_in(rest: Kube, namespace: str) -> list[dict]:
    return rest.list_items(f"{API}/namespaces/{namespace}/provisioningrequests")


def test_stand_in_atomic_scale_up_brings_one_rack_and_the_gang_binds_whole_there(
        rest: Kube, namespace: str, nodes: NodePool, extender: Scheduler, stand_in: StandInProvisioner) -> None:
    racks(nodes, per_rack=2)  # room for 2 of the gang's 8 in either rack
    atomic_gang(rest, namespace, "train", 8)
    bound = wait_all_bound(rest, namespace, 8, timeout=120, podgroup="train")
    assert stand_in.errors == []
    assert list(stand_in.seen.values()) == ["Provisioned"], stand_in.seen  # exactly one request, answered
    [(rack, made)] = [(r, n) for r, n in stand_in.created.items() if n]
    assert len(made) == 6  # the missing part: 8 pods, 2 fit on the nodes that exist
    node_racks = {node: node.split("-")[1] if node.startswith("prov-") else node.split("-")[0]
                  for node in bound.values()}
    assert set(node_racks.values()) == {rack}, bound  # the gang, whole, in the provisioned rack
    assert set(made) <= set(bound.values())
    wait_for(lambda: not requests_in(rest, namespace), 60, "the request deleted once the gang is bound")
    wait_for(lambda: not rest.list_items(f"/api/v1/namespaces/{namespace}/podtemplates"), 60,
             "the request's PodTemplates deleted")
    member = pods(rest, namespace, podgroup="train")[0]
    assert member["metadata"]["annotations"][names.ANNOTATION_CONSUME_PROVISIONING].startswith("phalanx-")
    assert placement(pods(rest, namespace, podgroup="train")) == bound


def test_stand_in_fails_a_request_past_the_node_group_maximum_and_the_podgroup_says_so(
        rest: Kube, namespace: str, nodes: NodePool, extender: Scheduler, stand_in: StandInProvisioner) -> None:
    racks(nodes, per_rack=2)
    atomic_gang(rest, namespace, "huge", 2 + MAX_NODES + 1)  # 9 pods missing in the nearest rack, 8 allowed

    def failed() -> dict | None:
        condition = podgroup_conditions(rest, namespace, "huge").get(names.CONDITION_INITIALLY_SCHEDULED)
        return condition if condition and condition["reason"] == names.REASON_PROVISIONING_FAILED else None

    condition = wait_for(failed, 90, "the PodGroup says its ProvisioningRequest failed")
    assert "failed (NodeGroupMaxSize: 9 more nodes in rack" in condition["message"]
    assert condition["status"] == "False"
    assert list(stand_in.seen.values()) == ["Failed"] and not any(stand_in.created.values())
    [request] = requests_in(rest, namespace)  # kept, saying why; never asked again
    assert [s["count"] for s in request["spec"]["podSets"]] == [MAX_NODES + 1]
    assert not [p for p in pods(rest, namespace, podgroup="huge") if p["spec"].get("nodeName")]


def test_stand_in_a_bound_gang_that_grows_gets_its_increment_in_the_rack_it_holds(
        rest: Kube, namespace: str, nodes: NodePool, extender: Scheduler, stand_in: StandInProvisioner) -> None:
    racks(nodes, per_rack=2)
    atomic_gang(rest, namespace, "serve", 2)  # fits the nodes there are: no request
    first = wait_all_bound(rest, namespace, 2, timeout=60, podgroup="serve")
    [held] = {node.split("-")[0] for node in first.values()}
    assert not requests_in(rest, namespace)
    # grown as phalanx's controller grows a scaled StatefulSet's gang: minCount first, then the pods;
    # the other rack has room for both new members, the held rack none
    rest.patch(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/serve",
               {"spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}})
    for i in (2, 3):
        create(rest, pod(f"serve-{i}", "serve", requests=CPU1), namespace)
    grown = wait_all_bound(rest, namespace, 4, timeout=120, podgroup="serve")
    assert stand_in.errors == []
    [(rack, made)] = [(r, n) for r, n in stand_in.created.items() if n]
    assert rack == held and len(made) == 2, stand_in.created  # exactly the increment, in the held rack
    assert {n: grown[n] for n in first} == first and {grown["serve-2"], grown["serve-3"]} == set(made)
    [name] = [key for key in stand_in.seen if key.startswith(f"{namespace}/")]  # (it watches every namespace)
    assert name.endswith("-2") and stand_in.seen[name] == "Provisioned", name  # the increment's own request: phalanx-<uid>-<members held>
    wait_for(lambda: not requests_in(rest, namespace), 60, "the increment's request deleted once the gang is bound")


def test_stand_in_a_composite_no_block_holds_asks_once_for_the_child_left_out_and_lands_whole(
        rest: Kube, namespace: str, nodes: NodePool, extender: Scheduler, stand_in: StandInProvisioner) -> None:
    """A CompositePodGroup of two rack gangs in one zone (block); each block has one rack of room
    for one child: no block holds the job. One request, for the child left out, in one rack of the
    nearest block (docs/autoscaling.md, "A CompositePodGroup"); the job then lands whole there."""
    for zone in ("za", "zb"):
        for i in range(2):
            nodes.add(f"{zone}1-{i}", cpu="1", zone=zone, rack=f"{zone}1")
    job = {"schedulingPolicy": {"gang": {"minGroupCount": 2}}, "schedulingConstraints": {"topology": [{"key": ZONE}]}}
    create(rest, {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload", "metadata": {"name": "job"},
                  "spec": {"compositePodGroupTemplates": [{"name": "job", **job, "podGroupTemplates": [
                      {"name": "rep", "schedulingPolicy": {"gang": {"minCount": 2}},
                       "schedulingConstraints": {"topology": [{"key": RACK}]}}]}]}}, namespace)
    create(rest, {"apiVersion": "scheduling.k8s.io/v1alpha3", "kind": "CompositePodGroup", "metadata": {"name": "job"},
                  "spec": {"workloadRef": {"workloadName": "job", "templateName": "job"}, **job}}, namespace)
    for child in ("rep-0", "rep-1"):
        group = podgroup(child, min_count=2, workload_name="job", template_name="rep", topology_key=RACK)
        group["spec"]["parentCompositePodGroupName"] = "job"
        group["metadata"]["annotations"] = {names.ANNOTATION_PROVISIONING: names.PROVISIONING_ATOMIC}
        create(rest, group, namespace)
        for i in range(2):
            create(rest, pod(f"{child}-{i}", child, requests=CPU1), namespace)
    bound = wait_all_bound(rest, namespace, 4, timeout=120)
    assert stand_in.errors == []
    mine = [key for key in stand_in.seen if key.startswith(f"{namespace}/")]
    assert [stand_in.seen[k] for k in mine] == ["Provisioned"], stand_in.seen  # one request for the tree
    [(rack, made)] = [(r, n) for r, n in stand_in.created.items() if n]
    assert len(made) == 2 and rack in ("za1", "zb1"), stand_in.created  # rep-1's two pods, one rack
    zones = {n: rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][ZONE] for n in bound.values()}
    assert set(zones.values()) == {rack[:2]}, (bound, zones)  # the whole job in the provisioned block
    for child in ("rep-0", "rep-1"):  # each child whole on old nodes or on new ones: one rack either way
        assert len({bound[f"{child}-{i}"] for i in range(2)} & set(made)) in (0, 2), bound
    wait_for(lambda: not requests_in(rest, namespace), 60, "the request deleted once the whole tree is bound")
