"""``phalanx bench trace-defaults``: does each default queue policy earn its place on every workload?

A default must do no harm where it does not help. Each queue policy is checked on its own,
phalanx with it on against phalanx with it off (everything else as default), on every workload
and load, over several priority draws (the traces carry no priorities, see
:mod:`bench.traces`; which jobs are high priority moves single waits by far more than any policy,
so one draw is not evidence):

* **starvation holds** (with their backfilling), which are for the longest waits: they earn their
  place on a case when they cut the p99 wait, or leave the all-jobs p95 wait and the completed
  gangs where they were. (Holds of a whole domain failed this on 3 of 33 cases; holds of the
  nodes the gang needs, the default now, pass on all 33);
* **preemption weighing** (victims cheapest lost work first, a lost-work budget), which is for
  what preemption costs: it earns its place when it cuts the GPU-hours lost or the low-priority p95
  wait, or leaves the all-jobs p95 wait and the completed gangs where they were.

Only contended cases are judged: the baselines run beside the variants, and a case where no
baseline's gangs waited in any draw compares nothing (every policy passes it by doing nothing), so
it is left out and the check says how many it kept.

"Where they were" is the median over the draws within the tie of :func:`bench.trace_bench.no_worse`
(completed gangs: not fewer). Group preemption itself is not a queue policy: a PriorityClass asks
for it (``preemptionPolicy``), so it is reported, not judged: what it buys (the high-priority p95
wait) and what it costs (the low-priority p95 wait, the GPU-hours lost) against phalanx without it.

Workloads: the shipped four and Pollux workloads 2-8 (held out: the defaults were first chosen on
workload 1), at 70, 90 and 110% load felt, three draws each; then, as cases nothing was looked
at on before the holds were changed to pass the first set, synthetic mixes generated with seeds
3-6 at 80 and 100% (one draw each). Quick: the shipped four's quick slices at 90%, one draw.
Output: ``bench/results/trace-defaults[-quick].{json,md}``.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import time
from typing import Callable

from cycle.queue import QueuePolicy

from .trace_bench import BASELINES, FULL, NO_CONTENTION, QUICK, RESULTS, no_worse, simulate
from .trace_bench import workloads as trace_workloads
from .trace_bound import PackingBound, shared_bound
from .trace_policies import NO_HOLDS, Phalanx, all_policies
from .traces import LOADS, LoadRefused, Trace, data_dir, pollux, synthetic

HELD_OUT = tuple(range(2, 9))  # Pollux workloads 2-8
SEEDS = 3
LATER_SEEDS = (3, 4, 5, 6)  # synthetic mixes generated with these seeds
LATER_LOADS = (0.8, 1.0)


def variants() -> list:
    """phalanx as default, and with one queue policy switched at a time; then the baselines, whose
    waits say whether the case is contended at all."""
    return [Phalanx("phalanx"),
            Phalanx("no-holds", policy=NO_HOLDS),
            Phalanx("no-weighing", policy=QueuePolicy(lost_work_preemption=False, lost_work_budget=None)),
            Phalanx("no-preemption", preempt=False)] + [p for p in all_policies() if p.name in BASELINES]


def contended(rows: list[dict], workload: str, load: float) -> bool:
    """Some baseline's gangs waited on this case, in some draw (else it compares nothing)."""
    return any(r["waited_gangs"] > 0 for r in rows
               if r["workload"] == workload and r["load"] == load and r["policy"] in BASELINES)


#: the policies judged: name -> (the variant with it on, the variant with it off, what it is for,
#: the metric that shows it)
JUDGED = {
    "starvation holds": ("phalanx", "no-holds", "the longest waits", "wait_p99_s"),
    "preemption weighing": ("phalanx", "no-weighing", "what preemption costs", "lost_gpu_hours"),
}


def workloads(quick: bool) -> list[tuple[str, Callable[..., Trace]]]:
    """The trace bench's workloads (its quick or full slices), and Pollux 2-8 in the full run."""
    out = trace_workloads(QUICK if quick else FULL)
    if not quick:
        data = data_dir()
        out += [(f"pollux-w{w}", lambda w=w, **kw: pollux(data, w, **kw)) for w in HELD_OUT]
    return out


def later(quick: bool) -> list[tuple[str, float, Callable[[], Trace]]]:
    """Cases no policy was looked at on before it was judged: synthetic mixes generated with other
    seeds, at loads the tables do not use (one draw each; none in the quick run)."""
    if quick:
        return []
    data = data_dir()
    return [(f"synthetic-seed{gen}", load, lambda gen=gen, load=load: synthetic(data, jobs=400, seed=gen, load=load))
            for gen in LATER_SEEDS for load in LATER_LOADS]


def run(quick: bool, draws: int | None = None, progress=print) -> tuple[list[dict], list[str]]:
    """One row per workload, load, draw and variant; the loads refused, with their reasons."""
    rows, refused = [], []
    loads = (0.9,) if quick else LOADS
    seeds = range(draws or (1 if quick else SEEDS))
    for name, make in workloads(quick):
        packing = None
        for load in loads:
            for seed in seeds:
                try:
                    trace = make(load=load, seed=seed)
                except LoadRefused as err:
                    refused.append(str(err))
                    progress(f"refused: {err}")
                    continue
                if packing is None or packing.cluster.name != trace.cluster.name:  # a sized cluster: per load
                    packing = PackingBound(trace.cluster, trace.jobs, deterministic_time=0.05)
                bound = shared_bound(trace, packing)
                for policy in variants():
                    row, _ = simulate(trace, policy, bound)
                    row.update(workload=name, seed=seed)
                    rows.append(row)
                    progress(f"{name:<14} {load:.0%} draw {seed} {policy.name:<14} done {row['completed']:>3}/"
                             f"{row['jobs']} wait p95 {row['wait_p95_s']:>8.0f} (high {row['wait_p95_high_s']}, "
                             f"low {row['wait_p95_low_s']}) p99 {row['wait_p99_s']:>8.0f} "
                             f"lost {row['lost_gpu_hours']} GPU-h  {row['sim_wall_s']} s")
    for name, load, make_later in later(quick):
        trace = make_later()
        bound = shared_bound(trace, PackingBound(trace.cluster, trace.jobs, deterministic_time=0.05))
        for policy in variants():
            row, _ = simulate(trace, policy, bound)
            row.update(workload=name, seed=0, later=True)
            rows.append(row)
            progress(f"{name:<16} {load:.0%} {policy.name:<14} wait p95 {row['wait_p95_s']:>8.0f} "
                     f"p99 {row['wait_p99_s']:>8.0f} lost {row['lost_gpu_hours']} GPU-h")
    return rows, refused


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] if r[key] is not None else 0.0 for r in rows)


def _better(on: dict, off: dict, metric: str) -> bool:
    """``on`` is lower than ``off`` on ``metric``, beyond a tie for waits."""
    if metric.startswith("wait"):
        return not no_worse(off[metric], on[metric])
    return on[metric] < off[metric]


def verdicts(rows: list[dict]) -> list[dict]:
    """Per judged policy and contended case (workload, load): the medians over the draws and
    whether the policy earned its place there. A case with no contention is not judged (it
    could only pass)."""
    out = []
    cases = sorted({(r["workload"], r["load"]) for r in rows if contended(rows, r["workload"], r["load"])})
    for policy, (on_variant, off_variant, purpose, metric) in JUDGED.items():
        for workload, load in cases:
            by = {v: [r for r in rows if r["workload"] == workload and r["load"] == load and r["policy"] == v]
                  for v in (on_variant, off_variant)}
            if not all(by.values()):
                continue  # not run both ways here
            on, without = ({k: _median(by[v], k) for k in ("completed", "wait_p95_s", metric, "wait_p95_low_s")}
                           for v in (on_variant, off_variant))
            helps = _better(on, without, metric)
            if policy == "preemption weighing":
                helps = helps or _better(on, without, "wait_p95_low_s")
            harmless = on["completed"] >= without["completed"] and no_worse(on["wait_p95_s"], without["wait_p95_s"])
            out.append(dict(policy=policy, purpose=purpose, workload=workload, load=load, draws=len(by[on_variant]),
                            on=on, off=without, helps=helps, harmless=harmless, earns=helps or harmless))
    return out


def left_out(rows: list[dict]) -> list[tuple[str, float]]:
    """The cases no baseline's gangs waited on."""
    return sorted({(r["workload"], r["load"]) for r in rows if not contended(rows, r["workload"], r["load"])})


def preemption(rows: list[dict]) -> list[dict]:
    """What group preemption buys and costs per contended case (medians over the draws)."""
    out = []
    for workload, load in sorted({(r["workload"], r["load"]) for r in rows if contended(rows, r["workload"],
                                                                                         r["load"])}):
        cell = {}
        for v in ("phalanx", "no-preemption"):
            sel = [r for r in rows if r["workload"] == workload and r["load"] == load and r["policy"] == v]
            cell[v] = {k: _median(sel, k) for k in ("wait_p95_high_s", "wait_p95_low_s", "wait_p95_s",
                                                     "lost_gpu_hours", "completed")}
        out.append(dict(workload=workload, load=load, **cell))
    return out


def markdown(rows: list[dict], judged: list[dict], bought: list[dict], refused: list[str], wall_s: float) -> str:
    idle = left_out(rows)
    cases = len({(r["workload"], r["load"]) for r in rows})
    out = [f"Run wall time {wall_s:.0f} s. Medians over {max((j['draws'] for j in judged), default=0)} priority "
           "draws per case; one queue policy switched at a time, everything else as default (bench/trace_defaults.py "
           f"says the rule). Cases kept: {cases - len(idle)} of {cases}; {len(idle)} where no baseline's gangs waited "
           f"({NO_CONTENTION}) are left out" + (": " + ", ".join(f"{w} at {load:.0%}" for w, load in idle)
                                                 if idle else "") + ".", ""]
    if refused:
        out += ["Refused (not run):", ""] + [f"- {why}" for why in refused] + [""]
    for policy, (_, _, purpose, metric) in JUDGED.items():
        mine = [j for j in judged if j["policy"] == policy]
        earned = sum(j["earns"] for j in mine)
        out += [f"**{policy}** (for {purpose}; earns its place on {earned} of {len(mine)} cases)", "",
                f"| workload | load | {metric} on / off | all-jobs p95 wait on / off s | completed on / off "
                "| helps | no harm | earns |", "|---|---|---|---|---|---|---|---|"]
        for j in mine:
            out.append(f"| {j['workload']} | {j['load']:.0%} | {j['on'][metric]:.1f} / {j['off'][metric]:.1f} "
                       f"| {j['on']['wait_p95_s']:.0f} / {j['off']['wait_p95_s']:.0f} "
                       f"| {j['on']['completed']:.0f} / {j['off']['completed']:.0f} "
                       f"| {'yes' if j['helps'] else 'no'} | {'yes' if j['harmless'] else 'no'} "
                       f"| {'yes' if j['earns'] else 'NO'} |")
        out.append("")
    out += ["**Group preemption** (asked for by PriorityClasses, so reported, not judged): with / without", "",
            "| workload | load | high-priority p95 wait s | low-priority p95 wait s | all-jobs p95 wait s "
            "| GPU-hours lost | completed |", "|---|---|---|---|---|---|---|"]
    for b in bought:
        on, off = b["phalanx"], b["no-preemption"]
        out.append(f"| {b['workload']} | {b['load']:.0%} | {on['wait_p95_high_s']:.0f} / {off['wait_p95_high_s']:.0f} "
                   f"| {on['wait_p95_low_s']:.0f} / {off['wait_p95_low_s']:.0f} "
                   f"| {on['wait_p95_s']:.0f} / {off['wait_p95_s']:.0f} | {on['lost_gpu_hours']:.1f} / "
                   f"{off['lost_gpu_hours']:.1f} | {on['completed']:.0f} / {off['completed']:.0f} |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    """``seeds``: priority draws per case (default 3, quick 1)."""
    started = time.perf_counter()
    path = pathlib.Path(json_path) if json_path else RESULTS / (
        "trace-defaults-quick.json" if quick else "trace-defaults.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    rows, refused = run(quick, seeds)
    judged, bought = verdicts(rows), preemption(rows)
    wall = time.perf_counter() - started
    table = markdown(rows, judged, bought, refused, wall)
    print(table)
    kept = [{k: v for k, v in r.items() if k != "notes"} for r in rows]  # the notes repeat per row
    path.write_text(json.dumps(dict(quick=quick, wall_s=round(wall, 1), verdicts=judged, preemption=bought,
                                    left_out=[dict(workload=w, load=load) for w, load in left_out(rows)],
                                    refused=refused, rows=kept), indent=1, default=str) + "\n")
    path.with_suffix(".md").write_text(table + "\n")
    return 0
