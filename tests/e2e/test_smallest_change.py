"""The smallest change a pending gang's PodGroup states, applied as a person would, against the real
control plane with phalanx as kube-scheduler's extender (the change is computed by the workload
cycle, the same in either mode): KWOK plays the nodes.

- a rack gang short of capacity: the condition names how many nodes like which one the rack lacks;
  the test adds exactly those nodes (KWOK nodes with that node's rack label and allocatable) and
  the gang binds whole in that rack;
- a gang kept out by a cordon and a taint: the condition names the node to uncordon or untaint;
  the test frees exactly that node and the gang binds whole;
- a rack gang too large for any one rack: the condition names the racks it fits across and the key
  that forbids it; the test recreates the gang without the key and the gang binds whole across
  exactly those racks;
- a gang whose priority is too low to preempt the gang in its way: the condition names the least
  priority that would; the test recreates the gang with a PriorityClass of exactly that value and
  it binds whole, the lower gang evicted.
"""

from __future__ import annotations

import re

import pytest
from harness import (
    GPU,
    RACK,
    create,
    job,
    podgroup,
    podgroup_conditions,
    priority_class,
    wait_all_bound,
    wait_for,
    wait_gone,
)

from cluster import names

pytestmark = pytest.mark.parametrize("scheduler_mode", ["extender"], scope="module")

ADD = re.compile(r"smallest change: .*?capacity: \S+ \S+ lacks (\d+) nodes? like (\S+) \((\S+)=(\S+); ")
SPAN = re.compile(r"smallest change: .*?topology: fits across \S+ (\S+), but the key (\S+) requires one ")
RAISE = re.compile(r"smallest change: .*?preemption: with priority (\d+) or more \(now (-?\d+)\)")
FREE = re.compile(r"smallest change: .*?constraint: [^|]*?uncordon/untaint (.+?) \(\d+ kept out")


def gang_job(rest, namespace, name, size, requests, topology_key=None, priority_class_name=None):
    create(rest, podgroup(name, min_count=size, topology_key=topology_key, priority_class_name=priority_class_name),
           namespace)
    create(rest, job(name, size, podgroup_name=name, requests=requests, priority_class_name=priority_class_name),
           namespace)


def recreate_gang(rest, namespace, name, size, requests, **fields):
    """The gang's Job and PodGroup deleted (a PodGroup goes once no pod names it; its spec is
    immutable) and created again, the PodGroup with ``fields``."""
    job_path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
    rest.delete(job_path, {"propagationPolicy": "Foreground"})
    wait_gone(rest, job_path, timeout=90)
    group_path = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{name}"
    rest.delete(group_path)
    wait_gone(rest, group_path, timeout=90)
    gang_job(rest, namespace, name, size, requests, **fields)


def stated(rest, namespace, name, pattern):
    """The PodGroup's Unschedulable condition once it states a change ``pattern`` reads."""
    seen = [""]

    def probe():
        cond = podgroup_conditions(rest, namespace, name).get(names.CONDITION_INITIALLY_SCHEDULED)
        if cond and cond["status"] == "False" and cond["reason"] == names.REASON_UNSCHEDULABLE:
            seen[0] = cond["message"]
            return pattern.search(cond["message"])
        return None
    try:
        return wait_for(probe, 60, f"podgroup {namespace}/{name} states its smallest change")
    except TimeoutError as err:
        raise AssertionError(f"{err}; the condition says: {seen[0]!r}; status: "
                             f"{rest.get(f'/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups/{name}').get('status')}"
) from None


def test_a_rack_gang_short_of_capacity_binds_whole_once_the_stated_nodes_are_added(
        rest, namespace, nodes, phalanx_scheduler):
    for rack in ("ra", "rb"):
        for i in range(2):
            nodes.add(f"sc-{rack}-{i}", gpu=4, rack=rack)
    gang_job(rest, namespace, "train", 3, {"cpu": "1", GPU: "4"}, topology_key=RACK)

    count, like, key, value = stated(rest, namespace, "train", ADD).groups()

    assert (int(count), key) == (1, RACK)
    template = rest.get(f"/api/v1/nodes/{like}")["status"]["allocatable"]
    for i in range(int(count)):
        nodes.add(f"sc-{value}-new-{i}", gpu=int(template[GPU]), cpu=template["cpu"], rack=value)
    placed = wait_all_bound(rest, namespace, 3, podgroup="train", timeout=90)
    assert {n.split("-")[1] for n in placed.values()} == {value}


def test_a_gang_kept_out_by_a_cordon_and_a_taint_binds_whole_once_the_stated_node_is_freed(
        rest, namespace, nodes, phalanx_scheduler):
    nodes.add("sc-free", cpu="1")
    nodes.add("sc-cordoned", cpu="1", unschedulable=True)
    nodes.add("sc-tainted", cpu="1", taints=[{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}])
    gang_job(rest, namespace, "db", 2, {"cpu": "1"})

    listed = stated(rest, namespace, "db", FREE).group(1)

    freed = [part.split(" (", 1)[0] for part in listed.split("; ")]
    assert len(freed) == 1 and freed[0] in ("sc-cordoned", "sc-tainted")
    rest.patch(f"/api/v1/nodes/{freed[0]}", {"spec": {"unschedulable": None, "taints": None}})
    placed = wait_all_bound(rest, namespace, 2, podgroup="db", timeout=90)
    assert set(placed.values()) == {"sc-free", freed[0]}


def test_a_rack_gang_too_large_for_one_rack_binds_across_the_stated_racks_once_the_key_is_dropped(
        rest, namespace, nodes, phalanx_scheduler):
    for rack in ("ta", "tb", "tc"):
        for i in range(2 if rack != "tc" else 1):
            nodes.add(f"sc-{rack}-{i}", gpu=4, rack=rack)
    gang_job(rest, namespace, "wide", 4, {"cpu": "1", GPU: "4"}, topology_key=RACK)

    racks, key = stated(rest, namespace, "wide", SPAN).groups()

    assert key == RACK and len(racks.split("+")) == 2  # two racks of two nodes: the fewest
    recreate_gang(rest, namespace, "wide", 4, {"cpu": "1", GPU: "4"})
    placed = wait_all_bound(rest, namespace, 4, podgroup="wide", timeout=90)
    assert {n.split("-")[1] for n in placed.values()} == set(racks.split("+"))


def test_a_gang_of_too_low_a_priority_binds_once_given_the_stated_priority(rest, namespace, nodes, phalanx_scheduler):
    for name, value in (("phalanx-sc-batch", 1000), ("phalanx-sc-urgent", 100)):
        if rest.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}") is None:
            create(rest, priority_class(name, value))
    for i in range(3):  # the lower gang takes two; a member alone passes kube-scheduler's own filters
        nodes.add(f"sc-p-{i}", gpu=4)
    gang_job(rest, namespace, "batch", 2, {"cpu": "1", GPU: "4"}, priority_class_name="phalanx-sc-batch")
    batch_nodes = set(wait_all_bound(rest, namespace, 2, podgroup="batch", timeout=90).values())
    gang_job(rest, namespace, "urgent", 2, {"cpu": "1", GPU: "4"}, priority_class_name="phalanx-sc-urgent")

    need, now = (int(v) for v in stated(rest, namespace, "urgent", RAISE).groups())

    assert (need, now) == (1001, 100)
    raised = f"phalanx-sc-raised-{need}"
    if rest.get_or_none(f"/apis/scheduling.k8s.io/v1/priorityclasses/{raised}") is None:
        create(rest, priority_class(raised, need))
    recreate_gang(rest, namespace, "urgent", 2, {"cpu": "1", GPU: "4"}, priority_class_name=raised)
    placed = wait_all_bound(rest, namespace, 2, podgroup="urgent", timeout=120)
    assert len(set(placed.values())) == 2 and set(placed.values()) & batch_nodes  # a lower member evicted
