"""The smallest change a pending gang's PodGroup states, applied as a person would, against the real
control plane with phalanx as kube-scheduler's extender (the change is computed by the workload
cycle, the same in either mode): KWOK plays the nodes.

- a rack gang short of capacity: the condition names how many nodes like which one the rack lacks;
  the test adds exactly those nodes (KWOK nodes with that node's rack label and allocatable) and
  the gang binds whole in that rack;
- a gang kept out by a cordon and a taint: the condition names the node to uncordon or untaint;
  the test frees exactly that node and the gang binds whole.
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
    wait_all_bound,
    wait_for,
)

from cluster import names

pytestmark = pytest.mark.parametrize("scheduler_mode", ["extender"], scope="module")

ADD = re.compile(r"smallest change: .*?capacity: \S+ \S+ lacks (\d+) nodes? like (\S+) \((\S+)=(\S+); ")
FREE = re.compile(r"smallest change: .*?constraint: [^|]*?uncordon/untaint (.+?) \(\d+ kept out")


def gang_job(rest, namespace, name, size, requests, topology_key=None):
    create(rest, podgroup(name, min_count=size, topology_key=topology_key), namespace)
    create(rest, job(name, size, podgroup_name=name, requests=requests), namespace)


def stated(rest, namespace, name, pattern):
    """The PodGroup's Unschedulable condition once it states a change ``pattern`` reads."""
    def probe():
        cond = podgroup_conditions(rest, namespace, name).get(names.CONDITION_INITIALLY_SCHEDULED)
        if cond and cond["status"] == "False" and cond["reason"] == names.REASON_UNSCHEDULABLE:
            return pattern.search(cond["message"])
        return None
    return wait_for(probe, 60, f"podgroup {namespace}/{name} states its smallest change")


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
