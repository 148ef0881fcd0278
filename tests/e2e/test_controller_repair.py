"""Repair after a webhook outage, against the real control plane.

Both webhooks use ``failurePolicy: Ignore``: while phalanx's webhook server is unreachable the real
kube-apiserver admits a gang StatefulSet's pods unstamped (no PodGroup reference, no gate). Here the
outage is real: the webhook configurations stay registered but point at a closed port, and no
controller replica runs. When phalanx comes back, the controller creates the Workload and PodGroup,
deletes the unbound unstamped pods, the real StatefulSet controller recreates them through the
webhook, and phalanx (kube-scheduler's extender) places the gang whole. A pod already bound
unstamped is reported, never deleted.
"""

from __future__ import annotations

import copy
import socket

import pytest
import yaml
from harness import assert_none_bound, bound, create, pods, statefulset, wait_all_bound, wait_for
from phalanx_controller import WEBHOOKS, PhalanxController

from cluster import names
from controller import WebhookServer

API = "scheduling.k8s.io/v1beta1"
GANG = {"schedulingPolicy": {"gang": {}}}
POOL = "phalanx.dev/repair-pool"  # node label the test StatefulSets select: no node has it at first


@pytest.fixture(scope="module")
def controller(control_plane, phalanx_scheduler):
    running = PhalanxController(control_plane)
    running.register()  # proves the webhooks work; the tests then take them down
    running.control_plane = control_plane
    yield running
    running.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outage(running: PhalanxController) -> None:
    """No controller replica, and the shipped webhook configurations (failurePolicy: Ignore)
    pointed at a port nobody listens on, until the API server calls them no more."""
    running.stop()
    port = closed_port()
    for doc in yaml.safe_load_all(WEBHOOKS.read_text()):
        doc = copy.deepcopy(doc)
        for hook in doc["webhooks"]:
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{hook['clientConfig']['service']['path']}",
                                    "caBundle": running.ca_bundle}
        collection = f"/apis/admissionregistration.k8s.io/v1/{doc['kind'].lower()}s"
        running.rest.delete(f"{collection}/{doc['metadata']['name']}", missing_ok=True)
        running.rest.create(collection, doc)
    wait_for(lambda: not running._validation_active(), 30, "the API server no longer reaches phalanx's webhooks")
    running.server.stop()


def recover(running: PhalanxController) -> None:
    """The webhook server back (a new port, registered again) and a controller replica leading."""
    tls = running.control_plane.pki.server("phalanx-webhook", ["IP:127.0.0.1", "DNS:localhost"])
    running.server = WebhookServer("127.0.0.1:0", str(tls.cert), str(tls.key), running.mutator.review).start()
    running.register()
    running.start()


def podgroups(rest, ns):
    return rest.list_items(f"/apis/{API}/namespaces/{ns}/podgroups")


def workloads(rest, ns):
    return rest.list_items(f"/apis/{API}/namespaces/{ns}/workloads")


def the_podgroup(rest, ns):
    groups = podgroups(rest, ns)
    return groups[0] if len(groups) == 1 and len(workloads(rest, ns)) == 1 else None


def live(rest, ns):
    return [p for p in pods(rest, ns) if not p["metadata"].get("deletionTimestamp")]


def stamped(pod):
    return (pod["spec"].get("schedulingGroup") or {}).get("podGroupName")


def whole_and_released(rest, ns, count, group):
    """``count`` live pods, every one naming ``group``, owned by it, without the sync gate."""
    items = live(rest, ns)
    if len(items) != count:
        return None
    for p in items:
        owners = {r["kind"]: r.get("uid") for r in p["metadata"].get("ownerReferences") or []}
        gates = [g["name"] for g in p["spec"].get("schedulingGates") or []]
        if stamped(p) != group["metadata"]["name"] or owners.get("PodGroup") != group["metadata"]["uid"] \
                or names.GATE_PODGROUP_SYNC in gates:
            return None
    return items


def unstamped_pods(rest, ns, count):
    items = live(rest, ns)
    return items if len(items) == count and not any(stamped(p) or p["spec"].get("schedulingGates")
                                                    for p in items) else None


def events_of(rest, ns, uid, reason):
    return [e for e in rest.list_items(f"/api/v1/namespaces/{ns}/events")
            if e["involvedObject"].get("uid") == uid and e["reason"] == reason]


def make(rest, ns, name, replicas):
    return create(rest, statefulset(name, replicas, scheduling=GANG, requests={"cpu": "1"},
                                    node_selector={POOL: ns}), ns)


def test_gang_admitted_unstamped_during_a_webhook_outage_is_repaired_and_forms_whole(rest, namespace, nodes,
                                                                                    controller):
    outage(controller)
    sts = make(rest, namespace, "db", 3)
    wait_for(lambda: unstamped_pods(rest, namespace, 3), 60, "3 pods admitted unstamped (webhook unreachable)")
    assert workloads(rest, namespace) == [] and podgroups(rest, namespace) == []
    before = {p["metadata"]["uid"] for p in live(rest, namespace)}
    assert not bound(live(rest, namespace))  # no node matches their nodeSelector

    recover(controller)
    group = wait_for(lambda: the_podgroup(rest, namespace), 60, "one Workload and one PodGroup")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    items = wait_for(lambda: whole_and_released(rest, namespace, 3, group), 90,
                     "every pod recreated in the PodGroup, gate lifted")
    assert not before & {p["metadata"]["uid"] for p in items}  # all three replaced, none kept unstamped
    wait_for(lambda: events_of(rest, namespace, sts["metadata"]["uid"], names.EVENT_UNSTAMPED_PODS_RECREATED),
             30, "the UnstampedPodsRecreated event")
    registry = controller.controller.registry
    assert registry.get_sample_value(names.METRIC_UNSTAMPED_PODS_DELETED) >= 3
    assert registry.get_sample_value(names.METRIC_UNSTAMPED_PODS_BOUND) == 0

    # The gang is one unit now: room for two of three binds nothing; room for all binds all.
    nodes.add(f"{namespace}-a", cpu="2", labels={POOL: namespace})
    assert_none_bound(rest, namespace, seconds=6, podgroup=group["metadata"]["name"])
    nodes.add(f"{namespace}-b", cpu="2", labels={POOL: namespace})
    placed = wait_all_bound(rest, namespace, count=3, timeout=90, podgroup=group["metadata"]["name"])
    assert set(placed.values()) <= {f"{namespace}-a", f"{namespace}-b"}


def test_a_pod_bound_unstamped_is_reported_never_deleted_and_the_gang_forms_after_the_advice(
        rest, namespace, nodes, controller):
    outage(controller)
    nodes.add(f"{namespace}-small", cpu="1", labels={POOL: namespace})  # room for one pod
    sts = make(rest, namespace, "db", 2)
    first = wait_for(lambda: (b := bound(live(rest, namespace))) and unstamped_pods(rest, namespace, 2) and b[0],
                     90, "one of two unstamped pods bound by the scheduler, one by one")
    recover(controller)
    (warning,) = wait_for(lambda: events_of(rest, namespace, sts["metadata"]["uid"], names.EVENT_UNSTAMPED_PODS_BOUND),
                          60, "the UnstampedPodsBound warning")
    assert warning["type"] == "Warning" and first["metadata"]["name"] in warning["message"]
    assert f"kubectl scale statefulset -n {namespace} db --replicas=0" in warning["message"]
    wait_for(lambda: controller.controller.registry.get_sample_value(names.METRIC_UNSTAMPED_PODS_BOUND) == 1, 30,
             "the unstamped-bound gauge")
    # Never deleted, and no gang is built around a running pod (KEP-6277: none once pods exist).
    still = {p["metadata"]["name"]: p["metadata"]["uid"] for p in live(rest, namespace)}
    assert still[first["metadata"]["name"]] == first["metadata"]["uid"] and len(still) == 2
    assert workloads(rest, namespace) == [] and podgroups(rest, namespace) == []

    # What the event tells the user to do: scale to 0 and back. The gang then forms, every pod in it.
    rest.patch(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/db", {"spec": {"replicas": 0}})
    group = wait_for(lambda: not live(rest, namespace) and the_podgroup(rest, namespace), 90,
                     "no pods, then one Workload and one PodGroup")
    rest.patch(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/db", {"spec": {"replicas": 2}})
    wait_for(lambda: whole_and_released(rest, namespace, 2, group), 90, "both pods in the PodGroup")
    assert the_podgroup(rest, namespace)["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert_none_bound(rest, namespace, seconds=6)  # one node with room for one: the gang waits whole
    nodes.add(f"{namespace}-big", cpu="2", labels={POOL: namespace})
    wait_all_bound(rest, namespace, count=2, timeout=90, podgroup=group["metadata"]["name"])
    wait_for(lambda: controller.controller.registry.get_sample_value(names.METRIC_UNSTAMPED_PODS_BOUND) == 0, 60,
             "the unstamped-bound gauge back at 0")
