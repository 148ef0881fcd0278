"""What phalanx cannot model, it learns — and never loops: kube-scheduler's per-pod verdicts reach
the solver, a rejected member is re-slotted before the group is re-planned, re-plans are bounded,
other plans' members are assumed pods, and no bad input raises out of a verb."""

import pytest

from cluster import names
from cycle import WorkloadCycle, planning, replans, verdicts
from cycle.verdicts import Verdicts
from extender import verbs
from solver import Pod, PodGroup, PodSpec
from solver.model import VolumeClaim

from .k8s_objects import pod, podgroup
from .test_cycle_service import all_nodes, bind_all, condition, make_gang


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def cycle(sim, clock):
    service_ = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, clock=clock).start()
    yield service_
    service_.close()


@pytest.fixture
def solves(monkeypatch):
    """Every solver call of the cycle: (snapshot, group, allowed)."""
    calls = []
    real = planning.place

    def spy(snapshot, group, options, allowed=None):
        calls.append((snapshot, group, allowed))
        return real(snapshot, group, options, allowed=allowed)

    monkeypatch.setattr(planning, "place", spy)
    return calls


def uid(p):
    return p["metadata"]["uid"]


def released(cycle, reason):
    return cycle.metrics.plans_released.labels(reason=reason)._value.get()


# -- per-pod verdicts --------------------------------------------------------------------------------
def test_each_pods_verdict_reaches_the_solver_and_identical_siblings_borrow_it(sim, cycle, solves):
    sim.create(podgroup("db", 3))
    small = [sim.create(pod(f"db-{i}", "db", gpu=1)) for i in range(2)]
    big = sim.create(pod("db-2", "db", gpu=2))  # another shape: the small pods' verdict is not its
    others = [n for n in all_nodes(sim) if n != "n-0-0"]
    answer = verbs.filter(cycle, small[1], others)
    assert answer.nodes and answer.nodes[0] != "n-0-0"
    _, _, allowed = solves[-1]
    assert allowed == {uid(small[0]): frozenset(others), uid(small[1]): frozenset(others)}
    assert uid(big) not in allowed


def test_a_verdict_is_borrowed_only_by_an_identical_sibling_without_volumes():
    store = Verdicts(clock=lambda: 0.0)
    claim = (VolumeClaim("default/data-db-0"),)
    spec = PodSpec(requests={"cpu": 1000})
    a, b = Pod("a", "db-0", spec), Pod("b", "db-1", spec)
    with_volume, other_shape = Pod("c", "db-2", spec, volumes=claim), Pod("d", "db-3", PodSpec(requests={"cpu": 2}))
    group = PodGroup("default", "db", (a, b, with_volume, other_shape), min_count=4)
    nodes = {"n1", "n2", "n3"}
    store.learn(a, frozenset({"n3"}))
    assert store.allowed(group, nodes) == {"a": {"n1", "n2"}, "b": {"n1", "n2"}}
    store.learn(with_volume, frozenset({"n1"}))  # its own verdict applies to it, and to it only
    assert store.allowed(group, nodes) == {"a": {"n1", "n2"}, "b": {"n1", "n2"}, "c": {"n2", "n3"}}
    store.forget(["a"])
    assert store.allowed(group, nodes) == {"c": {"n2", "n3"}}  # a pod with volumes lends nothing
    store.learn(b, frozenset())  # nothing excluded: no restriction at all
    assert store.allowed(group, nodes) == {"c": {"n2", "n3"}}


def test_an_identical_siblings_later_verdict_lifts_what_it_no_longer_excludes_and_adds_nothing():
    now = [0.0]
    store = Verdicts(clock=lambda: now[0])
    spec = PodSpec(requests={"cpu": 1000})
    a, b, c = Pod("a", "db-0", spec), Pod("b", "db-1", spec), Pod("c", "db-2", spec)
    claim = (VolumeClaim("default/data-db-3"),)
    with_volume = Pod("v", "db-3", spec, volumes=claim)
    group = PodGroup("default", "db", (a, b, c, with_volume), min_count=4)
    nodes = {"n1", "n2", "n3"}
    store.learn(b, frozenset({"n1", "n2"}))  # judged while n1 and n2 were full
    store.learn(with_volume, frozenset({"n1", "n2"}))
    now[0] = 5.0
    store.learn(a, frozenset({"n2", "n3"}))  # judged later: n1 has room again, n3 is now full
    allowed = store.allowed(group, nodes, fresh="a")
    assert allowed["a"] == {"n1"} and allowed["c"] == {"n1"}  # own, and borrowed as before
    assert allowed["b"] == {"n1", "n3"}  # n1 lifted by the later judgement; n3 not added to b's
    assert allowed["v"] == {"n3"}  # a pod with volumes keeps its own verdict whole
    now[0] = 9.0
    store.learn(b, frozenset({"n1", "n2"}))  # b judged again, after a: its own verdict stands
    assert store.allowed(group, nodes)["b"] == {"n3"}


def test_a_rack_gang_is_placed_once_one_member_sees_the_freed_room_though_the_other_was_judged_before(
        sim, cycle, clock):
    from .test_cycle_service import RACK

    pods = make_gang(sim, "g", 2, gpu=4, key=RACK)  # a whole rack
    blockers = [sim.create(pod(f"b-{n}", None, gpu=4, node=n)) for n in all_nodes(sim)]
    for p in reversed(pods):  # the cluster full: kube-scheduler's filters pass no node
        assert verbs.filter(cycle, p, []).nodes == []
    for b in blockers:
        if sim.get("Node", b["spec"]["nodeName"])["metadata"]["labels"][RACK] == "r0":
            sim.delete("Pod", f"default/{b['metadata']['name']}")
    clock.now += 30.0  # past the group's backoff; only the first member is tried again
    rack0 = [n for n in all_nodes(sim) if sim.get("Node", n)["metadata"]["labels"][RACK] == "r0"]
    answer = verbs.filter(cycle, pods[0], rack0)
    assert answer.nodes and answer.nodes[0] in rack0, answer
    assert set(cycle.plan_of("default/g").assignments.values()) == set(rack0)


def test_a_verdict_says_nothing_about_nodes_added_after_it(sim, cycle, solves):
    from .k8s_objects import node as k8s_node
    pods = make_gang(sim, "big", 5, gpu=4)  # 16 GPUs, 20 needed
    assert verbs.filter(cycle, pods[0], all_nodes(sim)).nodes == []
    sim.create(k8s_node("n-9", rack="r0", gpus=4))
    assert len(verbs.filter(cycle, pods[1], all_nodes(sim)).nodes) == 1


def test_a_node_kube_scheduler_did_not_know_yet_is_not_learned_as_excluded(sim, cycle, clock, solves):
    """Two nodes added back to back: kube-scheduler's informer has the first when a member is
    filtered, phalanx's cache both. Leaving the second out is not kube-scheduler's verdict."""
    from .k8s_objects import node as k8s_node
    pods = make_gang(sim, "big", 6, gpu=4)  # 24 GPUs: the 16 there plus both new nodes
    assert verbs.filter(cycle, pods[0], all_nodes(sim)).nodes == []
    sim.create(k8s_node("n-8", rack="r0", gpus=4))
    sim.create(k8s_node("n-9", rack="r0", gpus=4))
    lagging = [n for n in all_nodes(sim) if n != "n-9"]  # kube-scheduler has not seen n-9 yet
    verbs.filter(cycle, pods[1], lagging)
    assert "n-9" not in cycle.verdicts.get(uid(pods[1])).excluded
    assert solves[-1][2].get(uid(pods[1])) is None or "n-9" in solves[-1][2][uid(pods[1])]
    clock.now += verdicts.NEW_NODE_GRACE  # past the grace a node left out is a verdict again
    verbs.filter(cycle, pods[2], lagging)
    assert "n-9" in cycle.verdicts.get(uid(pods[2])).excluded
    relisted = Verdicts(clock)
    cycle.verdicts = relisted  # a re-list replays known nodes as ADDED: they are not new
    sim.cache.replace("Node", sim.list("Node"))
    verbs.filter(cycle, pods[3], lagging)
    assert "n-9" in relisted.get(uid(pods[3])).excluded


def test_verdicts_are_forgotten_when_pods_go_and_when_the_group_binds(sim, cycle):
    baseline = len(cycle.verdicts)
    for round_ in range(20):
        sim.create(podgroup(f"g{round_}", 3))
        members = [sim.create(pod(f"g{round_}-{i}", f"g{round_}", gpu=64)) for i in range(3)]  # never fit
        for m in members:
            verbs.filter(cycle, m, all_nodes(sim)[1:])
        assert len(cycle.verdicts) == baseline + 3
        for m in members:
            sim.delete("Pod", f"default/{m['metadata']['name']}")
        sim.delete("PodGroup", f"default/g{round_}")
    assert len(cycle.verdicts) == baseline and cycle.verdicts.distinct_sets == 0
    assert not cycle.replans.groups
    gang = make_gang(sim, "db", 3, gpu=1)
    _, errors = bind_all(cycle, sim, gang)
    assert errors == [] and len(cycle.verdicts) == baseline


def test_a_filter_call_that_raced_its_pods_deletion_leaves_no_verdict(sim, cycle):
    """kube-scheduler's filter call for a pod phalanx's cache has just seen deleted (its verdict
    forgotten before the call learned one) holds nothing until the sweep: the short soak found one
    left after its drain."""
    baseline = len(cycle.verdicts)
    sim.create(podgroup("late", 2))
    members = [sim.create(pod(f"late-{i}", "late", gpu=64)) for i in range(2)]
    for m in members:
        sim.delete("Pod", f"default/{m['metadata']['name']}")
    for m in members:  # the calls kube-scheduler had started before it saw the deletions
        verbs.filter(cycle, m, all_nodes(sim)[1:])
    assert len(cycle.verdicts) == baseline and cycle.verdicts.distinct_sets == 0


def test_verdicts_are_bounded_and_swept(monkeypatch, clock):
    monkeypatch.setattr(verdicts, "MAX_VERDICTS", 10)
    store = Verdicts(clock)
    for i in range(25):
        store.learn(Pod(f"u{i}", f"p{i}"), frozenset({f"n{i % 3}"}))
    assert len(store) == 10 and store.get("u24") and not store.get("u0")
    clock.now += verdicts.VERDICT_TTL + 1
    store.sweep(lambda u: None if u == "u24" else (u != "u23"))  # u24 unknown, u23 bound
    assert len(store) == 8 and not store.get("u23") and not store.get("u24")


# -- re-slot before re-plan ----------------------------------------------------------------------
def test_a_rejected_member_swaps_with_an_unanswered_identical_member(sim, cycle, solves):
    pods = make_gang(sim, "g", 2, gpu=4)  # one node each
    events: list = []
    cycle.subscribe(lambda kind, data: events.append(dict(data)) if kind == "reslotted" else None)
    cycle.place_group("default/g")  # planned, nobody answered yet
    plan = cycle.plan_of("default/g")
    mine, theirs = plan.assignments[uid(pods[0])], plan.assignments[uid(pods[1])]
    answer = verbs.filter(cycle, pods[0], [n for n in all_nodes(sim) if n != mine])
    assert answer.nodes == [theirs]
    # listeners learn both sides of the trade (a checker of "bound where planned" follows it)
    assert events == [{"group": "default/g", "pod": "default/g-0", "node": theirs, "was": mine,
                       "partner": "default/g-1"}]
    assert cycle.plan_of("default/g") is plan and plan.assignments[uid(pods[1])] == mine
    assert len(solves) == 1 and released(cycle, replans.FILTERED_OUT) == 0
    assert verbs.filter(cycle, pods[1], all_nodes(sim)).nodes == [mine]


def test_no_swap_with_a_member_already_answered_the_plan_is_released(sim, cycle, solves):
    pods = make_gang(sim, "g", 2, gpu=4)
    first = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    second = verbs.filter(cycle, pods[1], all_nodes(sim)).nodes[0]  # answered: kube-scheduler assumes it there
    answer = verbs.filter(cycle, pods[0], [n for n in all_nodes(sim) if n != first])
    assert released(cycle, replans.FILTERED_OUT) == 1 and len(solves) == 2
    assert answer.nodes and answer.nodes[0] != first
    assert second


# -- bounded re-plans ----------------------------------------------------------------------------
def test_a_planned_node_kube_scheduler_always_rejects_is_not_replanned_for_ever(sim, cycle, clock, solves):
    pods = make_gang(sim, "db", 3, gpu=1)
    key = "default/db"
    victim = pods[2]
    for _ in range(50):  # kube-scheduler's filters reject whatever node phalanx plans for db-2
        plan = cycle.plan_of(key)
        planned = plan.assignments.get(uid(victim)) if plan else None
        verbs.filter(cycle, victim, [n for n in all_nodes(sim) if n != planned])
    limit = replans.LIMITS[replans.FILTERED_OUT]
    assert len(solves) == limit  # the first plan and limit - 1 re-plans, then it backs off
    assert released(cycle, replans.FILTERED_OUT) == limit
    assert cycle.plan_of(key) is None
    answer = verbs.filter(cycle, victim, all_nodes(sim))
    message = next(iter(answer.unresolvable.values()))
    assert "kube-scheduler's filters rejected the planned node" in message and "for db-2" in message
    assert "not modelled by phalanx" in message
    cycle.flush()  # status, events and touches are written asynchronously
    cond = condition(sim, "db")
    assert cond["status"] == "False" and cond["reason"] == names.REASON_UNSCHEDULABLE and cond["message"] == message
    warnings = [e for e in sim.events if e["type"] == "Warning" and e["reason"] == "FailedScheduling"]
    assert warnings and warnings[-1]["note"] == message
    assert cycle.group_state(key) == "unschedulable"
    # the backoff ends: one more try, rejected again, and a longer backoff than the first
    first_delay = cycle.queue.failed[key].retry_at - clock.now
    clock.now += first_delay + 0.01
    for _ in range(20):
        plan = cycle.plan_of(key)
        planned = plan.assignments.get(uid(victim)) if plan else None
        verbs.filter(cycle, victim, [n for n in all_nodes(sim) if n != planned])
    assert len(solves) == limit + 1
    assert cycle.queue.failed[key].retry_at - clock.now > first_delay


def test_binding_forgets_the_releases(sim, cycle):
    pods = make_gang(sim, "db", 2, gpu=1)
    planned = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    verbs.filter(cycle, pods[0], [n for n in all_nodes(sim) if n != planned])  # one rejection
    assert cycle.replans.groups["default/db"].counts[replans.FILTERED_OUT] == 1
    _, errors = bind_all(cycle, sim, pods)
    assert errors == [] and "default/db" not in cycle.replans.groups


def test_release_reasons_are_a_fixed_set(sim, cycle):
    pods = make_gang(sim, "g", 2, gpu=1)
    planned = verbs.filter(cycle, pods[0], all_nodes(sim)).nodes[0]
    verbs.filter(cycle, pods[0], [n for n in all_nodes(sim) if n != planned])
    sim.create(pod("g-9", "g", gpu=1))
    verbs.filter(cycle, sim.get("Pod", "default/g-9"), all_nodes(sim))
    labels = {s.labels["reason"] for m in cycle.metrics.plans_released.collect() for s in m.samples}
    assert labels == set(replans.REASONS)
    assert released(cycle, replans.FILTERED_OUT) == 1 and released(cycle, replans.NEW_MEMBER) == 1


# -- assumed pods of other plans ---------------------------------------------------------------------
def test_other_plans_members_not_yet_bound_are_assumed_pods(sim, cycle, solves):
    a = make_gang(sim, "a", 2, gpu=1)
    planned = {uid(p): verbs.filter(cycle, p, all_nodes(sim)).nodes[0] for p in a}
    b = make_gang(sim, "b", 2, gpu=1)
    verbs.filter(cycle, b[0], all_nodes(sim))
    snapshot, group, _ = solves[-1]
    assert group.key == "default/b"
    assert {p.uid: p.node for p in snapshot.assumed} == planned
    _, errors = bind_all(cycle, sim, a)
    assert errors == []
    c = make_gang(sim, "c", 1, gpu=1)
    verbs.filter(cycle, c[0], all_nodes(sim))
    snapshot, _, _ = solves[-1]
    assert not {p.uid for p in snapshot.assumed} & set(planned)  # bound now: no longer assumed


# -- malformed members, bad input ------------------------------------------------------------------
def test_a_group_with_a_malformed_member_is_unschedulable_not_waiting(sim, cycle):
    sim.create(podgroup("db", 3))
    pods = [sim.create(pod(f"db-{i}", "db", gpu=1)) for i in range(2)]
    sim.create(pod("db-2", "db", cpu="lots"))  # the cache cannot convert it
    answer = verbs.filter(cycle, pods[0], all_nodes(sim))
    message = next(iter(answer.unresolvable.values()))
    assert answer.nodes == [] and message.startswith("podgroup default/db: member default/db-2 is malformed: ")
    assert "lots" in message
    cycle.flush()  # status, events and touches are written asynchronously
    cond = condition(sim, "db")
    assert cond["reason"] == names.REASON_UNSCHEDULABLE and cond["message"] == message


BAD_PODS = [
    None,
    [],
    {"metadata": {"name": "b", "labels": ["x"]}},
    {"metadata": {"name": "b"}, "spec": {"schedulingGroup": "db"}},
    {"metadata": {"name": "b"}, "spec": {"containers": "not a list", "schedulingGroup": {"podGroupName": "db"}}},
    {"metadata": {"name": "b"}, "spec": {"containers": [{"resources": {"requests": {"cpu": ["1"]}}}]}},
    {"metadata": {"name": "b"}, "spec": {"tolerations": "x", "schedulingGroup": {"podGroupName": "db"}}},
    {"metadata": "b"},
]


@pytest.mark.parametrize("bad", BAD_PODS)
def test_no_bad_pod_json_raises_out_of_a_verb(sim, cycle, bad):
    sim.create(podgroup("db", 1))
    answer = verbs.filter(cycle, bad, all_nodes(sim))
    assert answer.nodes == [] and all(r.startswith("phalanx: ") for r in answer.unresolvable.values())
    assert set(verbs.prioritize(cycle, bad, all_nodes(sim)).values()) <= {0}
    verbs.preempt(cycle, bad, {})
    assert verbs.preempt(cycle, {"metadata": {"name": "plain"}}, {"n-0-0": {"Pods": "junk"}}) == {"n-0-0": {"Pods": "junk"}}


def test_members_answered_no_node_are_touched_when_their_plan_forms(sim, cycle):
    """kube-scheduler parks a member phalanx answered "waiting for members"; when another member's
    call completes the group and plans it, the parked ones are touched (retry annotation) so they
    reach bind before the barrier gives up — and the touched ones are no longer parked."""
    sim.create(podgroup("g", 3))
    early = [sim.create(pod(f"g-{i}", "g")) for i in range(2)]
    nodes = all_nodes(sim)
    for member in early:
        assert verbs.filter(cycle, member, nodes).nodes == []  # 2 of 3 exist: waiting for members
    assert len(cycle.parked) == 2
    last = sim.create(pod("g-2", "g"))
    assert verbs.filter(cycle, last, nodes).nodes  # completes the group: planned
    assert len(cycle.parked) == 0
    cycle.requeue.touch_parked()
    cycle.flush()  # status, events and touches are written asynchronously
    touched = {p["metadata"]["name"] for p in sim.list("Pod")
               if names.ANNOTATION_RETRY in (p["metadata"].get("annotations") or {})}
    assert touched == {"g-0", "g-1"}


@pytest.mark.parametrize("verb", ["filter", "preempt"])
def test_a_member_answered_while_the_cache_lagged_is_touched_once_the_group_is_complete(sim, cycle, verb):
    """The last member's call can arrive before the cache has seen its sibling's gate lifted: the
    group looks incomplete, the member is parked, and no later call would come. Once the cache
    shows minCount schedulable members, the parked member is touched so kube-scheduler retries it
    (at filter), or the group's cycle is run (at its preemption call, when its own filters left no
    node)."""
    sim.create(podgroup("g", 2))
    sibling = pod("g-1", "g")
    sibling["spec"]["schedulingGates"] = [{"name": names.GATE_PODGROUP_SYNC}]
    sim.create(sibling)
    member = sim.create(pod("g-0", "g"))
    if verb == "filter":
        assert verbs.filter(cycle, member, all_nodes(sim)).nodes == []  # 1 of 2 schedulable: waiting
    else:
        verbs.preempt(cycle, member, {})
    assert "waiting for members, 1 of 2" in cycle.explanations["default/g"]
    cycle.requeue.members_arrived()
    cycle.requeue.touch_parked()
    assert len(cycle.parked) == 1  # nothing arrived yet: still parked, not touched

    sim.update("Pod", "default/g-1", lambda p: p["spec"].pop("schedulingGates"))
    cycle.requeue.members_arrived()
    cycle.requeue.touch_parked()
    cycle.flush()
    assert len(cycle.parked) == 0
    touched = {p["metadata"]["name"] for p in sim.list("Pod")
               if names.ANNOTATION_RETRY in (p["metadata"].get("annotations") or {})}
    assert touched == {"g-0"}
    # kube-scheduler retries a pod its own filters rejected only when they may pass now, never for
    # a touch: after a preemption call phalanx runs the group's cycle itself
    assert ("default/g" in cycle.plans) == (verb == "preempt")


def test_members_parked_before_the_cache_saw_their_podgroup_survive_a_prune_and_are_touched(sim, cycle, clock,
                                                                                           monkeypatch):
    """Under a slow API-server link a member's filter call can come before phalanx's watch brings
    its PodGroup: it is answered "does not exist yet" and parked. A prune of groups a re-list
    dropped runs meanwhile (it runs every second while deletions come in): the group is not in
    the cache, but it is young and kept, so when the PodGroup lands its members are touched and
    kube-scheduler retries them. A group the cache never shows is forgotten once no longer young."""
    held = []
    publish = sim._publish

    def lagging_watch(kind, event, obj):
        if kind == "PodGroup" and obj["metadata"]["name"] == "g":
            held.append((kind, event, obj))
        else:
            publish(kind, event, obj)

    monkeypatch.setattr(sim, "_publish", lagging_watch)
    sim.create(podgroup("g", 2))
    members = [sim.create(pod(f"g-{i}", "g")) for i in range(2)]
    for member in members:
        assert verbs.filter(cycle, member, all_nodes(sim)).nodes == []
    assert "does not exist yet" in cycle.explanations["default/g"]
    assert len(cycle.parked) == 2
    cycle.requeue.prune(full=True)  # the PodGroup is not in the cache: dropped by a re-list?
    assert len(cycle.parked) == 2  # no: parked a moment ago, kept

    for kind, event, obj in held:  # the watch catches up
        publish(kind, event, obj)
    cycle.requeue.members_arrived()
    cycle.requeue.touch_parked()
    cycle.flush()
    touched = {p["metadata"]["name"] for p in sim.list("Pod")
               if names.ANNOTATION_RETRY in (p["metadata"].get("annotations") or {})}
    assert touched == {"g-0", "g-1"}
    assert len(cycle.parked) == 0

    stray = sim.create(pod("s-0", "never"))  # names a PodGroup that never comes
    assert verbs.filter(cycle, stray, all_nodes(sim)).nodes == []
    cycle.requeue.prune(full=True)
    assert len(cycle.parked) == 1
    clock.now += 61.0
    cycle.requeue.prune(full=True)
    assert len(cycle.parked) == 0 and "default/never" not in cycle.explanations
