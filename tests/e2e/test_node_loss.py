"""Nodes that go away under a running gang, against the real control plane with phalanx in each
mode (extender, then plugin): a Node deleted, or taken NotReady by KWOK so that the node lifecycle
controller taints it and the taint eviction controller evicts its pods.

- ``disruptionMode: all`` (a gang StatefulSet through phalanx's controller and the real
  StatefulSet controller): the gang goes whole (phalanx evicts the rest once one member is lost)
  and the StatefulSet re-creates it; the new pods bind whole inside one rack. A pod on a deleted
  node is removed by the pod GC's orphan sweep (40 s quarantine upstream), so that case takes
  longer;
- ``single`` (a gang Job): only the lost pod goes; its replacement waits, with the reason on its
  PodGroup, while the gang's rack is full, and binds back into that rack once there is room;
  never in another rack.

The gang pods tolerate the NotReady / unreachable NoExecute taints for one second only (the
default is 300 s), so the eviction comes at once.
"""

from __future__ import annotations

import pytest
from harness import (
    RACK,
    bound,
    create,
    delete_node,
    job,
    placement,
    pod,
    podgroup,
    pods,
    set_not_ready,
    statefulset,
    wait_all_bound,
    wait_for,
)
from phalanx_controller import PhalanxController

from cluster import names

CPU1 = {"cpu": "1"}
TOLERATE_1S = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 1} for taint in ("not-ready", "unreachable")]
RACK_REQUIRED = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}


@pytest.fixture(scope="module")
def controller(control_plane, phalanx_scheduler):
    running = PhalanxController(control_plane)
    running.start()
    running.register()
    yield running
    running.close()


def racks(nodes, per_rack: int) -> None:
    for rack in ("ra", "rb"):
        for i in range(per_rack):
            nodes.add(f"{rack}-{i}", cpu="1", rack=rack)


def rack_of(node: str) -> str:
    return node.split("-")[0]


def gang_job(rest, namespace, name, size, mode=None):
    """A PodGroup of ``size`` (minCount ``size``, one rack required) and an Indexed Job of ``size``
    one-CPU pods in it; the Job re-creates what is evicted (backoffLimit room for two losses)."""
    create(rest, podgroup(name, min_count=size, topology_key=RACK, disruption_mode=mode), namespace)
    obj = job(name, size, podgroup_name=name, requests=CPU1, tolerations=TOLERATE_1S)
    obj["spec"]["backoffLimit"] = 2 * size
    create(rest, obj, namespace)


def live(items):
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def lose(rest, nodes, node: str, how: str) -> None:
    if how == "deleted":
        delete_node(rest, node)
        nodes.names.remove(node)
    else:
        set_not_ready(rest, node)


def events_of(rest, namespace, podgroup_name):
    return [e for e in rest.list_items(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
            if e.get("regarding", {}).get("kind") == "PodGroup" and e["regarding"].get("name") == podgroup_name]


def gang_pods(rest, namespace, name):
    return pods(rest, namespace, podgroup=name)


def test_a_single_gang_replacement_goes_back_into_its_rack_or_waits_with_the_reason(
        rest, namespace, nodes, phalanx_scheduler, scheduler_mode):
    racks(nodes, 5)  # 5 one-CPU nodes per rack: one spare in the gang's rack after it binds
    gang_job(rest, namespace, "ens", 4)  # disruptionMode single (the default)
    first = wait_all_bound(rest, namespace, 4, podgroup="ens")
    (home,) = {rack_of(n) for n in first.values()}
    spare = next(n for n in nodes.names if rack_of(n) == home and n not in first.values())
    # the spare node taken by a plain pod: the gang's rack is full
    filler = pod("filler", requests=CPU1)
    filler["spec"]["nodeName"] = spare
    create(rest, filler, namespace)
    lost_pod, lost_node = next(iter(first.items()))
    set_not_ready(rest, lost_node)
    wait_for(lambda: lost_pod not in {p["metadata"]["name"] for p in gang_pods(rest, namespace, "ens")},
             60, "the member on the NotReady node evicted")
    # only that one went; its replacement waits, with the reason on the PodGroup, never elsewhere
    replacement = wait_for(lambda: [p for p in gang_pods(rest, namespace, "ens")
                                    if p["metadata"]["name"] not in first], 30, "the Job made a replacement")
    assert len(replacement) == 1
    name = replacement[0]["metadata"]["name"]
    # (the message names the rack; its tail depends on which check found it full)
    wait_for(lambda: [e for e in events_of(rest, namespace, "ens") if e.get("reason") == names.EVENT_FAILED_SCHEDULING
                      and f"podgroup {namespace}/ens: rack {home}: no " in e.get("note", "")], 30,
             "a FailedScheduling event on the PodGroup: no room in the gang's rack")
    assert sorted(placement(bound(gang_pods(rest, namespace, "ens")))) == sorted(set(first) - {lost_pod})
    # room in the gang's rack again: the replacement binds there, not in the empty other rack
    rest.delete(f"/api/v1/namespaces/{namespace}/pods/filler")
    where = wait_for(lambda: placement(bound([p for p in gang_pods(rest, namespace, "ens")
                                              if p["metadata"]["name"] == name])), 60, "replacement bound")
    assert rack_of(where[name]) == home


@pytest.mark.parametrize("how", ["not-ready", "deleted"])
def test_an_all_gang_statefulset_that_loses_a_node_is_evicted_whole_and_replaced_whole_in_one_rack(
        rest, namespace, nodes, controller, how):
    racks(nodes, 4)  # two racks of 4 one-CPU nodes: a gang of 4 fills one
    create(rest, statefulset("db", 4, requests=CPU1, tolerations=TOLERATE_1S,
                             scheduling={**RACK_REQUIRED, "disruptionMode": {"all": {}}}), namespace)
    first = wait_all_bound(rest, namespace, 4, label_selector="app=db", timeout=90)
    (home,) = {rack_of(n) for n in first.values()}
    uids = {p["metadata"]["uid"] for p in pods(rest, namespace, "app=db")}
    lose(rest, nodes, first["db-0"], how)
    # the whole gang goes at once: phalanx evicts the rest as soon as one member is lost (a member
    # on a deleted node stays terminating until the pod GC removes it; it is out of the gang)
    wait_for(lambda: not uids & {p["metadata"]["uid"] for p in live(pods(rest, namespace, "app=db"))}, 30,
             "every first replica evicted")
    # the StatefulSet controller re-creates them; they bind whole, in the rack that still has room
    # for all four: the other one
    again = wait_for(lambda: (b := placement(bound(pods(rest, namespace, "app=db")))) and len(b) == 4
                     and not uids & {p["metadata"]["uid"] for p in pods(rest, namespace, "app=db")} and b,
                     120, "4 new replicas bound")
    assert {rack_of(n) for n in again.values()} == {"ra", "rb"} - {home}
