"""``phalanx bench composite``: planning a CompositePodGroup as one unit (solver/composite.py) at 5,000
nodes, beside the same children planned one by one.

A simulation of the solver alone (no API server, no cycle): 10 blocks (the zone label) of 20 racks
of 25 nodes with 8 GPUs each. The composite is a training job that must sit in one block, of 8
replicas of 8 pods x 8 GPUs each in one rack (a gang composite, minGroupCount 8: KEP's "a job in
one block, each replica in one rack"). Background load, bound pods of one node each on a seeded
random sample of the nodes: per case a share of the nodes and the GPUs each pod takes.

Per case, ``calls`` plans timed on the default ``exact`` path, every answer checked (fits: 64 pods,
one block, each replica in one rack; does not fit: nothing placed and an explanation). Beside it,
the same 8 replicas planned child by child (``solver.placement.place_batch``, what phalanx did before
composites): how many blocks they span, and whether all were placed.

Target (issue: gangs of gangs): p99 <= 200 ms for the 8 x 8 composite at 5,000 nodes.
"""

from __future__ import annotations

import random
import time

import numpy as np

from bench import run_suite
from cluster import names
from solver import (
    Node,
    Pod,
    PodGroup,
    PodSpec,
    Policy,
    PreemptionContext,
    Snapshot,
    SolveOptions,
    smallest_composite_change,
)
from solver.composite import Composite, CompositePlacement, place_composite
from solver.placement import place_batch

FULL = dict(calls=30)
QUICK = dict(calls=5)
BLOCKS, RACKS, NODES_PER_RACK, GPUS = 10, 20, 25, 8
REPLICAS, PODS_PER_REPLICA = 8, 8
TARGET_P99_MS = 200.0
GPU = "nvidia.com/gpu"
BLOCK, RACK = names.LABEL_ZONE, names.LABEL_RACK
#: (case, share of nodes loaded, GPUs per background pod, whether the composite fits)
CASES = (("half the nodes with 2 GPUs used", 0.5, 2, True),
         ("70% of the nodes with 1 GPU used (fragmented)", 0.7, 1, True),
         ("84% of the nodes with 1 GPU used (no block holds all 8 replicas)", 0.84, 1, False))


def nodes() -> list[Node]:
    return [Node(f"n-{b}-{r}-{i}", {"cpu": 128_000, "memory": 1024 * 2**30, GPU: GPUS, "pods": 110},
                 {BLOCK: f"b{b}", RACK: f"b{b}-r{r}", names.LABEL_HOSTNAME: f"n-{b}-{r}-{i}"})
            for b in range(BLOCKS) for r in range(RACKS) for i in range(NODES_PER_RACK)]


def loaded(all_nodes: list[Node], share: float, gpus: int, seed: int = 1) -> Snapshot:
    """The nodes with a background pod of ``gpus`` GPUs on ``share`` of them (a seeded sample)."""
    rng = random.Random(seed)
    busy = [Pod(f"bg-{n.name}", f"bg-{n.name}", PodSpec({"cpu": 1000, GPU: gpus}), node=n.name, namespace="bench")
            for n in rng.sample(all_nodes, int(len(all_nodes) * share))]
    return Snapshot(all_nodes, busy)


def job() -> Composite:
    def replica(i: int) -> PodGroup:
        members = tuple(Pod(f"rep-{i}-{j}", f"rep-{i}-{j}", PodSpec({"cpu": 4000, GPU: GPUS}), namespace="bench",
                            group=f"bench/rep-{i}") for j in range(PODS_PER_REPLICA))
        return PodGroup("bench", f"rep-{i}", members, Policy.GANG, PODS_PER_REPLICA, RACK)
    return Composite("bench", "job", tuple(replica(i) for i in range(REPLICAS)), min_group_count=REPLICAS,
                     topology_key=BLOCK)


def run(calls: int, seeds: int = 1) -> list[dict]:
    del seeds  # one cluster per case: the calls are the samples
    all_nodes, composite = nodes(), job()
    rows = []
    for case, share, gpus, fits in CASES:
        snapshot = loaded(all_nodes, share, gpus)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            answer = place_composite(snapshot, composite)
            times.append((time.perf_counter() - started) * 1000.0)
            _check(answer, fits, snapshot)
        change_ms, change = 0.0, ""
        if not answer.fits:  # the tree's smallest change, searched as serve searches it (greedy, a worker)
            started = time.perf_counter()
            found = smallest_composite_change(snapshot, composite, SolveOptions(path="greedy"), PreemptionContext())
            change_ms = (time.perf_counter() - started) * 1000.0
            change = "; ".join(f"{c.kind} {len(c.add_nodes) or len(c.victims)}" for c in found.changes)
        apart = place_batch(snapshot, composite.children).placements
        blocks = {snapshot.nodes[snapshot.index[n]].labels[BLOCK] for p in apart for n in p.assignments.values()}
        ms = np.array(times)
        rows.append({"case": case, "nodes": len(all_nodes), "pods": REPLICAS * PODS_PER_REPLICA, "calls": calls,
                     "fits": answer.fits, "block": answer.domain,
                     "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
                     "max_ms": round(float(ms.max()), 1),
                     "apart_placed": sum(1 for p in apart if p.assignments), "apart_blocks": len(blocks),
                     "smallest_change_ms": round(change_ms, 1), "smallest_change": change})
    return rows


def _check(answer: CompositePlacement, fits: bool, snapshot: Snapshot) -> None:
    """A wrong answer fails the bench."""
    assert answer.fits == fits, answer.explanation
    if not fits:
        assert answer.explanation and not answer.assignments
        return
    assert len(answer.assignments) == REPLICAS * PODS_PER_REPLICA
    labels = [snapshot.nodes[snapshot.index[n]].labels for n in answer.assignments.values()]
    assert {lab[BLOCK] for lab in labels} == {answer.domain}
    for child in answer.children.values():
        assert len({snapshot.nodes[snapshot.index[n]].labels[RACK] for n in child.assignments.values()}) == 1


def markdown(rows: list[dict]) -> str:
    lines = ["| background load | nodes | calls | composite | p50 | p99 | max | target p99 ≤ 200 ms "
             "| child by child: replicas placed, blocks spanned | the tree's smallest change (one search) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        what = f"fits in {r['block']}" if r["fits"] else "does not fit"
        met = "MET" if r["p99_ms"] <= TARGET_P99_MS else "MISSED"
        lines.append(f"| {r['case']} | {r['nodes']:,} | {r['calls']} | {what} | {r['p50_ms']} ms | {r['p99_ms']} ms "
                     f"| {r['max_ms']} ms | {met} | {r['apart_placed']} of {REPLICAS}, {r['apart_blocks']} "
                     f"| {_change(r)} |")
    return "\n".join(lines)


def _change(row: dict) -> str:
    if row["fits"]:
        return "-"
    what = {"capacity": "nodes", "preemption": "victims", "topology": "blocks", "constraint": "nodes"}
    parts = [f"{int(n)} {what.get(kind, '')} ({kind})" for kind, n in
             (p.split(" ") for p in row["smallest_change"].split("; ") if p)]
    return f"{', '.join(parts) or 'none found'}, {row['smallest_change_ms']:.0f} ms"


def main(quick: bool = False, json_path: str | None = None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)

