"""The trace simulator's invariants on tiny slices of each real trace and the synthetic mix: gang
policies never hold a partial gang, completed gangs ran exactly their GPU-seconds (plus what they
lost to preemption), every gang is counted (never-started ones censored at the run's end), every
policy's decisions are counted per gang attempt, the shared bound holds for every gang policy, the
offered load is what was asked (or refused, with the reason), and two runs agree."""

from __future__ import annotations

import numpy as np
import pytest

from bench.trace_bench import BOUNDED, censored, summarize
from bench.trace_bound import PackingBound, shared_bound
from bench.trace_policies import Phalanx, all_policies
from bench.trace_sim import Simulation
from bench.traces import (
    LOAD_TOLERANCE,
    DataMissing,
    Job,
    LoadRefused,
    acme,
    data_dir,
    offered_load,
    pollux,
    rack_cluster,
    scaled,
    synthetic,
    tiresias,
)
from cycle.queue import QueuePolicy

try:
    DATA = data_dir()
except DataMissing as missing:  # pragma: no cover - the data sits beside every checkout we test
    pytest.skip(str(missing), allow_module_level=True)

SLICES = {
    "acme": lambda **kw: acme(DATA, window=(150, 162), **kw),
    "pollux": lambda **kw: pollux(DATA, 2, window=(0, 24), **kw),
    "tiresias": lambda **kw: tiresias(DATA, window=(0, 24), **kw),
    "synthetic": lambda **kw: synthetic(DATA, jobs=24, **kw),
}
ALL_OR_NOTHING = ("upstream-1.37", "kueue-tas", "phalanx-greedy", "phalanx", "phalanx-no-queue-policy",
                  "phalanx-no-preemption")


def _outcome(sim: Simulation) -> list[tuple]:
    return sorted((g.job.id, g.started, g.finished, g.preempted, tuple(sorted(g.held.items())))
                  for g in sim.gangs.values())


@pytest.mark.parametrize("name", sorted(SLICES))
def test_trace_slice_invariants(name: str) -> None:
    trace = SLICES[name](load=0.9)
    assert offered_load(list(trace.jobs), trace.cluster.gpus) == pytest.approx(0.9, abs=LOAD_TOLERANCE)
    assert trace.measured_load == offered_load(list(trace.jobs), trace.cluster.gpus)
    bound = shared_bound(trace, PackingBound(trace.cluster, trace.jobs, deterministic_time=0.05))  # looser, valid
    for policy, twin in zip(all_policies(), all_policies(), strict=True):
        sim = Simulation(trace.cluster, trace.jobs, policy, trace.end, checkpoint_s=60.0).run()
        gangs = sim.gangs.values()
        if policy.name in ALL_OR_NOTHING:
            assert not any(g.was_partial for g in gangs), policy.name
        for g in gangs:
            if g.finished is not None:  # a completed gang ran its remaining work, then let go
                assert g.finished - g.started == pytest.approx(g.job.duration - (g.progress if g.preempted else 0))
                assert not g.held
        held = sum(len(g.held) * g.job.gpus for g in gangs)
        assert int(sim.used[:, sim.gpu].sum()) == held
        assert sim.used.min() >= 0
        wait, jct, never, unfinished = censored(sim)
        assert len(wait) == len(jct) == len(trace.jobs)  # every gang counted, censored ones too
        assert never == sum(g.first_started is None for g in gangs) and (wait >= 0).all()
        assert (jct <= trace.end).all()
        assert len(sim.decisions_ms) > 0, policy.name  # attempts are counted for every policy
        row = summarize(trace, sim, bound)
        assert row["lost_gpu_hours"] == pytest.approx(sum(g.lost_gpu_s for g in gangs) / 3600, abs=0.1)
        if policy.name in BOUNDED or isinstance(policy, Phalanx):
            assert row["useful_vs_bound"] <= 1.0 + 1e-9, policy.name
        again = Simulation(trace.cluster, trace.jobs, twin, trace.end, checkpoint_s=60.0).run()
        assert _outcome(again) == _outcome(sim), policy.name


def test_preemption_loses_only_the_work_since_the_last_checkpoint() -> None:
    """High priority for 40% of the jobs and no lost-work budget, so phalanx preempts here."""
    trace = SLICES["synthetic"](load=0.9, high_share=0.4)
    for checkpoint in (0.0, 600.0):
        unbudgeted = Phalanx(policy=QueuePolicy(lost_work_budget=None))
        sim = Simulation(trace.cluster, trace.jobs, unbudgeted, trace.end, checkpoint).run()
        assert sim.preempted_units > 0
        assert sim.lost_gpu_s == pytest.approx(sum(g.lost_gpu_s for g in sim.gangs.values()))
        for g in sim.gangs.values():
            assert g.progress <= g.job.duration
            if checkpoint == 0.0:
                assert g.progress == 0.0  # restart from zero
            else:  # each eviction loses less than one interval of the gang's GPUs
                assert g.lost_gpu_s <= g.preempted * checkpoint * g.job.pods * g.job.gpus + 1e-6
                assert g.progress % checkpoint == pytest.approx(0.0, abs=1e-6) or g.finished is not None


def test_the_shared_bound_is_the_same_for_every_policy_and_no_larger_than_its_parts() -> None:
    trace = SLICES["synthetic"](load=0.9)
    packing = PackingBound(trace.cluster, trace.jobs, deterministic_time=0.05)
    bound = shared_bound(trace, packing)
    assert bound.useful_gpu_s <= min(bound.integral(), bound.work) + 1e-6
    assert (bound.gpus <= trace.cluster.gpus).all() and (bound.found <= bound.gpus).all()
    assert (bound.gpus[1:] >= bound.gpus[:-1]).all()  # more arrived gangs never pack fewer GPUs
    # the same arrivals at another load: the k-th arrival set is the same, so is P per arrival
    other = shared_bound(SLICES["synthetic"](load=0.7), packing)
    assert list(other.gpus) == list(bound.gpus)


@pytest.mark.parametrize("name", sorted(SLICES))
def test_the_load_rule_cannot_collapse(name: str) -> None:
    """Where every job outlasts the last arrival (these slices: the old in-window rule reached 90%
    only through its 1-second floor), the arrival span still scales as 1 / load, and the load
    offered is the load asked at 70, 90 and 110%."""
    spans = {}
    for load in (0.7, 0.9, 1.1):
        trace = SLICES[name](load=load)
        assert abs(trace.measured_load - load) <= LOAD_TOLERANCE
        spans[load] = trace.horizon
    assert spans[0.7] / spans[0.9] == pytest.approx(0.9 / 0.7, rel=1e-3)
    assert spans[0.9] / spans[1.1] == pytest.approx(1.1 / 0.9, rel=1e-3)


def test_a_load_that_cannot_be_offered_is_refused_with_the_reason() -> None:
    cluster = rack_cluster("t", 1, 2)
    at_once = [Job(f"j{i}", 100.0, 3600.0, 1, 1, 1000) for i in range(3)]
    with pytest.raises(LoadRefused, match="at one instant"):
        scaled("t", cluster, at_once, "test")
    tiny = [Job("a", 0.0, 1.0, 1, 1, 1000), Job("b", 10_000.0, 1.0, 1, 1, 1000)]  # 2 GPU-seconds
    with pytest.raises(LoadRefused, match="under 60 s"):
        scaled("t", cluster, tiny, "test")


def test_the_run_goes_past_the_last_arrival_and_reports_each_priority_class() -> None:
    trace = SLICES["pollux"](load=0.7, high_share=0.4)
    policy = Phalanx()
    sim = Simulation(trace.cluster, trace.jobs, policy, trace.end).run()
    gangs = list(sim.gangs.values())
    assert any(g.finished is not None and g.finished > trace.horizon for g in gangs)  # past the last arrival
    row = summarize(trace, sim, shared_bound(trace, PackingBound(trace.cluster, trace.jobs, deterministic_time=0.05)))
    wait, jct, _, _ = censored(sim)
    high = [g.job.priority > 0 for g in gangs]
    assert 0 < sum(high) < len(gangs)
    assert row["wait_p95_high_s"] == round(float(np.percentile(wait[high], 95)), 1)
    assert row["wait_p95_low_s"] == round(float(np.percentile(wait[[not h for h in high]], 95)), 1)
    assert row["jct_p95_high_s"] == round(float(np.percentile(jct[high], 95)), 1)
    assert row["completed_high"] == sum(g.finished is not None for g, h in zip(gangs, high, strict=True) if h)
    assert row["load_measured"] == round(trace.measured_load, 4) and row["end_s"] == round(trace.end, 1)
