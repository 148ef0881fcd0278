"""``phalanx bench fragmentation``: which domain a gang takes, and whether the gangs after it still fit.

A simulation of placement rules alone (no API server, no cycle; the in-tree row is kube-scheduler's
rule *simulated*, see :func:`bench.baselines.in_tree_tas`). Seeded instances: 6 racks of 2-4 GPU
nodes (2, 4 or 8 GPUs, CPU and memory in proportion), and a sequence of gangs, each required in one
rack, of 1-8 pods of 1, 2, 4 or 8 GPUs (never more than one rack holds), until they ask for 115% of
the cluster's GPUs. Nothing leaves.

**Sequence** (gangs arrive one at a time, each placed or left waiting on arrival): per rule, the gangs
placed, on the benchmark's instances (seeds from 0) and on twice as many held-out ones (seeds from
:data:`HELD_OUT_FIRST`, drawn the same way and never looked at while phalanx's rule was chosen). A
gang is *stranded* when the best arrangement found for the instance places it and the rule did not:
that arrangement is the most gangs any rule placed or :func:`solver.joint.place_joint` finds over
all of them at once (3 s budget), so "stranded" counts gangs for which room existed in some
arrangement. Rules, each on the same instances:

- ``phalanx`` — :func:`solver.place` (exact path): the tightest rack that fits, then inside it the
  roomiest node kept whole when smaller ones hold the gang, then fewest nodes;
- ``phalanx before`` — the same without keeping the roomiest node (``keep_largest=False``): the
  tightest rack, then fewest nodes;
- ``phalanx's earlier order`` — the order before that: fewest nodes touched ranked above the
  tightest rack (the same solver, the domain chosen by the old order of the objective);
- ``in-tree (simulated)`` — kube-scheduler v1.37.2's topology-aware gang placement as written in its
  source (pods spread by LeastAllocated inside a rack, racks scored by pods placed + MostAllocated);
- ``best fit`` — :func:`bench.baselines.upstream_style`: the rack left with the least free GPUs,
  pods each on the tightest node;
- ``phalanx's rack, best-fit nodes (ablation)`` — phalanx's choice of rack, then best fit's node rule
  inside it: what the node rule alone is worth.

**Bursts** (the same gangs arriving 6 at a time): phalanx one at a time in arrival order against
:func:`solver.joint.place_joint` per burst (0.1 s budget) — gangs placed, over the bursts where not
every gang fits.

**Joint solve at 5,000 nodes**: 50 pending gangs of 3 x 1 GPU, rack-required, on 200 racks of 25
8-GPU nodes with background load; ``calls`` timed calls of :func:`place_joint` per case.

Targets (issue: joint placement): phalanx strands <= 0.5x the gangs in-tree strands and <= best fit's;
joint placement places >= 10% more gangs than one at a time on bursts that do not all fit, never fewer;
the joint solve of 50 small gangs at 5,000 nodes p99 <= 100 ms.
"""

from __future__ import annotations

import random
import time
from typing import Callable

import numpy as np

from bench import run_suite
from bench.baselines import in_tree_tas, upstream_style
from cluster import names
from solver import Node, Placement, Pod, PodGroup, PodSpec, Policy, Snapshot, SolveOptions, place
from solver.joint import place_joint
from solver.placement import place_batch, with_group

FULL = dict(seeds=40, calls=20)
QUICK = dict(seeds=8, calls=3)
RACKS, BURST, LOAD = 6, 6, 1.15
GPU, RACK = "nvidia.com/gpu", names.LABEL_RACK
TARGET_P99_MS = 100.0
Rule = Callable[[Snapshot, PodGroup], Placement]


def _node(name: str, rack: str, gpus: int) -> Node:
    return Node(name, {"cpu": 8000 * gpus, "memory": 32 * 2**30 * gpus, GPU: gpus, "pods": 110},
                {RACK: rack, names.LABEL_HOSTNAME: name})


def instance(seed: int) -> tuple[list[Node], list[PodGroup]]:
    rng = random.Random(seed)
    nodes = [_node(f"r{r}-n{i}", f"r{r}", rng.choice((2, 4, 8)))
             for r in range(RACKS) for i in range(rng.randint(2, 4))]
    per_rack: dict[str, int] = {}
    for n in nodes:
        per_rack[n.labels[RACK]] = per_rack.get(n.labels[RACK], 0) + n.allocatable[GPU]
    biggest_node, biggest_rack = max(n.allocatable[GPU] for n in nodes), max(per_rack.values())
    capacity, asked, gangs = sum(per_rack.values()), 0, []
    while asked < LOAD * capacity:
        gpus = rng.choice([g for g in (1, 2, 4, 8) if g <= biggest_node])
        count = rng.randint(1, max(1, min(8, biggest_rack // gpus)))
        k = len(gangs)
        spec = PodSpec({"cpu": 6000 * gpus, "memory": 16 * 2**30 * gpus, GPU: gpus})
        members = tuple(Pod(f"g{k}-{i}", f"g{k}-{i}", spec, namespace="bench", group=f"bench/g{k}")
                        for i in range(count))
        gangs.append(PodGroup("bench", f"g{k}", members, Policy.GANG, count, RACK, created=float(k)))
        asked += gpus * count
    return nodes, gangs


def _phalanx(snapshot: Snapshot, group: PodGroup) -> Placement:
    return place(snapshot, group, SolveOptions(path="exact"))


def _fewest_nodes(snapshot: Snapshot, group: PodGroup) -> Placement:
    """phalanx's rule before the roomiest node was kept: the tightest rack, then fewest nodes."""
    return place(snapshot, group, SolveOptions(path="exact", keep_largest=False))


def _fewest_nodes_first(snapshot: Snapshot, group: PodGroup) -> Placement:
    """The same solver per rack (fewest nodes inside it); the rack chosen by the order phalanx's
    objective had before (fewest nodes touched and least stranded above the tightest rack)."""
    best = None
    for rack in sorted({n.labels[RACK] for n in snapshot.nodes}):
        allowed = {p.uid: [n.name for n in snapshot.nodes if n.labels[RACK] == rack] for p in group.pending}
        answer = place(snapshot, group, SolveOptions(path="exact", keep_largest=False), allowed)
        if not answer.assignments or answer.objective is None:
            continue
        o = answer.objective
        key = (o.unplaced, o.preference, o.spread, o.nodes, o.stranded, o.domain_free)
        if best is None or key < best[0]:
            best = (key, answer)
    return best[1] if best else Placement(group.key, {})


def _tightest_rack_best_fit_nodes(snapshot: Snapshot, group: PodGroup) -> Placement:
    """An ablation: phalanx's rack, then the pods each on the tightest node of it (best fit's node
    rule) instead of phalanx's."""
    ours = _phalanx(snapshot, group)
    if not ours.assignments:
        return ours
    rack = [n.name for n in snapshot.nodes if n.labels[RACK] == ours.domain]
    return upstream_style(snapshot.only_nodes(rack), group)


RULES: dict[str, Rule] = {"phalanx": _phalanx, "phalanx before (tightest rack, then fewest nodes)": _fewest_nodes,
                          "phalanx's earlier order (fewest nodes, then tightest rack)": _fewest_nodes_first,
                          "in-tree (simulated)": in_tree_tas, "best fit": upstream_style,
                          "phalanx's rack, best-fit nodes (ablation)": _tightest_rack_best_fit_nodes}


def sequence(rule: Rule, nodes: list[Node], gangs: list[PodGroup]) -> tuple[int, int]:
    """(gangs placed, nodes their pods touched, summed over the gangs)."""
    snapshot, placed, touched = Snapshot(nodes), 0, 0
    for gang in gangs:
        answer = rule(snapshot, gang)
        if len(answer.assignments) == len(gang.pending):
            snapshot, placed = with_group(snapshot, gang, answer.assignments), placed + 1
            touched += len(set(answer.assignments.values()))
    return placed, touched


def bursts(nodes: list[Node], gangs: list[PodGroup], joint: bool,
           reasons: dict[str, int] | None = None) -> tuple[int, int, int]:
    """(gangs placed, gangs in bursts where not all fit one at a time, placed in those bursts);
    ``reasons`` counts the joint answers' outcomes (kept, or why the incumbent stood)."""
    snapshot, placed, contended, contended_placed = Snapshot(nodes), 0, 0, 0
    for start in range(0, len(gangs), BURST):
        burst = gangs[start:start + BURST]
        if not joint:  # one at a time in arrival order (created = arrival, equal priorities)
            batch = place_batch(snapshot, burst, SolveOptions(path="exact"))
            snapshot, got = batch.snapshot, sum(1 for a in batch.placements if a.assignments)
            seq_got = got
        else:
            result = place_joint(snapshot, burst, SolveOptions(path="exact"))
            snapshot, got, seq_got = result.snapshot, result.placed, result.sequential_placed
            if reasons is not None:
                why = "joint placed more" if result.joint else result.joint_reason
                reasons[why] = reasons.get(why, 0) + 1
        placed += got
        if seq_got < len(burst):
            contended += len(burst)
            contended_placed += got
    return placed, contended, contended_placed


def big_cluster(tight: bool, seed: int = 1) -> tuple[Snapshot, list[PodGroup]]:
    """200 racks of 25 8-GPU nodes. Loose: 40% of the nodes run a 6-8 GPU pod. Tight: every node is
    full but for 150 nodes with 1 GPU free and 20 with 3 free (seeded), so not every gang fits."""
    rng = random.Random(seed)
    nodes = [_node(f"r{r}-n{i}", f"r{r}", 8) for r in range(200) for i in range(25)]
    if tight:
        order = rng.sample(nodes, len(nodes))
        used = {n.name: 7 for n in order[:150]} | {n.name: 5 for n in order[150:170]} | {n.name: 8 for n in order[170:]}
    else:
        used = {n.name: rng.choice((6, 7, 8)) for n in rng.sample(nodes, int(len(nodes) * 0.4))}
    busy = [Pod(f"bg-{name}", f"bg-{name}", PodSpec({"cpu": 1000, GPU: gpus}), node=name, namespace="bench")
            for name, gpus in used.items()]
    gangs = []
    for k in range(50):
        spec = PodSpec({"cpu": 1000, GPU: 1})
        members = tuple(Pod(f"s{k}-{i}", f"s{k}-{i}", spec, namespace="bench", group=f"bench/s{k}") for i in range(3))
        gangs.append(PodGroup("bench", f"s{k}", members, Policy.GANG, 3, RACK, created=float(k)))
    return Snapshot(nodes, busy), gangs


#: the first seed of the held-out instances: drawn the same way, never looked at while a rule was chosen
HELD_OUT_FIRST = 1000


def sequence_rows(instances: list[tuple[list[Node], list[PodGroup]]], label: str) -> list[dict]:
    """One row per rule: gangs placed, stranded (room existed), instances stranding, nodes per gang."""
    rows = []
    runs = {name: [sequence(rule, n, g) for n, g in instances] for name, rule in RULES.items()}
    placed = {name: [p for p, _ in run] for name, run in runs.items()}
    reference = []
    for k, (n, g) in enumerate(instances):
        offline = place_joint(Snapshot(n), g, SolveOptions(path="greedy"), budget=3.0).placed
        reference.append(max([offline] + [placed[name][k] for name in RULES]))
    gangs = sum(len(g) for _, g in instances)
    for name in RULES:
        stranded = sum(r - p for r, p in zip(reference, placed[name], strict=True))
        rows.append({"kind": "sequence", "set": label, "rule": name, "instances": len(instances), "gangs": gangs,
                     "placed": sum(placed[name]), "stranded": stranded,
                     "nodes_per_gang": round(sum(t for _, t in runs[name]) / max(sum(placed[name]), 1), 2),
                     "instances_stranding": sum(1 for r, p in zip(reference, placed[name], strict=True) if p < r)})
    return rows


def run(seeds: int, calls: int) -> list[dict]:
    instances = [instance(seed) for seed in range(seeds)]
    rows = sequence_rows(instances, "benchmark")
    held_out = [instance(seed) for seed in range(HELD_OUT_FIRST, HELD_OUT_FIRST + 2 * seeds)]
    rows += sequence_rows(held_out, "held out")
    one = [bursts(n, g, joint=False) for n, g in instances]
    reasons: dict[str, int] = {}
    joint = [bursts(n, g, joint=True, reasons=reasons) for n, g in instances]
    rows.append({"kind": "bursts", "instances": seeds, "gangs": sum(len(g) for _, g in instances),
                 "one_at_a_time": sum(o[0] for o in one), "joint": sum(j[0] for j in joint),
                 "contended_gangs": sum(j[1] for j in joint), "contended_joint": sum(j[2] for j in joint),
                 "contended_one": sum(o[2] for o in one), "contended_gangs_one": sum(o[1] for o in one),
                 "fewer_on": sum(1 for o, j in zip(one, joint, strict=True) if j[0] < o[0]),
                 "outcomes": dict(sorted(reasons.items(), key=lambda kv: -kv[1]))})
    for case, tight in (("room for every gang (40% of the nodes loaded)", False),
                        ("room for some (every node full but 170)", True)):
        snapshot, gangs50 = big_cluster(tight)
        times, result = [], None
        for _ in range(calls):
            started = time.perf_counter()
            result = place_joint(snapshot, gangs50)
            times.append((time.perf_counter() - started) * 1000.0)
        assert result is not None
        ms = np.array(times)
        rows.append({"kind": "timing", "case": case, "nodes": len(snapshot.nodes), "gangs": len(gangs50),
                     "calls": calls, "placed": result.placed, "sequential_placed": result.sequential_placed,
                     "joint": result.joint, "reason": result.joint_reason,
                     "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
                     "model_ms": round(float(result.stats.get("model_ms", 0.0)), 1)})
    return rows


def markdown(rows: list[dict]) -> str:
    lines: list[str] = []
    for label in ("benchmark", "held out"):
        seq = [r for r in rows if r["kind"] == "sequence" and r.get("set", "benchmark") == label]
        if not seq:
            continue
        by = {r["rule"]: r for r in seq}
        lines += [f"Sequence ({label}): {seq[0]['instances']} instances, {seq[0]['gangs']} gangs (each rule on the "
                  "same ones).", "",
                  "| rule | gangs placed | stranded (room existed) | instances with a gang stranded | nodes per gang |",
                  "|---|---|---|---|---|"]
        for r in seq:
            lines.append(f"| {r['rule']} | {r['placed']} | {r['stranded']} | {r['instances_stranding']} "
                         f"| {r['nodes_per_gang']} |")
        ours, in_tree, best_fit = by["phalanx"], by["in-tree (simulated)"], by["best fit"]
        ratio = ours["stranded"] / in_tree["stranded"] if in_tree["stranded"] else float("nan")
        met = ours["stranded"] <= 0.5 * in_tree["stranded"] and ours["stranded"] <= best_fit["stranded"]
        lines += ["", f"phalanx strands {ours['stranded']} ({ratio:.2f}x in-tree's {in_tree['stranded']}, best fit "
                  f"{best_fit['stranded']}): target <= 0.5x in-tree and <= best fit {'MET' if met else 'MISSED'}.", ""]
    for r in rows:
        if r["kind"] == "bursts":
            gain = (r["contended_joint"] / r["contended_one"] - 1) * 100 if r["contended_one"] else float("nan")
            lines += ["", f"Bursts of {BURST}: one at a time {r['one_at_a_time']} gangs placed, joint {r['joint']}; "
                      f"on the bursts where not every gang fit one at a time ({r['contended_gangs']} gangs), "
                      f"joint placed {r['contended_joint']} where one at a time placed {r['contended_one']} of its "
                      f"{r['contended_gangs_one']} ({gain:+.1f}%; target >= +10% "
                      f"{'MET' if gain >= 10 else 'MISSED'}); instances where joint placed fewer: {r['fewer_on']}. "
                      "Per burst: " + "; ".join(f"{why}: {n}" for why, n in r["outcomes"].items()) + "."]
    timing = [r for r in rows if r["kind"] == "timing"]
    lines += ["", "| joint solve, 50 gangs of 3 | nodes | calls | placed (one at a time) | p50 | p99 | model | "
              "target p99 <= 100 ms |", "|---|---|---|---|---|---|---|---|"]
    for r in timing:
        lines.append(f"| {r['case']} | {r['nodes']:,} | {r['calls']} | {r['placed']} ({r['sequential_placed']}) | "
                     f"{r['p50_ms']} ms | {r['p99_ms']} ms | {r['model_ms']} ms | "
                     f"{'MET' if r['p99_ms'] <= TARGET_P99_MS else 'MISSED'} |")
    return "\n".join(lines)


def main(quick: bool = False, json_path: str | None = None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
