"""Several scheduler replicas (``phalanx serve --leader-lease``): a serve acts only while the
kube-scheduler beside it holds the Lease and keeps renewing it; a standby keeps its caches and
writes nothing — every write is refused at the one gate (cycle/leading.py) and counted — and a
serve that starts acting starts a clean term: plans of the other term dropped, groups planned
ahead, units that broke meanwhile evicted."""

import json
import time

import pytest

from cluster import names
from cluster.backend import WriteError
from cluster.leadership import AlwaysActing, LeaseFollower, LeaseView, holds, parse_lease_ref
from cluster.sim import SimCluster
from cycle import WorkloadCycle
from cycle.plans import PlanState
from extender import verbs

from .k8s_objects import node, pod, podgroup
from .test_cycle_service import bind_all


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(holder: str, renew: str, duration: int = 4) -> dict:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "phalanx-scheduler", "namespace": "phalanx-system"},
            "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}}


def follower(clock: Clock, current: dict | None = None) -> tuple[LeaseFollower, dict]:
    box = {"lease": current}
    return LeaseFollower(lambda: box["lease"], "replica-a", "phalanx-system/phalanx-scheduler", clock), box


def test_the_holders_identity_is_matched_on_the_host_name_before_kube_schedulers_uuid():
    assert holds("replica-a_0f3c-11", "replica-a") and holds("replica-a", "replica-a")
    assert not holds("replica-ab_0f3c", "replica-a") and not holds("replica-b_1", "replica-a")
    assert not holds("", "replica-a") and not holds("replica-a_1", "")
    assert parse_lease_ref("kube-system/kube-scheduler") == ("kube-system", "kube-scheduler")
    for bad in ("kube-scheduler", "/x", "ns/", "a/b/c"):
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            parse_lease_ref(bad)


def test_a_lease_without_a_duration_takes_kube_schedulers_default():
    view = LeaseView.parse({"spec": {"holderIdentity": "a_1"}})
    assert view is not None and view.duration == 15.0 and view.renew_time == ""
    assert LeaseView.parse(None) is None


def test_a_first_sighting_is_no_proof_the_holder_lives_a_renewal_seen_is():
    clock = Clock()
    f, box = follower(clock, lease("replica-a_1", "t0"))
    assert not f.poll_once()  # the holder may have died before this serve started
    assert "standby" in f.describe()
    box["lease"] = lease("replica-a_1", "t1")
    clock.now += 1
    assert f.poll_once() and f.acting()
    assert f.describe().startswith("acting") and "replica-a" in f.describe()


def test_a_holder_that_stops_renewing_is_stood_down_from_before_another_may_take_the_lease():
    clock = Clock()
    f, box = follower(clock, lease("replica-a_1", "t0", duration=4))
    f.poll_once()
    box["lease"] = lease("replica-a_1", "t1", duration=4)
    assert f.poll_once()
    assert f.poll == 0.5 and f.stand_down_after == 3.0  # two polls before the 4 s Lease can be taken
    clock.now += 2.9
    assert f.poll_once()  # the same renewTime read again: nothing new, still within
    clock.now += 0.2
    assert not f.acting() and not f.poll_once()  # 3.1 s without a renewal
    assert "not renewed" in f.describe()
    box["lease"] = lease("replica-a_1", "t2", duration=4)
    assert f.poll_once()  # renewing again


def test_another_holder_a_missing_lease_and_a_resumed_process_are_standby():
    clock = Clock()
    f, box = follower(clock, None)
    assert not f.poll_once() and "does not exist" in f.describe()
    box["lease"] = lease("replica-b_9", "t0")
    assert not f.poll_once() and "held by replica-b_9" in f.describe()
    box["lease"] = lease("replica-a_1", "t1")  # taken over by this replica's kube-scheduler: a change seen
    assert f.poll_once()
    clock.now += 60  # frozen a minute (SIGSTOP, a partitioned node): the last renewal seen is old
    assert not f.acting()
    box["lease"] = lease("replica-b_9", "t9")
    assert not f.poll_once()


def test_a_read_that_fails_keeps_what_was_seen_until_it_is_too_old():
    clock = Clock()
    calls = {"n": 0}
    seen = [lease("replica-a_1", "t0"), lease("replica-a_1", "t1")]

    def read():
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError("connection refused")
        return seen[calls["n"] - 1]

    f = LeaseFollower(read, "replica-a", "ns/l", clock)
    f.poll_once()
    assert f.poll_once()
    clock.now += 1
    assert f.poll_once() and "acting" in f.describe()  # the API server away for a second
    clock.now += 5
    assert not f.poll_once() and "standby" in f.describe()


def test_listeners_hear_each_start_and_stop_once():
    clock = Clock()
    f, box = follower(clock, lease("replica-a_1", "t0"))
    heard = []
    f.subscribe(heard.append)
    f.poll_once()
    box["lease"] = lease("replica-a_1", "t1")
    f.poll_once()
    f.poll_once()
    box["lease"] = lease("replica-b_2", "t2")
    f.poll_once()
    f.poll_once()
    assert heard == [True, False]


def test_confirm_reads_the_lease_now_but_not_more_than_ten_times_a_second():
    clock = Clock()
    reads = {"n": 0}
    box = {"lease": lease("replica-b_1", "t0")}

    def read():
        reads["n"] += 1
        return box["lease"]

    f = LeaseFollower(read, "replica-a", "ns/l", clock)
    f.poll_once()
    box["lease"] = lease("replica-a_1", "t1")  # this replica's kube-scheduler took it since
    clock.now += 0.5
    assert f.confirm() and reads["n"] == 2
    assert f.confirm() and reads["n"] == 2  # read 0 s ago: not again


def test_an_older_read_taken_after_a_newer_one_is_ignored():
    """Two threads read the Lease in turn (the poll thread, a write's confirm) and take their
    outcomes in whichever order they run: the older one must not put back a Lease taken over."""
    clock = Clock()
    f, _ = follower(clock, None)
    f.observe(lease("replica-b_1", "t0"), read=1)
    assert f.observe(lease("replica-a_1", "t1"), read=3)  # the newer read: taken over by this replica
    assert f.observe(lease("", "t0", duration=1), read=2)  # the older read (released), taken last: ignored
    assert f.acting() and "held by this replica" in f.describe()


def test_an_empty_identity_is_refused():
    with pytest.raises(ValueError, match="leader-identity"):
        LeaseFollower(lambda: None, "", "ns/l")


class Switch:
    """A leadership a test flips."""

    def __init__(self, acting: bool) -> None:
        self.on = acting
        self.listeners = []
        self.confirms = 0

    def acting(self) -> bool:
        return self.on

    def confirm(self) -> bool:
        self.confirms += 1
        return self.on

    def subscribe(self, listener) -> None:
        self.listeners.append(listener)

    def describe(self) -> str:
        return ("acting" if self.on else "standby") + " (a test's switch)"

    def flip(self, acting: bool) -> None:
        self.on = acting
        for listener in self.listeners:
            listener(acting)


def writes(cycle, outcome):
    return sum(sample.value for metric in cycle.metrics.api_writes.collect() for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels["outcome"] == outcome)


def leading(cycle):
    return cycle.metrics.registry.get_sample_value("phalanx_leading")  # computed at the scrape


def test_a_standby_binds_records_and_touches_nothing_and_counts_what_it_refused(sim):
    switch = Switch(acting=False)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, leadership=switch)
    try:
        assert leading(cycle) == 0
        sim.create(podgroup("db", 2))
        members = [sim.create(pod(f"db-{i}", "db", gpu=1)) for i in range(2)]
        errors = bind_all(cycle, sim, members)[1]  # a kube-scheduler that calls a standby anyway
        assert errors and all("standby" in e for e in errors)
        assert cycle.flush(timeout=5.0)
        assert not any(sim.get("Pod", f"default/{m['metadata']['name']}")["spec"].get("nodeName") for m in members)
        pg = sim.get("PodGroup", "default/db")
        assert not (pg["metadata"].get("annotations") or {}).get(names.ANNOTATION_PLACEMENT)
        assert not (pg.get("status") or {}).get("conditions") and sim.events == []
        assert writes(cycle, "standby") >= 1 and writes(cycle, "written") == 0
        assert switch.confirms >= 1  # each refusal asked the Lease once more first
    finally:
        cycle.close()


def test_a_serve_that_starts_acting_keeps_what_its_kube_scheduler_asked_a_moment_before_and_binds_whole(sim):
    """kube-scheduler calls its serve as soon as it takes the Lease, up to a read of the Lease before
    serve sees it: the plan made then is kept, and the gang binds whole once serve acts."""
    switch = Switch(acting=False)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, leadership=switch)
    try:
        sim.create(podgroup("db", 2))
        members = [sim.create(pod(f"db-{i}", "db", gpu=1)) for i in range(2)]
        nodes = sorted(n["metadata"]["name"] for n in sim.list("Node"))
        first = verbs.filter(cycle, members[0], nodes).nodes  # planned while a standby: nothing written
        plan = cycle.book.get("default/db")
        assert plan.state is PlanState.PLANNED and sim.events == []
        switch.flip(True)
        assert leading(cycle) == 1
        assert cycle.book.get("default/db") is plan  # kept
        assert bind_all(cycle, sim, members)[1] == []
        assert sim.get("Pod", f"default/{members[0]['metadata']['name']}")["spec"]["nodeName"] == first[0]
        assert all(sim.get("Pod", f"default/{m['metadata']['name']}")["spec"].get("nodeName") for m in members)
        assert writes(cycle, "written") >= 3  # the record and two bindings at least
        assert cycle.metrics.plans_released.labels(reason="leadership")._value.get() == 0
    finally:
        cycle.close()


def test_a_serve_that_stops_acting_drops_its_plans_not_yet_binding(sim):
    switch = Switch(acting=True)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, leadership=switch)
    try:
        sim.create(podgroup("db", 2))
        members = [sim.create(pod(f"db-{i}", "db", gpu=1)) for i in range(2)]
        verbs.filter(cycle, members[0], sorted(n["metadata"]["name"] for n in sim.list("Node")))
        assert cycle.book.get("default/db").state is PlanState.PLANNED
        switch.flip(False)
        assert leading(cycle) == 0
        plan = cycle.book.get("default/db")
        assert plan is None or plan.state is not PlanState.PLANNED
        assert cycle.metrics.plans_released.labels(reason="leadership")._value.get() == 1
    finally:
        cycle.close()


def test_the_dispatcher_drops_a_refused_write_at_once():
    from cycle.dispatch import Dispatcher, Write

    dispatcher = Dispatcher()
    calls = []

    def refused():
        calls.append(1)
        raise WriteError("standby", 0, names.REASON_STANDBY)  # status 0 would otherwise be retried for ever

    dispatcher.submit(Write("PodGroup/default/db", "status", refused))
    assert dispatcher.flush(timeout=5.0)
    assert calls == [1]  # not tried again
    dispatcher.close()


def test_a_standby_plans_nothing_ahead_and_plans_every_complete_group_once_it_acts(sim):
    switch = Switch(acting=False)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, plan_ahead=frozenset({"default-scheduler"}),
                          leadership=switch).start()
    try:
        sim.create(podgroup("db", 2))
        for i in range(2):
            sim.create(pod(f"db-{i}", "db", gpu=1))
        assert not cycle.ahead._pending  # a standby queues nothing
        assert cycle.book.get("default/db") is None
        switch.on = True  # as of now: the gauge reads acting() at each scrape, before any listener ran
        assert leading(cycle) == 1
        switch.flip(True)
        deadline = time.monotonic() + 5.0
        while cycle.book.get("default/db") is None:
            assert time.monotonic() < deadline, "the group was not planned ahead after acting"
            time.sleep(0.02)
        assert cycle.ahead.planned == 1
        switch.flip(False)  # stood down: the plan not yet asked for is dropped
        assert cycle.book.get("default/db") is None or cycle.book.get("default/db").state is not PlanState.PLANNED
    finally:
        cycle.close()


def test_one_replica_always_acts():
    assert AlwaysActing().acting() and AlwaysActing().confirm() and "one replica" in AlwaysActing().describe()


def frozen_leaders_record(sim, rack):
    """A gang of 2 four-GPU pods (one rack each way) whose record a former leader wrote for
    ``rack`` before it froze, none of its members bound."""
    sim.create(podgroup("db", 2, names.LABEL_RACK))
    members = [sim.create(pod(f"db-{i}", "db", gpu=4)) for i in range(2)]
    planned = {f"db-{i}": f"n-{rack[1]}-{i}" for i in range(2)}
    sim.annotate_podgroup("default", "db", {names.ANNOTATION_PLACEMENT: json.dumps({"domain": rack, "pods": planned})})
    return members, planned


@pytest.mark.parametrize("how", ["restart", "takeover"])
def test_a_new_term_resumes_a_gang_from_the_record_the_term_before_wrote_so_a_late_binding_agrees(sim, how):
    """The former leader froze after writing the record, before any binding landed; resumed, it
    sends its binding (leader election does not fence it). The new term plans the gang where the
    record says, so the late binding and the new term's bindings make one gang in one rack."""
    fresh = SimCluster()  # the same cluster without the record: the new term would choose r0
    for r in range(2):
        for i in range(2):
            fresh.create(node(f"n-{r}-{i}", rack=f"r{r}", gpus=4))
    fresh.create(podgroup("db", 2, names.LABEL_RACK))
    alone = [fresh.create(pod(f"db-{i}", "db", gpu=4)) for i in range(2)]
    control = WorkloadCycle(fresh.cache, fresh, barrier_timeout=2.0).start()
    try:
        chosen = verbs.filter(control, alone[0], sorted(n["metadata"]["name"] for n in fresh.list("Node"))).nodes
        assert chosen and chosen[0].startswith("n-0-")
    finally:
        control.close()

    members, planned = frozen_leaders_record(sim, "r1")
    switch = Switch(acting=how == "restart")
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, leadership=switch).start()
    try:
        if how == "takeover":
            switch.flip(True)
        nodes = sorted(n["metadata"]["name"] for n in sim.list("Node"))
        assert verbs.filter(cycle, members[0], nodes).nodes == [planned["db-0"]]
        sim.bind("default", "db-1", members[1]["metadata"]["uid"], planned["db-1"])  # the frozen leader's, late
        bind_all(cycle, sim, members[:1])
        bound = {m["metadata"]["name"]: sim.get("Pod", f"default/{m['metadata']['name']}")["spec"].get("nodeName")
                 for m in members}
        assert bound == planned  # one gang, one rack
    finally:
        cycle.close()


def test_a_record_of_this_terms_own_is_not_resumed_before_a_member_binds(sim):
    """Only a record inherited at the start of a term is resumed with none bound: one this serve
    wrote and then dropped (its plan released) is planned afresh like any gang."""
    members, planned = frozen_leaders_record(sim, "r1")
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0)  # not started: nothing inherited
    try:
        nodes = sorted(n["metadata"]["name"] for n in sim.list("Node"))
        assert verbs.filter(cycle, members[0], nodes).nodes[0].startswith("n-0-")
    finally:
        cycle.close()
