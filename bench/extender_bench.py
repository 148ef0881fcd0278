"""``phalanx bench extender``: the served extender on the simulated cluster.

Everything runs in one process on loopback: phalanx (cache, workload cycle, the cheroot HTTP
server) and the simulated kube-scheduler (``bench/scheduler_sim.py``) that calls it. The driver
shares the two cores and the interpreter with phalanx, so pods/s here is a floor for phalanx
alone. Requests use ``nodeCacheCapable`` mode (``NodeNames``), as scheduler-config/ ships.

- filter latency at 10,000 nodes: a pod without a group (echo of every candidate, the fast path),
  a group member whose plan exists (answered from the plan), and the first member of a group (the
  workload cycle: snapshot + solver for the whole group);
- sustained pods/s through filter + bind for gangs of 8 and 256 with a rack constraint, without and
  with required anti-affinity on the hostname among each gang's members (the first-member cycle is
  timed for both too).

The real-control-plane comparison (real kube-scheduler + phalanx vs in-tree gang scheduling) is
``tests/e2e/test_throughput.py``, which prints its numbers.
"""

from __future__ import annotations

import time

import numpy as np

from bench import run_suite
from bench.scheduler_sim import ExtenderClient, SimulatedScheduler
from cluster import names
from cluster.sim import SimCluster
from extender.server import ServeOptions, build

FULL = dict(nodes=10_000, samples=300, gangs=(8, 256), gang_pods=2_048)
QUICK = dict(nodes=2_000, samples=100, gangs=(8, 256), gang_pods=512)


RACK_NODES = 32


def _cluster(nodes: int) -> SimCluster:
    sim = SimCluster()
    racks = max(1, nodes // RACK_NODES)
    sim.add_nodes(zones=1, racks_per_zone=racks, nodes_per_rack=RACK_NODES, gpus=8)
    return sim


def _podgroup(name: str, size: int, key: str = "") -> dict:
    spec = {"schedulingPolicy": {"gang": {"minCount": size}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "bench"}, "spec": spec}


def _pod(name: str, group: str | None, gpus: int = 1, anti: bool = False) -> dict:
    """A bench pod; with ``anti`` it carries required anti-affinity on the hostname against the
    other members of its group (as a quorum database's chart writes it)."""
    spec: dict = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)}}}]}
    labels = {}
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
        labels["group"] = group
    if anti:
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"group": group}}, "topologyKey": names.LABEL_HOSTNAME}]}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "bench", "labels": labels},
            "spec": spec}


def _pct(values: list[float]) -> tuple[float, float]:
    return round(float(np.percentile(values, 50)), 3), round(float(np.percentile(values, 99)), 3)


def filter_latency(nodes: int, samples: int) -> list[dict]:
    sim = _cluster(nodes)
    options = ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="", http_threads=64,
                           plan_ttl=3600)
    phalanx = build(options, sim=sim).start()
    client = ExtenderClient(phalanx.port)
    all_names = sorted(n["metadata"]["name"] for n in sim.list("Node"))
    rows = []
    try:
        loner = sim.create(_pod("loner", None))
        timings: dict[str, list[float]] = {"plain": [], "planned": [], "cycle": [], "cycle, anti-affinity": []}
        for _ in range(samples):
            t = time.perf_counter()
            client.post("filter", {"Pod": loner, "Nodes": None, "NodeNames": all_names})
            timings["plain"].append((time.perf_counter() - t) * 1000)
        for k in range(samples):
            for anti in (False, True):
                group = f"g{k}{'a' if anti else ''}"
                sim.create(_podgroup(group, 8, names.LABEL_RACK))
                members = [sim.create(_pod(f"{group}-{i}", group, anti=anti)) for i in range(8)]
                for i, member in enumerate(members):
                    t = time.perf_counter()
                    client.post("filter", {"Pod": member, "Nodes": None, "NodeNames": all_names})
                    kind = ("cycle, anti-affinity" if anti else "cycle") if i == 0 else "planned"
                    if i == 0 or not anti:
                        timings[kind].append((time.perf_counter() - t) * 1000)
                with phalanx.cycle.lock:  # release, so every sample plans on the same free cluster
                    for key in list(phalanx.cycle.plans):
                        phalanx.cycle.planner.release(key, "", "released by the benchmark")
        for kind, values in timings.items():
            p50, p99 = _pct(values)
            rows.append(dict(nodes=nodes, gang=8 if kind != "plain" else 0, grouped=kind != "plain",
                             verb=f"filter ({kind})", p50_ms=p50, p99_ms=p99, pods_per_s=None))
    finally:
        phalanx.stop()
    return rows


def throughput(nodes: int, gang: int, total_pods: int, anti: bool = False) -> dict:
    sim = _cluster(nodes)
    options = ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="",
                           http_threads=max(300, gang + 50), barrier_timeout=120, plan_ttl=600)
    phalanx = build(options, sim=sim).start()
    driver = SimulatedScheduler(sim, phalanx.port, bind_threads=max(300, gang + 50))
    try:
        for k in range(total_pods // gang):
            sim.create(_podgroup(f"t{k}", gang, names.LABEL_RACK if gang <= 256 else ""))
            for i in range(gang):
                sim.create(_pod(f"t{k}-{i}", f"t{k}", anti=anti))
        started = time.perf_counter()
        stats = driver.run_until_settled()
        elapsed = time.perf_counter() - started
    finally:
        driver.close()
        phalanx.stop()
    p50, p99 = _pct(driver.filter_ms)
    return dict(nodes=nodes, gang=gang, grouped=True, verb="filter+bind", anti_affinity=anti, p50_ms=p50, p99_ms=p99,
                pods_per_s=round(stats.bound / elapsed, 1), bound=stats.bound, bind_errors=len(stats.bind_errors))


def run(nodes: int, samples: int, gangs: tuple[int, ...], gang_pods: int, seeds: int = 1) -> list[dict]:
    rows = filter_latency(nodes, samples)
    for row in rows:
        print(row)
    for gang in gangs:
        for anti in (False, True) if gang <= RACK_NODES else (False,):  # one member per node of a rack
            rows.append(throughput(nodes, gang, gang_pods, anti))
            print(rows[-1])
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| nodes | what | p50 ms | p99 ms | pods/s |", "|---|---|---|---|---|"]
    for r in rows:
        what = r["verb"] if r["verb"] != "filter+bind" else (
            f"filter+bind, gangs of {r['gang']} (rack{', hostname anti-affinity' if r.get('anti_affinity') else ''})")
        out.append(f"| {r['nodes']:,} | {what} | {r['p50_ms']} | {r['p99_ms']} | {r['pods_per_s'] or ''} |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, None, json_path)
