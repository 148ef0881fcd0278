"""The phalanx.v1.WorkloadCycle gRPC service: a real server on 127.0.0.1:0 over the simulated
cluster, called through the generated client stub."""

import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster import names
from extender.server import ServeOptions, build
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from rpc import SERVICE_NAME, EventHub, start_grpc_server

from .k8s_objects import pod, podgroup

RACK = names.LABEL_RACK
SAFETY_NET = 60  # seconds: a deadline so a broken stream fails the test instead of hanging it


@pytest.fixture
def server(cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0")
    yield running
    running.stop(grace=0)


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


@pytest.fixture
def stub(channel):
    return pb_grpc.WorkloadCycleStub(channel)


def make_gang(sim, name, size, gpu=1, key=None, min_count=None, namespace="default"):
    sim.create(podgroup(name, min_count or size, key, namespace=namespace))
    return [sim.create(pod(f"{name}-{i}", name, gpu=gpu, namespace=namespace)) for i in range(size)]


def ref(name, namespace="default"):
    return {"namespace": namespace, "name": name}


def code_of(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_place_group_places_a_gang_and_get_plan_returns_it(sim, stub):
    make_gang(sim, "t", 6, key=RACK)
    reply = stub.PlaceGroup(pb.PlaceGroupRequest(**ref("t")))
    assert reply.placed and not reply.explanation
    placement = reply.placement
    assert sorted(placement.assignments) == [f"t-{i}" for i in range(6)]
    assert placement.domain in {"r0", "r1"}
    assert {sim.get("Node", n)["metadata"]["labels"][RACK] for n in placement.assignments.values()} == {
        placement.domain}
    assert placement.path == "exact" and placement.optimal and placement.HasField("gap")
    assert placement.HasField("objective") and placement.objective.unplaced == 0

    plan = stub.GetPlan(pb.GetPlanRequest(**ref("t")))
    assert (plan.namespace, plan.name, plan.state) == ("default", "t", "planned")
    assert plan.placement == placement
    assert plan.expires_in_seconds > 0 and plan.members_at_barrier == 0


def test_place_group_of_a_gang_that_cannot_fit_returns_the_explanation(sim, stub):
    make_gang(sim, "big", 5, gpu=4)  # 4 nodes x 4 GPUs: room for 4 of 5
    reply = stub.PlaceGroup(pb.PlaceGroupRequest(**ref("big")))
    assert not reply.placed and not reply.HasField("placement")
    assert "needs 20 nvidia.com/gpu, 16 free" in reply.explanation
    code, details = code_of(lambda: stub.GetPlan(pb.GetPlanRequest(**ref("big"))))
    assert code is grpc.StatusCode.NOT_FOUND and "holds no plan (state: unschedulable)" in details


def test_explain_group_gives_state_explanation_and_members(sim, stub):
    sim.create(podgroup("g", 3))
    sim.create(pod("g-0", "g"))
    stub.PlaceGroup(pb.PlaceGroupRequest(**ref("g")))
    reply = stub.ExplainGroup(pb.ExplainGroupRequest(**ref("g")))
    assert (reply.state, reply.members_existing, reply.members_bound, reply.min_count) == ("waiting", 1, 0, 3)
    assert reply.explanation == "podgroup default/g: waiting for members, 1 of 3 exist"

    sim.create(pod("loner-0", "nowhere"))  # a pod naming a PodGroup that does not exist (yet)
    orphan = stub.ExplainGroup(pb.ExplainGroupRequest(**ref("nowhere")))
    assert (orphan.state, orphan.members_existing) == ("unknown", 1)


def test_list_groups_summarises_every_podgroup(sim, stub):
    make_gang(sim, "a", 2, key=RACK)
    make_gang(sim, "b", 3, min_count=5)
    sim.create(podgroup("web"))
    make_gang(sim, "c", 1, namespace="team")
    stub.PlaceGroup(pb.PlaceGroupRequest(**ref("a")))
    groups = stub.ListGroups(pb.ListGroupsRequest()).groups
    assert [(g.namespace, g.name) for g in groups] == [("default", "a"), ("default", "b"), ("default", "web"),
                                                      ("team", "c")]
    a, b, web, _ = groups
    assert (a.state, a.policy, a.min_count, a.members_existing, a.members_bound, a.topology_key) == (
        "planned", "gang", 2, 2, 0, RACK)
    assert a.domain in {"r0", "r1"}
    assert (b.state, b.min_count, b.members_existing, b.domain) == ("waiting", 5, 3, "")
    assert (web.policy, web.members_existing) == ("basic", 0)
    only_team = stub.ListGroups(pb.ListGroupsRequest(namespace="team")).groups
    assert [g.name for g in only_team] == ["c"]


def test_list_groups_reports_the_domain_of_the_placement_record(sim, stub):
    make_gang(sim, "done", 2, key=RACK)
    sim.annotate_podgroup("default", "done", {names.ANNOTATION_PLACEMENT: json.dumps(
        {"domain": "r1", "pods": {"done-0": "n-1-0", "done-1": "n-1-1"}})})
    (done,) = stub.ListGroups(pb.ListGroupsRequest()).groups
    assert done.domain == "r1"


def test_watch_events_receives_planned_after_place_group(sim, stub):
    make_gang(sim, "w", 2)
    make_gang(sim, "other", 1)
    events = stub.WatchEvents(pb.WatchEventsRequest(**ref("w")), timeout=SAFETY_NET)
    events.initial_metadata()  # the stream is subscribed from here on
    stub.PlaceGroup(pb.PlaceGroupRequest(**ref("other")))  # filtered out: another group
    placed = stub.PlaceGroup(pb.PlaceGroupRequest(**ref("w")))
    event = next(events)
    events.cancel()
    assert (event.group, event.kind, event.category, event.dropped) == (
        "default/w", "planned", pb.Event.CATEGORY_PLAN, 0)
    payload = json.loads(event.payload_json)
    assert payload["assignments"] == dict(placed.placement.assignments)  # pod names, not uids
    assert event.time.seconds > 0


def test_watch_events_of_a_namespace_and_of_everything(sim, stub):
    make_gang(sim, "big", 1, gpu=64, namespace="team")
    everything = stub.WatchEvents(pb.WatchEventsRequest(), timeout=SAFETY_NET)
    team = stub.WatchEvents(pb.WatchEventsRequest(namespace="team"), timeout=SAFETY_NET)
    everything.initial_metadata(), team.initial_metadata()
    stub.PlaceGroup(pb.PlaceGroupRequest(**ref("big", "team")))
    for stream in (everything, team):
        event = next(stream)
        stream.cancel()
        assert (event.group, event.kind, event.category) == ("team/big", "unschedulable",
                                                             pb.Event.CATEGORY_STATUS)
        assert "64 nvidia.com/gpu" in json.loads(event.payload_json)["message"]


def test_a_slow_stream_drops_its_oldest_events_and_counts_them():
    hub = EventHub(capacity=2)
    stream = hub.open()
    for i in range(5):
        hub.publish("planned", {"group": f"default/g{i}"})
    kept = [stream.next(timeout=0), stream.next(timeout=0), stream.next(timeout=0)]
    assert [e.group for e in kept[:2]] == ["default/g3", "default/g4"] and kept[2] is None
    assert stream.dropped == 3
    hub.close()
    assert stream.closed


def test_too_many_watchers_are_refused(cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0", workers=4, max_watchers=1)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as ch:
            stub = pb_grpc.WorkloadCycleStub(ch)
            first = stub.WatchEvents(pb.WatchEventsRequest(), timeout=SAFETY_NET)
            first.initial_metadata()
            code, details = code_of(lambda: next(stub.WatchEvents(pb.WatchEventsRequest(), timeout=SAFETY_NET)))
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 1 event streams" in details
            assert stub.ListGroups(pb.ListGroupsRequest()).groups == []  # unary calls still served
            first.cancel()
    finally:
        running.stop(grace=0)


def test_an_address_in_use_is_an_error_not_a_shared_port(cycle, server):
    with pytest.raises(RuntimeError, match="Failed to bind"):
        start_grpc_server(cycle, f"127.0.0.1:{server.port}")


def test_health_service_says_serving(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
            health_pb2.HealthCheckResponse.SERVING


def test_unknown_groups_are_not_found(stub):
    for call in (lambda: stub.PlaceGroup(pb.PlaceGroupRequest(**ref("ghost"))),
                 lambda: stub.GetPlan(pb.GetPlanRequest(**ref("ghost"))),
                 lambda: stub.ExplainGroup(pb.ExplainGroupRequest(**ref("ghost")))):
        code, details = code_of(call)
        assert code is grpc.StatusCode.NOT_FOUND and "default/ghost" in details


@pytest.mark.parametrize("namespace,name", [("", "g"), ("default", ""), ("Default", "g"), ("default", "a/b"),
                                            ("default", "g" * 254), ("x" * 64, "g")])
def test_malformed_names_are_invalid_arguments(stub, namespace, name):
    for call in (lambda: stub.PlaceGroup(pb.PlaceGroupRequest(namespace=namespace, name=name)),
                 lambda: stub.GetPlan(pb.GetPlanRequest(namespace=namespace, name=name)),
                 lambda: stub.ExplainGroup(pb.ExplainGroupRequest(namespace=namespace, name=name))):
        assert code_of(call)[0] is grpc.StatusCode.INVALID_ARGUMENT


def test_malformed_filters_are_invalid_arguments(stub):
    assert code_of(lambda: stub.ListGroups(pb.ListGroupsRequest(namespace="NS")))[0] is \
        grpc.StatusCode.INVALID_ARGUMENT
    code, details = code_of(lambda: next(stub.WatchEvents(pb.WatchEventsRequest(name="g"), timeout=SAFETY_NET)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and details == "name needs namespace"


def test_an_unexpected_failure_is_internal_and_the_server_keeps_serving(sim, cycle, stub, monkeypatch):
    make_gang(sim, "g", 1)

    def broken(key):
        raise RuntimeError("boom")

    monkeypatch.setattr(cycle, "place_group", broken)
    code, details = code_of(lambda: stub.PlaceGroup(pb.PlaceGroupRequest(**ref("g"))))
    assert code is grpc.StatusCode.INTERNAL and "boom" in details
    assert [g.name for g in stub.ListGroups(pb.ListGroupsRequest()).groups] == ["g"]


def test_phalanx_serve_runs_the_grpc_server_in_process(sim):
    make_gang(sim, "g", 2)
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0", http_threads=8), sim=sim).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{phalanx.grpc.port}") as ch:
            assert pb_grpc.WorkloadCycleStub(ch).PlaceGroup(pb.PlaceGroupRequest(**ref("g"))).placed
    finally:
        phalanx.stop()


@pytest.mark.parametrize("off", ["", "off"])
def test_phalanx_serve_without_grpc(sim, off):
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr=off, http_threads=8), sim=sim).start()
    assert phalanx.grpc is None
    phalanx.stop()
