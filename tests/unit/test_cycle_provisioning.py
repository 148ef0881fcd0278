"""Gang-aware autoscaling on the simulated cluster: a gang short of capacity gets one
ProvisioningRequest for exactly its missing pods in its nearest domain, its conditions reach the
PodGroup, and it is deleted once the gang is bound (docs/autoscaling.md)."""

import pytest

from cluster import names
from cluster.backend import WriteError
from cluster.cache import ClusterCache
from cluster.provisioning import (
    PodSet,
    ProvisioningAsk,
    pod_template_json,
    provisioning_record,
    provisioning_request_json,
    request_held,
    request_name,
)
from cluster.sim import SimCluster
from cycle import WorkloadCycle
from extender import verbs
from solver import InvalidInput, PodSpec, Toleration

from .k8s_objects import node, pod, podgroup
from .test_cycle_service import all_nodes, bind_all, condition, wait_until

RACK = names.LABEL_RACK


def gang(sim, name, size, gpu=4, key=RACK, mode=names.PROVISIONING_ATOMIC):
    """A gang of ``size`` pods of ``gpu`` GPUs each in one ``key`` domain, opted in by ``mode``."""
    group = podgroup(name, size, key)
    if mode:
        group["metadata"].setdefault("annotations", {})[names.ANNOTATION_PROVISIONING] = mode
    sim.create(group)
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu)) for i in range(size)]


def requests(sim):
    return sim.list("ProvisioningRequest")


def template(sim, request, index=0):
    ref = request["spec"]["podSets"][index]["podTemplateRef"]["name"]
    return sim.get("PodTemplate", f"default/{ref}")


def answer_reason(answer):
    return next(iter(answer.unresolvable.values()), "") or next(iter(answer.failed.values()), "")


def uid_of(sim, name):
    return sim.get("PodGroup", f"default/{name}")["metadata"]["uid"]


def test_a_gang_short_of_capacity_asks_once_for_its_missing_pods_in_the_nearest_rack(sim, cycle):
    pods = gang(sim, "train", 8)  # racks of 2 nodes x 4 GPUs: 2 of 8 fit in either
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes == []
    name = request_name(uid_of(sim, "train"))
    assert f"ProvisioningRequest default/{name} asks for 6 pods in rack r0, all at once" in answer_reason(answer)
    assert cycle.flush()
    [request] = requests(sim)
    assert request["metadata"]["name"] == name
    assert request["spec"]["provisioningClassName"] == names.PROVISIONING_CLASS_ATOMIC
    assert [s["count"] for s in request["spec"]["podSets"]] == [6]
    assert request["metadata"]["ownerReferences"][0]["uid"] == uid_of(sim, "train")
    spec = template(sim, request)["template"]["spec"]
    assert spec["nodeSelector"] == {RACK: "r0"}
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "1000m", "nvidia.com/gpu": "4"},
                                                  "limits": {"nvidia.com/gpu": "4"}}
    annotations = [p["metadata"].get("annotations") or {} for p in sim.list("Pod")]
    assert all(a.get(names.ANNOTATION_CONSUME_PROVISIONING) == name for a in annotations)
    assert [e["reason"] for e in sim.events].count(names.EVENT_PROVISIONING_REQUESTED) == 1
    assert condition(sim, "train")["reason"] == names.REASON_PROVISIONING

    for p in pods[1:]:  # every member asks again, and a restarted serve asks too: still one request
        verbs.filter(cycle, p, all_nodes(sim))
    restarted = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0)
    try:
        again = verbs.filter(restarted, pods[0], all_nodes(sim))
        assert f"ProvisioningRequest default/{name}" in answer_reason(again)
        assert restarted.flush() and cycle.flush()
    finally:
        restarted.close()
    assert len(requests(sim)) == 1 and len(sim.list("PodTemplate")) == 1


def test_the_pods_that_do_not_fit_are_asked_for_with_their_shape_the_largest_first():
    sim = SimCluster()
    sim.create(node("n-0", rack="r0", gpus=8))
    sim.create(podgroup("mixed", 4, RACK))
    sim.update("PodGroup", "default/mixed", lambda o: o["metadata"].setdefault("annotations", {}).update(
        {names.ANNOTATION_PROVISIONING: names.PROVISIONING_ATOMIC}))
    pods = [sim.create(pod("mixed-0", "mixed", gpu=2)), sim.create(pod("mixed-1", "mixed", gpu=2)),
            sim.create(pod("mixed-2", "mixed", gpu=4)), sim.create(pod("mixed-3", "mixed", gpu=4))]
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0)
    try:
        verbs.filter(cycle, pods[0], all_nodes(sim))  # 12 GPUs asked, 8 free: one 4-GPU pod fits too few
        assert cycle.flush()
    finally:
        cycle.close()
    [request] = requests(sim)
    counts = [s["count"] for s in request["spec"]["podSets"]]
    gpus = [template(sim, request, i)["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
            for i in range(len(counts))]
    # the domain fits at most 2 of 4 by its totals: the 2 missing are asked as the largest shape
    assert list(zip(gpus, counts, strict=True)) == [("4", 2)]


def test_no_request_without_opt_in(sim, cycle):
    pods = gang(sim, "plain", 8, mode=None)
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes == [] and "ProvisioningRequest" not in answer_reason(answer)
    assert cycle.flush() and requests(sim) == []


def test_serve_wide_default_asks_unless_the_podgroup_opts_out(sim):
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, provisioning=names.PROVISIONING_ATOMIC)
    try:
        out = gang(sim, "out", 8, mode=names.PROVISIONING_NONE)
        verbs.filter(cycle, out[0], all_nodes(sim))
        assert cycle.flush() and requests(sim) == []
        default = gang(sim, "default", 8, mode=None)
        verbs.filter(cycle, default[0], all_nodes(sim))
        assert cycle.flush()
        assert [r["metadata"]["labels"][names.LABEL_PROVISIONING_PODGROUP] for r in requests(sim)] == ["default"]
    finally:
        cycle.close()


def test_no_request_when_no_node_is_eligible_more_nodes_would_not_help():
    sim = SimCluster()
    for i in range(2):
        tainted = node(f"n-{i}", rack="r0", gpus=4)
        tainted["spec"] = {"taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}
        sim.create(tainted)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, provisioning=names.PROVISIONING_ATOMIC)
    try:
        pods = gang(sim, "t", 2, gpu=1)
        answer = verbs.filter(cycle, pods[0], all_nodes(sim))
        assert "no ProvisioningRequest: no domain lacks capacity only" in answer_reason(answer)
        assert cycle.flush() and requests(sim) == []
    finally:
        cycle.close()


def set_condition(sim, name, type_, message, status="True"):
    def mutate(obj):
        obj.setdefault("status", {})["conditions"] = [
            {"type": type_, "status": status, "reason": type_ + "Reason", "message": message,
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    sim.update("ProvisioningRequest", f"default/{name}", mutate)


def test_a_failed_request_reaches_the_podgroups_condition_and_explanation(sim, cycle):
    pods = gang(sim, "huge", 8)
    verbs.filter(cycle, pods[0], all_nodes(sim))
    assert cycle.flush()
    name = request_name(uid_of(sim, "huge"))
    set_condition(sim, name, names.PROVISIONING_FAILED, "max node group size reached")
    wait_until(lambda: cycle.flush() and (condition(sim, "huge") or {}).get("reason") == names.REASON_PROVISIONING_FAILED)
    message = condition(sim, "huge")["message"]
    assert f"ProvisioningRequest default/{name} failed (FailedReason: max node group size reached)" in message
    assert message.startswith("podgroup default/huge: ")  # the solver's reason comes first
    assert message == cycle.explanations["default/huge"]
    warnings = [e for e in sim.events if e["reason"] == names.EVENT_PROVISIONING_CHANGED]
    assert [e["type"] for e in warnings] == ["Warning"]
    verbs.filter(cycle, pods[1], all_nodes(sim))  # asked again: the failed request stays, no new one
    assert cycle.flush() and len(requests(sim)) == 1


@pytest.mark.parametrize("type_", [names.PROVISIONING_CAPACITY_REVOKED, names.PROVISIONING_BOOKING_EXPIRED])
def test_capacity_revoked_and_booking_expired_are_said_too(sim, cycle, type_):
    pods = gang(sim, "g", 8)
    verbs.filter(cycle, pods[0], all_nodes(sim))
    assert cycle.flush()
    set_condition(sim, request_name(uid_of(sim, "g")), type_, "gone")
    wait_until(lambda: cycle.flush() and (condition(sim, "g") or {}).get("reason") == names.REASON_PROVISIONING_FAILED)
    assert f"({type_}Reason: gone)" in condition(sim, "g")["message"]


def test_provisioned_nodes_take_the_gang_and_the_request_is_deleted(sim, cycle):
    pods = gang(sim, "train", 8)
    verbs.filter(cycle, pods[0], all_nodes(sim))
    assert cycle.flush()
    [request] = requests(sim)
    name = request["metadata"]["name"]
    set_condition(sim, name, names.PROVISIONING_PROVISIONED, "6 nodes")
    wait_until(lambda: cycle.flush() and "is provisioned" in condition(sim, "train")["message"])
    assert condition(sim, "train")["reason"] == names.REASON_PROVISIONING
    nodes = template(sim, request)["template"]["spec"]["nodeSelector"]
    for i in range(2, 8):  # what cluster-autoscaler would bring for 6 pods: 6 nodes of 4 GPUs in rack r0
        sim.create(node(f"n-0-{i}", rack=nodes[RACK], gpus=4))
    current = [sim.get("Pod", f"default/{p['metadata']['name']}") for p in pods]
    planned, errors = bind_all(cycle, sim, current)
    assert errors == []
    assert {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()} == {"r0"}
    wait_until(lambda: cycle.flush() and not requests(sim) and not sim.list("PodTemplate"))
    assert [e["reason"] for e in sim.events].count(names.EVENT_PROVISIONING_DELETED) == 1
    assert condition(sim, "train")["status"] == "True"


def test_a_malformed_request_is_skipped_by_the_cache():
    cache = ClusterCache()
    bad = {"metadata": {"name": "x", "namespace": "default"}, "spec": {"podSets": ["not an object"]}}
    assert not cache.apply("ProvisioningRequest", "ADDED", bad)
    with pytest.raises(InvalidInput, match=r"spec.podSets\[0\]"):
        provisioning_record(bad)
    assert cache.provisioning_requests == {}


def test_a_refused_request_is_said_and_asked_again_by_a_later_cycle(sim, cycle, monkeypatch):
    refusals = []

    def refuse(ask):
        refusals.append(ask.name)
        raise WriteError("the server could not find the requested resource", 404, "NotFound")

    monkeypatch.setattr(sim, "create_provisioning_request", refuse)
    pods = gang(sim, "g", 8)
    verbs.filter(cycle, pods[0], all_nodes(sim))
    assert cycle.flush()
    errors = [e for e in sim.events if e["reason"] == names.EVENT_PROVISIONING_ERROR]
    assert [e["type"] for e in errors] == ["Warning"] and "not created" in errors[0]["note"]
    assert "default/g" not in cycle.provisioning.asked
    monkeypatch.undo()
    sim.create(node("n-2-0", rack="r2", gpus=1))  # room may have appeared: the gang's cycle runs again
    verbs.filter(cycle, pods[1], all_nodes(sim))
    assert cycle.flush() and len(requests(sim)) == 1 and len(refusals) == 1


def test_a_restarted_serve_deletes_the_request_of_a_gang_bound_after_it_started(sim, cycle):
    pods = gang(sim, "train", 8)
    verbs.filter(cycle, pods[0], all_nodes(sim))
    assert cycle.flush()
    cycle.close()  # serve stops; a new one starts on the same cluster and asked for nothing itself
    restarted = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        assert restarted.provisioning.asked == {}
        for i in range(2, 8):
            sim.create(node(f"n-0-{i}", rack="r0", gpus=4))
        current = [sim.get("Pod", f"default/{p['metadata']['name']}") for p in pods]
        _, errors = bind_all(restarted, sim, current)
        assert errors == []
        wait_until(lambda: restarted.flush() and not requests(sim) and not sim.list("PodTemplate"))
    finally:
        restarted.close()


def test_the_template_carries_the_shapes_tolerations_and_selector_and_no_domain_without_a_key():
    spec = PodSpec(requests={"cpu": 500, "memory": 2 * 2**30}, node_selector={"pool": "gpu"},
                   tolerations=(Toleration("dedicated", "Equal", "ml", "NoSchedule"), Toleration("spot", "Exists")))
    ask = ProvisioningAsk("ns", "g", "u-1", (PodSet(spec, 3),))
    body = pod_template_json(ask, 0, "scheduling.k8s.io/v1beta1")
    assert body["metadata"]["name"] == "phalanx-u-1-0"
    template = body["template"]["spec"]
    assert template["nodeSelector"] == {"pool": "gpu"}  # no topology key: no domain label
    assert template["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                                       {"key": "spot", "operator": "Exists"}]
    assert template["containers"][0]["resources"] == {"requests": {"cpu": "500m", "memory": str(2 * 2**30)}}
    request = provisioning_request_json(ask, "scheduling.k8s.io/v1beta1")
    assert request["spec"]["podSets"] == [{"podTemplateRef": {"name": "phalanx-u-1-0"}, "count": 3}]
    with pytest.raises(InvalidInput, match="1 to 32 pod sets"):
        provisioning_request_json(ProvisioningAsk("ns", "g", "u-1", ()), "scheduling.k8s.io/v1beta1")


def grow(sim, name, to, gpu=4):
    """The gang's minCount raised to ``to`` and its new members created, as a StatefulSet scaled up
    through phalanx's controller would."""
    def raise_min(o):
        o["spec"]["schedulingPolicy"]["gang"]["minCount"] = to
    sim.update("PodGroup", f"default/{name}", raise_min)
    have = len([p for p in sim.list("Pod") if p["metadata"]["name"].startswith(f"{name}-")])
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu)) for i in range(have, to)]


def test_a_bound_gang_that_grows_asks_for_its_increment_in_the_rack_it_holds(sim, cycle):
    pods = gang(sim, "train", 2)  # 2 x 4 GPUs: fits one rack of 2 nodes x 4 GPUs, asks nothing
    planned, errors = bind_all(cycle, sim, pods)
    assert errors == [] and cycle.flush() and requests(sim) == []
    [held] = {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()}
    new = grow(sim, "train", 4)  # the other rack has room for both new members: not theirs to take
    answer = verbs.filter(cycle, new[0], all_nodes(sim))
    assert answer.nodes == []
    name = request_name(uid_of(sim, "train"), 2)
    assert f"ProvisioningRequest default/{name} asks for 2 pods in rack {held}, all at once" in answer_reason(answer)
    assert cycle.flush()
    [request] = requests(sim)
    assert request["metadata"]["name"] == name and name != request_name(uid_of(sim, "train"))
    assert [s["count"] for s in request["spec"]["podSets"]] == [2]
    assert template(sim, request)["template"]["spec"]["nodeSelector"] == {RACK: held}
    consumes = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(names.ANNOTATION_CONSUME_PROVISIONING)
                for p in sim.list("Pod")}
    assert consumes == {"train-0": None, "train-1": None, "train-2": name, "train-3": name}
    for i in range(2, 4):  # the increment's nodes arrive in the held rack; the new members bind there
        sim.create(node(f"n-{held[1]}-{i}", rack=held, gpus=4))
    current = [sim.get("Pod", f"default/{p['metadata']['name']}") for p in new]
    planned, errors = bind_all(cycle, sim, current)
    assert errors == [] and {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()} == {held}
    wait_until(lambda: cycle.flush() and not requests(sim) and not sim.list("PodTemplate"))


def test_a_gang_provisioned_once_asks_again_when_it_grows_and_the_first_request_goes():
    sim = SimCluster()
    sim.create(node("n-0-0", rack="r0", gpus=4))
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()  # its requeue thread syncs
    try:
        pods = gang(sim, "train", 2)
        verbs.filter(cycle, pods[0], all_nodes(sim))
        assert cycle.flush()
        first = request_name(uid_of(sim, "train"))
        assert [r["metadata"]["name"] for r in requests(sim)] == [first]
        sim.create(node("n-0-1", rack="r0", gpus=4))  # the first request's node: the gang binds
        current = [sim.get("Pod", f"default/{p['metadata']['name']}") for p in pods]
        _, errors = bind_all(cycle, sim, current)
        assert errors == []
        grow(sim, "train", 3)  # grown before the first request was deleted: both exist a moment
        answer = verbs.filter(cycle, sim.get("Pod", "default/train-2"), all_nodes(sim))
        second = request_name(uid_of(sim, "train"), 2)
        assert f"ProvisioningRequest default/{second} asks for 1 pods in rack r0" in answer_reason(answer)
        wait_until(lambda: cycle.flush() and [r["metadata"]["name"] for r in requests(sim)] == [second])
        deleted = [e["note"] for e in sim.events if e["reason"] == names.EVENT_PROVISIONING_DELETED]
        assert deleted == [f"ProvisioningRequest default/{first} deleted: superseded by default/{second}"], deleted
    finally:
        cycle.close()


def test_a_request_name_says_the_gang_and_the_members_it_held():
    assert request_held(request_name("u-1"), "u-1") == 0
    assert request_held(request_name("u-1", 12), "u-1") == 12
    for other in ("phalanx-u-2", "phalanx-u-1-", "phalanx-u-1-x", "phalanx-u-1-012", "phalanx-u-10", "u-1"):
        assert request_held(other, "u-1") is None, other
