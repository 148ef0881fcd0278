"""Group preemption's reliability on the simulated cluster: nominations end with their deadline,
their PodGroup or their members; a broken ``disruptionMode: all`` unit is acted on only when a
live member newly gets ``DisruptionTarget`` (never on a re-list's replay), and the rest of the
unit goes through the Eviction API, a PDB refusal reported and retried with backoff."""

import threading

import pytest

from cluster import names
from cluster.apiserver import ApiServerBackend
from cluster.backend import WriteError
from cluster.cache import ClusterCache
from cluster.kube import KubeError
from cluster.sim import SimCluster
from cluster.sizes import collection_sizes
from cycle import WorkloadCycle
from cycle import preemption as preemption_module
from cycle.preemption import Nomination
from extender import verbs

from .k8s_objects import node, pod, podgroup
from .test_cycle_service import all_nodes, bind_all, wait_until


class Clock:
    """The injected clock: moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingWriter:
    """The simulated cluster as writer, with every eviction recorded (and its outcome)."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.evictions: list[tuple[str, bool, int]] = []  # (pod name, respect_pdb, status: 0 = done)
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.sim, name)

    def evict(self, namespace, name, uid, message, respect_pdb):
        try:
            self.sim.evict(namespace, name, uid, message, respect_pdb)
        except WriteError as err:
            with self._lock:
                self.evictions.append((name, respect_pdb, err.status))
            raise
        with self._lock:
            self.evictions.append((name, respect_pdb, 0))


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def writer(sim):
    return RecordingWriter(sim)


@pytest.fixture
def cycle(sim, writer, clock):
    service = WorkloadCycle(sim.cache, writer, barrier_timeout=2.0, clock=clock).start()
    yield service
    service.close()


def preemption_state(gp):
    """Every structure of GroupPreemption, as sizes."""
    return {"nominations": len(gp.nominations), "nominated": len(gp._nominated), "intact": len(gp._intact),
            "retries": len(gp.retries), "queued": gp._broken.qsize()}


def names_of(sim, prefix):
    return sorted(p["metadata"]["name"] for p in sim.list("Pod") if p["metadata"]["name"].startswith(prefix))


# -- nominations expire --------------------------------------------------------------------------

def preempt_for_high(sim, cycle):
    """A low `all` gang fills the 4 nodes; a high gang of 2 preempts it and gets a nomination."""
    sim.create(podgroup("low", 4, mode="all", priority=10))
    bind_all(cycle, sim, [sim.create(pod(f"low-{i}", "low", gpu=4)) for i in range(4)])
    sim.create(podgroup("high", 2, priority=1000))
    high = [sim.create(pod(f"high-{i}", "high", gpu=4)) for i in range(2)]
    answer = verbs.filter(cycle, high[0], all_nodes(sim))
    assert "preempting 4 pods" in next(iter(answer.unresolvable.values()))
    wait_until(lambda: not names_of(sim, "low"))
    assert "default/high" in cycle.preemption.nominations
    return high


@pytest.mark.parametrize("end", ["podgroup-deleted", "members-deleted", "deadline"])
def test_a_nomination_whose_preemptor_is_gone_or_late_no_longer_holds_room(sim, cycle, clock, end):
    high = preempt_for_high(sim, cycle)
    if end == "podgroup-deleted":
        sim.delete("PodGroup", "default/high")
    elif end == "members-deleted":
        for p in high:
            sim.delete("Pod", f"default/{p['metadata']['name']}")
    else:
        clock.now += cycle.preemption.grace + 1
    plain = sim.create(pod("plain", gpu=4))
    answer = verbs.filter(cycle, plain, all_nodes(sim))
    assert answer.nodes == all_nodes(sim), answer.failed  # nothing "reserved for a planned podgroup"
    assert preemption_state(cycle.preemption)["nominations"] == 0


def test_a_nomination_stands_while_its_preemptor_lives(sim, cycle):
    preempt_for_high(sim, cycle)
    sim.delete("Pod", "default/high-1")  # one member of two gone: the room is still held
    answer = verbs.filter(cycle, sim.create(pod("plain", gpu=4)), all_nodes(sim))
    assert len(answer.nodes) == 2 and "reserved for a planned podgroup" in next(iter(answer.failed.values()))


def test_ten_thousand_nominations_created_and_ended_leave_every_structure_at_baseline(sim, cycle, clock):
    gp = cycle.preemption
    baseline = preemption_state(gp)
    for i in range(10_000):
        name = f"pre-{i}"
        sim.create(podgroup(name, 1, priority=1000))
        member = sim.create(pod(f"{name}-0", name, gpu=4))
        uid = member["metadata"]["uid"]
        gp.nominate(Nomination(group=f"default/{name}", victims={f"victim-{i}"}, placement={uid: "n-0-0"},
                               requests={uid: {"nvidia.com/gpu": 4}}, deadline=clock() + gp.grace))
        assert len(gp.reservations()) == 1
        way = i % 3
        if way == 0:  # the PodGroup goes first (its pod after)
            sim.delete("PodGroup", f"default/{name}")
            assert not gp.nominations
            sim.delete("Pod", f"default/{name}-0")
        elif way == 1:  # the preemptor's members go first
            sim.delete("Pod", f"default/{name}-0")
            assert not gp.nominations
            sim.delete("PodGroup", f"default/{name}")
        else:  # the deadline passes: the next read drops it
            clock.now += gp.grace + 1
            assert gp.reservations() == [] and not gp.nominations
            sim.delete("Pod", f"default/{name}-0")
            sim.delete("PodGroup", f"default/{name}")
    assert preemption_state(gp) == baseline


def test_a_relist_that_drops_the_preemptor_silently_drops_its_nomination(sim, cycle):
    preempt_for_high(sim, cycle)
    survivors = [o for o in sim.list("PodGroup") if o["metadata"]["name"] != "high"]
    sim.cache.replace("PodGroup", survivors)  # the DELETED event was lost in a watch gap
    assert cycle.preemption.reservations() == [] and not cycle.preemption.nominations


# -- broken `all` units --------------------------------------------------------------------------

def bound_unit(sim, cycle, name="unit", size=3, labels=None):
    sim.create(podgroup(name, size, mode="all"))
    members = [sim.create(pod(f"{name}-{i}", name, gpu=1, labels=labels)) for i in range(size)]
    _, errors = bind_all(cycle, sim, members)
    assert errors == []
    return members


def disruption_target(obj):
    obj["status"].setdefault("conditions", []).append({
        "type": names.CONDITION_DISRUPTION_TARGET, "status": "True", "reason": "PreemptionByScheduler",
        "message": "preempted by kube-scheduler"})


def settle(cycle):
    """Wait until the broken-unit worker has handled everything queued so far (it takes the
    queue in order, one item at a time: once this wake-up is taken, what came before is done)."""
    cycle.preemption._broken.put(None)
    wait_until(lambda: cycle.preemption._broken.qsize() == 0 and not cycle.preemption._units.locked())


def test_a_relist_replaying_finished_or_known_disrupted_pods_evicts_nothing(sim, cycle, writer):
    bound_unit(sim, cycle)
    # a member from an earlier attempt: Failed, with DisruptionTarget, still listed
    old = pod("unit-old", "unit", gpu=1)
    old["status"] = {"phase": "Failed", "conditions": [{"type": names.CONDITION_DISRUPTION_TARGET,
                                                        "status": "True", "reason": "PreemptionByScheduler"}]}
    sim.create(old)
    # a member that was terminating before it got the condition (deleted gracefully, then marked)
    sim.create(pod("unit-leaving", "unit", gpu=0))
    sim.update("Pod", "default/unit-leaving", lambda o: o["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"))
    sim.update("Pod", "default/unit-leaving", disruption_target)
    for _ in range(2):  # a 410 re-list, then an API-server restart: every pod replayed as ADDED
        sim.cache.replace("Pod", sim.list("Pod"))
    settle(cycle)
    assert writer.evictions == []
    assert names_of(sim, "unit") == ["unit-0", "unit-1", "unit-2", "unit-leaving", "unit-old"]
    assert not any(e["reason"] == names.EVENT_UNIT_BROKEN for e in sim.events)


def test_a_restart_seeing_a_live_member_already_disrupted_evicts_nothing():
    sim = SimCluster()
    for i in range(2):
        sim.create(node(f"n-{i}", gpus=4))
    sim.create(podgroup("unit", 2, mode="all"))
    for i in range(2):
        member = pod(f"unit-{i}", "unit", gpu=1, node=f"n-{i}")
        member["status"] = {"phase": "Running"}
        if i == 0:
            disruption_target(member)
        sim.create(member)
    writer = RecordingWriter(sim)
    service = WorkloadCycle(sim.cache, writer, clock=Clock()).start()  # phalanx starts: the list replays both
    try:
        sim.cache.replace("Pod", sim.list("Pod"))
        settle(service)
        assert writer.evictions == [] and names_of(sim, "unit") == ["unit-0", "unit-1"]
    finally:
        service.close()


def test_a_member_newly_preempted_evicts_the_rest_of_its_unit_through_eviction(sim, cycle, writer):
    bound_unit(sim, cycle)
    sim.update("Pod", "default/unit-0", disruption_target)  # kube-scheduler preempts one member
    wait_until(lambda: names_of(sim, "unit") == ["unit-0"])
    assert sorted(writer.evictions) == [("unit-1", True, 0), ("unit-2", True, 0)]  # never a plain delete
    cycle.flush()  # events are written off the cycle's lock
    broken = [e for e in sim.events if e["reason"] == names.EVENT_UNIT_BROKEN]
    assert len(broken) == 1 and broken[0]["type"] == "Warning"
    sim.cache.replace("Pod", sim.list("Pod"))  # the replay of the disrupted member changes nothing
    settle(cycle)
    assert len(writer.evictions) == 2 and not cycle.preemption.retries


def node_of(sim, name):
    return next(p["spec"]["nodeName"] for p in sim.list("Pod") if p["metadata"]["name"] == name)


def test_a_node_deleted_under_a_member_evicts_the_whole_all_unit(sim, cycle, writer):
    bound_unit(sim, cycle)
    lost = node_of(sim, "unit-1")
    sim.delete("Node", lost)  # the node goes; its pod stays until the pod GC removes it
    wait_until(lambda: names_of(sim, "unit") == [])
    # every member goes through the Eviction API, the one on the lost node too
    assert sorted(writer.evictions) == [("unit-0", True, 0), ("unit-1", True, 0), ("unit-2", True, 0)]
    cycle.flush()
    broken = [e for e in sim.events if e["reason"] == names.EVENT_UNIT_BROKEN]
    assert len(broken) == 1


def bind_late(sim, name, nodes):
    """The members' bindings reach phalanx's cache only now (its pod watch behind its node watch)."""
    for i, node_name in enumerate(nodes):
        sim.update("Pod", f"default/{name}-{i}", lambda p, n=node_name: p["spec"].update(nodeName=n))


def test_members_seen_bound_only_after_their_node_was_deleted_evict_the_whole_all_unit(sim, cycle, writer):
    sim.create(podgroup("unit", 3, mode="all"))
    for i in range(3):
        sim.create(pod(f"unit-{i}", "unit", gpu=1))
    sim.delete("Node", "n-0-0")  # the node's deletion is seen first: none of the unit is on it yet
    settle(cycle)
    assert writer.evictions == []
    bind_late(sim, "unit", ["n-0-0", "n-0-1", "n-1-0"])
    wait_until(lambda: names_of(sim, "unit") == [])
    assert sorted(writer.evictions) == [("unit-0", True, 0), ("unit-1", True, 0), ("unit-2", True, 0)]
    cycle.flush()
    assert len([e for e in sim.events if e["reason"] == names.EVENT_UNIT_BROKEN]) == 1


def test_a_node_deleted_and_created_again_is_a_new_node_its_members_stay(sim, cycle, writer):
    sim.create(podgroup("unit", 3, mode="all"))
    for i in range(3):
        sim.create(pod(f"unit-{i}", "unit", gpu=1))
    sim.delete("Node", "n-0-0")
    sim.create(node("n-0-0", rack="r0", gpus=4))  # back under the same name before the bindings are seen
    bind_late(sim, "unit", ["n-0-0", "n-0-1", "n-1-0"])
    settle(cycle)
    assert writer.evictions == [] and names_of(sim, "unit") == ["unit-0", "unit-1", "unit-2"]


def test_the_lost_node_memory_is_a_bounded_history_named_with_its_limit(sim, cycle, monkeypatch):
    monkeypatch.setattr(preemption_module, "LOST_NODES_KEPT", 3)
    for i in range(5):
        sim.create(node(f"gone-{i}", rack="r9", gpus=1))
        sim.delete("Node", f"gone-{i}")
    settle(cycle)
    assert list(cycle.preemption._lost_nodes) == ["gone-2", "gone-3", "gone-4"]  # the oldest forgotten
    # the size walker names it with the limit its class declares, so the soak's drain check
    # treats it as a history, not a map of live objects
    assert collection_sizes(cycle, "cycle")["cycle.preemption.lost_nodes<=4096"] == 3


def test_a_node_deleted_under_a_single_group_or_an_empty_node_evicts_nothing(sim, cycle, writer):
    sim.create(podgroup("ens", 3))  # disruptionMode single
    members = [sim.create(pod(f"ens-{i}", "ens", gpu=1)) for i in range(3)]
    assert bind_all(cycle, sim, members)[1] == []
    used = {node_of(sim, f"ens-{i}") for i in range(3)}
    sim.delete("Node", node_of(sim, "ens-0"))
    sim.delete("Node", next(n["metadata"]["name"] for n in sim.list("Node") if n["metadata"]["name"] not in used))
    settle(cycle)
    assert writer.evictions == [] and names_of(sim, "ens") == ["ens-0", "ens-1", "ens-2"]


def test_a_pdb_refusal_is_reported_and_retried_with_backoff_never_deleted(sim, cycle, writer, clock):
    bound_unit(sim, cycle, labels={"app": "unit"})
    sim.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "guard", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "unit"}}}, "status": {"disruptionsAllowed": 0}})
    gp = cycle.preemption
    sim.update("Pod", "default/unit-0", disruption_target)

    def blocked_events():
        return [e for e in sim.events if e["reason"] == names.EVENT_UNIT_EVICTION_BLOCKED]

    wait_until(lambda: len(blocked_events()) == 1)
    event = blocked_events()[0]
    assert event["type"] == "Warning" and "PodDisruptionBudget refuses evicting 2" in event["note"]
    assert "retrying in 5s" in event["note"]
    assert sorted(writer.evictions) == [("unit-1", True, 429), ("unit-2", True, 429)]
    assert gp.retries["default/unit"].backoff == gp.retry_initial
    clock.now += gp.retry_initial  # the backoff runs out: refused again, the backoff doubles
    wait_until(lambda: len(blocked_events()) == 2)
    assert "retrying in 10s" in blocked_events()[1]["note"]
    assert names_of(sim, "unit") == ["unit-0", "unit-1", "unit-2"]  # nothing deleted past the PDB
    sim.update("PodDisruptionBudget", "default/guard", lambda o: o["status"].update(disruptionsAllowed=5))
    clock.now += 2 * gp.retry_initial
    wait_until(lambda: names_of(sim, "unit") == ["unit-0"])
    assert all(respect_pdb for _, respect_pdb, _ in writer.evictions)
    wait_until(lambda: not gp.retries)


def test_a_retried_unit_is_forgotten_when_its_podgroup_is_deleted(sim, cycle, writer):
    bound_unit(sim, cycle, labels={"app": "unit"})
    sim.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "guard", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "unit"}}}, "status": {"disruptionsAllowed": 0}})
    sim.update("Pod", "default/unit-0", disruption_target)
    wait_until(lambda: "default/unit" in cycle.preemption.retries)
    sim.delete("PodGroup", "default/unit")
    for i in range(3):
        sim.delete("Pod", f"default/unit-{i}")
    settle(cycle)
    assert preemption_state(cycle.preemption) == {"nominations": 0, "nominated": 0, "intact": 0, "retries": 0,
                                                  "queued": 0}


# -- the real writer's eviction ------------------------------------------------------------------

class ScriptedKube:
    """Records the writes; answers POST .../eviction with ``eviction_status`` (0 = accepted)."""

    def __init__(self, eviction_status=0):
        self.eviction_status = eviction_status
        self.requests = []

    def served_resources(self, group_version):
        return {"podgroups", "workloads"}

    def request(self, method, path, body=None, content_type="application/json"):
        self.requests.append((method, path.rsplit("/", 1)[-1]))
        if path.endswith("/eviction") and self.eviction_status:
            raise KubeError(method, path, self.eviction_status, '{"message": "would violate the disruption budget"}')
        return {}


@pytest.mark.parametrize("status", [0, 429])
def test_the_api_server_writer_marks_a_pod_only_once_its_eviction_is_accepted(status):
    kube = ScriptedKube(status)
    backend = ApiServerBackend(kube, ClusterCache())
    if status:
        with pytest.raises(WriteError) as refused:
            backend.evict("default", "p", "uid-p", "unit broken", respect_pdb=True)
        assert refused.value.status == 429
        assert kube.requests == [("POST", "eviction")]  # no DisruptionTarget on a pod that stays
    else:
        backend.evict("default", "p", "uid-p", "unit broken", respect_pdb=True)
        assert kube.requests == [("POST", "eviction"), ("PATCH", "status")]
    kube.requests.clear()
    backend.evict("default", "p", "uid-p", "plan accepted a PDB violation", respect_pdb=False)
    assert kube.requests == [("PATCH", "status"), ("DELETE", "p")]


def test_preemption_goes_through_the_eviction_api_only_for_victims_a_budget_selects(sim, cycle, writer):
    # a PodDisruptionBudget that allows every disruption selects two of the four victims: they are
    # evicted through the Eviction API (its budget check); the other two get kube-scheduler's status
    # patch and DELETE, one write fewer
    sim.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "loose", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "guarded"}}}, "status": {"disruptionsAllowed": 10}})
    for i in range(4):  # single pods, bound, one per node
        sim.create(pod(f"low-{i}", gpu=4, node=f"n-{i // 2}-{i % 2}", priority=10,
                       labels={"app": "guarded"} if i < 2 else {"app": "free"}))
    sim.create(podgroup("high", 4, priority=1000))
    high = [sim.create(pod(f"high-{i}", "high", gpu=4, priority=1000)) for i in range(4)]
    assert "preempting 4 pods" in next(iter(verbs.filter(cycle, high[0], all_nodes(sim)).unresolvable.values()))
    wait_until(lambda: len(writer.evictions) == 4)
    assert sorted(writer.evictions) == [("low-0", True, 0), ("low-1", True, 0), ("low-2", False, 0),
                                        ("low-3", False, 0)]


# -- the plugin's stream holds a preemptor's members while its victims go -------------------------

def test_the_stream_lists_a_group_while_its_victims_live_and_changes_when_the_last_goes(sim, cycle, clock):
    """Plugin mode: a group whose preemption's victims have not all gone is listed in the
    reservations stream's snapshot (the plugin keeps its members out of kube-scheduler's queue:
    each attempt would fail member by member, a call each); the last victim going — a plain pod,
    which otherwise changes nothing the stream carries — makes a new snapshot without it, and a
    nomination past its deadline is dropped by the once-a-second recompute (``timed``)."""
    from cycle.plugin_mode import PluginEnforcement

    enforcement = PluginEnforcement(cycle)
    gp = cycle.preemption
    victims = [sim.create(pod(f"victim-{i}", gpu=1)) for i in range(2)]
    sim.create(podgroup("high", 1, priority=1000))
    member = sim.create(pod("high-0", "high", gpu=1))
    uid = member["metadata"]["uid"]
    assert enforcement.snapshot().preempting == () and not enforcement.timed()
    gp.nominate(Nomination(group="default/high", victims={v["metadata"]["uid"] for v in victims},
                           placement={uid: "n-0-0"}, requests={uid: {"nvidia.com/gpu": 1}},
                           deadline=clock() + gp.grace))
    assert enforcement.snapshot().preempting == ("default/high",) and enforcement.timed()
    seen = enforcement.wait_change(-1, 0)
    sim.delete("Pod", "default/victim-0")
    assert enforcement.snapshot().preempting == ("default/high",)
    seen = enforcement.wait_change(-1, 0)
    sim.delete("Pod", "default/victim-1")
    assert enforcement.wait_change(seen, 0) > seen  # the stream is told without a group event
    assert enforcement.snapshot().preempting == ()
    # a nomination whose victims outlive its deadline stops holding the group at the deadline
    late = sim.create(pod("victim-late", gpu=1))
    gp.nominate(Nomination(group="default/high", victims={late["metadata"]["uid"]}, placement={uid: "n-0-0"},
                           requests={uid: {"nvidia.com/gpu": 1}}, deadline=clock() + gp.grace))
    assert enforcement.snapshot().preempting == ("default/high",)
    clock.now += gp.grace + 1
    assert enforcement.snapshot().preempting == () and not enforcement.timed()


def test_a_new_stream_recomputes_its_snapshot_while_a_group_is_held_even_without_a_change(sim, cycle, clock):
    """The stream's loop re-reads a snapshot every second while ``timed`` says it can change with
    time alone, and sends it only when it differs: the deadline's release reaches the plugin."""
    import grpc

    from proto.phalanx.v1 import scheduler_plugin_pb2 as pb
    from proto.phalanx.v1 import scheduler_plugin_pb2_grpc as pb_grpc
    from rpc import start_grpc_server

    gp = cycle.preemption
    late = sim.create(pod("victim-late", gpu=1))
    sim.create(podgroup("high", 1, priority=1000))
    uid = sim.create(pod("high-0", "high", gpu=1))["metadata"]["uid"]
    gp.nominate(Nomination(group="default/high", victims={late["metadata"]["uid"]}, placement={uid: "n-0-0"},
                           requests={uid: {"nvidia.com/gpu": 1}}, deadline=clock() + gp.grace))
    running = start_grpc_server(cycle, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stream = pb_grpc.SchedulerPluginStub(channel).WatchReservations(
                pb.WatchReservationsRequest(version=pb.CONTRACT_VERSION_1), timeout=30)
            assert list(next(stream).preempting_groups) == ["default/high"]
            clock.now += gp.grace + 1  # no event at all: only the recompute sees it
            assert list(next(stream).preempting_groups) == []
    finally:
        running.stop(grace=0)
