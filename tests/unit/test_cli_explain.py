"""``phalanx explain`` against an in-process gRPC server over the simulated cluster."""

import pytest

from phalanx_cli.main import build_parser, main
from rpc import start_grpc_server

from .k8s_objects import pod, podgroup


@pytest.fixture
def addr(cycle):
    running = start_grpc_server(cycle, "127.0.0.1:0")
    yield f"127.0.0.1:{running.port}"
    running.stop(grace=0)


def test_explain_prints_state_and_plan(sim, cycle, addr, capsys):
    sim.create(podgroup("g", 2))
    for i in range(2):
        sim.create(pod(f"g-{i}", "g"))
    placement = cycle.place_group("default/g")
    assert main(["explain", "default/g", "--grpc-addr", addr]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["podgroup default/g: planned", "  members: 2 exist, 0 bound (minCount 2)"]
    assert out[2].startswith("  plan: planned, 2 pods (exact, optimal), 0 at the bind barrier, expires in ")
    nodes = sorted(placement.assignments.values())  # pod uids map to these nodes
    assert [line.split()[0] for line in out[3:]] == ["g-0", "g-1"]
    assert sorted(line.split()[1] for line in out[3:]) == nodes


def test_explain_prints_why_a_group_does_not_fit(sim, cycle, addr, capsys):
    sim.create(podgroup("huge", 2))
    for i in range(2):
        sim.create(pod(f"huge-{i}", "huge", gpu=64))
    cycle.place_group("default/huge")
    assert main(["explain", "huge", "--grpc-addr", addr]) == 0  # NAME alone: namespace default
    out = capsys.readouterr().out
    assert out.startswith("podgroup default/huge: unschedulable\n")
    assert "  why: " in out and "64 nvidia.com/gpu" in out and "plan:" not in out


def test_explain_of_an_unknown_group_fails_with_the_servers_reason(addr, capsys):
    assert main(["explain", "default/ghost", "--grpc-addr", addr]) == 1
    err = capsys.readouterr().err
    assert err.startswith("phalanx explain: not_found: podgroup default/ghost does not exist")


def test_grpc_addr_flags():
    parser = build_parser()
    assert parser.parse_args(["serve", "--sim", "x.yaml"]).grpc_addr == "127.0.0.1:50051"
    assert parser.parse_args(["serve", "--sim", "x.yaml", "--grpc-addr", "off"]).grpc_addr == "off"
    assert parser.parse_args(["explain", "ns/g"]).grpc_addr == "127.0.0.1:50051"


def test_explain_prints_the_whole_smallest_change(sim, cycle, addr, capsys):
    sim.create(podgroup("wide", 3, key="topology.kubernetes.io/rack"))
    for i in range(3):
        sim.create(pod(f"wide-{i}", "wide", gpu=4))  # 12 GPUs; a rack has 8
    cycle.place_group("default/wide")
    assert cycle.flush()  # the smallest change is searched off the cycle's call
    assert main(["explain", "default/wide", "--grpc-addr", addr]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("  smallest change:")
    assert out[at + 1].startswith("    capacity: rack r") and "lacks 1 node like" in out[at + 1]
    assert out[at + 2].startswith("    topology: fits across racks r0+r1")
