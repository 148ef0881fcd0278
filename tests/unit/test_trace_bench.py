"""The trace simulator's invariants on tiny slices of each real trace and the synthetic mix: gang
policies never hold a partial gang, completed gangs ran exactly their GPU-seconds (plus what they
lost to preemption), every gang is counted (never-started ones censored at the run's end), every
policy's decisions are counted per gang attempt, the shared bound holds for every gang policy, the
offered load is what was asked (or refused, with the reason), and two runs agree."""

from __future__ import annotations

import numpy as np
import pytest

from bench.trace_bench import BASELINES, BOUNDED, NO_CONTENTION, censored, summarize, tally, verdicts
from bench.trace_bound import PackingBound, shared_bound
from bench.trace_policies import Phalanx, all_policies
from bench.trace_sim import Simulation
from bench.traces import (
    LOAD_TOLERANCE,
    DataMissing,
    Job,
    LoadRefused,
    Sizing,
    acme,
    data_dir,
    demand_load,
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
    "acme": lambda **kw: acme(DATA, window=(200, 230), **kw),
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
    assert demand_load(list(trace.jobs), trace.cluster.gpus) == pytest.approx(0.9, abs=LOAD_TOLERANCE)
    assert trace.measured_load == demand_load(list(trace.jobs), trace.cluster.gpus)
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
def test_the_load_asked_is_the_load_felt_and_it_cannot_collapse(name: str) -> None:
    """At 70, 90 and 110% the scaled trace makes its cluster feel the load asked. On a given
    cluster (Acme on PAI's machines, the synthetic mix) only arrivals move, and a higher load is a
    shorter span; on a sized one (Pollux, Tiresias) the cluster never grows as the load rises and
    arrivals move only by what whole nodes (and the smallest cluster that holds every job) leave."""
    traces = {load: SLICES[name](load=load) for load in (0.7, 0.9, 1.1)}
    for load, trace in traces.items():
        assert abs(trace.measured_load - load) <= LOAD_TOLERANCE
        assert trace.measured_load == pytest.approx(demand_load(list(trace.jobs), trace.cluster.gpus))
    gpus = [traces[load].cluster.gpus for load in (0.7, 0.9, 1.1)]
    if traces[0.9].reached == "arrivals scaled":
        assert len(set(gpus)) == 1
        assert traces[0.7].horizon > traces[0.9].horizon > traces[1.1].horizon
    else:
        assert traces[0.9].reached == "cluster sized" and gpus[0] >= gpus[1] >= gpus[2]
        assert 0.5 < traces[0.9].arrival_scale < 2.0  # sizing did most of it


def test_the_load_felt_counts_a_long_job_only_inside_the_arrival_span() -> None:
    """One job of 100 GPU-days and nine short ones over an hour: the jobs' whole work over the span
    (the rule before) says the cluster is loaded 30 times over; what it feels is a tenth."""
    cluster = rack_cluster("t", 1, 2)  # 16 GPUs
    jobs = [Job("long", 0.0, 100 * 86400.0, 1, 1, 1000)]
    jobs += [Job(f"s{i}", 400.0 * (i + 1), 10.0, 1, 1, 1000) for i in range(9)]  # the span: 3,600 s
    assert offered_load(jobs, cluster.gpus) > 30
    # the long job for the whole span, eight short ones whole (the last arrives as the span ends)
    assert demand_load(jobs, cluster.gpus) == pytest.approx((3600 + 8 * 10) / (3600 * 16))
    # spreading arrivals never raises it; squeezing them never lowers it
    loads = [demand_load(jobs, cluster.gpus, f) for f in (0.02, 0.1, 1.0, 10.0, 100.0)]
    assert loads == sorted(loads, reverse=True)
    with pytest.raises(LoadRefused, match="on 16 GPUs the jobs feel at most 14%.*smaller cluster"):
        scaled("t", cluster, jobs, "test", load=0.9)  # ten 1-GPU jobs never fill 16 GPUs


def test_a_load_that_cannot_be_offered_is_refused_with_the_reason() -> None:
    cluster = rack_cluster("t", 1, 2)
    at_once = [Job(f"j{i}", 100.0, 3600.0, 1, 1, 1000) for i in range(3)]
    with pytest.raises(LoadRefused, match="at one instant"):
        scaled("t", cluster, at_once, "test")
    tiny = [Job("a", 0.0, 1.0, 1, 1, 1000), Job("b", 10_000.0, 1.0, 1, 1, 1000)]  # 2 GPU-seconds
    with pytest.raises(LoadRefused, match="feel at most"):
        scaled("t", cluster, tiny, "test")
    sizing = Sizing("t", 2, max_nodes=4)
    with pytest.raises(LoadRefused, match="no cluster of 2 racks of 1-4 8-GPU nodes.*holds its largest job"):
        scaled("t", sizing, [Job("huge", 0.0, 60.0, 80, 1, 1000), Job("b", 100.0, 60.0, 1, 1, 1000)], "test")


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


def _case(trace: str, phalanx_wait: float, baseline_wait: float, waited: int) -> list[dict]:
    rows = []
    for policy in (*BASELINES, "phalanx"):
        wait = phalanx_wait if policy == "phalanx" else baseline_wait
        rows.append(dict(trace=trace, label=trace, load=0.9, policy=policy, completed=10, jobs=10,
                         wait_p95_s=wait, waited_gangs=0 if policy == "phalanx" else waited,
                         waiting_share=0.5 if waited else 0.0, waiting_over_capacity=0.2 if waited else 0.0,
                         load_measured=0.9, load_reached="cluster sized", cluster="c"))
    return rows


def test_a_case_no_baseline_waited_on_is_no_contention_never_a_tie() -> None:
    """Every policy at p95 wait 0 on an idle cluster compares nothing: no verdict, left out of the
    count, which says how many it left out; a contended case is better, tie or worse."""
    rows = (_case("idle", 0.0, 0.0, waited=0) + _case("tied", 1000.0, 1020.0, waited=3)
            + _case("won", 100.0, 5000.0, waited=3) + _case("lost", 5000.0, 100.0, waited=3))
    judged = {v["trace"]: v for v in verdicts(rows)}
    assert {t: v["verdict"] for t, v in judged.items()} == {
        "idle": NO_CONTENTION, "tied": "tie", "won": "better", "lost": "worse"}
    assert judged["won"]["contention"]["waited_gangs"] == 3 and judged["idle"]["contention"]["waiting_share"] == 0
    assert tally(list(judged.values())) == "1 better, 1 tie, 1 worse over 3 contended cases (1 without contention " \
                                          "left out)"


def test_contention_is_measured_from_the_waits_of_the_run() -> None:
    trace = SLICES["tiresias"](load=1.1)
    sim = Simulation(trace.cluster, trace.jobs, all_policies()[2], trace.end).run()  # upstream-1.37
    row = summarize(trace, sim, shared_bound(trace, PackingBound(trace.cluster, trace.jobs, deterministic_time=0.05)))
    wait, _, _, _ = censored(sim)
    assert row["waited_gangs"] == int((wait > 0).sum()) > 0  # a sized cluster at 110%: gangs wait
    assert 0 < row["waiting_share"] <= 1 and row["waiting_over_capacity"] > 0
    assert all(s.waiting >= 0 for s in sim.samples)
