"""The workload cycle's reliability: the plan state machine (fake clock), binding errors of any
kind, barrier capacity planned across gangs, solves off the lock, and bounded state."""

import threading
import time

import pytest

from cluster import names
from cluster.backend import WriteError
from cluster.convert import placement_text
from cycle import BindError, NamespaceLimits, PlanState, WorkloadCycle, planning, replans
from cycle.plans import TRANSITIONS, Plan
from extender import verbs

from .k8s_objects import placement_of, pod, podgroup
from .test_cycle_learning import clock, cycle, released  # noqa: F401 - the fake clock and a cycle on it
from .test_cycle_service import RACK, all_nodes, condition, make_gang


def uid(p):
    return p["metadata"]["uid"]


def plan_for(cycle, sim, pods):
    """Filter every member; the planned node of each."""
    planned = {}
    for p in pods:
        answer = verbs.filter(cycle, p, all_nodes(sim))
        assert len(answer.nodes) == 1, answer
        planned[uid(p)] = answer.nodes[0]
    return planned


def bind_in_threads(cycle, pods, planned):
    errors, threads = [], []

    def bind(p):
        try:
            cycle.bind("default", p["metadata"]["name"], uid(p), planned[uid(p)])
        except BindError as err:
            errors.append(str(err))

    for p in pods:
        threads.append(threading.Thread(target=bind, args=(p,)))
        threads[-1].start()
    return threads, errors


def bind_gang(cycle, pods, planned):
    """Every member's bind in its own thread, joined: the errors (no waiter may stay blocked)."""
    threads, errors = bind_in_threads(cycle, pods, planned)
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a waiter is still blocked"
    return errors


def reasons(sim, key="default/"):
    return [e["reason"] for e in sim.events if f"{e['regarding']['namespace']}/{e['regarding']['name']}".startswith(key)]


def transitions(cycle, to):
    return cycle.metrics.transitions.labels(to=to)._value.get()


# -- the state machine, over a fake clock -------------------------------------------------------

@pytest.mark.parametrize("came, to, allowed", [
    (None, PlanState.PLANNED, True),
    (PlanState.PLANNED, PlanState.BINDING, True),
    (PlanState.PLANNED, PlanState.EXPIRED, True),
    (PlanState.PLANNED, PlanState.RELEASED, True),
    (PlanState.PLANNED, PlanState.BOUND, False),  # only through binding
    (PlanState.BINDING, PlanState.BOUND, True),
    (PlanState.BINDING, PlanState.FAILED, True),
    (PlanState.BINDING, PlanState.PLANNED, False),
    (PlanState.BOUND, PlanState.PLANNED, False),
    (PlanState.FAILED, PlanState.PLANNED, False),
    (PlanState.RELEASED, PlanState.BINDING, False),
])
def test_the_transition_table(sim, cycle, came, to, allowed):
    sim.create(podgroup("t", 1))
    plan = Plan("default/t", {}, {}, "", 0.0, 1e9, state=came)
    with cycle.lock:
        assert cycle.book.transition(plan, to) is allowed
    assert plan.state is (to if allowed else came)


def test_a_binding_gang_is_never_released_or_expired_under_its_waiters(sim, cycle):
    plan = Plan("default/t", {}, {}, "", 0.0, 1e9, state=PlanState.BINDING, gang=True)
    with cycle.lock:
        assert not cycle.book.transition(plan, PlanState.RELEASED)
        assert not cycle.book.transition(plan, PlanState.EXPIRED)
        assert not cycle.book.transition(plan, PlanState.FORGOTTEN)
    assert plan.state is PlanState.BINDING
    assert all(set(table) == {None, *PlanState} for table in TRANSITIONS.values())


def test_a_basic_group_binding_one_by_one_may_release_its_unbound_rest(sim, cycle):
    sim.create(podgroup("t", 1))
    plan = Plan("default/t", {}, {}, "", 0.0, 1e9, state=PlanState.BINDING, gang=False)
    with cycle.lock:
        assert cycle.book.transition(plan, PlanState.RELEASED)
    assert plan.state is PlanState.RELEASED


def test_no_plan_leaves_the_book_without_a_transition(sim, cycle):
    sim.create(podgroup("t", 1))
    plan = Plan("default/t", {}, {}, "", 0.0, 1e9)
    with cycle.lock:
        assert cycle.book.transition(plan, PlanState.PLANNED)
        assert cycle.plans["default/t"] is plan
        assert cycle.book.transition(plan, PlanState.FORGOTTEN)
        assert "default/t" not in cycle.plans
        assert not cycle.book.transition(plan, PlanState.PLANNED)  # final
    assert not hasattr(cycle.plans, "__setitem__") and not hasattr(cycle.plans, "pop")


def test_planned_expires_on_the_injected_clock(sim, cycle, clock):
    pods = make_gang(sim, "g", 2)
    plan_for(cycle, sim, pods[:1])
    assert cycle.plan_of("default/g").state is PlanState.PLANNED
    clock.now += 59.0
    cycle.check_timers()
    assert cycle.plan_of("default/g") is not None
    clock.now += 2.0
    cycle.check_timers()
    assert cycle.plan_of("default/g") is None
    assert transitions(cycle, "expired") == 1
    assert cycle.metrics.plans_released.labels(reason="expired")._value.get() == 1


def test_the_barrier_times_out_on_the_injected_clock(sim, cycle, clock):
    pods = make_gang(sim, "g", 2)
    planned = plan_for(cycle, sim, pods)
    threads, errors = bind_in_threads(cycle, pods[:1], planned)
    deadline = time.monotonic() + 5
    while not cycle.metrics.barrier_waiting._value.get() and time.monotonic() < deadline:
        time.sleep(0.01)
    clock.now += 2.5  # past the barrier timeout: no real time needed
    cycle.check_timers()
    for t in threads:
        t.join(5)
    assert errors and "barrier timed out: 1 of 2" in errors[0]
    assert cycle.plan_of("default/g") is None and transitions(cycle, "released") == 1
    cycle.flush()
    assert names.EVENT_BARRIER_TIMEOUT in reasons(sim)


def test_gang_goes_planned_binding_bound_with_status_event_and_time_to_place(sim, cycle, clock):
    pods = make_gang(sim, "g", 3)
    planned = plan_for(cycle, sim, pods)
    clock.now += 4.0
    threads, errors = bind_in_threads(cycle, pods, planned)
    for t in threads:
        t.join(10)
    assert errors == []
    assert cycle.plan_of("default/g").state is PlanState.BOUND
    cycle.flush()
    assert condition(sim, "g")["status"] == "True"
    assert reasons(sim) == []  # planned and bound: the condition says so, no event of its own
    assert cycle.metrics.time_to_place._sum.get() == pytest.approx(4.0)


def test_basic_group_gets_the_same_status_event_and_time_to_place(sim, cycle, clock):
    """Basic members bind one by one; the plan is binding from the first and bound with the last,
    and the group gets what a gang gets: PodGroupInitiallyScheduled=True, a time (and no event)."""
    sim.create(podgroup("web"))
    members = [sim.create(pod(f"web-{i}", "web")) for i in range(2)]
    first = verbs.filter(cycle, members[0], all_nodes(sim)).nodes[0]
    plan = cycle.plan_of("default/web")
    assert plan.gang is False and plan.state is PlanState.PLANNED
    clock.now += 1.5
    cycle.bind("default", "web-0", uid(members[0]), first)
    assert plan.state is PlanState.BINDING
    if uid(members[1]) in plan.assignments:
        second = verbs.filter(cycle, members[1], all_nodes(sim)).nodes[0]  # a Basic binding plan still answers
        cycle.bind("default", "web-1", uid(members[1]), second)
    else:  # planned alone: the plan is whole once its one member is bound
        cycle.check_timers()
    assert plan.state is PlanState.BOUND
    cycle.flush()
    assert condition(sim, "web")["status"] == "True"
    assert reasons(sim) == []
    assert cycle.metrics.time_to_place._sum.get() >= 1.5


# -- a bind error that is not a WriteError ---------------------------------------------------------

class Exploding:
    """The simulated cluster, whose bindings raise something that is not a WriteError."""

    def __init__(self, sim, error=RuntimeError("connection pool exploded")):
        self.sim, self.error = sim, error

    def __getattr__(self, name):
        return getattr(self.sim, name)

    def bind(self, *args):
        raise self.error


def test_a_bind_error_that_is_not_a_write_error_fails_the_plan_and_answers_every_waiter(sim, clock):
    cycle = WorkloadCycle(sim.cache, Exploding(sim), barrier_timeout=5.0, clock=clock).start()
    try:
        pods = make_gang(sim, "g", 3)
        planned = plan_for(cycle, sim, pods)
        errors = bind_gang(cycle, pods, planned)
        assert len(errors) == 3 and all("RuntimeError: connection pool exploded" in e for e in errors)
        assert cycle.plan_of("default/g") is None  # released: the group may be planned again
        assert transitions(cycle, "failed") == 1
        assert cycle.metrics.plans_released.labels(reason="bind_failed")._value.get() == 1
        cycle.flush()
        assert names.EVENT_BIND_FAILED in reasons(sim)
        # a pod without a group, or a Basic member: a BindError, never an exception out of bind
        sim.create(pod("solo"))
        solo = sim.get("Pod", "default/solo")
        with pytest.raises(BindError, match="RuntimeError"):
            cycle.bind("default", "solo", uid(solo), all_nodes(sim)[0])
        assert len(plan_for(cycle, sim, pods[:1])) == 1  # re-planned
    finally:
        cycle.close()


def test_a_pod_gone_mid_bind_fails_the_plan(sim, clock):
    class Vanishing(Exploding):
        def bind(self, namespace, name, uid_, node):
            if name.endswith("-1"):
                raise KeyError(uid_)  # the pod record vanished under the writer
            return self.sim.bind(namespace, name, uid_, node)

    cycle = WorkloadCycle(sim.cache, Vanishing(sim), barrier_timeout=5.0, clock=clock).start()
    try:
        pods = make_gang(sim, "g", 2)
        planned = plan_for(cycle, sim, pods)
        errors = bind_gang(cycle, pods, planned)
        assert errors and any("KeyError" in e for e in errors)
        assert cycle.plan_of("default/g") is None
    finally:
        cycle.close()


# -- barrier capacity ------------------------------------------------------------------------------

@pytest.fixture
def small(sim, clock):
    """A cycle whose server can hold 6 gang members at the barrier."""
    service_ = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0, clock=clock, barrier_capacity=6).start()
    yield service_
    service_.close()


def test_a_gang_beyond_the_free_barrier_capacity_waits_and_is_planned_when_it_frees(sim, small):
    a = make_gang(sim, "a", 4, gpu=1)
    b = make_gang(sim, "b", 4, gpu=1)
    planned = plan_for(small, sim, a)
    answer = verbs.filter(small, b[0], all_nodes(sim))
    message = next(iter(answer.unresolvable.values()))
    assert answer.nodes == [] and "waiting for barrier capacity: 4 members planned elsewhere" in message
    assert small.plan_of("default/b") is None
    threads, errors = bind_in_threads(small, a, planned)
    for t in threads:
        t.join(10)
    assert errors == []
    assert len(plan_for(small, sim, b)) == 4  # a is bound: its capacity is free again


def test_a_waiting_big_gang_blocks_a_later_small_one_from_taking_the_room(sim, small, clock):
    a = make_gang(sim, "a", 4, gpu=1)
    plan_for(small, sim, a)
    clock.now += 1
    b = make_gang(sim, "b", 4, gpu=1)  # older than c: first in the queue
    assert verbs.filter(small, b[0], all_nodes(sim)).nodes == []
    sim.now += 5  # c is created later
    c = make_gang(sim, "c", 2, gpu=1)
    answer = verbs.filter(small, c[0], all_nodes(sim))
    assert answer.nodes == [] and "behind an earlier gang" in next(iter(answer.unresolvable.values()))


def test_a_gang_that_can_never_wait_whole_at_the_barrier_is_unschedulable(sim, small):
    big = make_gang(sim, "big", 7, gpu=1)
    answer = verbs.filter(small, big[0], all_nodes(sim))
    message = next(iter(answer.unresolvable.values()))
    assert "7 members cannot all wait at the bind barrier: the server holds at most 6" in message
    small.flush()
    assert condition(sim, "big")["reason"] == names.REASON_UNSCHEDULABLE


# -- solves off the lock -----------------------------------------------------------------------

def test_other_calls_are_answered_while_a_group_is_being_solved(sim, cycle, monkeypatch):
    release, entered = threading.Event(), threading.Event()
    real = planning.place

    def slow(snapshot, group, options, allowed=None):
        if group.name == "slow":
            entered.set()
            release.wait(10)
        return real(snapshot, group, options, allowed=allowed)

    monkeypatch.setattr(planning, "place", slow)
    slow_pods = make_gang(sim, "slow", 2, gpu=1)
    fast_pods = make_gang(sim, "fast", 2, gpu=1)
    result = {}
    worker = threading.Thread(target=lambda: result.update(a=verbs.filter(cycle, slow_pods[0], all_nodes(sim))))
    worker.start()
    assert entered.wait(5)
    planned = plan_for(cycle, sim, fast_pods)  # another group is planned meanwhile
    sim.create(pod("solo", gpu=0))
    assert verbs.filter(cycle, sim.get("Pod", "default/solo"), all_nodes(sim)).nodes
    threads, errors = bind_in_threads(cycle, fast_pods, planned)
    for t in threads:
        t.join(5)
    # all of it while the slow group's solve is still held (release is set only below)
    assert errors == [] and not any(t.is_alive() for t in threads) and worker.is_alive()
    release.set()
    worker.join(10)
    # the fast plan changed the reservations while slow was solved: it was solved again, and fits
    assert len(result["a"].nodes) == 1
    assert cycle.plan_of("default/slow") is not None


def test_a_cycle_whose_inputs_keep_changing_answers_retry(sim, cycle, monkeypatch):
    real = planning.place

    def moving(snapshot, group, options, allowed=None):
        cycle.book.bump()  # as if another plan were committed during every solve
        return real(snapshot, group, options, allowed=allowed)

    monkeypatch.setattr(planning, "place", moving)
    pods = make_gang(sim, "g", 2, gpu=1)
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes == [] and "changed while it was being solved; retrying" in next(iter(answer.unresolvable.values()))
    assert cycle.plan_of("default/g") is None


# -- bounded state ---------------------------------------------------------------------------------

def sizes(cycle):
    return {
        "plans": len(cycle.plans), "explanations": len(cycle.explanations), "domains": len(cycle.domains),
        "barrier_queue": len(cycle.capacity.waiting), "conditions": len(cycle.status.conditions),
        "solving": len(cycle.planner.solving), **cycle.inbox.sizes(), "queue": len(cycle.queue.failed), "replans": len(cycle.replans.groups),
        "parked": len(cycle.parked), "verdicts": len(cycle.verdicts), "dispatch": len(cycle.dispatcher),
        "recorded": len(cycle.recorded), "namespace_limited": len(cycle.tenants.plans.limited),
        "throttled": len(cycle.tenants.cycles.throttled),
    }


def test_ten_thousand_groups_created_and_deleted_leave_every_structure_at_baseline(sim, clock):
    # one namespace's 10,000 groups, every kind planned: the per-namespace limits would hold most
    # back (tests/unit/test_tenants.py), so they are off here
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, clock=clock, barrier_capacity=10,
                          namespace_limits=NamespaceLimits(max_plans=0, max_retries=0, cycles_per_second=0)).start()
    try:
        baseline = sizes(cycle)
        nodes = all_nodes(sim)
        for i in range(10_000):
            name = f"g{i}"
            if i % 50 == 0:  # planned and bound (a Basic group keeps its rack)
                sim.create(podgroup(name, key=names.LABEL_RACK))
                p = sim.create(pod(f"{name}-0", name, gpu=0))
                node = verbs.filter(cycle, p, nodes).nodes[0]
                cycle.bind("default", f"{name}-0", uid(p), node)
            elif i % 50 == 1:  # planned, never bound
                sim.create(podgroup(name, 1))
                verbs.filter(cycle, sim.create(pod(f"{name}-0", name, gpu=0)), nodes)
            elif i % 50 == 2:  # infeasible: explanation, status, backoff
                sim.create(podgroup(name, 1))
                verbs.filter(cycle, sim.create(pod(f"{name}-0", name, gpu=64)), nodes)
            else:  # waiting for members: explanation and a parked pod
                sim.create(podgroup(name, 2))
                verbs.filter(cycle, sim.create(pod(f"{name}-0", name, gpu=0)), nodes)
        assert len(cycle.explanations) > 9000 and len(cycle.parked) > 9000
        # deleted as the watch reports it (the simulation's own delete collects garbage in
        # O(objects) per call: 20,000 of them would take minutes)
        for kind in ("Pod", "PodGroup"):
            for obj in sim.list(kind):
                sim.objects.pop((kind, f"default/{obj['metadata']['name']}"))
                sim.cache.apply(kind, "DELETED", obj)
        cycle.prune()
        cycle.flush()
        assert sizes(cycle) == baseline
    finally:
        cycle.close()


def test_a_relist_that_drops_groups_without_events_is_pruned(sim, cycle):
    for name in ("a", "b"):
        sim.create(podgroup(name, 2))
        verbs.filter(cycle, sim.create(pod(f"{name}-0", name)), all_nodes(sim))
    assert set(cycle.explanations) == {"default/a", "default/b"}
    keep = [pg for pg in sim.list("PodGroup") if pg["metadata"]["name"] == "a"]
    sim.cache.replace("PodGroup", keep)  # a re-list: b is gone, no DELETED event
    cycle.prune()
    assert set(cycle.explanations) == {"default/a"} and len(cycle.parked) == 1


def test_a_new_member_of_a_basic_group_whose_plan_is_binding_is_planned_at_once(sim, cycle):
    sim.create(podgroup("web"))
    first = sim.create(pod("web-0", "web"))
    node = verbs.filter(cycle, first, all_nodes(sim)).nodes[0]
    plan = cycle.plan_of("default/web")
    plan.assignments[uid(first) + "-other"] = node  # a second planned member, not bound yet
    cycle.bind("default", "web-0", uid(first), node)
    assert plan.state is PlanState.BINDING
    late = sim.create(pod("web-9", "web"))
    assert len(verbs.filter(cycle, late, all_nodes(sim)).nodes) == 1  # not "binding": re-planned with it
    assert cycle.plan_of("default/web") is not plan


# -- a partly bound gang's record holds its nodes -------------------------------------------------

def fill_other_rack(sim, rack):
    """Bind a 4-GPU blocker on every node outside ``rack``: a rack gang has only ``rack`` left."""
    for n in sim.list("Node"):
        if n["metadata"]["labels"][names.LABEL_RACK] != rack:
            name = f"blk-{n['metadata']['name']}"
            blocker = sim.create(pod(name, gpu=4))
            sim.bind("default", name, uid(blocker), n["metadata"]["name"])


def rack_of(sim, node):
    return sim.get("Node", node)["metadata"]["labels"][names.LABEL_RACK]


def test_after_a_restart_a_companion_planned_first_does_not_take_a_partly_bound_gangs_recorded_nodes(sim, clock):
    """``phalanx serve`` killed just after the record was written and one member bound; after the
    restart another rack gang is filtered before the rest of the first one comes back."""
    first = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0, clock=clock).start()
    pods = make_gang(sim, "g", 6, key=names.LABEL_RACK)
    planned = {p["metadata"]["name"]: verbs.filter(first, p, all_nodes(sim)).nodes[0] for p in pods}
    first.close()
    sim.patch_podgroup_status("default", "g", {"conditions": [{
        "type": names.CONDITION_PLACEMENT, "status": "True", "reason": names.REASON_PLACEMENT_RECORDED,
        "message": placement_text("", planned), "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    sim.bind("default", "g-0", uid(pods[0]), planned["g-0"])
    fill_other_rack(sim, rack_of(sim, planned["g-0"]))
    second = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0, clock=clock).start()
    try:
        companion = make_gang(sim, "c", 3, key=names.LABEL_RACK)  # fits the rack only on g's recorded room
        answer = verbs.filter(second, companion[0], all_nodes(sim))
        assert answer.nodes == [], "the companion was planned onto the recorded nodes"
        rest = {uid(p): verbs.filter(second, p, all_nodes(sim)).nodes for p in pods[1:]}
        assert rest == {uid(p): [planned[p["metadata"]["name"]]] for p in pods[1:]}
        assert bind_gang(second, pods[1:], {u: nodes[0] for u, nodes in rest.items()}) == []
        assert all(sim.get("Pod", f"default/g-{i}")["spec"]["nodeName"] == planned[f"g-{i}"] for i in range(6))
    finally:
        second.close()


def test_a_gang_whose_binding_failed_half_way_keeps_its_recorded_nodes_until_it_is_whole(sim, clock):
    """The API server restarting while a gang binds: some bindings land, the rest fail, the plan
    fails; a companion filtered before the failed members retry must not take their nodes."""
    class Restarting(Exploding):
        down = True

        def bind(self, namespace, name, uid_, node):
            if self.down and not name.endswith("-0") and not name.endswith("-1"):
                raise WriteError("connection refused", status=0)
            return self.sim.bind(namespace, name, uid_, node)

    writer = Restarting(sim)
    cycle = WorkloadCycle(sim.cache, writer, barrier_timeout=5.0, clock=clock).start()
    try:
        pods = make_gang(sim, "g", 6, key=names.LABEL_RACK)
        planned = plan_for(cycle, sim, pods)
        errors = bind_gang(cycle, pods, planned)
        assert errors and cycle.plan_of("default/g") is None
        bound = [p for p in pods if sim.get("Pod", f"default/{p['metadata']['name']}")["spec"].get("nodeName")]
        assert 0 < len(bound) < 6
        fill_other_rack(sim, rack_of(sim, planned[uid(pods[0])]))
        writer.down = False  # the API server is back
        companion = make_gang(sim, "c", 3, key=names.LABEL_RACK)
        assert verbs.filter(cycle, companion[0], all_nodes(sim)).nodes == []
        rest = [p for p in pods if p not in bound]
        again = plan_for(cycle, sim, rest)
        assert again == {uid(p): planned[uid(p)] for p in rest}
        assert bind_gang(cycle, rest, again) == []
        assert all(sim.get("Pod", f"default/{p['metadata']['name']}")["spec"]["nodeName"] == planned[uid(p)]
                   for p in pods)
    finally:
        cycle.close()


# -- a slow or throttling API server and the placement record ---------------------------------------

class Throttled(Exploding):
    """The simulated cluster answering the placement record's write with 429 (Retry-After spent)."""

    def patch_podgroup_status(self, namespace, name, status, resource_version=""):
        if any(c["type"] == names.CONDITION_PLACEMENT for c in status["conditions"]):
            raise WriteError("PATCH podgroups/status: HTTP 429: too many requests", 429, "TooManyRequests")
        return self.sim.patch_podgroup_status(namespace, name, status, resource_version)


def bound_pods(sim):
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in sim.list("Pod") if p["spec"].get("nodeName")}


def test_a_throttled_placement_record_write_binds_nothing(sim, clock):
    cycle = WorkloadCycle(sim.cache, Throttled(sim), barrier_timeout=5.0, clock=clock).start()
    try:
        pods = make_gang(sim, "t", 3)
        errors = bind_gang(cycle, pods, plan_for(cycle, sim, pods))
        assert len(errors) == 3 and all("could not write the placement record" in e and "429" in e for e in errors)
        assert bound_pods(sim) == {} and cycle.plan_of("default/t") is None
    finally:
        cycle.close()


def test_no_record_is_written_while_an_earlier_write_on_its_podgroup_is_still_queued(sim, clock, monkeypatch):
    """An older record removal stuck behind a throttled API server would land after the new record
    and leave bound members unrecorded: the record waits for it, and past the wait nothing binds."""
    from cycle import binding
    from cycle.dispatch import Write

    monkeypatch.setattr(binding, "RECORD_FLUSH_SECONDS", 0.3)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=5.0, clock=clock).start()
    gate = threading.Event()
    try:
        pods = make_gang(sim, "q", 2)
        planned = plan_for(cycle, sim, pods)
        cycle.dispatcher.submit(Write("PodGroup/default/q", "annotate", lambda: gate.wait(10)))
        errors = bind_gang(cycle, pods, planned)
        assert len(errors) == 2 and all("still pending" in e for e in errors)
        assert bound_pods(sim) == {}
        assert placement_of(sim.get("PodGroup", "default/q")) is None
        gate.set()
        assert cycle.dispatcher.flush(timeout=5)
        assert bind_gang(cycle, pods, plan_for(cycle, sim, pods)) == []  # once it landed, the gang binds whole
        assert len(bound_pods(sim)) == 2
    finally:
        gate.set()
        cycle.close()


def test_a_gang_that_backed_off_after_barrier_timeouts_gets_a_member_touched_when_its_backoff_ends(sim, cycle, clock):
    """Members cut off from phalanx (a network fault) time out at the barrier until the group stops
    re-planning and backs off; nothing else changes in the cluster. When the backoff ends and the
    gang fits, a member is touched, so kube-scheduler retries it instead of keeping it aside."""
    pods = make_gang(sim, "cut", 2)
    for _ in range(3):  # the re-plan limit for barrier timeouts
        planned = plan_for(cycle, sim, pods)
        threads, errors = bind_in_threads(cycle, pods[:1], planned)
        deadline = time.monotonic() + 5
        while not cycle.metrics.barrier_waiting._value.get() and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.now += 2.5
        cycle.check_timers()
        for t in threads:
            t.join(5)
        assert errors
    assert "default/cut" in cycle.queue.failed  # backing off; nothing in the cluster changes

    def touched():
        return [p["metadata"]["name"] for p in sim.list("Pod")
                if names.ANNOTATION_RETRY in (p["metadata"].get("annotations") or {})]

    cycle.requeue.requeue_ended_backoffs()
    assert touched() == []  # not before the backoff ends
    clock.now = cycle.queue.failed["default/cut"].retry_at
    cycle.requeue.requeue_ended_backoffs()
    cycle.flush()
    assert len(touched()) == 1 and "default/cut" not in cycle.queue.failed


def test_a_member_the_plan_left_out_does_not_release_it_as_a_new_member(sim, cycle):
    """A rack gang of 10 with minCount 8 and 8 GPUs per rack: the plan places 8 and leaves 2 out.
    A left-out member's filter call is answered without a node and the plan stands (it used to be
    released as a "new member" and re-planned on the same room, for ever)."""
    pods = make_gang(sim, "big", 10, key=names.LABEL_RACK, min_count=8)
    answers = {p["metadata"]["name"]: verbs.filter(cycle, p, all_nodes(sim)) for p in pods}
    plan = cycle.plan_of("default/big")
    assert plan is not None and plan.state is PlanState.PLANNED and len(plan.assignments) == 8
    left_out = [p for p in pods if uid(p) not in plan.assignments]
    assert len(left_out) == 2 and {uid(p) for p in left_out} == set(plan.left_out)
    for p in left_out:
        answer = verbs.filter(cycle, p, all_nodes(sim))
        assert not answer.nodes and "planned without" in next(iter(answer.unresolvable.values()))
    assert cycle.plan_of("default/big") is plan and plan.state is PlanState.PLANNED
    assert released(cycle, replans.NEW_MEMBER) == 0
    placed = [p for p in pods if uid(p) in plan.assignments]
    assert all(len(answers[p["metadata"]["name"]].nodes) == 1 for p in placed)


def test_a_deletion_pruned_partly_makes_the_thread_wake_for_the_full_prune(sim, clock):
    """The requeue thread prunes fully at most every FULL_PRUNE_INTERVAL; a deletion handled by the
    partial prune in between leaves the group's status conditions (and the like) to the full one,
    so the thread must wake for it instead of sleeping until the next sweep (60 s)."""
    from cycle.requeue import FULL_PRUNE_INTERVAL

    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, clock=clock)  # no thread: driven here
    sim.create(podgroup("gone", 1))
    verbs.filter(service, sim.create(pod("gone-0", "gone", gpu=16)), all_nodes(sim))  # fits nowhere
    assert service.smallest.settle(10)  # the refusal is written with its smallest change, off the call
    assert "default/gone" in service.status.conditions
    requeue = service.requeue
    requeue.prune_step()  # a full prune just ran
    sim.delete("Pod", "default/gone-0")
    sim.delete("PodGroup", "default/gone")
    requeue.prune_step()  # within the interval: the deletion noted, pruned partly
    assert requeue._next_wake(swept=clock()) <= FULL_PRUNE_INTERVAL
    requeue._full_prune -= FULL_PRUNE_INTERVAL  # the interval passed: the wake's prune is the full one
    requeue.prune_step()
    assert "default/gone" not in service.status.conditions


def test_a_gang_whose_plan_ended_unbound_is_not_held_to_that_rack(sim, cycle, clock):
    """The rack a plan named is kept for the group only while something of it bound: a gang whose
    plan expired with nothing bound is placed wherever it fits next (it was held to the first rack
    for good, found by the soak as a gang left unbound with another rack free)."""
    pods = make_gang(sim, "g", 2, gpu=4, key=RACK)  # a whole rack
    cycle.place_group("default/g")
    first = sim.get("Node", next(iter(cycle.plan_of("default/g").assignments.values())))
    rack = first["metadata"]["labels"][RACK]
    clock.now += 61.0
    cycle.check_timers()
    assert cycle.plan_of("default/g") is None
    for i, n in enumerate(n for n in all_nodes(sim) if sim.get("Node", n)["metadata"]["labels"][RACK] == rack):
        sim.create(pod(f"f-{i}", None, gpu=4, node=n))  # that rack fills up meanwhile
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    assert answer.nodes and sim.get("Node", answer.nodes[0])["metadata"]["labels"][RACK] != rack


def test_a_member_planned_before_the_cache_saw_it_is_not_bound_alone_once_its_plan_was_released(sim, cycle,
                                                                                                   monkeypatch):
    """A bind call names only the pod. Under a slow API-server link phalanx's watch lags
    kube-scheduler's: a member is planned from its filter call alone, its plan is released for a
    new member (also unseen) and re-made without it, and then its bind call comes. Unknown to the
    cache and in no plan, it must be refused as a gang member without a plan, never bound alone as
    a pod without a group; a plain pod the cache has not seen still binds."""
    lagging = {"g-0", "g-2", "solo"}
    held = []
    publish = sim._publish

    def lagging_watch(kind, event, obj):
        if kind == "Pod" and obj["metadata"]["name"] in lagging:
            held.append((kind, event, obj))
        else:
            publish(kind, event, obj)

    monkeypatch.setattr(sim, "_publish", lagging_watch)
    sim.create(podgroup("g", 2))
    seen = sim.create(pod("g-1", "g"))
    first, late = sim.create(pod("g-0", "g")), sim.create(pod("g-2", "g"))
    assert uid(first) not in sim.cache.pods and uid(late) not in sim.cache.pods
    node = plan_for(cycle, sim, [first])[uid(first)]  # planned with g-1, from its filter call alone
    assert set(cycle.plans["default/g"].assignments) == {uid(first), uid(seen)}
    plan_for(cycle, sim, [late])  # a new member: re-planned with g-1 and g-2 (g-0 still unseen)
    assert set(cycle.plans["default/g"].assignments) == {uid(late), uid(seen)}

    with pytest.raises(BindError, match="podgroup default/g has no plan"):
        cycle.bind("default", "g-0", uid(first), node)
    assert not sim.get("Pod", "default/g-0")["spec"].get("nodeName")

    solo = sim.create(pod("solo"))
    answer = verbs.filter(cycle, solo, all_nodes(sim))
    cycle.bind("default", "solo", uid(solo), answer.nodes[0])
    assert sim.get("Pod", "default/solo")["spec"]["nodeName"] == answer.nodes[0]

    for kind, event, obj in held:  # the watch catches up: g-0 is planned with its group again
        publish(kind, event, obj)
    planned = plan_for(cycle, sim, [first, late, seen])
    assert bind_gang(cycle, [first, late, seen], planned) == []
    assert all(sim.get("Pod", f"default/g-{i}")["spec"].get("nodeName") for i in range(3))


def test_the_group_a_filter_call_named_is_forgotten_once_the_pod_is_bound_or_deleted(sim, cycle):
    """What bind remembers per member stays within the pending ones: a member refused at filter and
    then deleted, and one bound, leave nothing behind."""
    sim.create(podgroup("g", 3))
    members = [sim.create(pod(f"g-{i}", "g")) for i in range(2)]
    for member in members:
        assert verbs.filter(cycle, member, all_nodes(sim)).nodes == []  # 2 of 3: waiting for members
    assert len(cycle.binding._filtered) == 2
    sim.delete("Pod", "default/g-0")
    assert set(cycle.binding._filtered) == {uid(members[1])}
    sim.update("Pod", "default/g-1", lambda p: p["spec"].update(nodeName=all_nodes(sim)[0]))
    assert len(cycle.binding._filtered) == 0
