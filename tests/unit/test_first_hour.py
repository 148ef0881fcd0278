"""A newcomer's first hour: each friction met at a door — a command, a file, a request — is one line
a user can act on, never a traceback or a 5xx (the what-if and demo doors have their own tests in
test_whatif.py and test_demo.py)."""

import glob
import json
import os
import subprocess
import sys
import tempfile

import grpc
import pytest

from cluster.sim import SimCluster
from cluster.whatif import MAX_MANIFEST_BYTES
from controller.whatif import compile_objects
from extender.http import create_app
from phalanx_cli.main import main
from phalanx_cli.whatif import whatif
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc
from rpc import start_grpc_server

from .k8s_objects import pod, podgroup


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == "phalanx 0.1.0"


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path):
    """`phalanx ... | head`: the pipe closes early; no BrokenPipeError traceback."""
    script = tmp_path / "loud.py"
    script.write_text("import sys\nfrom phalanx_cli import main as m\n"
                      "def run(args):\n    for _ in range(100000):\n        print('x' * 80)\n    return 0\n"
                      "m._demo = run\nsys.exit(m.main(['demo', '--solver-only']))\n")
    proc = subprocess.run(f"{sys.executable} {script} | head -1", shell=True, capture_output=True, text=True,
                          cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60)
    assert proc.stdout == "x" * 80 + "\n"
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def _big_manifest(megabytes):
    """PodGroups (one member each) padded with 1 MiB annotations: ``megabytes`` MiB as JSON, cheap
    to compile and plan."""
    objects = []
    for i in range(megabytes):
        group = podgroup(f"g{i}", 1)
        group["metadata"]["annotations"] = {"example.com/pad": "x" * 2**20}
        objects += [group, pod(f"g{i}-0", f"g{i}")]
    return objects


def test_one_manifest_size_limit_at_every_door_said_as_such(sim, cycle, tmp_path, capsys):
    objects = _big_manifest(MAX_MANIFEST_BYTES // 2**20 + 1)
    size = sum(len(json.dumps(o)) for o in objects)
    assert size > MAX_MANIFEST_BYTES
    reply = create_app(cycle, compile_manifest=compile_objects).test_client().post(
        "/api/v1/whatif", data=json.dumps({"objects": objects}), content_type="application/json")
    assert reply.status_code == 413 and "what-if takes at most 16 MiB" in reply.get_json()["error"]
    running = start_grpc_server(cycle, "127.0.0.1:0", compile_manifest=compile_objects)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}",
                                   options=[("grpc.max_send_message_length", 2 * size)]) as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.WorkloadCycleStub(channel).WhatIf(pb.WhatIfRequest(objects_json=[json.dumps(o) for o in objects]))
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "what-if takes at most 16 MiB" in err.value.details()
        manifest = tmp_path / "big.json"  # JSON is YAML: one List document
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        assert whatif([str(manifest)], f"127.0.0.1:{running.port}", sys.stdout) == 1
        said = capsys.readouterr().err
        assert said.startswith("phalanx whatif: the manifest is ") and "at most 16 MiB" in said
        # below the limit but above gRPC's 4 MiB default: the CLI and serve take it
        manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": _big_manifest(6)}))
        assert whatif([str(manifest)], f"127.0.0.1:{running.port}", open(os.devnull, "w")) == 0
    finally:
        running.stop(grace=0)


@pytest.mark.parametrize(("text", "said"), [
    ("a: [", "not YAML"),
    ("- just\n- a list\n", "document 1: not a Kubernetes object with metadata.name"),
    ("kind: Node\nmetadata: {name: n}\n---\nkind: Gadget\nmetadata: {name: g}\n",
     "document 2 (Gadget g): simulated cluster does not serve kind 'Gadget'"),
    ("kind: Node\nmetadata: {name: n}\n---\nkind: Node\nmetadata: {name: n}\n", "document 2 (Node n): Node n already exists"),
])
def test_a_sim_file_that_cannot_be_loaded_names_the_document(text, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        SimCluster().load_yaml(text)


def test_serve_says_a_bad_sim_file_in_one_line(tmp_path, capsys):
    bad = tmp_path / "cluster.yaml"
    bad.write_text("kind: Node\nmetadata: {name: n}\n---\n[1, 2]\n")
    with pytest.raises(SystemExit) as done:
        main(["serve", "--sim", str(bad), "--insecure-loopback-no-auth", "--http-addr", "127.0.0.1:0",
              "--grpc-addr", "off"])
    assert str(done.value) == "phalanx serve: document 2: not a Kubernetes object with metadata.name"


@pytest.mark.parametrize("suite", [["controller", "--quick"], ["faults", "--quick"], ["soak", "--real", "--quick"]])
def test_a_bench_suite_without_the_control_plane_says_how_to_build_it_and_leaves_nothing(
        suite, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "phalanx-bench-*")))
    with pytest.raises(SystemExit) as done:
        main(["bench", *suite])
    message = str(done.value)
    assert message.startswith(f"phalanx bench {suite[0]}: e2e control plane not built") and "make e2e" in message
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "phalanx-bench-*"))) == before


def test_the_dashboards_api_and_explain_take_any_name_or_query_without_a_5xx(sim, cycle):
    """Every path and query of the dashboard's JSON API, and gRPC ExplainGroup/GetPlan/ListGroups,
    with arbitrary text where a name, namespace, zone, rack or sequence number goes: HTTP 200, 400
    or 404, gRPC OK, INVALID_ARGUMENT or NOT_FOUND — never a 5xx, never INTERNAL."""
    import urllib.parse

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    sim.create(podgroup("g", 2))
    sim.create(pod("g-0", "g"))
    client = create_app(cycle, compile_manifest=compile_objects).test_client()
    running = start_grpc_server(cycle, "127.0.0.1:0")
    text = st.one_of(st.sampled_from(["default", "g", "", "-1", "9" * 30, "a/b", "..", "%00", "ü", " "]),
                     st.text(max_size=40))
    quote = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkloadCycleStub(channel)

            @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(text, text, text)
            def run(a, b, c) -> None:
                for path in (f"/api/v1/podgroups/{quote(a)}/{quote(b)}", f"/api/v1/topology/{quote(a)}/{quote(b)}",
                             f"/api/v1/events?since={quote(c)}", f"/api/v1/plans?namespace={quote(a)}",
                             f"/api/v1/podgroups?namespace={quote(b)}"):
                    status = client.get(path).status_code
                    assert status in (200, 400, 404), (path, status)
                for call, request in ((stub.ExplainGroup, pb.ExplainGroupRequest(namespace=a, name=b)),
                                      (stub.GetPlan, pb.GetPlanRequest(namespace=a, name=b)),
                                      (stub.ListGroups, pb.ListGroupsRequest(namespace=c))):
                    try:
                        call(request, timeout=10)
                    except grpc.RpcError as err:
                        assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (
                            request, err.code(), err.details())

            run()
    finally:
        running.stop(grace=0)
