"""Plan ahead (``phalanx serve --plan-ahead-for``): a complete gang of a named profile's pods, and a
Basic group with the members it has, is planned before kube-scheduler asks, with the plan a
member's call would make, or, when it does not fit and a group preemption helps, that preemption
started; anything else — another profile's pods, an incomplete or unplaceable gang — is left to
the members' own calls, with nothing written."""

import time

import pytest

from cluster import names
from cluster.sim import SimCluster
from cycle.plugin_mode import PluginEnforcement
from cycle.service import WorkloadCycle

from .k8s_objects import node, pod, podgroup


@pytest.fixture
def sim():
    s = SimCluster()
    for i in range(4):
        s.create(node(f"n-{i}", rack=f"r{i // 2}", gpus=4))
    return s


@pytest.fixture
def cycle(sim):
    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, plan_ahead=frozenset({"default-scheduler"}))
    yield service  # not started: the tests call plan() themselves, except the one that starts it
    service.close()


def gang(sim, name, size, gpu=1, scheduler=None, min_count=None):
    sim.create(podgroup(name, min_count or size))
    made = []
    for i in range(size):
        obj = pod(f"{name}-{i}", name, gpu=gpu)
        if scheduler:
            obj["spec"]["schedulerName"] = scheduler
        made.append(sim.create(obj))
    return made


def attempts(cycle, result):
    return cycle.metrics.attempts.labels(result=result)._value.get()


def test_a_complete_gang_is_planned_ahead_and_prefilter_answers_from_that_plan(sim, cycle):
    members = gang(sim, "db", 3)
    assert cycle.ahead.plan("default/db")
    plan = cycle.book.get("default/db")
    assert plan is not None and set(plan.assignments) == {m["metadata"]["uid"] for m in members}
    solved = attempts(cycle, "scheduled")
    enforcement = PluginEnforcement(cycle)
    read = sim.cache.pods[members[1]["metadata"]["uid"]].pod
    answer = enforcement.plan_for_pod(read)
    assert answer.verdict == "planned" and answer.node == plan.assignments[read.uid]
    assert attempts(cycle, "scheduled") == solved  # no second solve
    assert "default/db" in {p.group for p in enforcement.snapshot().plans}  # the plugin's mirror gets it
    assert not cycle.ahead.plan("default/db")  # a plan is held: nothing to do


def test_another_profiles_gang_an_incomplete_one_and_an_empty_basic_group_are_left_alone(sim, cycle):
    gang(sim, "other", 2, scheduler="someone-else")
    gang(sim, "half", 2, min_count=3)
    sim.create(podgroup("basic", None))
    for key in ("default/other", "default/half", "default/basic", "default/missing"):
        assert not cycle.ahead.plan(key)
        assert cycle.book.get(key) is None and key not in cycle.explanations
    assert cycle.flush(timeout=5.0)  # writes go out asynchronously: none may be queued
    assert sim.events == [] and attempts(cycle, "scheduled") == 0


def test_a_basic_group_is_planned_ahead_with_its_members_and_again_when_more_come_before_any_asks(sim, cycle):
    """A Basic group's members are planned as one before kube-scheduler asks (its loop then finds
    every member's node in the plan); a member seen after that plan, before any member asked, has
    the group planned again ahead with it; once a member was answered, the members' calls decide."""
    sim.create(podgroup("web", None))
    first = [sim.create(pod(f"web-{i}", "web", gpu=1)) for i in range(2)]
    assert cycle.ahead.plan("default/web")
    plan = cycle.book.get("default/web")
    assert not plan.gang and set(plan.assignments) == {m["metadata"]["uid"] for m in first}
    assert not cycle.ahead.plan("default/web")  # nothing new: the plan stands
    late = sim.create(pod("web-2", "web", gpu=1))
    assert cycle.ahead.plan("default/web")
    again = cycle.book.get("default/web")
    assert again is not plan and set(again.assignments) == {m["metadata"]["uid"] for m in first + [late]}
    enforcement = PluginEnforcement(cycle)
    read = sim.cache.pods[late["metadata"]["uid"]].pod
    solved = attempts(cycle, "scheduled")
    answer = enforcement.plan_for_pod(read)
    assert answer.verdict == "planned" and answer.node == again.assignments[read.uid]
    assert attempts(cycle, "scheduled") == solved  # answered from the plan made ahead
    sim.create(pod("web-3", "web", gpu=1))
    assert not cycle.ahead.plan("default/web")  # a member was answered: its calls decide now
    assert cycle.book.get("default/web") is again
    assert cycle.flush(timeout=5.0)
    assert sim.events == []


def test_a_gang_that_does_not_fit_is_left_to_its_members_calls_with_nothing_written(sim, cycle):
    gang(sim, "big", 3, gpu=8)  # no node has 8 GPUs
    assert not cycle.ahead.plan("default/big")
    assert cycle.book.get("default/big") is None and "default/big" not in cycle.explanations
    assert cycle.flush(timeout=5.0)
    assert sim.events == [] and attempts(cycle, "unschedulable") == 0
    # the member's own call runs the full cycle: the explanation and the Warning event
    member = next(r.pod for r in sim.cache.members("default/big"))
    PluginEnforcement(cycle).plan_for_pod(member)
    assert cycle.flush(timeout=5.0)
    assert "default/big" in cycle.explanations
    assert any(e["reason"] == "FailedScheduling" for e in sim.events)


def test_started_it_plans_a_gang_when_its_last_member_appears(sim, cycle):
    cycle.start()
    gang(sim, "late", 2, min_count=3)
    sim.create(pod("late-2", "late", gpu=1))
    deadline = time.monotonic() + 10.0  # a bounded wait for the thread, not a timing assertion
    while cycle.book.get("default/late") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    plan = cycle.book.get("default/late")
    assert plan is not None and len(plan.assignments) == 3 and cycle.ahead.planned == 1


def test_without_profiles_nothing_is_planned_ahead(sim):
    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        gang(sim, "db", 3)
        assert service.ahead._thread is None and not service.ahead._pending
    finally:
        service.close()


def test_only_a_window_of_plans_is_held_ahead(sim, cycle, monkeypatch):
    from cycle import ahead

    monkeypatch.setattr(ahead, "WINDOW", 1)
    gang(sim, "a", 2)
    gang(sim, "b", 2)
    assert cycle.ahead._free_slots() > 0
    assert cycle.ahead.plan("default/a")
    assert cycle.ahead._free_slots() <= 0  # the thread waits until "a" binds or goes
    from cycle import replans

    with cycle.lock:  # as every release runs
        cycle.planner.release("default/a", replans.EXPIRED, "released by the test")
    assert cycle.ahead._free_slots() > 0


def test_a_member_call_that_waited_for_a_fruitless_solve_ahead_runs_the_full_cycle(sim, cycle, monkeypatch):
    """A member's call that arrives while its gang is being solved ahead waits for that solve; when
    it placed nothing (and so wrote nothing, started no preemption), the call runs the full cycle
    itself — else the member would be answered "no node" with no reason and nothing to retry it."""
    import threading

    from cycle import planning
    gang(sim, "big", 3, gpu=8)  # no node has 8 GPUs
    inside, go_on = threading.Event(), threading.Event()
    real_place = planning.place

    def held_place(*args, **kwargs):
        if threading.current_thread().name == "ahead":
            inside.set()
            go_on.wait(10.0)
        return real_place(*args, **kwargs)
    monkeypatch.setattr(planning, "place", held_place)
    ahead = threading.Thread(target=cycle.ahead.plan, args=("default/big",), name="ahead")
    ahead.start()
    assert inside.wait(10.0)
    waiting = threading.Event()
    lock = cycle.planner.lock
    real_wait = lock.wait

    def spied_wait(timeout):
        waiting.set()
        real_wait(timeout)
    monkeypatch.setattr(lock, "wait", spied_wait)
    member = next(r.pod for r in sim.cache.members("default/big"))
    answers = []
    call = threading.Thread(target=lambda: answers.append(PluginEnforcement(cycle).plan_for_pod(member)))
    call.start()
    assert waiting.wait(10.0)  # the call waits for the solve ahead
    go_on.set()
    ahead.join(10.0)
    call.join(10.0)
    assert answers and answers[0].verdict == "wait"
    assert "default/big" in cycle.explanations and "nvidia.com/gpu" in answers[0].reason
    assert cycle.flush(timeout=5.0)
    assert any(e["reason"] == "FailedScheduling" for e in sim.events)


def burst(sim):
    """r1 has one whole 4-GPU node left, r0 two; a single 4-GPU pod and a rack gang of two 4-GPU
    pods (only r0 holds it) become complete together."""
    sim.create(pod("busy", None, gpu=1, node="n-3"))
    gang(sim, "solo", 1, gpu=4)
    sim.create(podgroup("pair", 2, key=names.LABEL_RACK))
    for i in range(2):
        sim.create(pod(f"pair-{i}", "pair", gpu=4))


def test_one_at_a_time_the_single_pod_takes_the_rack_the_gang_after_it_needs(sim, cycle):
    burst(sim)
    assert cycle.ahead.plan("default/solo") and not cycle.ahead.plan("default/pair")
    assert set(cycle.book.get("default/solo").assignments.values()) <= {"n-0", "n-1"}


def test_gangs_complete_at_once_are_planned_together_so_both_fit(sim, cycle):
    """The same two, planned together (the joint solve): the single pod takes r1's free node and
    both hold a plan."""
    burst(sim)
    assert cycle.ahead.plan_together(["default/solo", "default/pair"]) == 2
    solo, pair = cycle.book.get("default/solo"), cycle.book.get("default/pair")
    assert set(solo.assignments.values()) == {"n-2"} and set(pair.assignments.values()) == {"n-0", "n-1"}
    assert attempts(cycle, "scheduled") == 2


def test_planned_together_a_group_kube_scheduler_already_judged_is_planned_alone(sim, cycle, monkeypatch):
    burst(sim)
    calls = []
    monkeypatch.setattr(cycle.planner.verdicts, "allowed",
                        lambda group, nodes, fresh="": {p.uid: frozenset(nodes) for p in group.pending}
                        if group.key == "default/pair" else {})
    original = cycle.planner.plan_ahead
    monkeypatch.setattr(cycle.planner, "plan_ahead", lambda group: calls.append(group.key) or original(group))
    cycle.ahead.plan_together(["default/solo", "default/pair"])
    assert calls == ["default/solo", "default/pair"]  # not joinable as they are: one by one, as before


def fill_with_low_pods(sim, count=4):
    """Low-priority plain pods bound on the 4 nodes, every GPU taken."""
    return [sim.create(pod(f"low-{i}", gpu=4, node=f"n-{i}", priority=1)) for i in range(count)]


def names_left(sim, prefix):
    return sorted(p["metadata"]["name"] for p in sim.list("Pod") if p["metadata"]["name"].startswith(prefix))


def test_a_complete_gang_that_must_preempt_starts_its_preemption_ahead_of_any_member_call(sim, cycle):
    """``phalanx/preempt-ahead``: no member asked; its preemption is the one the first call would
    start (the same victims), the plugin's stream lists the group while they go, and a member that
    asks meanwhile waits for them without a second preemption."""
    fill_with_low_pods(sim)
    sim.create(podgroup("high", 2, priority=1000))
    members = [sim.create(pod(f"high-{i}", "high", gpu=4, priority=1000)) for i in range(2)]
    enforcement = PluginEnforcement(cycle)
    assert not cycle.ahead.plan("default/high")  # no plan yet: the room is being freed
    assert "default/high" in cycle.preemption.nominations
    assert "preempting 2 pods" in cycle.explanations["default/high"]
    read = sim.cache.pods[members[0]["metadata"]["uid"]].pod
    answer = enforcement.plan_for_pod(read)
    assert answer.verdict == "wait", answer
    assert cycle.preemption.metrics.preemption_attempts.labels(result="scheduled")._value.get() == 1
    # the sim evicts at once: once the cache shows the victims gone the group is no longer held
    deadline = time.monotonic() + 5
    while len(names_left(sim, "low")) != 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(names_left(sim, "low")) == 2
    assert enforcement.snapshot().preempting == ()
    assert enforcement.plan_for_pod(read).verdict == "planned"


def test_a_gang_with_a_gated_member_or_short_of_members_evicts_nothing_ahead(sim, cycle):
    fill_with_low_pods(sim)
    sim.create(podgroup("gated", 2, priority=1000))
    sim.create(pod("gated-0", "gated", gpu=4, priority=1000))
    gated = pod("gated-1", "gated", gpu=4, priority=1000)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    sim.create(gated)
    assert not cycle.ahead.plan("default/gated")
    sim.create(podgroup("short", 3, priority=1000))
    for i in range(3):  # complete by count, but one member is another profile's: not planned ahead
        obj = pod(f"short-{i}", "short", gpu=4, priority=1000)
        if i == 2:
            obj["spec"]["schedulerName"] = "other"
        sim.create(obj)
    assert not cycle.ahead.plan("default/short")
    assert not cycle.preemption.nominations and len(names_left(sim, "low")) == 4


def during_the_try(cycle, enforcement, monkeypatch):
    """The snapshots the stream would send while plan ahead tries its batch."""
    seen = []
    for name in ("plan", "plan_together"):
        real = getattr(cycle.ahead, name)

        def looking(arg, real=real):
            seen.append(enforcement.snapshot())
            return real(arg)
        monkeypatch.setattr(cycle.ahead, name, looking)
    return seen


def test_the_stream_lists_the_groups_plan_ahead_is_trying_then_their_plan_or_nothing(sim, cycle, monkeypatch):
    """``phalanx/hold-until-tried``: the plugin keeps kube-scheduler's loop from meeting a group
    while plan ahead tries it; the snapshot after the try carries its plan (it fits) or no longer
    lists it (it does not: its members ask as before), and the stream is told either way. A group
    merely queued is not held (a burst's groups reach kube-scheduler's queue as before)."""
    enforcement = PluginEnforcement(cycle)
    gang(sim, "db", 2)
    gang(sim, "big", 2, gpu=8)  # no node has 8 GPUs
    gang(sim, "other", 2, scheduler="someone-else")
    assert enforcement.snapshot().untried == ()  # queued, not yet tried: not held
    assert enforcement.timed()  # a stall would change the list with time alone
    seen = during_the_try(cycle, enforcement, monkeypatch)
    version = enforcement.wait_change(-1, 0)
    assert cycle.ahead.step() == 1  # both tried, together: db placed, big not
    assert [s.untried for s in seen] == [("default/db", "default/big")]  # (another profile's: never)
    assert enforcement.wait_change(version, 0) > version
    snap = enforcement.snapshot()
    assert snap.untried == () and [p.group for p in snap.plans] == ["default/db"]
    assert cycle.book.get("default/big") is None and not enforcement.timed()


def test_a_group_that_must_preempt_goes_from_untried_to_preempting_never_neither(sim, cycle, monkeypatch):
    fill_with_low_pods(sim)
    sim.create(podgroup("high", 2, priority=1000))
    for i in range(2):
        sim.create(pod(f"high-{i}", "high", gpu=4, priority=1000))
    enforcement = PluginEnforcement(cycle)
    seen = during_the_try(cycle, enforcement, monkeypatch)
    cycle.ahead.step()
    assert [s.untried for s in seen] == [("default/high",)]
    snap = enforcement.snapshot()
    assert snap.untried == () and "default/high" in cycle.preemption.nominations
    assert "default/high" in snap.preempting or len(names_left(sim, "low")) == 2  # (the sim evicts at once)


def test_a_stalled_plan_ahead_or_a_standby_holds_nothing_back(sim, cycle, monkeypatch):
    import cycle.ahead as ahead_module
    now = [100.0]
    monkeypatch.setattr(cycle.ahead, "clock", lambda: now[0])
    enforcement = PluginEnforcement(cycle)
    gang(sim, "db", 2)
    cycle.ahead._look_again(("default/db",))  # as when its victims went: held while queued
    assert enforcement.snapshot().untried == ("default/db",)
    now[0] += ahead_module.STALL_SECONDS + 0.1  # nothing tried since the group began to wait
    assert enforcement.snapshot().untried == ()
    assert enforcement.timed()  # still recomputed every second: a try would list the next ones again
    cycle.ahead.step()
    gang(sim, "web", 2)
    cycle.ahead._look_again(("default/web",))
    assert enforcement.snapshot().untried == ("default/web",)
    monkeypatch.setattr(cycle.ahead, "acting", lambda: False)
    assert enforcement.snapshot().untried == ()


def test_a_group_whose_victims_are_gone_is_planned_ahead_in_the_room_they_freed(sim, cycle):
    """The last victim going queues the group for plan ahead: the stream lists it untried (not
    released bare to kube-scheduler, whose loop would then meet it without a plan) until plan
    ahead plans it in the room freed."""
    from cycle.preemption import Nomination

    victims = [sim.create(pod(f"low-{i}", gpu=4, node=f"n-{i}", priority=1)) for i in range(4)]
    sim.create(podgroup("high", 1, priority=1000))
    uid = sim.create(pod("high-0", "high", gpu=4, priority=1000))["metadata"]["uid"]
    gp = cycle.preemption
    gp.nominate(Nomination(group="default/high", victims={victims[0]["metadata"]["uid"]}, placement={uid: "n-0"},
                           requests={uid: {"nvidia.com/gpu": 4}}, deadline=cycle.clock() + gp.grace))
    enforcement = PluginEnforcement(cycle)
    while cycle.ahead.busy():  # tried: it waits for its victim, nothing is planned
        assert cycle.ahead.step() == 0
    snap = enforcement.snapshot()
    assert snap.untried == () and snap.preempting == ("default/high",) and snap.plans == ()
    sim.delete("Pod", "default/low-0")
    snap = enforcement.snapshot()
    assert snap.preempting == () and snap.untried == ("default/high",) and snap.plans == ()
    assert cycle.ahead.step() == 1
    snap = enforcement.snapshot()
    assert snap.untried == () and [p.group for p in snap.plans] == ["default/high"]
    assert cycle.book.get("default/high").assignments == {uid: "n-0"}


def test_a_basic_group_is_never_held(sim, cycle, monkeypatch):
    """A Basic group the loop meets before its plan costs one member's call, not a cycle failed
    member by member: it is not held (holding them measured no better on upstream's Basic groups)."""
    sim.create(podgroup("web", None))
    sim.create(pod("web-0", "web", gpu=1))
    enforcement = PluginEnforcement(cycle)
    seen = during_the_try(cycle, enforcement, monkeypatch)
    assert cycle.ahead.step() == 1
    assert [s.untried for s in seen] == [()]
