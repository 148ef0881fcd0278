"""Which kube-apiserver flags the Workload API really needs in the pinned release: separate,
short-lived control planes with one setting changed each."""

from __future__ import annotations

import pytest
from harness import RACK, ControlPlane, create, locate, podgroup


@pytest.fixture
def plane_with(tmp_path):
    started: list[ControlPlane] = []

    def start(**settings) -> ControlPlane:
        try:
            binaries = locate()
        except Exception as err:  # MissingBinaries: fail, never skip
            pytest.fail(str(err), pytrace=False)
        plane = ControlPlane(tmp_path / f"plane-{len(started)}", binaries, **settings)
        started.append(plane)
        return plane.start()

    yield start
    for plane in started:
        plane.stop()


def served(plane: ControlPlane) -> bool:
    return plane.rest.get_or_none("/apis/scheduling.k8s.io/v1beta1") is not None


def test_feature_gate_alone_does_not_serve_v1beta1(plane_with):
    assert not served(plane_with(apiserver_feature_gates={"GenericWorkload": True}, runtime_config=None))


def test_runtime_config_alone_does_not_serve_v1beta1(plane_with):
    assert not served(plane_with(apiserver_feature_gates=None, controller_manager_feature_gates=None))


def test_without_the_topology_gate_constraints_are_dropped(plane_with):
    plane = plane_with(apiserver_feature_gates={"GenericWorkload": True})
    assert served(plane)
    created = create(plane.rest, podgroup("db", min_count=2, topology_key=RACK), "default")
    assert "schedulingConstraints" not in created["spec"]
