"""``phalanx bench whatif``: the latency of a what-if call on a simulated cluster of 5,000 nodes.

A simulation: no API server. The cache holds :mod:`bench.cache_bench`'s nodes (8 GPUs each, racks
of 32, zones of 1,024) and bound pods of 1 GPU spread round-robin (half of every node's GPUs used).
A ``WorkloadCycle`` runs over it as ``phalanx serve`` runs it; one rack-gang plan is held, so the
what-if sees a reservation too.

One call is what serve does for a ``WhatIf`` request after reading it: the controller's compiler
turns the manifest (a StatefulSet of 64 replicas, 1 GPU each, gang, required key rack) into its
PodGroup and pods, and the cycle plans it (snapshot minus reservations, then the solver). Timed
per call, on the default ``exact`` path; every answer is checked (``fits``, 64 pods, one rack, the
nodes within the rack). Cases: the rack gang; the same gang without a topology key; and a gang
that cannot fit (64 pods of 8 GPUs in one rack), whose explanation is part of the answer and whose
call also searches a preemption (none helps: every bound pod has a higher priority), with a fifth
of the calls.

Target (issue: what-if): p99 <= 200 ms for the 64-pod gang at 5,000 nodes.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from bench import run_suite
from bench.cache_bench import node_json, pod_json
from cluster import names
from cluster.cache import ClusterCache
from cluster.sim import SimCluster
from controller.whatif import compile_objects
from cycle import DOES_NOT_FIT, FITS, WorkloadCycle

FULL = dict(nodes=5_000, calls=100)
QUICK = dict(nodes=5_000, calls=20)
GANG = 64
TARGET_P99_MS = 200.0
GPU = "nvidia.com/gpu"
#: (case, GPUs per pod, required key, expected verdict)
CASES = (("64-pod gang, one rack", 1, names.LABEL_RACK, FITS),
         ("64-pod gang, no topology key", 1, "", FITS),
         ("64 pods of 8 GPUs, one rack (does not fit)", 8, names.LABEL_RACK, DOES_NOT_FIT))


def manifest(name: str, gpus: int, key: str) -> dict[str, Any]:
    """A StatefulSet of ``GANG`` replicas with phalanx's gang annotation (and ``key`` required)."""
    scheduling: dict[str, Any] = {"schedulingPolicy": {"gang": {}}}
    if key:
        scheduling["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": "bench",
                         "annotations": {names.ANNOTATION_SCHEDULING: json.dumps(scheduling)}},
            "spec": {"replicas": GANG, "podManagementPolicy": "Parallel", "serviceName": name,
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "main", "image": "train", "resources": {
                                      "requests": {"cpu": "4", "memory": "32Gi", GPU: str(gpus)}}}]}}}}


def loaded_cycle(nodes: int) -> tuple[WorkloadCycle, ClusterCache]:
    """A cycle over ``nodes`` nodes, half their GPUs used by bound pods, one rack-gang plan held."""
    cache = ClusterCache()
    cache.replace("Node", [node_json(i) for i in range(nodes)])
    cache.replace("Pod", [pod_json(i, nodes) for i in range(nodes * 4)])
    cycle = WorkloadCycle(cache, SimCluster(cache))  # the simulation only takes the status writes
    cache.apply("PodGroup", "ADDED", {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "held", "namespace": "bench", "uid": "held"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": GANG}},
                 "schedulingConstraints": {"topology": [{"key": names.LABEL_RACK}]}}})
    for i in range(GANG):
        cache.apply("Pod", "ADDED", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"held-{i}", "namespace": "bench", "uid": f"h-{i}"},
            "spec": {"schedulingGroup": {"podGroupName": "held"},
                     "containers": [{"name": "main", "resources": {"requests": {"cpu": "4", GPU: "1"}}}]}})
    planned = cycle.place_group("bench/held")
    assert not isinstance(planned, str) and len(planned.assignments) == GANG, planned
    return cycle, cache


def run(nodes: int, calls: int, seeds: int = 1) -> list[dict]:
    del seeds  # one cluster: the calls are the samples
    cycle, cache = loaded_cycle(nodes)
    rows = []
    try:
        for case, gpus, key, expected in CASES:
            body = manifest("gang", gpus, key)
            times = []
            # the answer that searches preemption too is ~10x slower: fewer samples of it
            for _ in range(calls if expected == FITS else max(10, calls // 5)):
                started = time.perf_counter()
                drafts = compile_objects([body], "bench")
                [answer] = cycle.what_if(drafts.groups)
                times.append((time.perf_counter() - started) * 1000.0)
                _check(answer, expected, key, cache)
            ms = np.array(times)
            rows.append({"case": case, "nodes": nodes, "pods": GANG, "calls": len(times), "verdict": answer.verdict,
                         "path": answer.path or "-", "optimal": answer.optimal,
                         "p50_ms": round(float(np.percentile(ms, 50)), 1),
                         "p99_ms": round(float(np.percentile(ms, 99)), 1), "max_ms": round(float(ms.max()), 1)})
    finally:
        cycle.close()
    return rows


def _check(answer: Any, expected: str, key: str, cache: ClusterCache) -> None:
    """A wrong answer fails the bench."""
    assert answer.verdict == expected, answer
    if expected == FITS:
        assert len(answer.nodes) == GANG
        if key:
            assert len({cache.nodes[n].labels[key] for n in answer.nodes.values()}) == 1
    else:
        assert answer.explanation and not answer.nodes


def markdown(rows: list[dict]) -> str:
    lines = ["| case | nodes | calls | answer | p50 | p99 | max | target p99 ≤ 200 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        how = r["verdict"] + (f" ({r['path']}{', optimal' if r['optimal'] else ''})" if r["path"] != "-" else "")
        met = "MET" if r["p99_ms"] <= TARGET_P99_MS else "MISSED"
        lines.append(f"| {r['case']} | {r['nodes']:,} | {r['calls']} | {how} | {r['p50_ms']} ms | {r['p99_ms']} ms | "
                     f"{r['max_ms']} ms | {met} |")
    return "\n".join(lines)


def main(quick: bool = False, json_path: str | None = None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
