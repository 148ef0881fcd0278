"""The smallest change a pending gang's condition states, on the simulated cluster: read it from the
PodGroup's condition as a person would, apply it to the cluster, and see the gang bound whole."""

import re

from cluster import names
from extender import verbs

from .k8s_objects import node, pod, podgroup
from .test_cycle_service import all_nodes, bind_all, condition, wait_until

RACK = names.LABEL_RACK
ADD = re.compile(r"capacity: \S+ \S+ lacks (\d+) nodes? like (\S+) \((\S+)=(\S+); ")
FREE = re.compile(r"constraint: [^|]*?uncordon/untaint (.+?) \(\d+ kept out")


def gang(sim, name, size, gpu, key=None):
    sim.create(podgroup(name, size, key))
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu)) for i in range(size)]


def refused(cycle, sim, pods, name):
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes == []
    assert cycle.flush()
    cond = condition(sim, name)
    assert cond["status"] == "False" and cond["reason"] == names.REASON_UNSCHEDULABLE
    return cond["message"]


def test_a_gang_short_of_capacity_fits_once_the_stated_nodes_are_added(sim, cycle):
    pods = gang(sim, "train", 3, gpu=4, key=RACK)  # racks of 2 nodes x 4 GPUs: one node short
    message = refused(cycle, sim, pods, "train")

    assert message.startswith("podgroup default/train: ")  # the shortfall first, as before
    assert "; smallest change: capacity: " in message
    count, like, key, value = ADD.search(message).groups()
    assert (int(count), key) == (1, RACK)
    template = sim.get("Node", like)
    gpus = template["status"]["allocatable"]["nvidia.com/gpu"]
    for i in range(int(count)):
        sim.create(node(f"new-{i}", rack=value, gpus=int(gpus)))
    whole = cycle.smallest.texts["default/train"]
    assert [e["reason"] for e in sim.events].count(names.EVENT_SMALLEST_CHANGE) == 1
    assert any(e["note"] == whole for e in sim.events if e["reason"] == names.EVENT_SMALLEST_CHANGE)

    planned, errors = bind_all(cycle, sim, pods)

    assert errors == []
    assert {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()} == {value}
    assert "default/train" not in cycle.smallest.texts  # placed: nothing left to change


def test_a_gang_kept_out_by_a_cordon_and_a_taint_fits_once_the_stated_nodes_are_freed(sim, cycle):
    def cordon(obj):
        obj.setdefault("spec", {})["unschedulable"] = True

    def taint(obj):
        obj.setdefault("spec", {})["taints"] = [{"key": "maintenance", "value": "yes", "effect": "NoSchedule"}]

    sim.update("Node", "n-0-0", cordon)
    sim.update("Node", "n-1-0", taint)
    pods = gang(sim, "train", 3, gpu=4)  # 4 nodes of 4 GPUs, two kept out: one short
    message = refused(cycle, sim, pods, "train")

    freed = [part.split(" (", 1)[0] for part in FREE.search(message).group(1).split("; ")]
    assert len(freed) == 1 and freed[0] in {"n-0-0", "n-1-0"}
    assert "2 kept out there by a cordon or taint; minimal" in message

    def uncordon_untaint(obj):
        obj["spec"].pop("unschedulable", None)
        obj["spec"].pop("taints", None)

    sim.update("Node", freed[0], uncordon_untaint)
    planned, errors = bind_all(cycle, sim, pods)

    assert errors == []
    assert len(planned) == 3


def test_a_gang_the_key_keeps_from_fitting_fits_once_the_key_is_relaxed(sim, cycle):
    pods = gang(sim, "wide", 3, gpu=4, key=RACK)  # 12 GPUs; a rack has 8, two racks 16
    message = refused(cycle, sim, pods, "wide")

    assert f"topology: fits across racks r0+r1, but the key {RACK} requires one rack (the fewest)" in message

    def relax(obj):
        del obj["spec"]["schedulingConstraints"]

    sim.update("PodGroup", "default/wide", relax)
    wait_until(lambda: verbs.filter(cycle, pods[0], all_nodes(sim)).nodes)  # once its backoff ends
    planned, errors = bind_all(cycle, sim, pods)

    assert errors == []
    assert {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()} == {"r0", "r1"}


def test_a_gang_that_may_not_preempt_fits_with_the_priority_stated(sim, cycle):
    for i, n in enumerate(all_nodes(sim)):  # every GPU taken by pods of priority 5
        sim.create(pod(f"busy-{i}", gpu=4, node=n, priority=5))
    sim.create(podgroup("urgent", 2, priority=5))
    pods = [sim.create(pod(f"urgent-{i}", "urgent", gpu=4)) for i in range(2)]
    message = refused(cycle, sim, pods, "urgent")

    found = re.search(r"preemption: with priority (\d+) or more \(now 5\) it would evict (\d+) pods", message)
    assert found is not None and "(the least priority)" in message
    priority, evicted = int(found.group(1)), int(found.group(2))
    assert (priority, evicted) == (6, 2)

    def raise_priority(obj):
        obj["spec"]["priority"] = priority

    sim.update("PodGroup", "default/urgent", raise_priority)
    def busy():
        return sum(1 for p in sim.list("Pod") if p["metadata"]["name"].startswith("busy-"))

    # once its backoff ends the group's preemption starts: two of the four pods go
    wait_until(lambda: verbs.filter(cycle, pods[0], all_nodes(sim)) and busy() == 2)
    planned, errors = bind_all(cycle, sim, pods)

    assert errors == [] and len(planned) == 2
