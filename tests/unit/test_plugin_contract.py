"""The phalanx.v1.SchedulerPlugin gRPC service (the framework plugin's contract): a real server on
127.0.0.1:0 over the simulated cluster, called through the generated client stub the way the Go
plugin calls it (PreFilter -> PlanForPod, Reserve, Permit, Unreserve, PostFilter ->
ReportRejection, the reservations stream)."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from cluster import names
from cluster.backend import WriteError
from proto.phalanx.v1 import scheduler_plugin_pb2 as pb
from proto.phalanx.v1 import scheduler_plugin_pb2_grpc as pb_grpc
from rpc import start_grpc_server
from rpc.server import PLUGIN_SERVICE_NAME

from .k8s_objects import placement_of, pod, podgroup
from .test_cycle_service import wait_until

V1 = pb.CONTRACT_VERSION_1
SAFETY_NET = 30  # seconds: a broken stream fails the test instead of hanging it


@pytest.fixture
def stub(cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield pb_grpc.SchedulerPluginStub(channel)
    running.stop(grace=0)


def gang(sim, name, size, gpu=1, min_count=None):
    sim.create(podgroup(name, min_count or size))
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu)) for i in range(size)]


def plan_for(stub, obj):
    return stub.PlanForPod(pb.PlanForPodRequest(version=V1, pod_json=json.dumps(obj).encode()))


def uid(obj):
    return obj["metadata"]["uid"]


def touched(sim, obj):
    meta = sim.get("Pod", f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")["metadata"]
    return names.ANNOTATION_RETRY in (meta.get("annotations") or {})


def first_snapshot(stub, predicate=lambda s: True):
    for snap in stub.WatchReservations(pb.WatchReservationsRequest(version=V1), timeout=SAFETY_NET):
        if predicate(snap):
            return snap
    raise AssertionError("stream ended")


def test_service_is_registered_under_its_proto_name():
    assert PLUGIN_SERVICE_NAME == "phalanx.v1.SchedulerPlugin"


def test_gang_plan_reserve_permit_allows_all_once_complete_with_the_record_written_first(sim, stub):
    members = gang(sim, "g", 4)
    reply = plan_for(stub, members[0])
    assert reply.verdict == pb.PlanForPodReply.PLANNED
    assert reply.plan.gang and reply.plan.state == "planned"
    assert set(reply.plan.assignments) == {uid(m) for m in members}
    assert reply.node == reply.plan.assignments[uid(members[0])]
    for m in members[1:]:  # the other members get the same plan
        assert plan_for(stub, m).node == reply.plan.assignments[uid(m)]
    decisions = []
    for m in members:
        node = reply.plan.assignments[uid(m)]
        assert stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(m), group="default/g", node=node)).ok
        decisions.append(stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(m), group="default/g", node=node)))
    assert [d.decision for d in decisions] == [pb.PermitReply.WAIT] * 3 + [pb.PermitReply.ALLOW]
    assert decisions[0].wait_seconds > 0 and "1 of 4 members reserved" in decisions[0].reason
    assert sorted(decisions[-1].allow_uids) == sorted(uid(m) for m in members)
    assert set(placement_of(sim.get("PodGroup", "default/g"))["pods"]) == {f"g-{i}" for i in range(4)}
    assert not any(sim.get("Pod", f"default/g-{i}")["spec"].get("nodeName") for i in range(4))  # kube-scheduler binds


def test_reserve_on_another_node_than_planned_is_refused(sim, stub):
    members = gang(sim, "r", 1)
    reply = plan_for(stub, members[0])
    other = next(n for n in sim.cache.nodes if n != reply.node)
    answer = stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(members[0]), group="default/r", node=other))
    assert not answer.ok and f"planned on {reply.node}, not {other}" in answer.reason


def test_incomplete_gang_waits_and_is_listed_as_waiting(sim, stub):
    members = gang(sim, "w", 2, min_count=3)
    reply = plan_for(stub, members[0])
    assert reply.verdict == pb.PlanForPodReply.WAIT and "waiting for members, 2 of 3 exist" in reply.reason
    assert reply.members_missing
    assert "default/w" in first_snapshot(stub).waiting_groups


def test_plain_pod_is_not_a_member_and_malformed_pods_wait_with_the_reason(stub):
    assert plan_for(stub, pod("loner")).verdict == pb.PlanForPodReply.NOT_A_MEMBER
    bad = pod("bad", "g")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    reply = plan_for(stub, bad)
    assert reply.verdict == pb.PlanForPodReply.WAIT and "lots" in reply.reason


def test_refusals_are_status_codes(stub):
    with pytest.raises(grpc.RpcError) as err:
        stub.PlanForPod(pb.PlanForPodRequest(pod_json=b"{}"))  # no contract version
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        stub.PlanForPod(pb.PlanForPodRequest(version=V1, pod_json=b"not json"))
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_reservations_stream_holds_planned_capacity_until_members_are_reserved(sim, stub):
    members = gang(sim, "s", 2, gpu=2)
    reply = plan_for(stub, members[0])
    snap = first_snapshot(stub, lambda s: s.plans)
    held = {n: dict(r.amounts) for n, r in snap.nodes.items()}
    assert sum(a.get("nvidia.com/gpu", 0) for a in held.values()) == 4
    assert sum(a.get("cpu", 0) for a in held.values()) == 2000  # millicores
    assert [p.group for p in snap.plans] == ["default/s"] and snap.plans[0].id == reply.plan.id
    for m in members:
        stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(m), group="default/s",
                                       node=reply.plan.assignments[uid(m)]))
    snap = first_snapshot(stub, lambda s: s.plans and len(s.plans[0].reserved) == 2)
    assert not snap.nodes  # assumed by kube-scheduler now: its own cache counts them


def test_rejection_releases_the_plan_and_the_next_plan_avoids_the_node(sim, stub):
    members = gang(sim, "x", 1)
    first = plan_for(stub, members[0])
    outcome = stub.ReportRejection(pb.ReportRejectionRequest(
        version=V1, pod_json=json.dumps(members[0]).encode(), node=first.node, plugin="NodeResourcesFit",
        reason="Insufficient example.com/widget"))
    assert outcome.outcome == "released"
    second = plan_for(stub, members[0])
    assert second.verdict == pb.PlanForPodReply.PLANNED and second.node != first.node
    assert second.plan.id != first.plan.id


def test_rejection_reslots_an_identical_unanswered_member(sim, stub):
    members = gang(sim, "y", 2, gpu=4)  # one per node
    first = plan_for(stub, members[0])  # answers members[0] only
    outcome = stub.ReportRejection(pb.ReportRejectionRequest(
        version=V1, pod_json=json.dumps(members[0]).encode(), node=first.node, plugin="X", reason="no"))
    assert outcome.outcome == "reslotted"
    assert outcome.node == first.plan.assignments[uid(members[1])]
    assert plan_for(stub, members[1]).node == first.node  # the partner took the old node


def test_permit_rejection_of_one_member_releases_the_gang_and_names_the_waiting_rest(sim, stub):
    members = gang(sim, "t", 3)
    reply = plan_for(stub, members[0])
    for m in members[:2]:
        node = reply.plan.assignments[uid(m)]
        stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(m), group="default/t", node=node))
        stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(m), group="default/t", node=node))
    answer = stub.Unreserve(pb.UnreserveRequest(version=V1, pod_uid=uid(members[0]), group="default/t",
                                                reason="rejected"))
    assert list(answer.reject_uids) == [uid(members[1])]
    assert sim.cache.podgroups  # still there; the plan is not
    wait_until(lambda: any(touched(sim, m) for m in members))  # the event that retries them
    late = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[2]), group="default/t"))
    assert late.decision == pb.PermitReply.REJECT


def test_basic_group_members_are_allowed_one_by_one(sim, stub):
    sim.create(podgroup("b"))
    members = [sim.create(pod(f"b-{i}", "b")) for i in range(2)]
    reply = plan_for(stub, members[0])
    assert reply.verdict == pb.PlanForPodReply.PLANNED and not reply.plan.gang
    node = reply.plan.assignments[uid(members[0])]
    stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(members[0]), group="default/b", node=node))
    answer = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/b", node=node))
    assert answer.decision == pb.PermitReply.ALLOW and list(answer.allow_uids) == [uid(members[0])]


def test_permit_with_the_reservations_the_plugin_kept_completes_the_gang_in_one_call(sim, stub):
    members = gang(sim, "p", 3)
    reply = plan_for(stub, members[0])
    last = members[-1]
    answer = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(last), group="default/p",
                                          node=reply.plan.assignments[uid(last)],
                                          reserved_uids=[uid(m) for m in members]))
    assert answer.decision == pb.PermitReply.ALLOW
    assert sorted(answer.allow_uids) == sorted(uid(m) for m in members)
    assert placement_of(sim.get("PodGroup", "default/p")) is not None


def test_members_reserved_by_the_plugin_from_its_mirror_arrive_with_their_own_permit_calls(sim, stub):
    """The plugin's Reserve makes no call when kube-scheduler assumed the member on the mirror's
    planned node: each member's Permit call names it reserved there. The gang completes with no
    Reserve call, the stream stops holding an arrived member's capacity, and a member assumed
    elsewhere than planned is refused at Permit."""
    members = gang(sim, "m", 3)
    reply = plan_for(stub, members[0])
    node_of = {uid(m): reply.plan.assignments[uid(m)] for m in members}
    other = next(n for n in sim.cache.nodes if n != node_of[uid(members[0])])
    before = first_snapshot(stub, lambda s: any(p.group == "default/m" for p in s.plans))
    n0 = node_of[uid(members[0])]
    assert dict(before.nodes[n0].amounts)["nvidia.com/gpu"] == sum(1 for u in node_of if node_of[u] == n0)
    wrong = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/m", node=other,
                                         reserved_uids=[uid(members[0])]))
    assert wrong.decision == pb.PermitReply.REJECT and f"not {other}" in wrong.reason
    first = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/m",
                                         node=node_of[uid(members[0])], reserved_uids=[uid(members[0])]))
    assert first.decision == pb.PermitReply.WAIT and "1 of 3 members reserved" in first.reason
    snap = first_snapshot(stub, lambda s: any(p.group == "default/m" and p.reserved for p in s.plans))
    (plan,) = [p for p in snap.plans if p.group == "default/m"]
    assert list(plan.reserved) == [uid(members[0])]
    still_held = sum(1 for u in node_of if node_of[u] == n0 and u != uid(members[0]))
    assert dict(snap.nodes[n0].amounts).get("nvidia.com/gpu", 0) == still_held if still_held else n0 not in snap.nodes
    answers = [stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(m), group="default/m", node=node_of[uid(m)],
                                            reserved_uids=[uid(m)])) for m in members[1:]]
    assert [a.decision for a in answers] == [pb.PermitReply.WAIT, pb.PermitReply.ALLOW]
    assert sorted(answers[-1].allow_uids) == sorted(node_of)
    assert placement_of(sim.get("PodGroup", "default/m")) is not None


def test_a_gang_allowed_whole_leaves_the_stream_and_a_member_asking_again_gets_its_plan(sim, stub):
    """Once every member is allowed the gang's plan (bound, held until the cache shows the
    bindings) is no longer streamed: the stream, sent whole after each change, stays the size of
    the groups being placed. A member whose binding failed asks with PlanForPod and gets its node."""
    members = gang(sim, "b2", 2)
    reply = plan_for(stub, members[0])
    node_of = {uid(m): reply.plan.assignments[uid(m)] for m in members}
    first_snapshot(stub, lambda s: any(p.group == "default/b2" for p in s.plans))
    answers = [stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(m), group="default/b2", node=node_of[uid(m)],
                                            reserved_uids=[uid(m)])) for m in members]
    assert answers[-1].decision == pb.PermitReply.ALLOW
    snap = first_snapshot(stub, lambda s: not any(p.group == "default/b2" for p in s.plans))
    assert not any(p.group == "default/b2" for p in snap.plans)
    again = plan_for(stub, members[1])
    assert again.verdict == pb.PlanForPodReply.PLANNED and again.node == node_of[uid(members[1])]


def test_a_new_stream_gets_a_first_snapshot_even_when_nothing_is_held_or_changed(stub):
    """The plugin retries its pending members on the first snapshot after it (re)connects: a service
    holding nothing (no plan, no waiting group, no change since it started: the snapshot's
    encoding is empty) still sends it at once."""
    snap = next(iter(stub.WatchReservations(pb.WatchReservationsRequest(version=V1), timeout=5)))
    assert not snap.plans and not snap.waiting_groups and not snap.nodes


def test_a_permit_call_overlapping_the_record_write_waits_and_the_completing_reply_allows_it(sim, cycle, stub):
    """The plugin makes Permit calls beside its scheduling loop, so a member's call may arrive while
    the completing member's call is writing the placement record: it is answered WAIT (never
    ALLOW before the record exists), and the completing reply allows it."""
    members = gang(sim, "o", 2)
    reply = plan_for(stub, members[0])
    for m in members:
        assert stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(m), group="default/o",
                                              node=reply.plan.assignments[uid(m)])).ok
    writing, release = threading.Event(), threading.Event()
    write = cycle.writer.patch_podgroup_status

    def slow_write(*args, **kwargs):
        writing.set()
        assert release.wait(SAFETY_NET)
        return write(*args, **kwargs)

    cycle.writer.patch_podgroup_status = slow_write
    with ThreadPoolExecutor(1) as pool:
        completing = pool.submit(stub.Permit, pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/o"))
        assert writing.wait(SAFETY_NET)
        overlapping = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[1]), group="default/o"))
        assert overlapping.decision == pb.PermitReply.WAIT and "placement record" in overlapping.reason
        release.set()
        answer = completing.result(SAFETY_NET)
    assert answer.decision == pb.PermitReply.ALLOW
    assert sorted(answer.allow_uids) == sorted(uid(m) for m in members)
    assert placement_of(sim.get("PodGroup", "default/o")) is not None


def test_members_arriving_and_a_gang_binding_leave_other_groups_solves_valid(sim, cycle, stub):
    """A solve runs off the cycle's lock and is redone when the plan generation moved meanwhile.
    A member reserved, a gang going binding then bound, and a bound plan forgotten once the cache
    shows every binding change nothing another group's solve sees: no generation bump (each
    would make a solve in flight start over)."""
    members = gang(sim, "s", 2)
    reply = plan_for(stub, members[0])
    before = cycle.book.generation
    for m in members:
        node = reply.plan.assignments[uid(m)]
        assert stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=uid(m), group="default/s", node=node)).ok
        stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(m), group="default/s", node=node))
    assert cycle.plan_of("default/s").state.value == "bound"
    for m in members:
        sim.bind(m["metadata"]["namespace"], m["metadata"]["name"], uid(m), reply.plan.assignments[uid(m)])
    cycle.check_timers()
    assert cycle.plan_of("default/s") is None
    assert cycle.book.generation == before


@pytest.mark.parametrize("error", [WriteError("forbidden", 403), OSError("connection reset")])
def test_a_placement_record_that_cannot_be_written_rejects_the_gang_and_fails_its_plan(sim, cycle, stub, error):
    """Nothing binds without the record: whatever the writer raises, the completing Permit is
    REJECT with the reason and the plan is failed (it holds nothing, the group is re-planned)."""
    members = gang(sim, "w", 2)
    assert plan_for(stub, members[0]).verdict == pb.PlanForPodReply.PLANNED

    def failing(*args, **kwargs):
        raise error

    cycle.writer.patch_podgroup_status = failing
    answer = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/w",
                                          reserved_uids=[uid(m) for m in members]))
    assert answer.decision == pb.PermitReply.REJECT
    assert "could not write the placement record" in answer.reason and str(error) in answer.reason
    assert cycle.plan_of("default/w") is None
    assert placement_of(sim.get("PodGroup", "default/w")) is None
    # kube-scheduler keeps the rejected members aside until an event: phalanx touches one of them
    wait_until(lambda: any(touched(sim, m) for m in members))


@pytest.mark.parametrize("by_scheduler", [False, True])
def test_the_condition_is_written_at_binding_unless_kube_scheduler_writes_it(sim, stub, cycle, by_scheduler):
    """kube-scheduler's own pod-group cycle (GenericWorkload) writes PodGroupInitiallyScheduled; a
    plugin that says so at Permit gets the gang bound without serve writing the condition too."""
    members = gang(sim, "c", 2)
    reply = plan_for(stub, members[0])
    answer = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[-1]), group="default/c",
                                          node=reply.plan.assignments[uid(members[-1])],
                                          reserved_uids=[uid(m) for m in members],
                                          condition_by_scheduler=by_scheduler))
    assert answer.decision == pb.PermitReply.ALLOW
    assert cycle.flush(timeout=5.0)
    conditions = sim.get("PodGroup", "default/c").get("status", {}).get("conditions") or []
    written = [c for c in conditions if c["type"] == names.CONDITION_INITIALLY_SCHEDULED]
    assert (written == []) if by_scheduler else (written[0]["status"] == "True")
    assert placement_of(sim.get("PodGroup", "default/c")) is not None
    # kube-scheduler writes the status at the same moment: phalanx's record stays out of it (a
    # status write crossing kube-scheduler's would carry the conditions list without its condition)
    annotations = sim.get("PodGroup", "default/c")["metadata"].get("annotations") or {}
    assert (names.ANNOTATION_PLACEMENT in annotations) == by_scheduler
    assert (conditions == []) == by_scheduler


def spread_gang(sim, name, size, rule="DoNotSchedule"):
    """A gang whose members spread over racks (one filter kube-scheduler judges member by member)."""
    sim.create(podgroup(name, size))
    made = []
    for i in range(size):
        obj = pod(f"{name}-{i}", name, gpu=1, labels={"app": name})
        obj["spec"]["topologySpreadConstraints"] = [{
            "maxSkew": 1, "topologyKey": names.LABEL_RACK, "whenUnsatisfiable": rule,
            "labelSelector": {"matchLabels": {"app": name}}}]
        made.append(sim.create(obj))
    return made


def test_members_placed_in_order_trade_nodes_at_reserve(sim, stub):
    """kube-scheduler's spread filter judges each member against those already assumed, so a plan
    right for the group can be refused to one member for now: the plan names the members that may
    take each other's nodes, and a member reserved on another's node trades with it."""
    members = spread_gang(sim, "s", 3)
    reply = plan_for(stub, members[0])
    classes = dict(reply.plan.trade_classes)
    assert set(classes) == {uid(m) for m in members} and len(set(classes.values())) == 1
    nodes = reply.plan.assignments
    a = uid(members[0])
    b = next(uid(m) for m in members if nodes[uid(m)] != nodes[a])  # the spread puts one on another rack
    c = next(uid(m) for m in members if uid(m) not in (a, b))
    node_a, node_b = nodes[a], nodes[b]
    answer = stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=a, group="default/s", node=node_b, traded_with=b))
    assert answer.ok, answer.reason
    traded = first_snapshot(stub, lambda s: any(p.group == "default/s" for p in s.plans))
    plan = next(p for p in traded.plans if p.group == "default/s")
    assert plan.assignments[a] == node_b and plan.assignments[b] == node_a and a in plan.reserved
    # a member reserved already holds its node: no trade with it
    refused = stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=c, group="default/s", node=node_b, traded_with=a))
    assert not refused.ok and "already holds" in refused.reason
    # nor with a member planned elsewhere than the node named
    refused = stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=c, group="default/s", node=node_b, traded_with=b))
    assert not refused.ok and f"planned on {node_a}, not {node_b}" in refused.reason


@pytest.mark.parametrize("rule", ["ScheduleAnyway", None])
def test_members_whose_filters_do_not_depend_on_order_keep_their_nodes(sim, stub, rule):
    members = spread_gang(sim, "k", 2, rule) if rule else gang(sim, "k", 2)
    reply = plan_for(stub, members[0])
    assert reply.verdict == pb.PlanForPodReply.PLANNED and not reply.plan.trade_classes
    a, b = (uid(m) for m in members)
    refused = stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=a, group="default/k",
                                             node=reply.plan.assignments[b], traded_with=b))
    assert not refused.ok and "not in one trade class" in refused.reason


def test_a_trade_in_the_pod_group_cycles_simulation_does_not_count_the_member_reserved(sim, stub):
    """kube-scheduler's pod-group cycle (GenericWorkload) reverts its simulation without telling:
    a trade made there stays, but the member must not count at the barrier until it is reserved
    for real — else a reverted attempt could leave the gang counted complete without it."""
    members = spread_gang(sim, "v", 3)
    reply = plan_for(stub, members[0])
    nodes = reply.plan.assignments
    a = uid(members[0])
    b = next(uid(m) for m in members if nodes[uid(m)] != nodes[a])
    node_a, node_b = nodes[a], nodes[b]
    answer = stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=a, group="default/v", node=node_b, traded_with=b,
                                            simulation=True))
    assert answer.ok, answer.reason
    snap = first_snapshot(stub, lambda s: any(p.group == "default/v" for p in s.plans))
    plan = next(p for p in snap.plans if p.group == "default/v")
    assert plan.assignments[a] == node_b and plan.assignments[b] == node_a and a not in plan.reserved
    # its real Reserve (on the node it traded for) counts it
    assert stub.Reserve(pb.ReserveRequest(version=V1, pod_uid=a, group="default/v", node=node_b)).ok
    snap = first_snapshot(stub, lambda s: any(p.group == "default/v" and a in p.reserved for p in s.plans))
    assert a in next(p for p in snap.plans if p.group == "default/v").reserved


@pytest.mark.parametrize("status", [0, 429, 503])
def test_a_touch_the_api_server_could_not_take_is_retried_until_it_lands(sim, cycle, status):
    """A touch is the event that makes kube-scheduler retry a pod it set aside; one lost while the
    API server was away or throttling left a gang pending at rest (the network-fault run)."""
    member = sim.create(pod("n-0", "n"))
    real, failures = sim.annotate_pod, []

    def flaky(namespace, name, annotations):
        if len(failures) < 2:
            failures.append(status)
            raise WriteError("connection reset" if status == 0 else "try later", status)
        return real(namespace, name, annotations)

    cycle.status.writer.annotate_pod = flaky
    cycle.status.nudge("default", "n-0")
    assert cycle.flush(timeout=10.0)
    assert failures == [status, status] and touched(sim, member)



def test_two_touches_of_one_pod_on_one_clock_reading_each_change_the_pod(sim, cycle):
    """The API server drops an update that changes nothing (no watch event follows): a second touch
    that wrote the first one's value would never reach kube-scheduler. Touches within one clock
    reading (here the clock stands still) still write new, increasing values."""
    from datetime import datetime, timezone

    from cycle.status import TouchStamps
    sim.create(pod("t-0", "t"))
    frozen = 1_796_000_000 * 10**9 + 123_456_000  # ns
    cycle.status.touches = TouchStamps(now_ns=lambda: frozen)
    values = []
    for _ in range(3):
        cycle.status.nudge("default", "t-0")
        assert cycle.flush(timeout=10.0)
        values.append(sim.get("Pod", "default/t-0")["metadata"]["annotations"][names.ANNOTATION_RETRY])
    stamps = [datetime.strptime(v, "%Y-%m-%dT%H:%M:%S.%fZ") for v in values]
    assert len(set(values)) == 3 and stamps == sorted(stamps), values
    assert stamps[0] == datetime.fromtimestamp(frozen // 10**9, timezone.utc).replace(microsecond=123_456, tzinfo=None)

def test_a_resource_rejection_keeps_the_node_from_the_gang_for_a_moment_only(sim, cycle, stub, monkeypatch):
    """phalanx counts resources itself: kube-scheduler rejecting a planned node for resources means
    the two caches differed for a moment. The node is avoided at once, and again once the verdict's
    time is over (it kept a rack gang off room it had, at rest, in the network-fault run)."""
    from cycle import verdicts
    members = gang(sim, "v", 1)
    first = plan_for(stub, members[0])
    stub.ReportRejection(pb.ReportRejectionRequest(
        version=V1, pod_json=json.dumps(members[0]).encode(), node=first.node, plugin="NodeResourcesFit",
        reason="Insufficient cpu"))
    assert cycle.verdicts.get(uid(members[0])).excluded == {first.node}
    now = cycle.verdicts.clock()
    monkeypatch.setattr(cycle.verdicts, "clock", lambda: now + verdicts.TRANSIENT_VERDICT_SECONDS + 1)
    assert cycle.verdicts.get(uid(members[0])) is None
    group = cycle.cache.podgroup("default/v")
    assert cycle.verdicts.allowed(group, frozenset(cycle.cache.nodes)) == {}
    # a rejection by a filter phalanx does not model lasts
    stub.ReportRejection(pb.ReportRejectionRequest(
        version=V1, pod_json=json.dumps(members[0]).encode(), node=first.node, plugin="X", reason="no"))
    monkeypatch.setattr(cycle.verdicts, "clock", lambda: now + 10 * verdicts.TRANSIENT_VERDICT_SECONDS)
    assert cycle.verdicts.get(uid(members[0])).excluded == {first.node}


def test_a_gang_a_resource_rejection_turned_away_is_retried_when_the_verdict_ends(sim, cycle, stub, monkeypatch):
    """A member planned on the one node with room, refused there by kube-scheduler for resources
    (its cache still held a pod phalanx's had seen go), is answered "no room" while the verdict
    holds; the pod's deletion reached kube-scheduler meanwhile and retried nothing. When the
    verdict ends, phalanx touches the member so kube-scheduler tries it again."""
    from cycle import verdicts
    for r in range(2):
        for i in range(2):
            if (r, i) != (1, 1):
                sim.create(pod(f"full-{r}-{i}", gpu=4, node=f"n-{r}-{i}"))
    [member] = gang(sim, "late", 1, gpu=4)
    first = plan_for(stub, member)
    assert first.node == "n-1-1"
    stub.ReportRejection(pb.ReportRejectionRequest(
        version=V1, pod_json=json.dumps(member).encode(), node=first.node, plugin="NodeResourcesFit",
        reason="Insufficient nvidia.com/gpu"))
    again = plan_for(stub, member)
    assert again.verdict != pb.PlanForPodReply.PLANNED and "default/late" in cycle.queue.failed
    cycle.requeue.requeue_ended_verdicts()
    cycle.flush()
    assert not touched(sim, member)  # the verdict still holds: it would not fit
    now = cycle.verdicts.clock()
    monkeypatch.setattr(cycle.verdicts, "clock", lambda: now + verdicts.TRANSIENT_VERDICT_SECONDS + 1)
    cycle.requeue.requeue_ended_verdicts()
    cycle.flush()
    assert touched(sim, member) and "default/late" not in cycle.queue.failed
    cycle.requeue.requeue_ended_verdicts()  # each ended verdict once


def reject_uids(stub, predicate):
    return sorted(first_snapshot(stub, lambda s: predicate(sorted(s.reject_uids))).reject_uids)


def test_members_at_the_barrier_of_a_dropped_plan_are_streamed_for_rejection_and_leave_the_next_plan_alone(
        sim, cycle, stub):
    """A gang plan released before it completed (here kube-scheduler's filters refused a member's
    node) leaves its members waiting at Permit for a plan that is gone, assumed by kube-scheduler on
    capacity phalanx no longer counts: the stream names them for the plugin to reject. Their
    rejection (Unreserve, "rejected") does not release the group's next plan: they were not at its
    barrier. Unreserved, they are no longer streamed."""
    members = gang(sim, "l", 3)
    reply = plan_for(stub, members[0])
    node_of = {uid(m): reply.plan.assignments[uid(m)] for m in members}
    for m in members[:2]:
        wait = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(m), group="default/l", node=node_of[uid(m)],
                                            reserved_uids=[uid(m)]))
        assert wait.decision == pb.PermitReply.WAIT
    outcome = stub.ReportRejection(pb.ReportRejectionRequest(
        version=V1, pod_json=json.dumps(members[2]).encode(), node=node_of[uid(members[2])],
        plugin="NodeResourcesFit", reason="Insufficient cpu"))
    assert outcome.outcome == "released"
    left = sorted(uid(m) for m in members[:2])
    assert reject_uids(stub, lambda r: bool(r)) == left
    again = plan_for(stub, members[2])
    assert again.verdict == pb.PlanForPodReply.PLANNED and again.plan.id != reply.plan.id
    plan = cycle.plan_of("default/l")
    for m in members[:2]:
        answer = stub.Unreserve(pb.UnreserveRequest(version=V1, pod_uid=uid(m), group="default/l",
                                                    reason="rejected"))
        assert list(answer.reject_uids) == []
    assert cycle.plan_of("default/l") is plan  # the next plan stands
    assert reject_uids(stub, lambda r: not r) == []


def test_members_waiting_when_the_placement_record_fails_are_streamed_for_rejection(sim, cycle, stub):
    """The completing Permit call is rejected when the record cannot be written; members that
    reached the barrier with earlier calls wait for no reply: the stream names every member of the
    failed plan's barrier."""
    members = gang(sim, "f", 2)
    reply = plan_for(stub, members[0])
    first = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/f",
                                         node=reply.plan.assignments[uid(members[0])], reserved_uids=[uid(members[0])]))
    assert first.decision == pb.PermitReply.WAIT

    def failing(*args, **kwargs):
        raise WriteError("too many requests", 429)

    cycle.writer.patch_podgroup_status = failing
    last = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[1]), group="default/f",
                                        node=reply.plan.assignments[uid(members[1])], reserved_uids=[uid(members[1])]))
    assert last.decision == pb.PermitReply.REJECT
    assert reject_uids(stub, lambda r: bool(r)) == sorted(uid(m) for m in members)


def test_a_permit_call_naming_a_member_assumed_off_its_planned_node_is_rejected_and_counts_none(sim, cycle, stub):
    """The plugin reserves members against its mirror, which may be older than the group's plan: a
    call naming where each was assumed is rejected when one is not on its planned node, and none of
    them counts as reserved (allowed, that member would bind where no plan put it)."""
    members = gang(sim, "n", 3)
    reply = plan_for(stub, members[0])
    node_of = {uid(m): reply.plan.assignments[uid(m)] for m in members}
    other = next(n for n in sim.cache.nodes if n != node_of[uid(members[1])])
    nodes = {uid(members[0]): node_of[uid(members[0])], uid(members[1]): other}
    answer = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/n",
                                          node=node_of[uid(members[0])], reserved_uids=list(nodes),
                                          reserved_nodes=nodes))
    assert answer.decision == pb.PermitReply.REJECT and f"not {other}" in answer.reason
    assert not cycle.plan_of("default/n").arrived
    nodes = {uid(m): node_of[uid(m)] for m in members}
    answer = stub.Permit(pb.PermitRequest(version=V1, pod_uid=uid(members[0]), group="default/n",
                                          node=node_of[uid(members[0])], reserved_uids=list(nodes),
                                          reserved_nodes=nodes))
    assert answer.decision == pb.PermitReply.ALLOW and sorted(answer.allow_uids) == sorted(nodes)
