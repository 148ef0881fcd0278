"""``phalanx bench trace``: gang + topology scheduling on real traces, every policy on the same
simulated cluster and the same arrivals, in one run.

Traces, clusters and every derivation (synthesized racks, the load felt and how it is reached,
drawn priorities, declared durations) are in :mod:`bench.traces`; the simulator in
:mod:`bench.trace_sim`; the policies in :mod:`bench.trace_policies` (phalanx's queue policies are
:mod:`cycle.queue`, the live cycle's code); the shared bound in :mod:`bench.trace_bound`.

Per workload (Acme, Pollux w1, Tiresias, the synthetic mix) and load (70, 90, 110% felt): every
policy, one row each, with how contended the run was (gangs that waited, the share of the span
some gang waited, the mean GPUs waiting over the cluster's). A case where no baseline's gangs
waited is "no contention": it gets no verdict and is left out of every count (:func:`verdict`).
At 90%: the ablations (one queue policy off, other hold thresholds) and a sensitivity run of
phalanx and the best baseline over checkpoint intervals, priority shares and no duration hints.
Waits and JCTs include gangs that never started / never finished, censored at the horizon
(counted). Decision time is per gang placement attempt, for every policy alike.

A second part, the *scaling study*, times one placement call per policy on the synthetic clusters
of :mod:`bench.generate` (500 to 20,000 nodes, racks of 100 nodes, 60% filled, gangs of 1-GPU
pods, 4 to 1,000 pods; the rack as required key when the gang fits in a rack's GPUs, else the zone).

Output beside ``--json`` (default ``bench/results/trace[-quick].json``): the JSON, a markdown
table (same stem, ``.md``) and, when matplotlib is installed, PNG plots (allocation over time
against the bound, wait CDF including never-started gangs, lost work, decision time vs cluster
size). The targets are evaluated from the measured numbers and reported as met or missed; nothing
is tuned to meet them.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Callable

import numpy as np

from cluster.names import LABEL_RACK, LABEL_ZONE
from solver import SolveOptions, assert_placement_valid, place

from .baselines import upstream_style
from .generate import filled_snapshot, gpu_cluster, gpu_gang
from .trace_bound import Bound, PackingBound, shared_bound
from .trace_policies import Phalanx, ablations, all_policies, kueue_policy, kueue_tas, tightest_node
from .trace_sim import Simulation
from .traces import (
    HIGH_PRIORITY,
    HIGH_SHARE,
    LOAD_TOLERANCE,
    RUN_SPANS,
    Cluster,
    LoadRefused,
    Trace,
    acme,
    assumptions,
    data_dir,
    given,
    pollux,
    synthetic,
    tiresias,
)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ALL = (0, None)
#: Quick mode: windows of each workload, 90% load only, no sensitivity run.
QUICK = dict(acme=(120, 200), pollux=(0, 80), tiresias=ALL, synthetic=120, loads=(0.9,), extra=False,
             sizes=(500, 5_000), gangs=(4, 64, 1_000), seeds=1)
FULL = dict(acme=ALL, pollux=ALL, tiresias=ALL, synthetic=400, loads=(0.9, 0.7, 1.1), extra=True,
            sizes=(500, 2_000, 5_000, 10_000, 20_000), gangs=(4, 64, 256, 1_000), seeds=2)
SCALING_FILL = 0.6
RACK_GPUS = 800
BASELINES = ("pod-by-pod", "permit-barrier", "upstream-1.37", "kueue-tas")
#: gang policies the shared bound holds for (pod-by-pod's partial gangs are not gangs)
BOUNDED = ("permit-barrier", "upstream-1.37", "kueue-tas", "phalanx-greedy")
CHECKPOINTS = (0.0, 1800.0, 7200.0)
SHARES = (0.1, 0.4)


def workloads(params: dict) -> list[tuple[str, Callable[..., Trace]]]:
    """The traces of a run by name, each made at a load (``maker(load=...)``, other options of
    :func:`bench.traces.scaled` too): a trace given by path (``params["given"]``: path, cluster)
    alone, else the shipped workloads."""
    if params.get("given"):
        path, cluster = params["given"]
        return [(path.stem, lambda **kw: given(path, cluster, **kw))]
    data = data_dir()
    return [("acme-kalos", lambda **kw: acme(data, window=params["acme"], **kw)),
            ("pollux-w1", lambda **kw: pollux(data, 1, window=params["pollux"], **kw)),
            ("tiresias-60", lambda **kw: tiresias(data, window=params["tiresias"], **kw)),
            ("synthetic-mix", lambda **kw: synthetic(data, jobs=params["synthetic"], **kw))]


# -- one simulation -> one row ----------------------------------------------------------------------
def _integral(times: np.ndarray, values: np.ndarray, start: float, end: float) -> float:
    """Integral over [start, end] of the step function that takes values[k] from times[k] on."""
    if end <= start or not len(times):
        return 0.0
    edges = np.clip(np.append(times, end), start, end)
    return float(np.sum(values * np.diff(edges)))


def censored(sim: Simulation) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Waits (to the first start) and JCTs of every gang, censored at the run's end; how many were."""
    h = sim.horizon
    gangs = list(sim.gangs.values())
    wait = np.array([(g.first_started if g.first_started is not None else h) - g.job.arrival for g in gangs])
    jct = np.array([(g.finished if g.finished is not None else h) - g.job.arrival for g in gangs])
    return wait, jct, sum(g.first_started is None for g in gangs), sum(g.finished is None for g in gangs)


def _p95(values: np.ndarray) -> float | None:
    return _r(np.percentile(values, 95)) if len(values) else None


def summarize(trace: Trace, sim: Simulation, bound: Bound, label: str = "") -> dict:
    gangs = list(sim.gangs.values())
    h = trace.horizon  # allocation and the bound: over the arrival span
    cap = sim.capacity
    t = np.array([s.time for s in sim.samples])
    held = _integral(t, np.array([s.held for s in sim.samples]), 0, h)
    running = _integral(t, np.array([s.running for s in sim.samples]), 0, h)
    stranded = _integral(t, np.array([s.stranded for s in sim.samples]), 0, h) / max(h, 1e-9)
    useful = running - sim.lost_gpu_s
    wait, jct, never, unfinished = censored(sim)
    waiting = np.array([s.waiting for s in sim.samples])
    high = np.array([g.job.priority > 0 for g in gangs], dtype=bool)
    ms = np.array(sim.decisions_ms) if sim.decisions_ms else np.zeros(1)
    multi = [g.single_rack for g in gangs if g.single_rack is not None and g.job.pods > 1]
    row = dict(
        trace=trace.name, load=trace.load, label=label or trace.name, cluster=trace.cluster.name,
        nodes=len(trace.cluster.nodes), gpus=cap, policy=sim.policy.name, jobs=len(gangs),
        horizon_s=round(h, 1), end_s=round(sim.horizon, 1), checkpoint_s=sim.checkpoint_s,
        completed=sum(g.finished is not None for g in gangs), never_started=never, unfinished=unfinished,
        completed_high=sum(g.finished is not None for g in gangs if g.job.priority > 0),
        jobs_high=int(high.sum()),
        wait_mean_s=_r(wait.mean()), wait_p95_s=_r(np.percentile(wait, 95)), wait_p99_s=_r(np.percentile(wait, 99)),
        wait_p95_high_s=_p95(wait[high]), wait_p95_low_s=_p95(wait[~high]),
        jct_mean_s=_r(jct.mean()), jct_p95_s=_r(np.percentile(jct, 95)),
        jct_p95_high_s=_p95(jct[high]), jct_p95_low_s=_p95(jct[~high]),
        load_measured=round(trace.measured_load, 4), load_native=round(trace.native_load, 4),
        load_reached=trace.reached, load_work=round(trace.work_load, 4),
        waited_gangs=int((wait > 0).sum()),
        waiting_share=round(_integral(t, (waiting > 0).astype(float), 0, h) / max(h, 1e-9), 4),
        waiting_over_capacity=round(_integral(t, waiting.astype(float), 0, h) / (max(h, 1e-9) * cap), 4),
        offered_in_window=round(bound.work / (h * cap), 4),
        alloc=round(held / (h * cap), 4), running=round(running / (h * cap), 4),
        useful=round(useful / (h * cap), 4), bound=round(bound.useful_gpu_s / (h * cap), 4),
        useful_vs_bound=round(useful / bound.useful_gpu_s, 4) if bound.useful_gpu_s else None,
        stranded_gpus_mean=round(stranded, 1),
        single_rack_share=round(float(np.mean(multi)), 4) if multi else None,
        partial_gangs=sum(g.was_partial for g in gangs),
        deadlocked_gangs=sum(bool(g.held) and g.started is None for g in gangs), stuck=sim.stuck,
        incomplete_gpu_hours=round(_integral(t, np.array([s.incomplete for s in sim.samples]), 0, h) / 3600, 1),
        preempted_units=sim.preempted_units, lost_gpu_hours=round(sim.lost_gpu_s / 3600, 1),
        decisions=len(sim.decisions_ms), decision_p50_ms=round(float(np.percentile(ms, 50)), 3),
        decision_p99_ms=round(float(np.percentile(ms, 99)), 3),
        decision_total_s=round((float(ms.sum()) + sim.overhead_ms) / 1000, 2),
        arrival_scale=round(trace.arrival_scale, 4), notes=trace.notes,
    )
    if isinstance(sim.policy, Phalanx):
        row["rounds_with_a_hold"] = sim.policy.held_rounds
    return row


def _r(x) -> float:
    return round(float(x), 1)


def _curve(sim: Simulation, horizon: float) -> dict:
    """Allocation and cumulative work over the arrival span (``horizon``), where the bound is; the
    waits of every job."""
    wait, _, never, _ = censored(sim)
    t = np.array([s.time for s in sim.samples])
    running = np.array([s.running for s in sim.samples])
    grid = np.linspace(0.0, horizon, 200)
    done = np.array([_integral(t, running, 0.0, g) for g in grid])  # GPU-seconds run by each grid time
    return dict(t=[round(s.time, 1) for s in sim.samples], running=running.tolist(),
                capacity=sim.capacity, horizon=horizon, wait=sorted(round(float(w), 1) for w in wait),
                never=never, grid=grid.tolist(), done=done.tolist(), lost=sim.lost_gpu_s)


def simulate(trace: Trace, policy, bound: Bound, checkpoint_s: float = 0.0, label: str = "") -> tuple[dict, dict]:
    started = time.perf_counter()
    sim = Simulation(trace.cluster, trace.jobs, policy, trace.end, checkpoint_s).run()
    row = summarize(trace, sim, bound, label)
    row["sim_wall_s"] = round(time.perf_counter() - started, 2)
    return row, _curve(sim, trace.horizon)


def run_traces(params: dict, progress=print, refused: list[str] | None = None) -> tuple[list[dict], dict]:
    """Every policy on every trace at every load; a load a trace cannot be run at is skipped and its
    reason appended to ``refused``."""
    rows, curves = [], {}
    packings: dict[str, PackingBound] = {}
    for load in params["loads"]:
        for _, make in workloads(params):
            try:
                trace = make(load=load)
            except LoadRefused as err:
                progress(f"refused: {err}")
                if refused is not None:
                    refused.append(str(err))
                continue
            key = f"{trace.name} on {trace.cluster.name}"  # a sized cluster differs per load
            packing = packings.get(key) or packings.setdefault(key, PackingBound(trace.cluster, trace.jobs))
            bound = shared_bound(trace, packing)
            grid = np.linspace(0.0, trace.horizon, 200)
            curves[(trace.name, load, "bound")] = dict(t=bound.times.tolist(), gpus=bound.gpus.tolist(),
                                                       grid=grid.tolist(),
                                                       cumulative=bound.cumulative(trace.jobs, grid).tolist())
            wide = params["extra"] and load == 0.9 and trace.name not in params.get("narrow", ())
            extra = ablations() if wide else []
            for policy in all_policies() + extra:
                row, curve = simulate(trace, policy, bound)
                rows.append(row)
                curves[(trace.name, load, policy.name)] = curve
                progress(_line(row))
            if wide:
                rows += sensitivity(trace, make, packing, progress)
    return rows, curves


def sensitivity(trace: Trace, make: Callable[..., Trace], packing: PackingBound, progress) -> list[dict]:
    """phalanx and kueue-tas over checkpoint intervals, priority shares and no hints (90% load);
    ``make`` makes ``trace`` with another assumption."""
    rows = []
    variants = [(f"checkpoint {c / 60:.0f} min", trace, c) for c in CHECKPOINTS[1:]]
    variants += [(f"{share:.0%} high priority", make(load=trace.load, high_share=share), 0.0) for share in SHARES]
    variants.append(("no duration hints", make(load=trace.load, hints=False), 0.0))
    for label, variant, checkpoint in variants:
        bound = shared_bound(variant, packing)
        for policy in (Phalanx(), kueue_policy()):
            row, _ = simulate(variant, policy, bound, checkpoint, label=label)
            rows.append(row)
            progress(_line(row))
    return rows


def _line(r: dict) -> str:
    return (f"{r['label']:<22} {r['load']:.0%} {r['policy']:<26} done {r['completed']:>3}/{r['jobs']} "
            f"never {r['never_started']:>3}  wait p95 {r['wait_p95_s']:>9.0f}  useful {r['useful']:.3f} "
            f"(÷bound {_ratio(r['useful_vs_bound'])})  lost {r['lost_gpu_hours']} GPU-h  "
            f"partial {r['partial_gangs']}  {r['sim_wall_s']} s")


# -- the scaling study -----------------------------------------------------------------------------
def _pod_by_pod(snapshot, group, same_domain: bool) -> dict[str, str]:
    free = snapshot.free.copy()
    vec = snapshot.request_vector(group.members[0].spec.requests)[0]
    gpu = snapshot.rindex["nvidia.com/gpu"]
    values = snapshot.label_values(group.topology_key) if same_domain and group.topology_key else None
    out, first = {}, None
    for pod in group.pending:
        allowed = values == values[first] if values is not None and first is not None else None
        i = tightest_node(free, vec, gpu, allowed)
        if i is None:
            break
        first = i if first is None else first
        free[i] -= vec
        out[pod.uid] = snapshot.nodes[i].name
    return out


SCALING_CALLS = {
    "pod-by-pod": lambda s, g: _pod_by_pod(s, g, same_domain=False),
    "permit-barrier": lambda s, g: _pod_by_pod(s, g, same_domain=True),
    "upstream-1.37": lambda s, g: upstream_style(s, g).assignments,
    "kueue-tas": kueue_tas,
    "phalanx-greedy": lambda s, g: place(s, g, SolveOptions(path="greedy")).assignments,
    "phalanx-exact": lambda s, g: place(s, g, SolveOptions()).assignments,
}


def run_scaling(params: dict, progress=print) -> list[dict]:
    rows = []
    for nodes in params["sizes"]:
        base = gpu_cluster(nodes)
        for gang in params["gangs"]:
            key = LABEL_RACK if gang <= RACK_GPUS else LABEL_ZONE
            times: dict[str, list[float]] = {name: [] for name in SCALING_CALLS}
            placed: dict[str, int] = {name: 0 for name in SCALING_CALLS}
            for seed in range(params["seeds"]):
                snapshot = filled_snapshot(base, SCALING_FILL, seed)
                group = gpu_gang(f"s{gang}-{seed}", gang, 1, key)
                snapshot.free, snapshot.domains(key), snapshot.eligibility(group.members[0].spec)
                for name, call in SCALING_CALLS.items():
                    started = time.perf_counter()
                    assignments = call(snapshot, group)
                    times[name].append((time.perf_counter() - started) * 1000.0)
                    if assignments and name not in ("pod-by-pod", "permit-barrier"):
                        assert_placement_valid(snapshot, group, assignments)
                    placed[name] += len(assignments) == gang
            for name, ms in times.items():
                rows.append(dict(nodes=nodes, gang=gang, key=key, policy=name, instances=len(ms),
                                 p50_ms=round(float(np.median(ms)), 3), max_ms=round(max(ms), 3),
                                 placed_rate=round(placed[name] / len(ms), 3)))
                progress(f"scaling {nodes:>6} nodes gang {gang:>4} {name:<15} p50 {rows[-1]['p50_ms']:>9.2f} ms")
    return rows


# -- targets, tables, plots --------------------------------------------------------------------------
def main_rows(rows: list[dict], load: float) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r["load"] == load and r["label"] == r["trace"]:
            out.setdefault(r["trace"], {})[r["policy"]] = r
    return out


#: p95 waits this close count as equal in the targets (see :func:`no_worse`)
WAIT_TIE_S = 60.0
WAIT_TIE_SHARE = 0.05


def no_worse(mine: float, best: float) -> bool:
    """A p95 wait no worse than ``best`` beyond a tie (:data:`WAIT_TIE_S` or :data:`WAIT_TIE_SHARE`)."""
    return mine <= best + max(WAIT_TIE_S, WAIT_TIE_SHARE * best)


NO_CONTENTION = "no contention"


def contention(by: dict[str, dict]) -> dict:
    """How contended a case (one workload at one load) was under the baselines: whether any
    baseline's gangs waited at all, and under the best baseline (the shortest all-jobs p95 wait,
    then the most completed) how many gangs waited, the share of the arrival span some gang waited
    and the mean GPUs waiting over the cluster's."""
    best = min(BASELINES, key=lambda b: (by[b]["wait_p95_s"], -by[b]["completed"], b))
    row = by[best]
    return dict(contended=any(by[b]["waited_gangs"] > 0 for b in BASELINES), best=best,
                waited_gangs=row["waited_gangs"], jobs=row["jobs"], waiting_share=row["waiting_share"],
                waiting_over_capacity=row["waiting_over_capacity"])


def best_baseline(by: dict[str, dict]) -> tuple[int, float]:
    """The best of the baselines on each measure alone: the most completed gangs, the shortest
    all-jobs p95 wait."""
    return max(by[b]["completed"] for b in BASELINES), min(by[b]["wait_p95_s"] for b in BASELINES)


def verdict(by: dict[str, dict]) -> str:
    """Default phalanx against the best baseline on each of completed gangs and all-jobs p95 wait:
    ``better``, ``tie`` (within :func:`no_worse` both ways), ``worse`` — or :data:`NO_CONTENTION`
    where no baseline's gangs waited (nothing was compared)."""
    if not contention(by)["contended"]:
        return NO_CONTENTION
    ph = by["phalanx"]
    done, wait = best_baseline(by)
    if ph["completed"] < done or not no_worse(ph["wait_p95_s"], wait):
        return "worse"
    return "better" if ph["completed"] > done or not no_worse(wait, ph["wait_p95_s"]) else "tie"


def verdicts(rows: list[dict]) -> list[dict]:
    """One entry per workload and load of the main tables: its contention and its verdict."""
    out = []
    for load in sorted({r["load"] for r in rows}):
        for trace, by in main_rows(rows, load).items():
            ph = by["phalanx"]
            best = contention(by)
            out.append(dict(trace=trace, load=load, load_measured=ph["load_measured"], reached=ph["load_reached"],
                            cluster=ph["cluster"], contention=best, verdict=verdict(by),
                            phalanx=(ph["completed"], ph["wait_p95_s"]),
                            best_baseline=best_baseline(by)))
    return out


def tally(judged: list[dict]) -> str:
    """better / tie / worse over the contended cases, and how many were left out."""
    kept = [v for v in judged if v["verdict"] != NO_CONTENTION]
    counts = {k: sum(v["verdict"] == k for v in kept) for k in ("better", "tie", "worse")}
    return (f"{counts['better']} better, {counts['tie']} tie, {counts['worse']} worse over {len(kept)} contended "
            f"cases ({len(judged) - len(kept)} without contention left out)")


def targets(rows: list[dict], scaling: list[dict]) -> list[dict]:
    out = []
    for load in sorted({r["load"] for r in rows}):
        for trace, by in main_rows(rows, load).items():
            off = max(abs(r["load_measured"] - load) for r in by.values())
            out.append(dict(target="load felt within 1 point of the one asked", trace=f"{trace} at {load:.0%}",
                            measured=f"{by['phalanx']['load_measured']:.1%} ({by['phalanx']['load_reached']})",
                            met=off <= LOAD_TOLERANCE))
            busy = contention(by)
            if load >= 0.7:
                out.append(dict(target="gangs wait under the best baseline (the load is felt)",
                                trace=f"{trace} at {load:.0%}",
                                measured=f"{busy['best']}: {busy['waited_gangs']} of {busy['jobs']} gangs waited, "
                                         f"some gang waiting {busy['waiting_share']:.0%} of the span",
                                met=busy["waited_gangs"] > 0))
            if not busy["contended"]:
                continue  # nothing to compare: no verdict on this case
            ph = by["phalanx"]
            best_done, best_wait = best_baseline(by)
            out.append(dict(target="default phalanx never worse than the best baseline on completed gangs and "
                                   "all-jobs p95 wait", trace=f"{trace} at {load:.0%}",
                            measured=dict(phalanx=(ph["completed"], ph["wait_p95_s"]),
                                          best_baseline=(best_done, best_wait)),
                            met=ph["completed"] >= best_done and no_worse(ph["wait_p95_s"], best_wait)))
            high = [by[b]["wait_p95_high_s"] for b in BASELINES if by[b]["wait_p95_high_s"] is not None]
            low = [by[b]["wait_p95_low_s"] for b in BASELINES if by[b]["wait_p95_low_s"] is not None]
            if high and low and ph["wait_p95_high_s"] is not None:
                out.append(dict(target="what preemption buys (high-priority p95 wait) and costs (low-priority p95 "
                                       "wait), against the best baseline on each", trace=f"{trace} at {load:.0%}",
                                measured=dict(high=(ph["wait_p95_high_s"], min(high)),
                                              low=(ph["wait_p95_low_s"], min(low))),
                                met=no_worse(ph["wait_p95_high_s"], min(high))))
    cases = [g for g in out if g["target"].startswith("default phalanx never worse")]
    every = len({(r["trace"], r["load"]) for r in rows if r["label"] == r["trace"]})
    out.append(dict(target="default phalanx never worse than the best baseline, every contended workload and load",
                    trace="all", measured=f"{sum(g['met'] for g in cases)} of {len(cases)} contended "
                                          f"({every - len(cases)} without contention left out)",
                    met=all(g["met"] for g in cases)))
    for trace, by in main_rows(rows, 0.9).items():
        ph = by["phalanx"]
        partial = {p: by[p]["partial_gangs"] for p in by if p.startswith("phalanx")}
        out.append(dict(target="zero partial gangs (phalanx)", trace=trace, measured=partial,
                        met=all(v == 0 for v in partial.values())))
        out.append(dict(target="phalanx useful allocation within 3% of the shared bound (90%)", trace=trace,
                        measured=ph["useful_vs_bound"], met=(ph["useful_vs_bound"] or 0) >= 0.97))
        out.append(dict(target="GPU-hours lost to preemption reported", trace=trace,
                        measured=ph["lost_gpu_hours"], met=True))
    for nodes in sorted({r["nodes"] for r in scaling if r["nodes"] >= 5_000}):
        for gang in sorted({r["gang"] for r in scaling}):
            cell = {r["policy"]: r["p50_ms"] for r in scaling if r["nodes"] == nodes and r["gang"] == gang}
            out.append(dict(target="exact decision time below upstream-style at >= 5,000 nodes",
                            trace=f"{nodes} nodes, gang {gang}",
                            measured=dict(exact=cell["phalanx-exact"], greedy=cell["phalanx-greedy"],
                                          upstream=cell["upstream-1.37"]),
                            met=cell["phalanx-exact"] < cell["upstream-1.37"]))
    return out


HEADER = ("| policy | done / never started / unfinished | gangs waited, span waiting, waiting GPUs ÷ GPUs "
          "| wait mean / p95 s (censored) "
          "| wait p95 high / low s | JCT mean / p95 s (censored) | JCT p95 high / low s "
          "| alloc / useful (÷ bound) | stranded GPUs | one rack | partial | preempted / GPU-h lost "
          "| decisions, p50 / p99 ms, total s |")


SEPARATOR = "|---" * 13 + "|"


def _s(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def _row_md(r: dict, name: str = "") -> str:
    rack = f"{r['single_rack_share']:.0%}" if r["single_rack_share"] is not None else "-"
    return (f"| {name or r['policy']} | {r['completed']} / {r['never_started']} / {r['unfinished']} "
            f"| {r['waited_gangs']}, {r['waiting_share']:.0%}, {r['waiting_over_capacity']:.2f} "
            f"| {r['wait_mean_s']:.0f} / {r['wait_p95_s']:.0f} "
            f"| {_s(r['wait_p95_high_s'])} / {_s(r['wait_p95_low_s'])} "
            f"| {r['jct_mean_s']:.0f} / {r['jct_p95_s']:.0f} | {_s(r['jct_p95_high_s'])} / {_s(r['jct_p95_low_s'])} "
            f"| {r['alloc']:.1%} / {r['useful']:.1%} ({_ratio(r['useful_vs_bound'])}) | {r['stranded_gpus_mean']:.1f} "
            f"| {rack} | {r['partial_gangs']} | {r['preempted_units']} / {r['lost_gpu_hours']} "
            f"| {r['decisions']}, {r['decision_p50_ms']:.2f} / {r['decision_p99_ms']:.2f}, "
            f"{r['decision_total_s']:.1f} |")


def markdown(rows: list[dict], scaling: list[dict], goals: list[dict], wall_s: float,
             refused: list[str] | None = None) -> str:
    out = [f"Run wall time {wall_s:.0f} s. The load is the one the cluster feels: the GPUs the arrived jobs would "
           "hold if each started on arrival, averaged over the arrival span, over the cluster's GPUs (asked and "
           "measured, per table), reached by sizing the cluster (Pollux, Tiresias) or by scaling arrivals (Acme on "
           f"PAI's machines, the synthetic mix), as each table says; each run goes past the last arrival until every "
           f"job finished or {RUN_SPANS:.0f} arrival spans. Waits and JCTs count every gang, high (priority "
           f"{HIGH_PRIORITY}) and low (0) apart too: one that never started (or never finished) is censored at the "
           "run's end. Allocation and contention are over the arrival span. Decision time is per gang placement "
           "attempt. ÷ bound: useful GPU-seconds in the arrival span (running, minus work lost to preemption) over "
           "the shared bound min(integral of P(t), W) of bench/trace_bound.py (not a bound for pod-by-pod). "
           f"A case where no baseline's gangs waited is '{NO_CONTENTION}': it compares nothing, gets no verdict "
           "and is left out of the counts.", ""]
    judged = verdicts(rows)
    if judged:
        out += [f"**Verdicts**: {tally(judged)}. Contention under the best baseline: gangs that waited, the share "
                "of the arrival span some gang waited, the mean GPUs waiting over the cluster's.", "",
                "| workload | load (felt) | reached by | cluster | best baseline | contention | best baseline: done "
                "/ p95 wait s | phalanx: done / p95 wait s | verdict |", "|---" * 9 + "|"]
        for v in judged:
            c = v["contention"]
            out.append(f"| {v['trace']} | {v['load']:.0%} ({v['load_measured']:.1%}) | {v['reached']} "
                       f"| {v['cluster']} | {c['best']} | {c['waited_gangs']} of {c['jobs']}, "
                       f"{c['waiting_share']:.0%}, {c['waiting_over_capacity']:.2f} "
                       f"| {v['best_baseline'][0]} / {v['best_baseline'][1]:,.0f} "
                       f"| {v['phalanx'][0]} / {v['phalanx'][1]:,.0f} | {v['verdict']} |")
        out.append("")
    if refused:
        out += ["Refused (not run):", ""] + [f"- {why}" for why in refused] + [""]
    for load in sorted({r["load"] for r in rows}):
        for trace, by in main_rows(rows, load).items():
            first = next(iter(by.values()))
            out += [f"**{trace} at {load:.0%}** ({first['jobs']} gangs, {first['jobs_high']} high priority, "
                    f"{first['cluster']}: {first['nodes']} nodes, {first['gpus']} GPUs; arrival span "
                    f"{first['horizon_s']:.0f} s, run to {first['end_s']:.0f} s at most; load felt "
                    f"{first['load_measured']:.1%} ({first['load_reached']}; at the trace's own arrivals "
                    f"{first['load_native']:.1%}; the jobs' work over the span {first['load_work']:.1%}), bound "
                    f"{first['bound']:.1%}). Assumptions: "
                    f"{assumptions(load)}; {first['notes']}.", "", HEADER, SEPARATOR]
            out += [_row_md(r) for r in by.values()]
            extra = [r for r in rows if r["load"] == load and r["trace"] == trace and r["label"] != trace]
            if extra:
                out += ["", f"Sensitivity ({trace}, {load:.0%}; one assumption changed per row):", "",
                        HEADER.replace("| policy |", "| variant, policy |"), SEPARATOR]
                out += [_row_md(r, f"{r['label']}, {r['policy']}") for r in extra]
            out.append("")
    policies = list(SCALING_CALLS)
    if scaling:
        out += ["**Decision time per gang, p50 ms** (synthetic clusters of bench/generate.py, racks of 100 nodes, "
                f"{SCALING_FILL:.0%} filled, 1-GPU pods)", "",
                "| nodes | gang | " + " | ".join(policies) + " |", "|---|---|" + "---|" * len(policies)]
        for nodes, gang in sorted({(r["nodes"], r["gang"]) for r in scaling}):
            cell = {r["policy"]: r["p50_ms"] for r in scaling if r["nodes"] == nodes and r["gang"] == gang}
            out.append(f"| {nodes:,} | {gang} | " + " | ".join(f"{cell[p]:.2f}" for p in policies) + " |")
        out.append("")
    out += [f"**Targets** (measured, not tuned; a p95 wait within {WAIT_TIE_S:.0f} s or {WAIT_TIE_SHARE:.0%} of "
            "another is a tie: the simulation is exact, but a tie-break between equal placements moves single "
            "gangs by that much)", "", "| target | case | met | measured |", "|---|---|---|---|"]
    for g in goals:
        out.append(f"| {g['target']} | {g['trace']} | {'yes' if g['met'] else 'NO'} | {g['measured']} |")
    return "\n".join(out)


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


SHOWN = ("pod-by-pod", "permit-barrier", "upstream-1.37", "kueue-tas", "phalanx", "phalanx-no-queue-policy",
         "phalanx-no-preemption")


def plots(stem: pathlib.Path, curves: dict, rows: list[dict], scaling: list[dict]) -> list[str]:
    """PNG plots beside the JSON; skipped (with a note) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots written (the JSON and markdown are)")
        return []
    written: list[str] = []
    if not curves:  # every load refused: nothing was run
        return written
    load = 0.9 if any(k[1] == 0.9 for k in curves) else next(iter(curves))[1]
    names = list(dict.fromkeys(k[0] for k in curves if k[1] == load))
    for what in ("allocation", "cumulative", "wait-cdf"):
        fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4), squeeze=False)
        for ax, trace in zip(axes[0], names, strict=False):
            for policy in SHOWN:
                c = curves.get((trace, load, policy))
                if c is None:
                    continue
                if what == "allocation":
                    ax.step(np.array(c["t"]) / 3600, np.array(c["running"]) / c["capacity"], where="post",
                            label=policy, lw=0.8)
                elif what == "cumulative":
                    ax.plot(np.array(c["grid"]) / 3600, np.array(c["done"]) / 3600, label=policy, lw=0.9)
                else:
                    wait = np.array(c["wait"]) / 3600
                    ax.step(wait, np.arange(1, len(wait) + 1) / len(wait), where="post",
                            label=f"{policy} ({c['never']} never started)", lw=0.9)
            if what == "allocation":
                b = curves[(trace, load, "bound")]
                cap = curves[(trace, load, "phalanx")]["capacity"]
                ax.step(np.array(b["t"]) / 3600, np.array(b["gpus"]) / cap, where="post", color="black",
                        ls="--", label="bound P(t)")
                ax.set_xlabel("simulated hours"), ax.set_ylabel("GPUs of running gangs (share)")
            elif what == "cumulative":
                b = curves[(trace, load, "bound")]
                ax.plot(np.array(b["grid"]) / 3600, np.array(b["cumulative"]) / 3600, color="black", ls="--",
                        label="shared bound (useful work)")
                ax.set_xlabel("simulated hours"), ax.set_ylabel("GPU-hours run by gangs (cumulative)")
            else:
                ax.set_xscale("symlog", linthresh=0.01), ax.set_xlabel("wait, hours (never started: censored at the "
                                                                       "horizon)"), ax.set_ylabel("CDF")
            ax.set_title(f"{trace}, {load:.0%} load (simulated)")
        written.append(_save(plt, fig, axes, stem, what))
    lost = [r for r in rows if r["policy"] == "phalanx" and r["load"] == load]
    if lost:
        fig, axes = plt.subplots(1, 1, figsize=(9, 4), squeeze=False)
        lost = [r for r in lost if r["label"] == r["trace"] or r["checkpoint_s"]]
        labels = [f"{r['trace']}\n" + (f"ckpt {r['checkpoint_s'] / 60:.0f} min" if r["checkpoint_s"] else "no ckpt")
                  for r in lost]
        values = [r["lost_gpu_hours"] for r in lost]
        axes[0][0].bar(range(len(values)), values, label="phalanx: GPU-hours lost to preemption")
        axes[0][0].set_xticks(range(len(values)), labels, fontsize=6, rotation=60)
        axes[0][0].set_ylabel("GPU-hours lost")
        written.append(_save(plt, fig, axes, stem, "lost-work"))
    gangs = sorted({r["gang"] for r in scaling})
    if not gangs:  # no scaling study in this run (a trace given by path)
        return written
    fig, axes = plt.subplots(1, len(gangs), figsize=(4.5 * len(gangs), 4), squeeze=False)
    for ax, gang in zip(axes[0], gangs, strict=False):
        for policy in SCALING_CALLS:
            sel = sorted((r["nodes"], r["p50_ms"]) for r in scaling if r["gang"] == gang and r["policy"] == policy)
            ax.plot([n for n, _ in sel], [m for _, m in sel], marker="o", label=policy)
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_title(f"gang of {gang} (synthetic racks)"), ax.set_xlabel("nodes"), ax.set_ylabel("p50 ms per gang")
    written.append(_save(plt, fig, axes, stem, "decision-time"))
    return written


def _recorded(params: dict) -> dict:
    """The run's parameters as the JSON keeps them: a given trace by its file name and its cluster
    by name (or "sized"), never a path of the machine that ran it."""
    out = dict(params)
    if params.get("given"):
        path, cluster = params["given"]
        out["given"] = dict(trace=path.name, cluster=cluster.name if cluster is not None else "sized")
    return out


def _save(plt, fig, axes, stem: pathlib.Path, what: str) -> str:
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = stem.with_name(f"{stem.name}-{what}.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path.name


def main(quick: bool, json_path: str | None, seeds: int | None = None, params: dict | None = None,
         trace: pathlib.Path | None = None, cluster: Cluster | None = None) -> int:
    """``trace``/``cluster``: replay that trace on that cluster (None: racks sized to each load)
    instead of the shipped workloads (all
    policies at 70, 90 and 110%, no ablations, no scaling study), results beside ``--json`` or in
    ``bench/results/trace-given-<stem>.json``."""
    params = dict(params or (QUICK if quick else FULL))
    if seeds:
        params["seeds"] = seeds
    if trace is not None:
        params.update(given=(trace, cluster), loads=FULL["loads"], extra=False, scaling=False)
    started = time.perf_counter()
    default = f"trace-given-{trace.stem}.json" if trace is not None else (
        "trace-quick.json" if quick else "trace.json")
    path = pathlib.Path(json_path) if json_path else RESULTS / default
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.with_suffix(".log")  # one line per simulation as it ends (the run takes minutes)
    log.write_text("")

    def progress(line: str) -> None:
        print(line, flush=True)
        with open(log, "a") as f:
            f.write(line + "\n")

    refused: list[str] = []
    rows, curves = run_traces(params, progress, refused)
    scaling = run_scaling(params) if params.get("scaling", True) else []
    goals = targets(rows, scaling)
    wall = time.perf_counter() - started
    table = markdown(rows, scaling, goals, wall, refused)
    print(table)
    stem = path.with_suffix("")
    pngs = plots(stem, curves, rows, scaling)
    path.write_text(json.dumps(dict(assumptions=assumptions(0.9, HIGH_SHARE), quick=quick, wall_s=round(wall, 1),
                                    params=_recorded(params), traces=rows, scaling=scaling,
                                    verdicts=verdicts(rows), targets=goals, refused=refused, plots=pngs),
                               indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(table + "\n")
    if not rows:
        print(f"phalanx bench trace: nothing run, every load was refused: {'; '.join(refused)}", file=sys.stderr)
        return 1
    return 0
