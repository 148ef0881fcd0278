"""One flavor rule for ``phalanx serve`` and ``phalanx controller`` (cluster.apiserver.detect_flavor)."""

import pytest

from cluster.apiserver import FlavorUnavailable, detect_flavor
from controller import BUILTIN, CRD, discover_flavor


class Discovery:
    """An API server's discovery: resources served per group/version."""

    def __init__(self, served):
        self.served = served

    def served_resources(self, group_version):
        return self.served.get(group_version)


BOTH = {"workloads", "podgroups"}


@pytest.mark.parametrize("served,flavor", [
    ({"scheduling.k8s.io/v1beta1": BOTH}, "builtin"),
    ({"scheduling.k8s.io/v1beta1": BOTH, "scheduling.phalanx.dev/v1beta1": BOTH}, "builtin"),
    ({"scheduling.phalanx.dev/v1beta1": BOTH}, "crd"),
    # half of the built-in API is not the built-in API: both components fall back to the CRDs alike
    ({"scheduling.k8s.io/v1beta1": {"podgroups"}, "scheduling.phalanx.dev/v1beta1": BOTH}, "crd"),
])
def test_serve_and_controller_pick_the_same_flavor(served, flavor):
    kube = Discovery(served)
    assert detect_flavor(kube) == flavor
    assert discover_flavor(kube) == (BUILTIN if flavor == "builtin" else CRD)


@pytest.mark.parametrize("served", [{}, {"scheduling.k8s.io/v1beta1": {"podgroups"}},
                                    {"scheduling.phalanx.dev/v1beta1": {"workloads"}}])
def test_neither_api_served_is_a_clear_error(served):
    for detect in (detect_flavor, discover_flavor):
        with pytest.raises(FlavorUnavailable, match="kubectl apply -k scheduler-config/crds/"):
            detect(Discovery(served))
