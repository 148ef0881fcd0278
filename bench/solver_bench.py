"""``phalanx bench solver``: placement latency and quality on synthetic GPU clusters.

Cases: cluster size x gang size x pod shape (1 or 8 GPUs) x fill, several seeds each; every
instance is solved by phalanx greedy, phalanx exact and the upstream-style baseline, side by side
in one run, and every answer is checked by the validator. The required topology key is the rack
(100 nodes, 800 GPUs) when the gang could fit in one, else the zone (10 racks); racks and zones
are synthetic labels.

Constraint cases (:func:`bench.generate.constraint_instance`) run beside them on a cluster of five
zones: a hostname anti-affinity gang, a zone spread (DoNotSchedule, maxSkew 1) gang and a gang whose
members each need a WaitForFirstConsumer claim served by local PVs on a fifth of the nodes; greedy
and exact only (the upstream-style baseline models no inter-pod rule).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np

from cluster.names import LABEL_RACK, LABEL_ZONE
from solver import SolveOptions, assert_placement_valid, place
from solver.constraints import placed_anti_affinity
from solver.objective import Objective

from . import run_suite
from .baselines import upstream_style
from .generate import CONSTRAINT_KINDS, constraint_instance, filled_snapshot, gpu_cluster, gpu_gang

#: gang size of each constraint case
CONSTRAINT_GANGS = {"hostname-anti": 16, "zone-spread": 20, "volume-topology": 8}
FULL = dict(sizes=(500, 5_000, 10_000), gangs=(4, 64, 256, 1_000), gpus=(1, 8), fills=(0.5, 0.8, 0.95), seeds=20,
            constraint_sizes=(500, 5_000, 10_000), constraint_fills=(0.5, 0.8))
QUICK = dict(sizes=(500, 5_000), gangs=(4, 64, 256), gpus=(1, 8), fills=(0.5, 0.8), seeds=3,
             constraint_sizes=(500,), constraint_fills=(0.5,))
#: The baseline runs pods one by one in every domain; above this many pod-domain trials per
#: instance it only runs on the first seeds, so a full run stays within an hour.
BASELINE_SEEDS_WHEN_HEAVY = 5


@dataclass
class Sample:
    ms: float
    feasible: bool
    objective: Objective | None
    gap_zero: bool


def _run(path: str, snapshot, group) -> Sample:
    gc.collect()  # a collection pause belongs to whoever allocated, not to the next instance timed
    started = time.perf_counter()
    if path == "upstream-style":
        result = upstream_style(snapshot, group)
    else:
        result = place(snapshot, group, SolveOptions(path=path))
    ms = (time.perf_counter() - started) * 1000.0
    if result.assignments:
        assert_placement_valid(snapshot, group, result.assignments)
    return Sample(ms, bool(result.assignments), result.objective, result.gap == 0.0 and result.optimal)


def warm_indexes(snapshot, group) -> None:
    """Build the snapshot's indexes (free matrix, whether a placed pod carries required
    anti-affinity, domain index, eligibility) before timing, so each path is timed on its own work
    and the first path is not charged for them; the tables of docs/benchmarks.md#placement-solver
    say so. A watch cache builds them once per snapshot (the anti-affinity flag once per bound-pod
    tuple), not per path."""
    _ = snapshot.free
    placed_anti_affinity(snapshot)  # once per bound-pod tuple: a watch cache reuses it across cycles
    snapshot.domains(group.topology_key)
    for pod in group.members[:1]:
        snapshot.eligibility(pod.spec)


def run(sizes, gangs, gpus, fills, seeds, constraint_sizes=(), constraint_fills=(), progress=print) -> list[dict]:
    rows = run_plain(sizes, gangs, gpus, fills, seeds, progress)
    rows += run_constraints(constraint_sizes, constraint_fills, seeds, progress=progress)
    return rows


def _summary(samples: dict[str, list[Sample]], **fields) -> list[dict]:
    exact = samples["exact"]
    rows = []
    for path, got in samples.items():
        ms = np.array([s.ms for s in got])
        # both infeasible counts as the same answer
        same_or_better = [
            s.objective is None or (e.objective is not None and e.objective <= s.objective)
            for e, s in zip(exact, got, strict=False)
        ]
        rows.append(dict(
            **fields, path=path,
            instances=len(got),
            p50_ms=round(float(np.percentile(ms, 50)), 3),
            p99_ms=round(float(np.percentile(ms, 99)), 3),
            feasible_rate=round(sum(s.feasible for s in got) / len(got), 3),
            # over the instances that have a placement (an infeasible one has no gap)
            gap_zero_rate=round(sum(s.gap_zero for s in got) / sum(s.feasible for s in got), 3)
            if path == "exact" and any(s.feasible for s in got) else None,
            exact_same_or_better_rate=round(sum(same_or_better) / len(got), 3)
            if path != "exact" else None,
        ))
    return rows


def constraint_cluster(nodes: int):
    """Five zones at every size (racks of 100 nodes), so a zone spread has domains to even out."""
    return gpu_cluster(nodes, racks_per_zone=max(1, nodes // 500))


def run_constraints(sizes, fills, seeds, kinds=CONSTRAINT_KINDS, progress=print) -> list[dict]:
    rows = []
    for nodes in sizes:
        base = constraint_cluster(nodes)
        for fill in fills:
            for kind in kinds:
                gang = CONSTRAINT_GANGS[kind]
                samples: dict[str, list[Sample]] = {"greedy": [], "exact": []}
                for seed in range(seeds):
                    snap, group = constraint_instance(kind, base, fill, seed, f"{kind}-{seed}", gang)
                    warm_indexes(snap, group)
                    for path in samples:
                        samples[path].append(_run(path, snap, group))
                for row in _summary(samples, case=kind, nodes=nodes, gang=gang, pod_gpus=1, fill=fill,
                                    key=group.topology_key):
                    rows.append(row)
                    progress(_line(row))
    return rows


def run_plain(sizes, gangs, gpus, fills, seeds, progress=print) -> list[dict]:
    rows = []
    for nodes in sizes:
        base = gpu_cluster(nodes)
        for fill in fills:
            snapshots = [filled_snapshot(base, fill, seed) for seed in range(seeds)]
            for gang in gangs:
                for pod_gpus in gpus:
                    key = LABEL_RACK if gang * pod_gpus <= 800 else LABEL_ZONE
                    samples: dict[str, list[Sample]] = {"greedy": [], "exact": [], "upstream-style": []}
                    heavy = gang * (nodes // 100) > 20_000
                    for seed, snap in enumerate(snapshots):
                        group = gpu_gang(f"g{gang}x{pod_gpus}-{seed}", gang, pod_gpus, key)
                        warm_indexes(snap, group)
                        for path in samples:
                            if path == "upstream-style" and heavy and seed >= BASELINE_SEEDS_WHEN_HEAVY:
                                continue
                            samples[path].append(_run(path, snap, group))
                    for row in _summary(samples, case="plain", nodes=nodes, gang=gang, pod_gpus=pod_gpus,
                                        fill=fill, key=key):
                        rows.append(row)
                        progress(_line(row))
    return rows


def _line(row: dict) -> str:
    case = "" if row.get("case", "plain") == "plain" else f"{row['case']} "
    return (f"{case}{row['nodes']:>6} nodes gang {row['gang']:>4}x{row['pod_gpus']}gpu fill {row['fill']:.2f} "
            f"{row['path']:<15} p50 {row['p50_ms']:>9.2f} ms  p99 {row['p99_ms']:>9.2f} ms  "
            f"feasible {row['feasible_rate']:.2f}")


def markdown(rows: list[dict]) -> str:
    """The tables of docs/benchmarks.md#placement-solver: per size and gang, p50/p99 of each path
    over fills and shapes; then the constraint cases per kind and size."""
    plain = [r for r in rows if r.get("case", "plain") == "plain"]
    out = _plain_markdown(plain) if plain else []
    constrained = [r for r in rows if r.get("case", "plain") != "plain"]
    if constrained:
        out += ["", _constraint_markdown(constrained)]
    return "\n".join(out)


def _gap_cell(exact_rows: list[dict]) -> str:
    gap = [r["gap_zero_rate"] * r["feasible_rate"] * r["instances"]
           for r in exact_rows if r["gap_zero_rate"] is not None]
    count = sum(r["feasible_rate"] * r["instances"] for r in exact_rows if r["gap_zero_rate"] is not None)
    return f"{sum(gap) / count:.0%}" if count else "— (none feasible)"


def _constraint_markdown(rows: list[dict]) -> str:
    out = ["| case | nodes | gang | greedy p50 / p99 ms | exact p50 / p99 ms | exact gap 0 (feasible) | feasible |",
           "|---|---|---|---|---|---|---|"]
    for kind in dict.fromkeys(r["case"] for r in rows):
        for nodes in sorted({r["nodes"] for r in rows if r["case"] == kind}):
            sel = [r for r in rows if r["case"] == kind and r["nodes"] == nodes]
            cell = {}
            for path in ("greedy", "exact"):
                got = [r for r in sel if r["path"] == path]
                cell[path] = (float(np.median([r["p50_ms"] for r in got])), max(r["p99_ms"] for r in got))
            exact_rows = [r for r in sel if r["path"] == "exact"]
            instances = sum(r["instances"] for r in exact_rows)
            feasible = sum(r["feasible_rate"] * r["instances"] for r in exact_rows) / instances
            out.append(f"| {kind} | {nodes:,} | {sel[0]['gang']} | {cell['greedy'][0]:.2f} / {cell['greedy'][1]:.2f} | "
                       f"{cell['exact'][0]:.2f} / {cell['exact'][1]:.2f} | {_gap_cell(exact_rows)} | {feasible:.0%} |")
    return "\n".join(out)


def _plain_markdown(rows: list[dict]) -> list[str]:
    out = ["| nodes | gang | greedy p50 / p99 ms | exact p50 / p99 ms | exact gap 0 (feasible) "
           "| upstream-style p50 / p99 ms | exact vs upstream-style (p50) |",
           "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["nodes"], r["gang"]) for r in rows})
    for nodes, gang in keys:
        cell = {}
        for path in ("greedy", "exact", "upstream-style"):
            sel = [r for r in rows if r["nodes"] == nodes and r["gang"] == gang and r["path"] == path]
            cell[path] = (float(np.median([r["p50_ms"] for r in sel])), max(r["p99_ms"] for r in sel))
        gap_cell = _gap_cell([r for r in rows if r["nodes"] == nodes and r["gang"] == gang and r["path"] == "exact"])
        speedup = cell["upstream-style"][0] / max(cell["exact"][0], 1e-9)
        out.append(f"| {nodes:,} | {gang} | {cell['greedy'][0]:.2f} / {cell['greedy'][1]:.2f} | "
                   f"{cell['exact'][0]:.2f} / {cell['exact'][1]:.2f} | {gap_cell} | "
                   f"{cell['upstream-style'][0]:.2f} / {cell['upstream-style'][1]:.2f} | {speedup:.1f}x |")
    return out


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
