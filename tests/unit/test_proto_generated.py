"""The committed gRPC code is exactly what proto/phalanx/v1/*.proto generates (hack/gen-proto.sh
with the venv's grpcio-tools): a changed .proto without regenerated code fails here."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path("proto/phalanx/v1")
GENERATED = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_files(base: pathlib.Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((base / PACKAGE).glob("*")) if p.name.endswith(GENERATED)}


def test_committed_code_matches_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run(["bash", str(ROOT / "hack/gen-proto.sh"), str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    fresh, committed = generated_files(tmp_path), generated_files(ROOT)
    assert fresh, "hack/gen-proto.sh generated nothing"
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"generated code differs from proto/phalanx/v1/*.proto in {stale}: run hack/gen-proto.sh"


def test_generated_modules_import_as_a_package():
    from proto.phalanx.v1 import workload_cycle_pb2, workload_cycle_pb2_grpc

    assert workload_cycle_pb2_grpc.proto_dot_phalanx_dot_v1_dot_workload__cycle__pb2 is workload_cycle_pb2
    assert workload_cycle_pb2.DESCRIPTOR.services_by_name["WorkloadCycle"].full_name == "phalanx.v1.WorkloadCycle"


GO_PACKAGE = pathlib.Path("gen/phalanx/v1")


def test_committed_go_code_matches_the_proto(tmp_path):
    """plugin/gen/phalanx/v1 is what hack/gen-proto-go.sh generates (pinned protoc-gen-go and
    protoc-gen-go-grpc, built once into the cache; go must be on PATH)."""
    pytest.importorskip("grpc_tools")
    subprocess.run(["bash", str(ROOT / "hack/gen-proto-go.sh"), str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    fresh = {p.name: p.read_text() for p in sorted((tmp_path / GO_PACKAGE).glob("*.go"))}
    committed = {p.name: p.read_text() for p in sorted((ROOT / "plugin" / GO_PACKAGE).glob("*.go"))}
    assert fresh, "hack/gen-proto-go.sh generated nothing"
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"Go code differs from proto/phalanx/v1/scheduler_plugin.proto in {stale}: run hack/gen-proto-go.sh"
