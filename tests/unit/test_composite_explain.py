"""Explain shows a child of a CompositePodGroup as one: the tree's root, the groups planned with it
and the root's policy — in the dashboard's JSON (what ``kubectl phalanx explain`` prints), in the
gRPC ExplainGroup reply (what ``phalanx explain`` prints), and for a tree not ready yet, why."""

from __future__ import annotations

import grpc

from cycle import WorkloadCycle
from extender.http import create_app
from phalanx_cli.explain import render
from phalanx_cli.kubectl.main import render_explain
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from rpc import start_grpc_server

from .k8s_objects import podgroup
from .test_cycle_composite import ZONE, blocks, child, composite


def test_a_child_is_explained_with_its_composite_in_every_door():
    sim = blocks()
    sim.create(composite("job", min_group_count=2))
    child(sim, "rep-0", "job")
    child(sim, "rep-1", "job")
    sim.create(podgroup("alone", 1))
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    server = start_grpc_server(cycle, "127.0.0.1:0")
    try:
        of = cycle.composite_of("default/rep-0")
        assert of is not None and of.root == "default/job" and of.why == ""
        assert of.groups == ("default/rep-0", "default/rep-1")
        assert of.how == f"2 of 2 children together, in one {ZONE}"
        assert cycle.composite_of("default/alone") is None

        client = create_app(cycle).test_client()
        view = client.get("/api/v1/podgroups/default/rep-0").json
        assert view["composite"] == {"key": "default/job", "groups": ["default/rep-0", "default/rep-1"],
                                     "how": of.how, "why": ""}
        line = f"  composite: compositepodgroup default/job, planned as one with default/rep-1 ({of.how})"
        assert line in render_explain(view).splitlines()
        alone = client.get("/api/v1/podgroups/default/alone").json
        assert alone["composite"] == {} and "composite:" not in render_explain(alone)

        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.WorkloadCycleStub(channel)
            reply = stub.ExplainGroup(pb.ExplainGroupRequest(namespace="default", name="rep-0"))
            assert (reply.composite, list(reply.composite_groups), reply.composite_how) == (
                "default/job", ["default/rep-0", "default/rep-1"], of.how)
            assert line in render(reply, None).splitlines()
            lone = stub.ExplainGroup(pb.ExplainGroupRequest(namespace="default", name="alone"))
            assert lone.composite == "" and "composite:" not in render(lone, None)
    finally:
        server.stop(grace=0)
        cycle.close()


def test_a_tree_not_ready_says_why():
    sim = blocks()
    child(sim, "orphan-0", "missing")  # its parent was never created
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    try:
        of = cycle.composite_of("default/orphan-0")
        assert of is not None and of.root == "default/missing" and "does not exist" in of.why
        view = create_app(cycle).test_client().get("/api/v1/podgroups/default/orphan-0").json
        assert "  composite: compositepodgroup default/missing, not ready: compositepodgroup default/missing " \
               "does not exist (yet)" in render_explain(view).splitlines()
    finally:
        cycle.close()
