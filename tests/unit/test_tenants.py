"""Hostile and careless tenants: each gets a clear refusal or a bounded cost, and another
namespace's gang is still placed (docs/operations.md, "Tenants")."""

import time

import pytest

from cluster import names
from cluster.convert import MAX_HINT_BYTES, pod_group_name
from controller import BUILTIN
from controller.config import ConfigError, raw_scheduling
from controller.runtime import Controller
from cycle import WorkloadCycle
from cycle.tenants import FairShare, NamespaceCycles, NamespaceLimits
from extender import verbs
from solver import InvalidInput

from .controller_fakes import FakeKube, statefulset
from .k8s_objects import pod, podgroup
from .test_cycle_service import all_nodes, bind_all, wait_until


def reason(answer):
    return next(iter(answer.unresolvable.values()))


def group_condition(sim, key):
    pg = sim.get("PodGroup", key)
    return next((c for c in (pg.get("status") or {}).get("conditions") or []
                 if c["type"] == names.CONDITION_INITIALLY_SCHEDULED), None)


@pytest.fixture
def limited(sim):
    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0,
                            namespace_limits=NamespaceLimits(max_plans=2, max_retries=2)).start()
    yield service
    service.close()


def test_a_namespace_holds_at_most_its_open_plans_and_others_still_plan(sim, limited):
    hostile = []
    for i in range(3):
        sim.create(podgroup(f"h{i}", 1, namespace="hostile"))
        hostile.append(sim.create(pod(f"h{i}-0", f"h{i}", namespace="hostile")))
    assert [len(verbs.filter(limited, p, all_nodes(sim)).nodes) for p in hostile[:2]] == [1, 1]
    refused = verbs.filter(limited, hostile[2], all_nodes(sim))
    assert refused.nodes == [] and "--namespace-max-plans" in reason(refused)
    assert "hostile/h2" not in limited.plans
    limited.flush()
    cond = group_condition(sim, "hostile/h2")
    assert cond["status"] == "False" and cond["reason"] == names.REASON_NAMESPACE_LIMIT
    assert "namespace hostile holds 2 open plans" in cond["message"]
    # another namespace is not held back by the hostile one's plans
    sim.create(podgroup("victim", 2, namespace="tenant"))
    victims = [sim.create(pod(f"victim-{i}", "victim", namespace="tenant")) for i in range(2)]
    _, errors = bind_all(limited, sim, victims)
    assert not errors and all(sim.get("Pod", f"tenant/victim-{i}")["spec"].get("nodeName") for i in range(2))
    # one of the hostile namespace's plans closes: the group held back gets its turn
    with limited.lock:
        limited.planner.release("hostile/h0", "", "test: released")
    assert len(verbs.filter(limited, hostile[2], all_nodes(sim)).nodes) == 1
    assert limited.metrics.namespace_limited.labels(limit="plans")._value.get() >= 1


def test_a_group_held_back_by_its_namespace_is_touched_when_a_slot_frees(sim, limited):
    for i in range(3):
        sim.create(podgroup(f"h{i}", 1, namespace="hostile"))
    pods = [sim.create(pod(f"h{i}-0", f"h{i}", namespace="hostile")) for i in range(3)]
    for p in pods:
        verbs.filter(limited, p, all_nodes(sim))
    with limited.lock:
        limited.planner.release("hostile/h1", "", "test: released")
    limited.flush()
    # the requeue thread touches the parked member; wait for the annotation (bounded)
    wait_until(lambda: (sim.get("Pod", "hostile/h2-0")["metadata"].get("annotations") or {}).get(
        names.ANNOTATION_RETRY))


def test_limits_off_with_zero(sim):
    service = WorkloadCycle(sim.cache, sim, namespace_limits=NamespaceLimits(max_plans=0, max_retries=0))
    try:
        for i in range(5):
            sim.create(podgroup(f"h{i}", 1, namespace="hostile"))
            assert len(verbs.filter(service, sim.create(pod(f"h{i}-0", f"h{i}", namespace="hostile")),
                                    all_nodes(sim)).nodes) == 1
    finally:
        service.close()


def test_fair_share_bounds_a_pass_per_namespace_and_rotates():
    share = FairShare(3)
    keys = [f"hostile/g{i}" for i in range(10)] + ["tenant/a", "tenant/b"]
    first = share.take(keys)
    assert len(first) == 5 and {"tenant/a", "tenant/b"} <= set(first)
    assert first[:2] == ["hostile/g0", "tenant/a"]  # namespaces interleaved
    seen = set(first)
    for _ in range(3):
        seen |= set(share.take(keys))
    assert seen == set(keys)  # every group gets its turn
    assert FairShare(0).take(keys) == keys


def test_requeue_pass_checks_a_namespace_s_fair_share_only(sim):
    service = WorkloadCycle(sim.cache, sim, namespace_limits=NamespaceLimits(max_retries=4))
    try:
        for i in range(40):
            sim.create(podgroup(f"h{i}", 1, namespace="hostile"))
            sim.create(pod(f"h{i}-0", f"h{i}", gpu=64, namespace="hostile"))  # never fits
            service.queue.failed_attempt(f"hostile/h{i}", service.cache.capacity_version, "no room")
        checked = []
        real = service.planner.check_inputs
        service.planner.check_inputs = lambda key, group: checked.append(key) or real(key, group)
        service.requeue.requeue_fitting()
        assert len(checked) == 4
        assert service.metrics.namespace_limited.labels(limit="retries")._value.get() == 36
    finally:
        service.close()


def test_min_count_larger_than_the_cluster_is_refused_at_once(sim, cycle):
    sim.create(podgroup("huge", 1_000_000))
    p = sim.create(pod("huge-0", "huge"))
    answer = verbs.filter(cycle, p, all_nodes(sim))
    assert answer.nodes == []
    assert "minCount 1,000,000 is more pods than every node of the cluster together may run (440)" in reason(answer)
    cycle.flush()
    cond = group_condition(sim, "default/huge")
    assert cond["reason"] == names.REASON_MIN_COUNT_TOO_LARGE
    # a gang that could fit, short of members, still just waits
    sim.create(podgroup("fits", 400))
    waiting = verbs.filter(cycle, sim.create(pod("fits-0", "fits")), all_nodes(sim))
    assert "waiting for members, 1 of 400 exist" in reason(waiting)


def test_a_pod_cannot_name_another_namespace_s_podgroup(sim, cycle):
    sim.create(podgroup("shared", 2, namespace="other"))
    crossing = pod("x-0", "other/shared", namespace="mine")
    with pytest.raises(InvalidInput, match="own namespace only"):
        pod_group_name(crossing)
    answer = verbs.filter(cycle, crossing, all_nodes(sim))
    assert answer.nodes == [] and "is not a PodGroup name (a pod names a PodGroup of its own namespace only)" \
        in reason(answer)
    # the same name in its own namespace resolves there only: the other's group gains no member
    local = sim.create(pod("y-0", "shared", namespace="mine"))
    answer = verbs.filter(cycle, local, all_nodes(sim))
    assert "podgroup mine/shared does not exist yet" in reason(answer)
    assert cycle.cache.members("other/shared") == []


def test_an_oversized_hint_annotation_is_refused_with_its_size(sim, cycle):
    group = podgroup("big", 1)
    group["metadata"]["annotations"] = {names.ANNOTATION_PREFERRED_TOPOLOGY: "k," * 131_072}
    sim.create(group)
    answer = verbs.filter(cycle, sim.create(pod("big-0", "big")), all_nodes(sim))
    assert answer.nodes == []
    assert (f"podgroup default/big is malformed: annotation {names.ANNOTATION_PREFERRED_TOPOLOGY} is 262,144 "
            f"bytes; phalanx reads at most {MAX_HINT_BYTES:,}") in reason(answer)
    assert len(reason(answer)) < 400  # the value itself is never echoed
    # fixed: read again, planned
    sim.update("PodGroup", "default/big", lambda o: o["metadata"].update(annotations={}))
    assert "default/big" not in cycle.cache.invalid_podgroups
    assert len(verbs.filter(cycle, sim.get("Pod", "default/big-0"), all_nodes(sim)).nodes) == 1


def test_an_oversized_scheduling_annotation_is_refused_by_the_controller():
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": "t", "annotations": {
        names.ANNOTATION_SCHEDULING: '{"schedulingPolicy": {"gang": {}}, "x": "' + "y" * 20_000 + '"}'}},
        "spec": {"replicas": 1, "template": {"spec": {"containers": []}}}}
    with pytest.raises(ConfigError, match="Too long: annotation .* is 20,043 bytes; phalanx reads at most 16,384"):
        raw_scheduling(sts)


def test_a_flapping_scheduling_annotation_is_reconciled_once_per_settle_period():
    controller = Controller(FakeKube(), "me", flavor=BUILTIN, scheduling_settle=30.0)
    gang, basic = statefulset(scheduling={"schedulingPolicy": {"gang": {}}}), statefulset(scheduling={})
    controller._on_statefulset("ADDED", gang)
    assert controller.queue.get() == "ns/db"  # first sight: at once
    controller.queue.done("ns/db")
    controller._on_statefulset("MODIFIED", basic)  # the first change after a quiet spell: at once
    assert controller.queue.get() == "ns/db"
    controller.queue.done("ns/db")
    for flap in range(20):  # then 20 flaps within the period: one reconcile, due at its end
        controller._on_statefulset("MODIFIED", gang if flap % 2 == 0 else basic)
    assert list(controller.queue._due) == ["ns/db"]
    due = controller.queue._due["ns/db"]
    assert due - time.monotonic() > 25.0
    # an update that leaves the annotation as it is (status, replicas) is not held back
    controller._on_statefulset("MODIFIED", basic)
    assert controller.queue._due["ns/db"] < due
    controller.queue.close()


def test_failed_cycles_per_namespace_are_rate_limited_and_others_are_not(sim):
    service = WorkloadCycle(sim.cache, sim, namespace_limits=NamespaceLimits(cycles_per_second=1.0),
                            clock=lambda: 100.0)  # time stands still: the bucket does not refill
    try:
        answers = []
        for i in range(12):  # never fit: each first call is a failed cycle
            sim.create(podgroup(f"h{i}", 1, namespace="hostile"))
            p = sim.create(pod(f"h{i}-0", f"h{i}", gpu=64, namespace="hostile"))
            answers.append(reason(verbs.filter(service, p, all_nodes(sim))))
        throttled = [a for a in answers if "--namespace-cycles-per-second" in a]
        assert len(throttled) == 2  # a bucket of 10 s at 1 a second
        assert "namespace hostile ran its 1 failed workload cycles a second" in throttled[0]
        assert service.metrics.namespace_limited.labels(limit="cycles")._value.get() >= 1
        # another namespace's gang is planned at once; gangs that fit spend nothing
        for i in range(12):
            sim.create(podgroup(f"ok{i}", 1, namespace="tenant"))
            p = sim.create(pod(f"ok{i}-0", f"ok{i}", cpu="10m", gpu=0, namespace="tenant"))
            assert len(verbs.filter(service, p, all_nodes(sim)).nodes) == 1
    finally:
        service.close()


def test_a_throttled_group_is_touched_once_its_namespace_may_run_a_cycle():
    now = [0.0]
    cycles = NamespaceCycles(1.0, lambda: now[0])
    for _ in range(10):
        assert cycles.check("hostile/a") == ""
        cycles.spend("hostile/a")
    assert cycles.check("hostile/b") and cycles.check("hostile/c")
    assert cycles.due() == [] and cycles.check("tenant/x") == ""
    now[0] = 1.5
    assert cycles.due() == ["hostile/b"]  # one cycle refilled: the group throttled first
    now[0] = 30.0
    assert cycles.due() == ["hostile/c"] and not cycles.throttled


def test_what_the_limits_keep_for_a_deleted_group_is_pruned(sim, limited):
    for i in range(3):
        sim.create(podgroup(f"h{i}", 1, namespace="hostile"))
        verbs.filter(limited, sim.create(pod(f"h{i}-0", f"h{i}", namespace="hostile")), all_nodes(sim))
    assert limited.tenants.plans.limited == {"hostile": {"hostile/h2": None}}
    sim.delete("Pod", "hostile/h2-0")
    sim.delete("PodGroup", "hostile/h2")
    limited.prune()
    assert limited.tenants.plans.limited == {}
