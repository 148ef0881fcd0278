"""The workload-cycle service on the simulated cluster: plans, reservations, the bind barrier,
status, and the rules of docs/design.md ("A gang through the extender's verbs")."""

import json
import threading
import time

import pytest

from cluster import names
from cycle import BindError, WorkloadCycle
from extender import verbs

from .k8s_objects import node as k8s_node
from .k8s_objects import placement_of, pod, podgroup

RACK = names.LABEL_RACK


def all_nodes(sim):
    return sorted(n["metadata"]["name"] for n in sim.list("Node"))


def make_gang(sim, name, size, gpu=1, key=None, min_count=None):
    sim.create(podgroup(name, min_count or size, key))
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu)) for i in range(size)]


def bind_all(cycle, sim, pods):
    """Run filter for every member, then every bind in its own thread, as kube-scheduler does."""
    planned = {}
    for p in pods:
        answer = verbs.filter(cycle, p, all_nodes(sim))
        assert len(answer.nodes) == 1, answer
        planned[p["metadata"]["uid"]] = answer.nodes[0]
    errors = []

    def bind(p):
        try:
            cycle.bind(p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["uid"],
                       planned[p["metadata"]["uid"]])
        except BindError as err:
            errors.append(str(err))

    threads = [threading.Thread(target=bind, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return planned, errors


def wait_until(probe, seconds=5.0):
    """Evictions run on phalanx's own threads: wait (bounded) for their effect."""
    deadline = time.monotonic() + seconds
    while not probe():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def condition(sim, name):
    pg = sim.get("PodGroup", f"default/{name}")
    return next((c for c in (pg.get("status") or {}).get("conditions") or []
                 if c["type"] == names.CONDITION_INITIALLY_SCHEDULED), None)


def test_members_wait_until_min_count_exist(sim, cycle):
    sim.create(podgroup("db", 5))
    pods = [sim.create(pod(f"db-{i}", "db")) for i in range(3)]
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes == []
    assert set(answer.unresolvable.values()) == {"podgroup default/db: waiting for members, 3 of 5 exist"}


def test_pod_whose_podgroup_does_not_exist_waits(sim, cycle):
    p = sim.create(pod("x-0", "missing"))
    answer = verbs.filter(cycle, p, all_nodes(sim))
    assert answer.nodes == [] and "does not exist yet" in next(iter(answer.unresolvable.values()))


def test_gang_is_planned_at_first_filter_and_bound_whole(sim, cycle):
    pods = make_gang(sim, "db", 5)
    planned, errors = bind_all(cycle, sim, pods)
    assert errors == []
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in sim.list("Pod")}
    assert all(bound.values()) and len(bound) == 5
    assert placement_of(sim.get("PodGroup", "default/db"))["pods"] == bound
    assert cycle.flush()  # status and events are written off the cycle's lock
    assert condition(sim, "db")["status"] == "True"
    assert sim.events == []  # the condition says it; kube-scheduler's Scheduled events say each pod's


def test_a_gangs_record_and_condition_are_one_write(sim, cycle):
    """Per gang placed, phalanx writes its PodGroup once — the placement record and
    PodGroupInitiallyScheduled=True in one status write, before any member binds — as in-tree
    gang scheduling writes the condition alone."""
    writes = []
    for method in ("patch_podgroup_status", "annotate_podgroup", "event", "bind"):
        real = getattr(sim, method)
        setattr(sim, method, lambda *a, _real=real, _m=method, **kw: (writes.append((_m, a)), _real(*a, **kw))[1])
    pods = make_gang(sim, "db", 4)
    planned, errors = bind_all(cycle, sim, pods)
    assert errors == [] and cycle.flush()
    kinds = [m for m, _ in writes]
    assert kinds.count("bind") == 4 and kinds.index("patch_podgroup_status") < kinds.index("bind")
    assert [m for m in kinds if m != "bind"] == ["patch_podgroup_status"]
    status = next(a[2] for m, a in writes if m == "patch_podgroup_status")
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        names.CONDITION_PLACEMENT: "True", names.CONDITION_INITIALLY_SCHEDULED: "True"}
    assert names.ANNOTATION_PLACEMENT not in sim.get("PodGroup", "default/db")["metadata"].get("annotations", {})


def test_a_record_too_long_for_a_condition_goes_on_the_annotation_and_is_read_back(sim, cycle):
    make_gang(sim, "big", 2)
    short = json.dumps({"domain": "", "pods": {"big-0": "n0"}})
    cycle.status.write_record("default/big", short, "2 pods going to binding", 5.0)
    assert placement_of(sim.get("PodGroup", "default/big")) == {"domain": "", "pods": {"big-0": "n0"}}
    pods = {f"big-{'x' * 60}-{i}": f"node-{i}" for i in range(600)}
    long = json.dumps({"domain": "", "pods": pods})
    assert len(long) > 32768
    cycle.status.write_record("default/big", long, "600 pods going to binding", 5.0)
    obj = sim.get("PodGroup", "default/big")
    assert obj["metadata"]["annotations"][names.ANNOTATION_PLACEMENT] == long
    placement = next(c for c in obj["status"]["conditions"] if c["type"] == names.CONDITION_PLACEMENT)
    assert (placement["status"], placement["reason"]) == ("False", names.REASON_PLACEMENT_ON_ANNOTATION)
    assert placement_of(obj)["pods"] == pods
    assert sim.cache.podgroups["default/big"].placement == long  # what a restarted serve reads


def test_gang_that_does_not_fit_binds_nothing_and_says_why(sim, cycle):
    pods = make_gang(sim, "big", 5, gpu=4)  # 4 nodes x 4 GPUs: room for 4 of 5
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes == []
    assert "needs 20 nvidia.com/gpu, 16 free" in next(iter(answer.unresolvable.values()))
    cycle.flush()  # status, events and touches are written asynchronously
    cond = condition(sim, "big")
    assert cond["status"] == "False" and cond["reason"] == names.REASON_UNSCHEDULABLE
    assert not any(p["spec"].get("nodeName") for p in sim.list("Pod"))


def test_rack_constraint_keeps_the_gang_in_one_rack(sim, cycle):
    pods = make_gang(sim, "t", 8, gpu=1, key=RACK)
    planned, errors = bind_all(cycle, sim, pods)
    assert errors == []
    racks = {sim.get("Node", n)["metadata"]["labels"][RACK] for n in planned.values()}
    assert len(racks) == 1


def test_planned_capacity_is_reserved_against_other_pods(sim, cycle):
    pods = make_gang(sim, "g", 4, gpu=4)  # takes every GPU
    verbs.filter(cycle, pods[0], all_nodes(sim))
    other = sim.create(pod("loner", gpu=1))
    answer = verbs.filter(cycle, other, all_nodes(sim))
    assert answer.nodes == [] and len(answer.failed) == 4
    assert "reserved for a planned podgroup" in next(iter(answer.failed.values()))


def test_a_bound_gang_deleted_before_any_cycle_looked_holds_no_room(sim, cycle):
    """A short job's gang is bound and its pods deleted before any verb or pass runs the plans'
    deadlines: the plan must not keep holding the room of pods that are gone until it expires
    (the next gang of the same size was refused "no node can host a member" for a minute)."""
    for round_ in range(3):  # 8 GPUs a round on a cluster of 16: room only if each round's is freed
        pods = make_gang(sim, f"short-{round_}", 4, gpu=2)
        _, errors = bind_all(cycle, sim, pods)
        assert errors == []
        for p in pods:
            sim.delete("Pod", f"default/{p['metadata']['name']}")
        assert cycle.planner.reservations() == {}
    nxt = make_gang(sim, "next", 4, gpu=4)  # every GPU of the cluster
    _, errors = bind_all(cycle, sim, nxt)
    assert errors == []


def test_pods_without_groups_pass_through_when_nothing_is_reserved(sim, cycle):
    p = sim.create(pod("loner"))
    assert verbs.filter(cycle, p, all_nodes(sim)).nodes == all_nodes(sim)


def test_two_gangs_that_fit_alone_but_not_together_do_not_deadlock(sim, cycle):
    a = make_gang(sim, "a", 3, gpu=4)
    b = make_gang(sim, "b", 3, gpu=4)
    first = verbs.filter(cycle, a[0], all_nodes(sim))
    second = verbs.filter(cycle, b[0], all_nodes(sim))
    assert first.nodes and second.nodes == []  # b waits whole while a holds its plan
    _, errors = bind_all(cycle, sim, a)
    assert errors == []
    assert sum(1 for p in sim.list("Pod") if p["spec"].get("nodeName")) == 3


def test_stale_plan_is_released_and_the_group_replanned(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    planned = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    others = [n for n in all_nodes(sim) if n != planned]
    answer = verbs.filter(cycle, pods[0], others)  # in-tree filters dropped the planned node
    assert answer.nodes and answer.nodes[0] in others


def test_barrier_timeout_binds_nothing_and_releases_the_plan(sim, cycle):
    pods = make_gang(sim, "g", 3, gpu=1)
    node0 = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    with pytest.raises(BindError, match="barrier timed out: 1 of 3 members reached bind"):
        cycle.bind("default", "g-0", pods[0]["metadata"]["uid"], node0)
    assert not any(p["spec"].get("nodeName") for p in sim.list("Pod"))
    assert cycle.plan_of("default/g") is None


def test_bind_to_an_unplanned_node_is_refused(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    node0 = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    wrong = next(n for n in all_nodes(sim) if n != node0)
    with pytest.raises(BindError, match="is planned on"):
        cycle.bind("default", "g-0", pods[0]["metadata"]["uid"], wrong)


def test_gang_member_without_a_plan_is_never_bound(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    with pytest.raises(BindError, match="has no plan"):
        cycle.bind("default", "g-0", pods[0]["metadata"]["uid"], "n-0-0")
    assert not sim.get("Pod", "default/g-0")["spec"].get("nodeName")


def test_pods_without_a_group_bind_at_once(sim, cycle):
    p = sim.create(pod("loner"))
    cycle.bind("default", "loner", p["metadata"]["uid"], "n-0-0")
    assert sim.get("Pod", "default/loner")["spec"]["nodeName"] == "n-0-0"


def test_condition_never_goes_back_to_false(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    bind_all(cycle, sim, pods)
    assert cycle.flush()  # status is written off the cycle's lock
    first = condition(sim, "g")
    assert first["status"] == "True"
    extra = sim.create(pod("g-9", "g", gpu=64))  # cannot fit anywhere
    verbs.filter(cycle, extra, all_nodes(sim))
    assert cycle.flush()
    assert condition(sim, "g") == first


def test_basic_group_places_members_and_binds_at_once(sim, cycle):
    sim.create(podgroup("web"))
    p = sim.create(pod("web-0", "web"))
    node0 = verbs.filter(cycle, p, all_nodes(sim)).nodes[0]
    cycle.bind("default", "web-0", p["metadata"]["uid"], node0)
    assert sim.get("Pod", "default/web-0")["spec"]["nodeName"] == node0


def test_malformed_pod_gets_an_answer_not_a_crash(sim, cycle):
    bad = {"metadata": {"name": "b", "namespace": "default"},
           "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}}
    answer = verbs.filter(cycle, bad, all_nodes(sim))
    assert answer.nodes == [] and "unparsable quantity" in next(iter(answer.unresolvable.values()))


def test_prioritize_favours_the_planned_node(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    node0 = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    scores = verbs.prioritize(cycle, pods[0], all_nodes(sim))
    assert scores[node0] == 10 and sum(scores.values()) == 10


def crash_after_binding(sim, name, size, bind_count, where="condition"):
    """A gang whose record was written and part of it bound when phalanx stopped; ``where`` the
    record is: its condition, or the annotation an earlier version of phalanx wrote."""
    first = WorkloadCycle(sim.cache, sim, barrier_timeout=1.0).start()
    pods = make_gang(sim, name, size, gpu=1, key=RACK)
    planned = {p["metadata"]["name"]: verbs.filter(first, p, all_nodes(sim)).nodes[0] for p in pods}
    first.close()
    text = json.dumps({"domain": "r0", "pods": planned})
    if where == "condition":
        sim.patch_podgroup_status("default", name, {"conditions": [{
            "type": names.CONDITION_PLACEMENT, "status": "True", "reason": names.REASON_PLACEMENT_RECORDED,
            "message": text, "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    else:
        sim.annotate_podgroup("default", name, {names.ANNOTATION_PLACEMENT: text})
    for p in pods[:bind_count]:
        sim.bind("default", p["metadata"]["name"], p["metadata"]["uid"], planned[p["metadata"]["name"]])
    return pods, planned


@pytest.mark.parametrize("where", ["condition", "annotation"])
def test_restart_finishes_a_half_bound_gang_from_its_record(sim, where):
    pods, planned = crash_after_binding(sim, "g", 3, bind_count=2, where=where)
    second = WorkloadCycle(sim.cache, sim, barrier_timeout=1.0).start()
    answer = verbs.filter(second, pods[2], all_nodes(sim))
    assert answer.nodes == [planned["g-2"]]
    second.bind("default", "g-2", pods[2]["metadata"]["uid"], planned["g-2"])  # others bound: no wait
    assert sim.get("Pod", "default/g-2")["spec"]["nodeName"] == planned["g-2"]
    second.close()


@pytest.mark.parametrize("where", ["condition", "annotation"])
def test_record_whose_node_no_longer_fits_is_abandoned_and_replanned_in_the_domain(sim, where):
    pods, planned = crash_after_binding(sim, "g", 3, bind_count=2, where=where)
    blocker = sim.create(pod("blocker", gpu=4))  # the API server binds without checking capacity
    sim.bind("default", "blocker", blocker["metadata"]["uid"], planned["g-2"])
    second = WorkloadCycle(sim.cache, sim, barrier_timeout=1.0).start()
    answer = verbs.filter(second, pods[2], all_nodes(sim))
    bound_rack = sim.get("Node", planned["g-0"])["metadata"]["labels"][RACK]
    assert answer.nodes and answer.nodes[0] != planned["g-2"]
    assert sim.get("Node", answer.nodes[0])["metadata"]["labels"][RACK] == bound_rack
    # the record's removal and the event are API writes, made off the cycle's lock by its dispatcher
    wait_until(lambda: placement_of(sim.get("PodGroup", "default/g")) is None)
    obj = sim.get("PodGroup", "default/g")
    assert names.ANNOTATION_PLACEMENT not in obj["metadata"].get("annotations", {})
    placement = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == names.CONDITION_PLACEMENT]
    # the condition turns False where the record was one; an annotation record is only removed
    assert [(c["status"], c["reason"]) for c in placement] == (
        [("False", names.REASON_PLACEMENT_ABANDONED)] if where == "condition" else [])
    wait_until(lambda: any(e["reason"] == "PlacementAbandoned" for e in sim.events))
    second.close()


def test_place_group_on_demand_and_states(sim, cycle):
    sim.create(podgroup("g", 3))
    sim.create(pod("g-0", "g"))
    assert "waiting for members, 1 of 3 exist" in cycle.place_group("default/g")
    assert cycle.group_state("default/g") == "waiting"
    for i in (1, 2):
        sim.create(pod(f"g-{i}", "g"))
    placement = cycle.place_group("default/g")
    assert len(placement.assignments) == 3 and cycle.group_state("default/g") == "planned"
    make_gang(sim, "huge", 2, gpu=64)
    assert "a pod needs 64 nvidia.com/gpu, at most 4 free on one node" in cycle.place_group("default/huge")
    assert cycle.group_state("default/huge") == "unschedulable"


def test_group_preemption_evicts_a_whole_all_group_and_holds_the_room(sim, cycle):
    low = podgroup("low", 4, mode="all", priority=10)
    sim.create(low)
    victims = [sim.create(pod(f"low-{i}", "low", gpu=4)) for i in range(4)]
    bind_all(cycle, sim, victims)  # the low gang fills the cluster
    sim.create(podgroup("high", 2, priority=1000))
    high = [sim.create(pod(f"high-{i}", "high", gpu=4)) for i in range(2)]
    answer = verbs.filter(cycle, high[0], all_nodes(sim))
    assert answer.nodes == []
    assert "preempting 4 pods in 1 units (podgroup default/low (4 pods))" in next(iter(answer.unresolvable.values()))
    wait_until(lambda: not any(p["metadata"]["name"].startswith("low") for p in sim.list("Pod")))
    # the whole unit went (not just the 2 pods whose room was needed), each marked DisruptionTarget
    assert not any(p["metadata"]["name"].startswith("low") for p in sim.list("Pod"))
    _, errors = bind_all(cycle, sim, high)
    assert errors == []
    # each victim's event follows its eviction on the evicting thread
    wait_until(lambda: any(e["reason"] == "Preempted" and "podgroup default/high" in e["note"] for e in sim.events))


def test_a_member_waiting_for_its_victims_is_touched_once_the_cache_saw_them_go(sim, cycle):
    # kube-scheduler retries the member on the victims' deletion events; when that retry comes
    # before phalanx's cache saw the last one go it is answered "waiting" again and no event
    # follows: phalanx touches it once its victims are gone
    sim.create(podgroup("low", 4, mode="all", priority=10))
    bind_all(cycle, sim, [sim.create(pod(f"low-{i}", "low", gpu=4)) for i in range(4)])
    sim.create(podgroup("high", 1, priority=1000))
    high = sim.create(pod("high-0", "high", gpu=4))
    assert "preempting 4 pods" in next(iter(verbs.filter(cycle, high, all_nodes(sim)).unresolvable.values()))
    wait_until(lambda: not any(p["metadata"]["name"].startswith("low") for p in sim.list("Pod")))
    wait_until(lambda: names.ANNOTATION_RETRY in (sim.get("Pod", "default/high-0")["metadata"].get("annotations") or {}))
    assert len(verbs.filter(cycle, sim.get("Pod", "default/high-0"), all_nodes(sim)).nodes) == 1


def test_a_member_parked_after_its_last_victim_went_is_still_touched(sim, cycle):
    # the order the test above leaves to chance, forced: the victims are gone and a requeue pass
    # has found nobody parked to touch before the preemptor's filter call parks it
    sim.create(podgroup("low", 4, mode="all", priority=10))
    bind_all(cycle, sim, [sim.create(pod(f"low-{i}", "low", gpu=4)) for i in range(4)])
    sim.create(podgroup("high", 1, priority=1000))
    high = sim.create(pod("high-0", "high", gpu=4))
    park = cycle.parked.park

    def late_park(group, uid, namespace, name, incomplete=False):
        if name == "high-0":
            wait_until(lambda: not any(r.active for r in cycle.cache.pods.values() if r.pod.group == "default/low"))
            cycle.requeue.victims_cleared()  # the requeue thread's pass (the cycle's lock is held here)
        park(group, uid, namespace, name, incomplete)

    cycle.parked.park = late_park
    assert "preempting 4 pods" in next(iter(verbs.filter(cycle, high, all_nodes(sim)).unresolvable.values()))
    wait_until(lambda: names.ANNOTATION_RETRY in (sim.get("Pod", "default/high-0")["metadata"].get("annotations") or {}))


def test_preemption_policy_never_and_equal_priority_do_not_preempt(sim, cycle):
    sim.create(podgroup("low", 4, priority=10))
    bind_all(cycle, sim, [sim.create(pod(f"low-{i}", "low", gpu=4)) for i in range(4)])
    never = podgroup("never", 1, priority=1000)
    never["spec"]["preemptionPolicy"] = "Never"
    sim.create(never)
    p = sim.create(pod("never-0", "never", gpu=4))
    answer = verbs.filter(cycle, p, all_nodes(sim))
    assert answer.nodes == [] and "preempting" not in next(iter(answer.unresolvable.values()))
    sim.create(podgroup("peer", 1, priority=10))
    q = sim.create(pod("peer-0", "peer", gpu=4))
    assert "preempting" not in next(iter(verbs.filter(cycle, q, all_nodes(sim)).unresolvable.values()))
    assert len([x for x in sim.list("Pod") if x["spec"].get("nodeName")]) == 4


def test_a_broken_all_unit_loses_its_other_members(sim, cycle):
    sim.create(podgroup("unit", 3, mode="all"))
    members = [sim.create(pod(f"unit-{i}", "unit", gpu=1)) for i in range(3)]
    bind_all(cycle, sim, members)
    sim.evict("default", "unit-0", members[0]["metadata"]["uid"], "evicted by an operator", respect_pdb=False)
    wait_until(lambda: not any(p["metadata"]["name"].startswith("unit") for p in sim.list("Pod")))


def test_an_infeasible_gang_backs_off_until_capacity_is_freed(sim, cycle):
    pods = make_gang(sim, "big", 5, gpu=4)  # needs 20 GPUs, 16 exist
    first = verbs.filter(cycle, pods[0], all_nodes(sim))
    attempts = cycle.metrics.attempts.labels(result="unschedulable")._value.get()
    for p in pods[1:]:
        assert verbs.filter(cycle, p, all_nodes(sim)).unresolvable == first.unresolvable  # answered from memory
    assert cycle.metrics.attempts.labels(result="unschedulable")._value.get() == attempts  # no re-solve
    sim.create(k8s_node("n-9", rack="r0", gpus=4))  # room appears: retried at once
    assert len(verbs.filter(cycle, pods[0], all_nodes(sim)).nodes) == 1


def test_queue_orders_eligible_groups_by_priority_then_age():
    from cycle.queue import PodGroupQueue
    from solver import Pod, PodGroup

    def group(name, priority, created, members, min_count):
        pods = tuple(Pod(f"{name}-{i}", f"{name}-{i}") for i in range(members))
        return PodGroup("d", name, pods, min_count=min_count, priority=priority, created=created)

    groups = [group("old-low", 1, 1.0, 2, 2), group("new-high", 9, 5.0, 2, 2), group("old-high", 9, 2.0, 2, 2),
              group("incomplete", 99, 0.0, 1, 3)]
    assert [g.name for g in PodGroupQueue.order(groups)] == ["old-high", "new-high", "old-low"]


def test_place_eligible_plans_the_higher_priority_gang_first(sim, cycle):
    sim.create(podgroup("low", 4, priority=1))
    for i in range(4):
        sim.create(pod(f"low-{i}", "low", gpu=4))
    sim.create(podgroup("high", 4, priority=100))
    for i in range(4):
        sim.create(pod(f"high-{i}", "high", gpu=4))
    sim.create(podgroup("waiting", 3))
    sim.create(pod("waiting-0", "waiting"))
    results = cycle.place_eligible()
    assert list(results) == ["default/high", "default/low"]  # "waiting" is not eligible yet
    assert results["default/high"].assignments and isinstance(results["default/low"], str)


def test_a_backed_off_gang_that_fits_again_gets_a_member_touched_for_kube_scheduler(sim, cycle):
    pods = make_gang(sim, "big", 5, gpu=4)
    verbs.filter(cycle, pods[0], all_nodes(sim))  # infeasible: backs off
    sim.create(k8s_node("n-9", rack="r0", gpus=4))  # room appears while kube-scheduler is not looking
    wait_until(lambda: names.ANNOTATION_RETRY in (sim.get("Pod", "default/big-0")["metadata"].get("annotations") or {}))
    assert not cycle.queue.failed


def test_a_plan_on_a_deleted_or_cordoned_node_is_released(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    node0 = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    sim.update("Node", node0, lambda n: n.setdefault("spec", {}).update(unschedulable=True))
    wait_until(lambda: cycle.plan_of("default/g") is None)
    node1 = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    assert node1 != node0
    sim.delete("Node", node1)
    wait_until(lambda: cycle.plan_of("default/g") is None)


def test_basic_group_members_bind_one_by_one_without_a_barrier(sim, cycle):
    sim.create(podgroup("web"))
    members = [sim.create(pod(f"web-{i}", "web")) for i in range(3)]
    node0 = verbs.filter(cycle, members[0], all_nodes(sim)).nodes[0]
    cycle.bind("default", "web-0", members[0]["metadata"]["uid"], node0)  # returns at once
    assert sim.get("Pod", "default/web-0")["spec"]["nodeName"] == node0
    assert not sim.get("Pod", "default/web-1")["spec"].get("nodeName")


def test_a_basic_group_keeps_its_domain_while_bindings_are_not_yet_seen(sim, cycle):
    sim.create(podgroup("web", key=RACK))
    first = sim.create(pod("web-0", "web", gpu=1))
    rack = sim.get("Node", verbs.filter(cycle, first, all_nodes(sim)).nodes[0])["metadata"]["labels"][RACK]
    # the other rack becomes the tighter fit, the first member's binding is not visible yet, and a
    # second member arrives: without the remembered domain, the re-plan would move the group
    other = next(n for n in all_nodes(sim) if sim.get("Node", n)["metadata"]["labels"][RACK] != rack)
    blocker = sim.create(pod("blocker", gpu=4))
    sim.bind("default", "blocker", blocker["metadata"]["uid"], other)
    second = sim.create(pod("web-1", "web", gpu=1))
    node = verbs.filter(cycle, second, all_nodes(sim)).nodes[0]
    assert sim.get("Node", node)["metadata"]["labels"][RACK] == rack
