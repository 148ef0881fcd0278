"""The trace simulator's invariants on tiny slices of each real trace: gang policies never hold a
partial gang, completed gangs ran exactly their GPU-seconds, and two runs agree."""

from __future__ import annotations

import pytest

from bench.trace_policies import all_policies
from bench.trace_sim import Simulation
from bench.traces import DataMissing, acme, data_dir, pollux, tiresias

try:
    DATA = data_dir()
except DataMissing as missing:  # pragma: no cover - the data sits beside every checkout we test
    pytest.skip(str(missing), allow_module_level=True)

SLICES = {
    "acme": lambda: acme(DATA, window=(150, 175)),
    "pollux": lambda: pollux(DATA, 2, window=(0, 30)),
    "tiresias": lambda: tiresias(DATA, window=(0, 25)),
}
ALL_OR_NOTHING = ("upstream-1.37", "kueue-tas", "phalanx-greedy", "phalanx-exact", "phalanx-exact-no-preemption")


def _outcome(sim: Simulation) -> list[tuple]:
    return sorted((g.job.id, g.started, g.finished, g.preempted, tuple(sorted(g.held.items())))
                  for g in sim.gangs.values())


@pytest.mark.parametrize("name", sorted(SLICES))
def test_trace_slice_invariants(name: str) -> None:
    trace = SLICES[name]()
    for policy, twin in zip(all_policies(), all_policies(), strict=False):
        sim = Simulation(trace.cluster, trace.jobs, policy).run()
        gangs = sim.gangs.values()
        if policy.name in ALL_OR_NOTHING:
            assert not any(g.was_partial for g in gangs), policy.name
            assert all(g.finished is not None for g in gangs), policy.name
        for g in gangs:
            if g.finished is not None:  # a completed gang ran its full duration, then let go
                assert g.finished - g.started == pytest.approx(g.job.duration)
                assert not g.held
        # every held GPU belongs to a gang: the usage matrix and the gangs agree
        held = sum(len(g.held) * g.job.gpus for g in gangs)
        assert int(sim.used[:, sim.gpu].sum()) == held
        assert sim.used.min() >= 0
        completed = [g for g in gangs if g.finished is not None]
        ran = sum((g.finished - g.started) * g.job.pods * g.job.gpus for g in completed)
        assert ran == pytest.approx(sum(g.job.gpu_seconds for g in completed))
        again = Simulation(trace.cluster, trace.jobs, twin).run()
        assert _outcome(again) == _outcome(sim), policy.name
