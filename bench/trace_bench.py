"""``phalanx bench trace``: gang + topology scheduling on real traces, every policy on the same
simulated cluster and the same arrivals, in one run.

Traces, clusters and every derivation (synthesized racks, Acme CPU cap, Pollux durations, arrival
scaling to 90% offered load, assigned priorities) are described in :mod:`bench.traces`; the
simulator in :mod:`bench.trace_sim`; the policies in :mod:`bench.trace_policies`. Quick mode runs
a window of the Acme trace (:data:`QUICK`), Pollux workload 1 and the Tiresias trace; the full run
all 319 Acme jobs and the Pollux workloads 1..``seeds`` (8 by default).

A second part, the *scaling study*, times one placement call per policy on the synthetic clusters
of :mod:`bench.generate` (500 to 20,000 nodes, racks of 100 nodes, 60% filled, gangs of 1-GPU
pods, 4 to 1,000 pods; the rack as required key when the gang fits in a rack's GPUs, else the zone).

Wall time on the 2-core development machine: quick about 25 s; full about 4 CPU-minutes (3 to
5.5 min wall), most of it the Permit barrier on the full Acme trace (its 60 s timeouts make tens of
thousands of rounds).

Output beside ``--json`` (default ``bench/results/trace[-quick].json``): the JSON, a markdown table
(same stem, ``.md``) and, when matplotlib is installed, PNG plots (allocation over time, JCT CDF,
decision time vs cluster size). The targets are evaluated from the measured numbers and reported
as met or missed; nothing is tuned to meet them.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from cluster.names import LABEL_RACK, LABEL_ZONE
from solver import SolveOptions, assert_placement_valid, place

from .baselines import upstream_style
from .generate import filled_snapshot, gpu_cluster, gpu_gang
from .trace_policies import PhalanxExact, all_policies, kueue_tas, tightest_node
from .trace_sim import Simulation
from .traces import SYNTHESIZED, Trace, acme, data_dir, pollux, tiresias

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
#: Quick mode: Acme jobs ``start:stop`` in arrival order (a busy window with 128-node gangs).
QUICK = dict(acme_jobs=(120, 240), pollux_workloads=1, sizes=(500, 5_000), gangs=(4, 64, 1_000), seeds=1)
FULL = dict(acme_jobs=(0, None), pollux_workloads=8, sizes=(500, 2_000, 5_000, 10_000, 20_000),
            gangs=(4, 64, 256, 1_000), seeds=3)
SCALING_FILL = 0.6
RACK_GPUS = 800
GANG_POLICIES = ("permit-barrier", "upstream-1.37", "kueue-tas", "phalanx-greedy", "phalanx-exact",
                 "phalanx-exact-no-preemption")
#: Policies that place whole gangs only, for which the per-round knapsack is an upper bound
#: (phalanx exact's preemption could in principle beat it; it is reported all the same).
ROUND_BOUNDED = ("upstream-1.37", "kueue-tas", "phalanx-greedy", "phalanx-exact", "phalanx-exact-no-preemption")
BASELINES = ("pod-by-pod", "permit-barrier", "upstream-1.37", "kueue-tas")


def traces(params: dict) -> list[Trace]:
    data = data_dir()
    start, stop = params["acme_jobs"]
    out = [acme(data, window=(start, stop))]
    out += [pollux(data, w) for w in range(1, params["pollux_workloads"] + 1)]
    out.append(tiresias(data))
    return out


# -- one simulation -> one row ----------------------------------------------------------------------
def _integral(times: np.ndarray, values: np.ndarray, start: float, end: float) -> float:
    """Integral over [start, end] of the step function that takes values[k] from times[k] on."""
    if end <= start:
        return 0.0
    edges = np.clip(np.append(times, end), start, end)
    return float(np.sum(values * np.diff(edges)))


def summarize(trace: Trace, sim: Simulation) -> dict:
    gangs = list(sim.gangs.values())
    window = max(j.arrival for j in trace.jobs)
    done = [g for g in gangs if g.finished is not None]
    jct = np.array([g.finished - g.job.arrival for g in done])
    wait = np.array([g.started - g.job.arrival for g in gangs if g.started is not None])
    t = np.array([s.time for s in sim.samples])
    held = np.array([s.held for s in sim.samples])
    end = max(t[-1], window) if len(t) else window
    span = max(window, 1e-9)
    cap = sim.capacity
    alloc = _integral(t, held, 0, window) / span / cap
    bound = _integral(t, np.array([s.bound for s in sim.samples]), 0, window) / span / cap
    free = cap - held
    stranded = _integral(t, np.array([s.stranded for s in sim.samples]), 0, window) / span
    multi = [g.single_rack for g in gangs if g.single_rack is not None and g.job.pods > 1]
    ms = np.array(sim.decisions_ms) if sim.decisions_ms else np.zeros(1)
    total_gpu_s = sum(j.gpu_seconds for j in trace.jobs)
    row = dict(
        trace=trace.name, cluster=trace.cluster.name, nodes=len(trace.cluster.nodes), gpus=cap,
        policy=sim.policy.name, jobs=len(gangs),
        completed=len(done), completed_in_window=sum(g.finished <= window for g in done),
        never_started=sum(g.started is None and g.finished is None for g in gangs),
        jct_mean_s=_r(jct.mean()) if len(jct) else None, jct_p95_s=_r(np.percentile(jct, 95)) if len(jct) else None,
        wait_mean_s=_r(wait.mean()) if len(wait) else None,
        wait_p95_s=_r(np.percentile(wait, 95)) if len(wait) else None,
        makespan_s=_r(max(g.finished for g in done)) if done else None,
        alloc_mean=round(alloc, 4), alloc_bound_mean=round(bound, 4),
        alloc_vs_round_bound=round(alloc / bound, 4) if bound and sim.policy.name in ROUND_BOUNDED else None,
        useful_alloc_mean=round(_integral(t, np.array([s.running for s in sim.samples]), 0, window) / span / cap, 4),
        stranded_gpus_mean=round(stranded, 1),
        stranded_share_of_free=round(stranded / max(_integral(t, free, 0, window) / span, 1e-9), 4),
        single_rack_share=round(float(np.mean(multi)), 4) if multi else None,
        partial_gangs=sum(g.was_partial for g in gangs),
        deadlocked_gangs=sum(bool(g.held) and g.started is None for g in gangs),
        stuck=sim.stuck,
        incomplete_gpu_hours=round(_integral(t, np.array([s.incomplete for s in sim.samples]), 0, end) / 3600, 1),
        preempted_units=sim.preempted_units, preempted_pods=sim.preempted_pods,
        decisions=len(sim.decisions_ms),
        decision_p50_ms=round(float(np.percentile(ms, 50)), 3),
        decision_p99_ms=round(float(np.percentile(ms, 99)), 3),
        lb_jct_mean_s=_r(np.mean([j.duration for j in trace.jobs])),
        lb_makespan_s=_r(max(total_gpu_s / cap, max(j.arrival + j.duration for j in trace.jobs))),
        arrival_scale=round(trace.arrival_scale, 4), notes=trace.notes,
    )
    if isinstance(sim.policy, PhalanxExact) and sim.policy.gaps:
        row["exact_placement_gap_mean"] = round(float(np.mean(sim.policy.gaps)), 5)
    return row


def _r(x) -> float:
    return round(float(x), 1)


def timeline(sim: Simulation) -> dict:
    return dict(t=[round(s.time, 1) for s in sim.samples], held=[s.held for s in sim.samples])


def run_traces(params: dict, progress=print) -> tuple[list[dict], dict]:
    rows, curves = [], {}
    for trace in traces(params):
        for policy in all_policies():
            started = time.perf_counter()
            sim = Simulation(trace.cluster, trace.jobs, policy).run()
            rows.append(summarize(trace, sim))
            rows[-1]["sim_wall_s"] = round(time.perf_counter() - started, 2)
            curves[(trace.name, policy.name)] = dict(
                timeline(sim), capacity=sim.capacity,
                jct=sorted(g.finished - g.job.arrival for g in sim.gangs.values() if g.finished is not None))
            progress(_line(rows[-1]))
    return rows, curves


def _line(r: dict) -> str:
    return (f"{r['trace']:<12} {r['policy']:<15} done {r['completed_in_window']:>3}/{r['jobs']} in window "
            f"({r['completed']} total)  wait p95 {r['wait_p95_s']}  alloc {r['alloc_mean']:.3f}  "
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
def targets(rows: list[dict], scaling: list[dict]) -> list[dict]:
    out = []
    for trace in sorted({r["trace"] for r in rows}):
        by = {r["policy"]: r for r in rows if r["trace"] == trace}
        exact = by["phalanx-exact"]
        out.append(dict(target="phalanx exact allocation within 2% of the per-round CP-SAT bound", trace=trace,
                        measured=exact["alloc_vs_round_bound"], met=(exact["alloc_vs_round_bound"] or 0) >= 0.98))
        if trace.startswith(("acme", "pollux")):
            more = all(exact["completed_in_window"] > by[b]["completed_in_window"] for b in BASELINES)
            lower = all((exact["wait_p95_s"] or 0) < (by[b]["wait_p95_s"] or 0) for b in BASELINES)
            out.append(dict(target="more gangs completed (in the arrival window) than every baseline", trace=trace,
                            measured={p: by[p]["completed_in_window"] for p in by}, met=more))
            out.append(dict(target="lower p95 queueing delay than every baseline", trace=trace,
                            measured={p: by[p]["wait_p95_s"] for p in by}, met=lower))
        partial = {p: by[p]["partial_gangs"] for p in GANG_POLICIES}
        out.append(dict(target="no partially placed gang for gang policies", trace=trace, measured=partial,
                        met=all(v == 0 for p, v in partial.items() if p != "permit-barrier"),
                        note="permit-barrier's partial gangs are reservations held at the barrier, not bound pods"))
    for nodes in sorted({r["nodes"] for r in scaling if r["nodes"] >= 5_000}):
        for gang in sorted({r["gang"] for r in scaling}):
            cell = {r["policy"]: r["p50_ms"] for r in scaling if r["nodes"] == nodes and r["gang"] == gang}
            out.append(dict(target="exact decision time below upstream-style at >= 5,000 nodes",
                            trace=f"{nodes} nodes, gang {gang}",
                            measured=dict(exact=cell["phalanx-exact"], greedy=cell["phalanx-greedy"],
                                          upstream=cell["upstream-1.37"]),
                            met=cell["phalanx-exact"] < cell["upstream-1.37"]))
    return out


def markdown(rows: list[dict], scaling: list[dict], goals: list[dict], wall_s: float) -> str:
    out = [f"Simulated; {SYNTHESIZED}. Run wall time {wall_s:.0f} s.", ""]
    for trace in sorted({r["trace"] for r in rows}, key=lambda t: [r["trace"] for r in rows].index(t)):
        sel = [r for r in rows if r["trace"] == trace]
        first = sel[0]
        out += [f"**{trace}** ({first['jobs']} gangs, {first['cluster']}: {first['nodes']} nodes, "
                f"{first['gpus']} GPUs; "
                f"{first['notes']}). Bounds: mean JCT >= {first['lb_jct_mean_s']:.0f} s, makespan >= "
                f"{first['lb_makespan_s']:.0f} s.", "",
                "| policy | done in window / total | JCT mean / p95 s | wait mean / p95 s | makespan s "
                "| alloc (÷ round bound) | stranded GPUs | one rack | partial / deadlocked | incomplete GPU-h "
                "| preempted units / pods | decision p50 / p99 ms |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sel:
            rack = f"{r['single_rack_share']:.0%}" if r["single_rack_share"] is not None else "-"
            out.append(
                f"| {r['policy']} | {r['completed_in_window']} / {r['completed']} "
                f"| {_n(r['jct_mean_s'])} / {_n(r['jct_p95_s'])} "
                f"| {_n(r['wait_mean_s'])} / {_n(r['wait_p95_s'])} | {_n(r['makespan_s'])} "
                f"| {r['alloc_mean']:.1%} ({_ratio(r['alloc_vs_round_bound'])}) "
                f"| {r['stranded_gpus_mean']:.1f} | {rack} "
                f"| {r['partial_gangs']} / {r['deadlocked_gangs']} | {r['incomplete_gpu_hours']} "
                f"| {r['preempted_units']} / {r['preempted_pods']} "
                f"| {r['decision_p50_ms']:.2f} / {r['decision_p99_ms']:.2f} |")
        out.append("")
    policies = list(SCALING_CALLS)
    out += ["**Decision time per gang, p50 ms** (synthetic clusters of bench/generate.py, racks of 100 nodes, "
            f"{SCALING_FILL:.0%} filled, 1-GPU pods)", "",
            "| nodes | gang | " + " | ".join(policies) + " |", "|---|---|" + "---|" * len(policies)]
    for nodes, gang in sorted({(r["nodes"], r["gang"]) for r in scaling}):
        cell = {r["policy"]: r["p50_ms"] for r in scaling if r["nodes"] == nodes and r["gang"] == gang}
        out.append(f"| {nodes:,} | {gang} | " + " | ".join(f"{cell[p]:.2f}" for p in policies) + " |")
    out += ["", "**Targets** (measured, not tuned)", "", "| target | case | met | measured |", "|---|---|---|---|"]
    for g in goals:
        out.append(f"| {g['target']} | {g['trace']} | {'yes' if g['met'] else 'NO'} | {g['measured']} |")
    return "\n".join(out)


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _n(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def plots(stem: pathlib.Path, curves: dict, scaling: list[dict]) -> list[str]:
    """PNG plots beside the JSON; skipped (with a note) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots written (the JSON and markdown are)")
        return []
    written = []
    trace_names = list(dict.fromkeys(t for t, _ in curves))
    for what in ("allocation", "jct-cdf"):
        fig, axes = plt.subplots(1, len(trace_names), figsize=(6 * len(trace_names), 4), squeeze=False)
        for ax, trace in zip(axes[0], trace_names, strict=False):
            for (t, policy), c in curves.items():
                if t != trace:
                    continue
                if what == "allocation":
                    ax.step(np.array(c["t"]) / 3600, np.array(c["held"]) / c["capacity"], where="post", label=policy)
                    ax.set_xlabel("simulated hours"), ax.set_ylabel("GPUs allocated (share)")
                elif c["jct"]:
                    jct = np.array(c["jct"]) / 3600
                    ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=policy)
                    ax.set_xscale("log"), ax.set_xlabel("job completion time, hours"), ax.set_ylabel("CDF")
            ax.set_title(f"{trace} (synthesized racks, simulated)")
        written.append(_save(plt, fig, axes, stem, what))
    gangs = sorted({r["gang"] for r in scaling})
    fig, axes = plt.subplots(1, len(gangs), figsize=(4.5 * len(gangs), 4), squeeze=False)
    for ax, gang in zip(axes[0], gangs, strict=False):
        for policy in SCALING_CALLS:
            sel = sorted((r["nodes"], r["p50_ms"]) for r in scaling if r["gang"] == gang and r["policy"] == policy)
            ax.plot([n for n, _ in sel], [m for _, m in sel], marker="o", label=policy)
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_title(f"gang of {gang} (synthetic racks)"), ax.set_xlabel("nodes"), ax.set_ylabel("p50 ms per gang")
    written.append(_save(plt, fig, axes, stem, "decision-time"))
    return written


def _save(plt, fig, axes, stem: pathlib.Path, what: str) -> str:
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = stem.with_name(f"{stem.name}-{what}.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path.name


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    params = dict(QUICK if quick else FULL)
    if seeds:
        params["pollux_workloads"] = min(seeds, 8)
        params["seeds"] = seeds
    started = time.perf_counter()
    rows, curves = run_traces(params)
    scaling = run_scaling(params)
    goals = targets(rows, scaling)
    wall = time.perf_counter() - started
    table = markdown(rows, scaling, goals, wall)
    print(table)
    path = pathlib.Path(json_path) if json_path else RESULTS / ("trace-quick.json" if quick else "trace.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.with_suffix("")
    pngs = plots(stem, curves, scaling)
    path.write_text(json.dumps(dict(synthesized=SYNTHESIZED, quick=quick, wall_s=round(wall, 1), params=params,
                                    traces=rows, scaling=scaling, targets=goals, plots=pngs), indent=1) + "\n")
    path.with_suffix(".md").write_text(table + "\n")
    return 0
