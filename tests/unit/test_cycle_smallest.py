"""The smallest change a pending gang's condition states, on the simulated cluster: read it from the
PodGroup's condition as a person would, apply it to the cluster, and see the gang bound whole."""

import re

from cluster import names
from extender import verbs

from .k8s_objects import node, pod, podgroup
from .test_cycle_service import all_nodes, bind_all, condition

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
