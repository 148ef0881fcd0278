"""``phalanx bench contention``: one group's filter and bind while another group's preemption
plan is solved, against the same calls idle, in the same run.

A simulated cluster of 5,000 8-GPU nodes (quick: 2,000) is full of low-priority 8-GPU pods but for a few nodes.
In the *busy* phase a thread keeps sending the first filter call of a fresh high-priority gang
(6 pods of 8 GPUs) that does not fit: each is a workload cycle (placement solve) followed by a
group-preemption solve over the whole cluster (evictions are not carried out, so every preemptor
finds the same full cluster). Meanwhile, and in the *idle* phase alone, a probe gang of 2 one-GPU
pods is filtered and bound (each bind in its own thread, as kube-scheduler does), then deleted:
busy, probes go on until three preemption cycles after the first (a warm-up) were made (quick:
two); idle, as many probes again. Rows: filter and bind p50/p99 of the probe, idle and busy, with
the preemption plans and smallest-change searches in a solver worker process (as phalanx runs,
cycle/workers.py) and, for comparison, in the serving interpreter (``--solver-workers off``; off
the cycle's lock either way).
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np

from cluster.sim import SimCluster
from cycle import BindError, InProcess, SolverWorkers, WorkloadCycle
from extender import verbs

from . import run_suite

NS = "bench"
POOL = "bench.phalanx.dev/pool"  # the full nodes are the preemptors' pool: the probe's room stays its own
FULL = dict(nodes=5_000, probes=60, cycles=3, seeds=1)
QUICK = dict(nodes=2_000, probes=20, cycles=2, seeds=1)


class _NoEvictions:
    """The simulated cluster, except that evictions are dropped (victims stay, every preemptor
    solves against the same full cluster)."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim

    def __getattr__(self, name):
        return getattr(self.sim, name)

    def evict(self, *args, **kwargs) -> None:
        return None


def _podgroup(name: str, size: int, priority: int) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulingPolicy": {"gang": {"minCount": size}}, "priority": priority}}


def _pod(name: str, group: str | None, gpus: int, priority: int, node: str = "", pool: str = "") -> dict:
    spec: dict = {"priority": priority, "containers": [{"name": "c", "resources": {"requests": {
        "cpu": "1", "nvidia.com/gpu": str(gpus)}}}]}
    if pool:
        spec["nodeSelector"] = {POOL: pool}
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _cluster(nodes: int, free: int) -> tuple[SimCluster, list[str]]:
    sim = SimCluster()
    names = sim.add_nodes(zones=1, racks_per_zone=max(1, nodes // 100), nodes_per_rack=min(nodes, 100), gpus=8)
    for i, node in enumerate(names[free:]):
        sim.update("Node", node, lambda n: n["metadata"].setdefault("labels", {}).update({POOL: "batch"}))
        sim.create(_pod(f"low-{i}", None, 8, 0, node))
    return sim, names


def _probe(cycle: WorkloadCycle, sim: SimCluster, nodes: list[str], k: int) -> tuple[float, float]:
    """Filter both members of a fresh 2-pod gang, bind them; (slowest filter, slowest bind) ms."""
    group = f"probe-{k}"
    sim.create(_podgroup(group, 2, 0))
    pods = [sim.create(_pod(f"{group}-{i}", group, 1, 0)) for i in range(2)]
    filter_ms, planned = 0.0, {}
    for p in pods:
        started = time.perf_counter()
        answer = verbs.filter(cycle, p, nodes)
        filter_ms = max(filter_ms, (time.perf_counter() - started) * 1000)
        planned[p["metadata"]["uid"]] = answer.nodes[0] if answer.nodes else ""
    bind_ms = [0.0, 0.0]

    def bind(i: int, p: dict) -> None:
        started = time.perf_counter()
        try:
            cycle.bind(NS, p["metadata"]["name"], p["metadata"]["uid"], planned[p["metadata"]["uid"]])
        except BindError:
            pass
        bind_ms[i] = (time.perf_counter() - started) * 1000

    threads = [threading.Thread(target=bind, args=(i, p)) for i, p in enumerate(pods)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in pods:
        sim.delete("Pod", f"{NS}/{p['metadata']['name']}")
    sim.delete("PodGroup", f"{NS}/{group}")
    return filter_ms, max(bind_ms)


def _phase(cycle: WorkloadCycle, sim: SimCluster, nodes: list[str], probes: int, busy: bool,
           counter: itertools.count, cycles: int = 0) -> dict:
    """Probes while another group's preemption cycles run (``busy``: at least ``probes``, and on
    until ``cycles`` cycles after the first, a warm-up, were made), or ``probes`` probes alone."""
    stop = threading.Event()
    solves: list[float] = []

    def preemptors() -> None:
        for _ in itertools.count():
            if stop.is_set():
                return
            group = f"pre-{next(counter)}"
            sim.create(_podgroup(group, 6, 10_000))
            first = [sim.create(_pod(f"{group}-{i}", group, 8, 10_000, pool="batch")) for i in range(6)][0]
            started = time.perf_counter()
            verbs.filter(cycle, first, nodes)
            solves.append((time.perf_counter() - started) * 1000)
            cycle.preemption.release(f"{NS}/{group}")  # victims never go: hold nothing, next one

    worker = threading.Thread(target=preemptors, daemon=True)
    if busy:
        worker.start()
        while not solves:  # the first solve warms up; measure from the second on
            time.sleep(0.05)
    rows = [_probe(cycle, sim, nodes, next(counter)) for _ in range(probes)]
    while busy and len(solves) < 1 + cycles:
        rows.append(_probe(cycle, sim, nodes, next(counter)))
    stop.set()
    if busy:
        worker.join()
    filters, binds = [r[0] for r in rows], [r[1] for r in rows]

    def pct(values: list[float], q: int) -> float:
        return round(float(np.percentile(values, q)), 1) if values else 0.0

    return {"filter_p50_ms": pct(filters, 50), "filter_p99_ms": pct(filters, 99),
            "bind_p50_ms": pct(binds, 50), "bind_p99_ms": pct(binds, 99),
            "probes": len(rows), "preemption_cycles": len(solves[1:]),
            "preemption_cycle_p50_ms": pct(solves[1:], 50), "preemption_cycle_p99_ms": pct(solves[1:], 99)}


def run(nodes: int, probes: int, cycles: int, seeds: int = 1) -> list[dict]:
    rows = []
    for where in ("a worker process", "serve's interpreter"):
        sim, names = _cluster(nodes, free=4)
        solves = SolverWorkers() if where == "a worker process" else InProcess()
        cycle = WorkloadCycle(sim.cache, _NoEvictions(sim), barrier_timeout=30.0, solves=solves).start()
        cycle.heap.settle()  # as `phalanx serve` does once its caches are synced
        counter = itertools.count()
        try:
            busy = _phase(cycle, sim, names, probes, True, counter, cycles)
            idle = _phase(cycle, sim, names, busy["probes"], False, counter)  # as many probes alone
            for phase, row in (("idle", idle), ("busy", busy)):
                rows.append({"nodes": nodes, "solves": where, "phase": phase, **row})
        finally:
            cycle.close()
            if isinstance(solves, SolverWorkers):
                solves.close()
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| nodes | preemption and smallest-change solves in | another group's preemption | probes | "
           "filter p50 / p99 ms | bind p50 / p99 ms | preemption cycle p50 / p99 ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        pre = (f"{r['preemption_cycle_p50_ms']} / {r['preemption_cycle_p99_ms']} ({r['preemption_cycles']})"
               if r["phase"] == "busy" else "")
        phase = "solving" if r["phase"] == "busy" else "idle"
        out.append(f"| {r['nodes']:,} | {r['solves']} | {phase} | {r['probes']} | "
                   f"{r['filter_p50_ms']} / {r['filter_p99_ms']} | {r['bind_p50_ms']} / {r['bind_p99_ms']} | {pre} |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, None, json_path)
