"""``phalanx bench preemption``: group preemption plans, exact vs the upstream-style baseline.

Each instance is a synthetic GPU cluster (:func:`bench.generate.gpu_cluster`: racks of 100 8-GPU
nodes) that is full: about 700 *victim candidates* run on randomly chosen nodes — single pods and
``all`` groups of 2-8 members, 1-8 GPUs each, in three priority classes — and every other GPU but
a fragmented few is held by pods of a priority above the preemptor. Some groups and sets of single
pods sit behind PodDisruptionBudgets. A high-priority gang that needs room arrives: 8-GPU or 4-GPU
pods, inside one rack (the required key) in some cases, anywhere in the others.

Both planners run on every instance: ``baseline`` (evict every candidate in the domain, then
reprieve in upstream order) and ``exact`` (CP-SAT per domain, seeded with the baseline). Every plan
is checked as the extender would act on it: the victims leave the snapshot, the placement solver
places the gang there and the validator accepts it; no victim is of the preemptor's priority or
above; no ``all`` group is split. Racks are synthetic labels.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from cluster.names import LABEL_RACK
from solver import (
    PREEMPTION_OPTIONS,
    DisruptionBudget,
    DisruptionMode,
    Pod,
    PodSpec,
    PreemptionContext,
    Snapshot,
    VictimInfo,
    assert_placement_valid,
    plan_preemption,
)

from . import run_suite
from .generate import GPU, gpu_cluster, gpu_gang

#: Victim priority classes (low, medium, high) and the priorities of the preemptor and of the
#: pods nobody may preempt.
CLASSES = (100, 1_000, 5_000)
PREEMPTOR_PRIORITY = 10_000
PROTECTED_PRIORITY = 20_000
CANDIDATES = 700
#: (gang size, GPUs per pod, required key) per case.
CASES = ((24, 8, ""), (48, 4, ""), (6, 8, LABEL_RACK), (12, 4, LABEL_RACK))
FULL = dict(sizes=(500, 2_000), seeds=10)
QUICK = dict(sizes=(500, 2_000), seeds=1)


def _spec(gpus: int) -> PodSpec:
    return PodSpec({"cpu": 8_000 * gpus, "memory": 64 * 2**30 * gpus, GPU: gpus})


def full_cluster(nodes: int, seed: int) -> tuple[Snapshot, PreemptionContext]:
    """A cluster with every node full but for 0-2 GPUs: ~CANDIDATES victim candidates on random
    nodes, protected pods everywhere else."""
    rng = np.random.default_rng(seed)
    names = [n.name for n in gpu_cluster(nodes)]
    free = {name: 8 - int(rng.choice([0, 0, 0, 1, 2])) for name in names}  # GPUs left to fill
    hosts = rng.permutation(len(names))[: max(1, int(CANDIDATES * 3.2 / 8))]
    bound: list[Pod] = []
    victims: dict[str, VictimInfo] = {}
    budgets: list[DisruptionBudget] = []
    count = 0
    cursor = 0

    def put(uid: str, gpus: int, node: str, group: str = "") -> Pod:
        free[node] -= gpus
        pod = Pod(uid, uid, _spec(gpus), node=node, namespace="bench", group=group)
        bound.append(pod)
        return pod

    while count < CANDIDATES:
        priority = int(rng.choice(CLASSES))
        if rng.random() < 0.35:  # an `all` group of 2-8 members on consecutive candidate hosts
            size = int(rng.integers(2, 9))
            gpus = int(rng.choice([1, 2, 4, 8]))
            key = f"bench/all-{count}"
            members = []
            for m in range(size):
                node = _host_with_room(names, hosts, free, gpus, cursor + m)
                if node is None:
                    break
                members.append(put(f"all-{count}-{m}", gpus, node, key))
            for pod in members:
                victims[pod.uid] = VictimInfo(priority, key, DisruptionMode.ALL)
            if members and rng.random() < 0.3:
                budgets.append(DisruptionBudget(f"pdb-{key}", frozenset(p.uid for p in members), 0))
            count += max(1, len(members))
            cursor += size
        else:
            gpus = int(rng.choice([1, 2, 4, 8], p=[0.4, 0.3, 0.2, 0.1]))
            node = _host_with_room(names, hosts, free, gpus, cursor)
            cursor += 1
            count += 1
            if node is None:
                continue
            pod = put(f"single-{count}", gpus, node)
            victims[pod.uid] = VictimInfo(priority)
    singles = [p.uid for p in bound if p.uid.startswith("single-")]
    for b in range(0, len(singles), 40):  # a budget over every 40 single pods, 5 disruptions allowed
        budgets.append(DisruptionBudget(f"pdb-singles-{b}", frozenset(singles[b : b + 40 : 3]), 5))
    for name in names:  # protected pods hold the rest of each node but for its fragmented spare
        spare = 0 if free[name] < 8 else int(rng.choice([0, 0, 0, 1, 2]))
        if free[name] - spare > 0:
            put(f"protected-{name}", free[name] - spare, name)
    for pod in bound:
        if pod.uid.startswith("protected-"):
            victims[pod.uid] = VictimInfo(PROTECTED_PRIORITY)
    return Snapshot(gpu_cluster(nodes), bound), PreemptionContext(victims, tuple(budgets))


def _host_with_room(names, hosts, free, gpus, start) -> str | None:
    for step in range(len(hosts)):
        name = names[hosts[(start + step) % len(hosts)]]
        if free[name] >= gpus:
            return name
    return None


def _check(snapshot, context, group, plan) -> None:
    """The plan is sound: room after the evictions, only lower priorities, no `all` group split."""
    assert plan.helps, plan.reason
    after = snapshot.without_pods(plan.victims)
    assert_placement_valid(after, group, plan.placement)
    evicted = set(plan.victims)
    for unit in plan.units:
        assert unit.priority < group.priority
    for pod in snapshot.bound:
        info = context.info(pod)
        if info.mode is DisruptionMode.ALL and any(u.key == info.group for u in plan.units):
            assert pod.uid in evicted, f"{info.group} split"


def run(sizes, seeds, progress=print) -> list[dict]:
    rows = []
    for nodes in sizes:
        for seed in range(seeds):
            snapshot, context = full_cluster(nodes, seed)
            candidates = sum(1 for i in context.victims.values() if i.priority < PREEMPTOR_PRIORITY)
            for case, (size, gpus, key) in enumerate(CASES):
                group = gpu_gang(f"hi-{case}", size, gpus, key, priority=PREEMPTOR_PRIORITY)
                for planner, path in (("baseline", "greedy"), ("exact", "exact")):
                    started = time.perf_counter()
                    options = dataclasses.replace(PREEMPTION_OPTIONS, path=path, seed=seed)
                    plan = plan_preemption(snapshot, group, context, options)
                    ms = (time.perf_counter() - started) * 1000.0
                    if plan.helps:
                        _check(snapshot, context, group, plan)
                    rows.append(dict(
                        nodes=nodes, candidates=candidates, seed=seed, case=case, gang=size, pod_gpus=gpus,
                        key=key or "-", planner=planner, helps=plan.helps,
                        evicted_pods=len(plan.victims), evicted_units=len(plan.units),
                        pdb_violations=plan.pdb_violations,
                        highest_priority=plan.cost.highest_priority if plan.cost else None,
                        optimal=plan.optimal, decision_ms=round(ms, 2),
                    ))
                    progress(_line(rows[-1]))
    return rows


def _line(row: dict) -> str:
    return (f"{row['nodes']:>5} nodes seed {row['seed']:>2} gang {row['gang']:>2}x{row['pod_gpus']} "
            f"key {row['key']:<28} {row['planner']:<8} evicts {row['evicted_pods']:>3} pods "
            f"{row['evicted_units']:>3} units pdb {row['pdb_violations']:>2} top {row['highest_priority']}  "
            f"{row['decision_ms']:>8.1f} ms")


def _cost(row: dict) -> tuple:
    return (row["pdb_violations"], row["highest_priority"] or 0, row["evicted_pods"])


def summary(rows: list[dict]) -> dict:
    pairs = {}
    for row in rows:
        pairs.setdefault((row["nodes"], row["seed"], row["case"]), {})[row["planner"]] = row
    both = [p for p in pairs.values() if "exact" in p and "baseline" in p and p["exact"]["helps"]]
    differ = [p for p in both if p["exact"]["evicted_pods"] != p["baseline"]["evicted_pods"]]
    out = dict(
        instances=len(both),
        exact_worse=sum(_cost(p["exact"]) > _cost(p["baseline"]) for p in both),
        exact_better=sum(_cost(p["exact"]) < _cost(p["baseline"]) for p in both),
        evicted_exact=sum(p["exact"]["evicted_pods"] for p in both),
        evicted_baseline=sum(p["baseline"]["evicted_pods"] for p in both),
        differ=len(differ),
        differ_evicted_exact=sum(p["exact"]["evicted_pods"] for p in differ),
        differ_evicted_baseline=sum(p["baseline"]["evicted_pods"] for p in differ),
        timing={},
    )
    for nodes in sorted({r["nodes"] for r in rows}):
        for key in ("any", "-", LABEL_RACK):
            for planner in ("baseline", "exact"):
                ms = np.array([r["decision_ms"] for r in rows if r["nodes"] == nodes and r["planner"] == planner
                               and key in ("any", r["key"])])
                if len(ms):
                    out["timing"][(nodes, key, planner)] = (float(np.median(ms)), float(np.percentile(ms, 99)))
    return out


def markdown(rows: list[dict]) -> str:
    s = summary(rows)
    reduction = 1 - s["differ_evicted_exact"] / s["differ_evicted_baseline"] if s["differ_evicted_baseline"] else 0.0
    out = [
        "| nodes | required key | planner | decision p50 ms | decision p99 ms |",
        "|---|---|---|---|---|",
    ]
    for (nodes, key, planner), (p50, p99) in s["timing"].items():
        label = {"any": "all cases", "-": "none", LABEL_RACK: "rack"}[key]
        out.append(f"| {nodes:,} | {label} | {planner} | {p50:.1f} | {p99:.1f} |")
    out += [
        "",
        f"{s['instances']} instances; exact worse than the baseline on {s['exact_worse']}, better on "
        f"{s['exact_better']} (upstream order: PDB violations, highest victim priority, victim pods).",
        f"Evicted pods, all instances: exact {s['evicted_exact']}, baseline {s['evicted_baseline']}.",
        f"Where they differ ({s['differ']} instances): exact {s['differ_evicted_exact']}, baseline "
        f"{s['differ_evicted_baseline']} ({reduction:.0%} fewer).",
    ]
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
