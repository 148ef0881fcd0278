"""``phalanx bench tenants``: another tenant's gang of 8, placed while a hostile or careless
namespace does its worst, against the same gang placed on a quiet cluster, in the same run.

A simulated cluster (8 victim nodes of 8 GPUs, the hostile namespace's pods kept to the other
nodes by a node selector: sharing capacity is ResourceQuota's job, what is measured is phalanx's
own work). A simulated kube-scheduler loop — one thread, as kube-scheduler's scheduling loop is —
sends phalanx the hostile namespace's pending pods back to back, for ever; when the victim's gang
of 8 (1 GPU each) arrives, its members are interleaved one for one with the hostile pods (a fair
queue; upstream's orders by priority, then age). Binds run in threads, as kube-scheduler's binding
cycles do, the hostile ones too. The victim's *time to place* runs from its first member's filter
call to its last binding; the ratio is its median over the quiet median. Each behaviour:

- ``many-groups``: 10,000 PodGroups (quick 1,000) of 2 one-GPU pods in one namespace: a few
  hundred fit their nodes and bind, the rest fail and back off, and every capacity change (the
  victim's bindings, its deletion) sends the requeue pass over the failed ones;
- ``min-count``: 1,000 PodGroups (quick 100) with minCount 1,000,000 and a pod each;
- ``cross-namespace``: 1,000 pods (quick 100) naming the victim namespace's PodGroup as
  ``tenant/<group>``;
- ``never-arrive``: 10,000 PodGroups (quick 1,000) of minCount 8 whose other 7 pods never come;
- ``big-annotations``: 100 PodGroups (quick 20) each carrying a 250 KiB preferred-topology
  annotation (the API's limit on all annotations together is 256 KiB), with a pod each.

``many-groups`` runs a second time with the per-namespace limits off (``--namespace-max-plans 0
--namespace-max-retries 0 --namespace-cycles-per-second 0``), for comparison. The cost columns:
workload cycles (solver calls) run while the victims were measured (one per victim gang included),
the requeue pass's checks held back by the retry limit, and the hostile filter calls answered per
second. (A StatefulSet flapping its scheduling annotation costs the controller, not serve: see
tests/unit/test_tenants.py and docs/operations.md.)
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from cluster import names
from cluster.sim import SimCluster
from cycle import BindError, NamespaceLimits, WorkloadCycle, barrier_capacity
from extender import verbs

from . import run_suite

POOL = "bench.phalanx.dev/pool"
VICTIM, HOSTILE = "tenant", "hostile"
VICTIM_NODES = 8
FULL = dict(nodes=64, scale=10, probes=30, seeds=1)
QUICK = dict(nodes=32, scale=1, probes=10, seeds=1)
BIG_ANNOTATION = 250 * 1024
WARMUP = 3  # victim gangs placed before the measured ones
OFF = NamespaceLimits(max_plans=0, max_retries=0, cycles_per_second=0)  # the comparison: no limits


def _podgroup(namespace: str, name: str, min_count: int, annotations: dict | None = None) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


def _pod(namespace: str, name: str, group: str, pool: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": {POOL: pool}, "schedulingGroup": {"podGroupName": group},
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]}}


def _cluster(nodes: int) -> tuple[SimCluster, list[str]]:
    sim = SimCluster()
    node_names = sim.add_nodes(zones=1, racks_per_zone=max(1, nodes // 16), nodes_per_rack=min(nodes, 16), gpus=8)
    for i, node in enumerate(node_names):
        pool = VICTIM if i < VICTIM_NODES else HOSTILE
        sim.update("Node", node, lambda n, pool=pool: n["metadata"].setdefault("labels", {}).update({POOL: pool}))
    return sim, node_names


def _hostile(sim: SimCluster, behaviour: str, scale: int) -> list[dict]:
    """Create the hostile namespace's objects; its pods, as kube-scheduler would send them."""
    pods = []
    if behaviour == "many-groups":
        for g in range(1_000 * scale):
            sim.create(_podgroup(HOSTILE, f"h{g}", 2))
            pods += [sim.create(_pod(HOSTILE, f"h{g}-{i}", f"h{g}", HOSTILE)) for i in range(2)]
    elif behaviour == "min-count":
        for g in range(100 * scale):
            sim.create(_podgroup(HOSTILE, f"huge{g}", 1_000_000))
            pods.append(sim.create(_pod(HOSTILE, f"huge{g}-0", f"huge{g}", HOSTILE)))
    elif behaviour == "cross-namespace":
        # created as kube-scheduler would be handed them; the API server itself refuses the name
        pods = [_pod(HOSTILE, f"cross{i}", f"{VICTIM}/v0", VICTIM) | {"metadata": {
            "name": f"cross{i}", "namespace": HOSTILE, "uid": f"cross-{i}"}} for i in range(100 * scale)]
    elif behaviour == "never-arrive":
        for g in range(1_000 * scale):
            sim.create(_podgroup(HOSTILE, f"lonely{g}", 8))
            pods.append(sim.create(_pod(HOSTILE, f"lonely{g}-0", f"lonely{g}", HOSTILE)))
    elif behaviour == "big-annotations":
        big = {names.ANNOTATION_PREFERRED_TOPOLOGY: "k" * BIG_ANNOTATION}
        for g in range(20 * scale):
            sim.create(_podgroup(HOSTILE, f"big{g}", 1, big))
            pods.append(sim.create(_pod(HOSTILE, f"big{g}-0", f"big{g}", HOSTILE)))
    return pods


class _Loop:
    """The simulated kube-scheduler loop: hostile pods back to back, the victim's interleaved."""

    def __init__(self, cycle: WorkloadCycle, sim: SimCluster, nodes: list[str], hostile: list[dict]) -> None:
        self.cycle, self.sim, self.nodes = cycle, sim, nodes
        self.hostile = collections.deque(hostile)
        self.binder = ThreadPoolExecutor(max_workers=256, thread_name_prefix="bench-bind")
        self.hostile_calls = 0
        self.inflight: set[str] = set()

    def close(self) -> None:
        self.binder.shutdown(wait=True)

    def _bind(self, pod: dict, node: str, done: Callable[[], None] | None = None) -> None:
        meta = pod["metadata"]
        try:
            self.cycle.bind(meta["namespace"], meta["name"], meta["uid"], node)
        except BindError:
            pass
        finally:
            self.inflight.discard(meta["uid"])
            if done:
                done()

    def _schedule(self, pod: dict) -> str:
        answer = verbs.filter(self.cycle, pod, self.nodes)
        return answer.nodes[0] if answer.nodes else ""

    def hostile_step(self) -> None:
        """Send phalanx the next pending hostile pod (bound ones leave the queue, binding ones wait)."""
        for _ in range(len(self.hostile)):
            pod = self.hostile.popleft()
            meta = pod["metadata"]
            live = self.sim.get("Pod", f"{HOSTILE}/{meta['name']}")
            if live is not None and live["spec"].get("nodeName"):
                continue  # bound: kube-scheduler no longer sends it
            self.hostile.append(pod)
            if meta["uid"] in self.inflight:
                continue
            self.hostile_calls += 1
            node = self._schedule(pod)
            if node:
                self.inflight.add(meta["uid"])
                self.binder.submit(self._bind, pod, node)
            return

    def victim(self, k: int, timeout: float = 60.0) -> float | None:
        """One gang of 8 through the loop: seconds from its first filter call to its last binding
        (None: not placed within ``timeout``)."""
        group = f"v{k}" if k >= 0 else f"warm{-k}"
        self.sim.create(_podgroup(VICTIM, group, 8))
        pods = [self.sim.create(_pod(VICTIM, f"{group}-{i}", group, VICTIM)) for i in range(8)]
        bound = threading.Semaphore(0)
        started = time.perf_counter()
        waiting = list(pods)
        placed = None
        while time.perf_counter() - started < timeout:
            retry = []
            for pod in waiting:
                self.hostile_step()
                node = self._schedule(pod)
                if node:
                    self.inflight.add(pod["metadata"]["uid"])
                    self.binder.submit(self._bind, pod, node, bound.release)
                else:
                    retry.append(pod)
            waiting = retry
            if not waiting:
                for _ in pods:  # the loop keeps serving the hostile pods while the binds finish
                    while not bound.acquire(blocking=False):
                        self.hostile_step()
                        time.sleep(0)
                if all(self.sim.get("Pod", f"{VICTIM}/{p['metadata']['name']}")["spec"].get("nodeName") for p in pods):
                    placed = time.perf_counter() - started
                break
            self.hostile_step()
        for p in pods:
            self.sim.delete("Pod", f"{VICTIM}/{p['metadata']['name']}")
        self.sim.delete("PodGroup", f"{VICTIM}/{group}")
        self.cycle.prune()
        return placed


def _solves(cycle: WorkloadCycle) -> int:
    return int(sum(s.value for m in cycle.metrics.attempts.collect() for s in m.samples
                   if s.name.endswith("_total")))


def _limited(cycle: WorkloadCycle, limit: str) -> int:
    return int(cycle.metrics.namespace_limited.labels(limit=limit)._value.get())


def _run_one(nodes: int, scale: int, probes: int, behaviour: str, limits: NamespaceLimits) -> dict:
    sim, node_names = _cluster(nodes)
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=30.0, barrier_capacity=barrier_capacity(1100),
                          namespace_limits=limits).start()
    cycle.heap.settle()
    made = time.perf_counter()
    hostile = _hostile(sim, behaviour, scale) if behaviour != "quiet" else []
    made = time.perf_counter() - made
    loop = _Loop(cycle, sim, node_names, hostile)
    try:
        for _ in range(min(len(hostile), 2_000)):  # warm up: the hostile load under way first
            loop.hostile_step()
        for k in range(WARMUP):  # the victim's path warmed up too, in every row alike
            loop.victim(-1 - k)
        solves, calls = _solves(cycle), loop.hostile_calls
        started = time.perf_counter()
        times = [loop.victim(k) for k in range(probes)]
        elapsed = time.perf_counter() - started
        placed = [t for t in times if t is not None]
        return {"behaviour": behaviour, "limits": "off" if limits == OFF else "on",
                "hostile_objects": len(hostile), "probes": probes, "placed": len(placed),
                "time_to_place_ms": round(statistics.median(placed) * 1000, 1) if placed else None,
                "solves": _solves(cycle) - solves, "retries_held_back": _limited(cycle, "retries"),
                "plans_held_back": _limited(cycle, "plans"),
                "hostile_calls_per_s": round((loop.hostile_calls - calls) / elapsed) if elapsed else 0,
                "setup_s": round(made, 1)}
    finally:
        loop.close()
        cycle.close()


BEHAVIOURS = ("quiet", "many-groups", "min-count", "cross-namespace", "never-arrive", "big-annotations")


def run(nodes: int, scale: int, probes: int, seeds: int = 1) -> list[dict]:
    rows = []
    for behaviour in BEHAVIOURS:
        rows.append(_run_one(nodes, scale, probes, behaviour, NamespaceLimits()))
        print(rows[-1], flush=True)
    rows.append(_run_one(nodes, scale, probes, "many-groups", OFF))
    print(rows[-1], flush=True)
    quiet = rows[0]["time_to_place_ms"]
    for r in rows:
        r["ratio"] = round(r["time_to_place_ms"] / quiet, 2) if quiet and r["time_to_place_ms"] else None
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| hostile namespace | objects | per-namespace limits | victim's gang of 8: time to place, median ms "
           "| × quiet | placed | workload cycles (the victim's included) | requeue checks held back "
           "| hostile filter calls / s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['behaviour']} | {r['hostile_objects']:,} | {r['limits']} | {r['time_to_place_ms']} | "
                   f"{r['ratio']} | {r['placed']}/{r['probes']} | {r['solves']:,} | {r['retries_held_back']:,} | "
                   f"{r['hostile_calls_per_s']:,} |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, None, json_path)
