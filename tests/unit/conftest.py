import os

import pytest
from hypothesis import HealthCheck, settings

from cluster.sim import SimCluster
from cycle import WorkloadCycle

from .k8s_objects import node

settings.register_profile(
    "phalanx", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("fuzz", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "phalanx"))


@pytest.fixture
def sim():
    """A simulated cluster of 4 nodes with 4 GPUs each, in racks r0 and r1."""
    s = SimCluster()
    for r in range(2):
        for i in range(2):
            s.create(node(f"n-{r}-{i}", rack=f"r{r}", gpus=4))
    return s


@pytest.fixture
def cycle(sim):
    service = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0).start()
    yield service
    service.close()
