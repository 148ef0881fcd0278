"""``phalanx bench scale``: phalanx on a simulated cluster of 65,000 nodes and 500,000 bound pods.

A simulation: no API server, no kubelet. The nodes and pods are :mod:`bench.cache_bench`'s objects
(8-GPU nodes in racks of 32, pods of 1 GPU with two containers, owners and status), here in zones
of :data:`ZONE_NODES` nodes (20 racks, 5,120 GPUs). Everything runs in a fresh process (spawned),
so the memory reported is that of a serve-like process holding the cache, not of the bench:

1. **Start-up sync**: the nodes, then the pods, in list pages of 500, ``json.loads`` of each page
   and ``replace`` of the whole list, as the API-server backend feeds :class:`ClusterCache`
   (generating a page is not timed); then the RSS, with the decoded lists the backend keeps alive
   beside the cache until its next re-list, and the peak RSS. The heap is then settled as
   ``phalanx serve`` settles it.
2. **The first snapshot** after the sync (the node part and the bound-pod tuple are built once).
3. **Cycle time for a big gang**: 4,096 pods of 1 GPU (512 nodes' worth) that must share one zone
   (a rack holds 256 GPUs, too few). The bound pods are laid out so that exactly one zone can hold
   it: that zone keeps room for the gang and an eighth more; the other pods are spread round-robin
   over every other node, so each other zone is partly filled and has far less than 4,096 GPUs
   free (full size: 102 zones, the others about 150 GPUs free each; quick: 4 zones, about 650).
   Timed as a workload cycle solves: a snapshot from the cache, then ``place()``, for the
   ``greedy`` and the ``exact`` path (``phalanx serve --solver``). Every answer is checked: all
   4,096 pods placed, all in one zone, within every node's free capacity; a wrong answer fails
   the bench.
4. **Cycle time for a small gang**: 3 pods of 1 GPU, no topology: most gangs are small.

Targets are printed beside the numbers (MET / MISSED); a missed target does not fail the bench.
"""

from __future__ import annotations

import gc
import json
import math
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Callable, Iterator, Mapping

from bench import run_suite
from bench.cache_bench import PAGE, node_json, pod_json
from cluster.cache import ClusterCache
from cluster.names import LABEL_ZONE
from cycle.heap import Heap
from solver import PodGroup, Snapshot, SolveOptions, place

FULL = dict(nodes=65_000, pods=500_000, gang=4_096, repeats=5, small_repeats=50)
QUICK = dict(nodes=2_000, pods=10_000, gang=4_096, repeats=3, small_repeats=50)
GPU = "nvidia.com/gpu"
GPUS = 8  # per node (cache_bench's nodes)
ZONE_NODES = 640  # 20 racks: 5,120 GPUs, room for the 4,096-pod gang in a zone that is mostly free
SMALL_GANG = 3
PATHS = ("greedy", "exact")
NAMESPACE = "bench"

JSON = dict[str, Any]  # an API object
Row = dict[str, Any]  # one measurement

#: what a row is held to: (field, at most, as printed)
TARGETS: dict[str, tuple[str, float, str]] = {
    "sync": ("seconds", 60.0, "sync ≤ 60 s"),
    "rss": ("rss_mib", 4096.0, "RSS ≤ 4 GiB"),
    "gang greedy": ("p99_ms", 50.0, "p99 ≤ 50 ms"),
    "gang exact": ("p99_ms", 1000.0, "p99 ≤ 1 s"),
}


class BenchFailed(RuntimeError):
    """The bench got a wrong answer (a placement that is not complete, not in one domain or not valid)."""


@dataclass(frozen=True)
class Layout:
    """Where the bound pods sit: ``open_bound`` of them in the open zone (round-robin over its
    nodes), the rest round-robin over every other node."""

    nodes: int
    pods: int
    zone_nodes: int
    open_zone: int
    open_bound: int

    @property
    def open_first(self) -> int:
        return self.open_zone * self.zone_nodes

    def node(self, i: int) -> int:
        """The node pod ``i`` is bound to."""
        if i < self.open_bound:
            return self.open_first + i % self.zone_nodes
        j = (i - self.open_bound) % (self.nodes - self.zone_nodes)
        return j if j < self.open_first else j + self.zone_nodes


def layout(nodes: int, pods: int, gang: int, zone_nodes: int = ZONE_NODES) -> Layout:
    """The open zone is the middle one of the whole zones; it keeps ``gang`` GPUs free and an
    eighth more (all of it when the zone is smaller). Raises ValueError when the pods do not fit."""
    whole = nodes // zone_nodes
    if whole < 2:
        raise ValueError(f"{nodes} nodes make {whole} whole zones of {zone_nodes} nodes: need 2 or more")
    open_bound = min(pods, max(0, zone_nodes * GPUS - gang - gang // 8))
    if pods - open_bound > (nodes - zone_nodes) * GPUS:
        raise ValueError(f"{pods} pods of 1 GPU do not fit on {nodes} nodes with a zone kept for the gang")
    return Layout(nodes, pods, zone_nodes, whole // 2, open_bound)


def bound_pod(i: int, where: Layout) -> JSON:
    obj = pod_json(i, where.nodes)
    obj["spec"]["nodeName"] = f"node-{where.node(i):05d}"
    return obj


def gang_objects(name: str, size: int, key: str, nodes: int) -> list[tuple[str, JSON]]:
    """A gang PodGroup and its pending members, shaped like the bound pods, as (kind, object)."""
    spec: JSON = {"schedulingPolicy": {"gang": {"minCount": size}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    out: list[tuple[str, JSON]] = [("PodGroup", {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"pg-{name}"}, "spec": spec})]
    for k in range(size):
        obj = pod_json(k, nodes)
        obj["metadata"].update(name=f"{name}-{k}", namespace=NAMESPACE, uid=f"{name}-{k}", labels={"app": name})
        obj["metadata"]["ownerReferences"][0].update(name=name, uid=f"s-{name}")
        del obj["spec"]["nodeName"]
        obj["spec"]["schedulingGroup"] = {"podGroupName": name}
        obj["status"] = {"phase": "Pending"}
        out.append(("Pod", obj))
    return out


# -- memory ---------------------------------------------------------------------------------
def memory_mib() -> tuple[float, float]:
    """This process's RSS and peak RSS (VmHWM; ru_maxrss where /proc is missing), MiB."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line.split(":")[0]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = found.get("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return found.get("VmRSS", peak), peak


# -- the measurements -----------------------------------------------------------------------
def _pages(make: Callable[[int], JSON], count: int) -> Iterator[bytes]:
    for start in range(0, count, PAGE):
        yield json.dumps({"items": [make(i) for i in range(start, min(count, start + PAGE))]}).encode()


def sync(cache: ClusterCache, where: Layout) -> Row:
    """Feed the nodes and the pods as the backend does; only the decode and ``replace`` are timed.
    The RSS is read with each kind's decoded list still alive, as the backend keeps it (until its
    next re-list)."""
    seconds = 0.0
    lists = []
    for kind, make, count in (("Node", lambda i: node_json(i, where.zone_nodes), where.nodes),
                              ("Pod", lambda i: bound_pod(i, where), where.pods)):
        items: list[JSON] = []
        for page in _pages(make, count):
            started = time.perf_counter()
            items.extend(json.loads(page)["items"])
            seconds += time.perf_counter() - started
        started = time.perf_counter()
        cache.replace(kind, items)
        seconds += time.perf_counter() - started
        lists.append(items)
    gc.collect()
    rss, peak = memory_mib()
    del lists, items
    if cache.skipped or len(cache.nodes) != where.nodes or len(cache.pods) != where.pods:
        raise BenchFailed(f"the cache holds {len(cache.nodes)} nodes and {len(cache.pods)} pods "
                          f"({cache.skipped} skipped), not {where.nodes} and {where.pods}")
    return dict(what="start-up sync", seconds=round(seconds, 2), rss_mib=round(rss, 1), peak_rss_mib=round(peak, 1))


def first_snapshot(cache: ClusterCache) -> Row:
    started = time.perf_counter()
    cache.snapshot({}, assumed={})
    seconds = time.perf_counter() - started
    rss, peak = memory_mib()
    return dict(what="first snapshot", seconds=round(seconds, 3), rss_mib=round(rss, 1), peak_rss_mib=round(peak, 1))


def zone_room(cache: ClusterCache, gpus: int) -> tuple[int, int]:
    """How many zones there are, and how many have ``gpus`` GPUs free (the bound pods' usage)."""
    free: dict[str, int] = {}
    for name, node in cache.nodes.items():
        zone = node.labels[LABEL_ZONE]
        free[zone] = free.get(zone, 0) + node.allocatable[GPU] - cache.usage.get(name, {}).get(GPU, 0)
    return len(free), sum(f >= gpus for f in free.values())


def check(cache: ClusterCache, snapshot: Snapshot, group: PodGroup, assignments: Mapping[str, str], key: str) -> None:
    """Raise BenchFailed unless every pending member is placed, in one ``key`` domain, within every
    node's free capacity. (The pods carry no inter-pod or volume rule, so that is all validity asks
    here; ``solver.assert_placement_valid`` would also scan every bound pod for each placed one.)"""
    pending = {p.uid: p for p in group.pending}
    if set(assignments) != set(pending):
        raise BenchFailed(f"{group.key}: {len(assignments)} of {len(pending)} pods placed")
    if key:
        domains = {cache.nodes[n].labels.get(key, "") for n in assignments.values()}
        if len(domains) != 1:
            raise BenchFailed(f"{group.key}: placed across {len(domains)} {key} domains: {sorted(domains)[:5]}")
    after = snapshot.with_placement(assignments, pending)
    rows = sorted({after.index[n] for n in assignments.values()})
    over = after.used[rows] > after.allocatable[rows]
    if over.any():
        i, j = (int(x[0]) for x in over.nonzero())
        raise BenchFailed(f"{group.key}: node {after.nodes[rows[i]].name} over capacity on {after.resources[j]}")


def percentile(samples: list[float], q: float) -> float:
    """Nearest rank: with fewer than 100 samples p99 is the slowest."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def time_cycles(cache: ClusterCache, group_key: str, path: str, repeats: int, key: str) -> Row:
    """A workload cycle's solve, ``repeats`` times: a snapshot from the cache, then ``place()``."""
    group = cache.podgroup(group_key)
    if group is None:
        raise BenchFailed(f"podgroup {group_key} is not in the cache")
    options = SolveOptions(path=path)
    samples = []
    placed = 0
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        snapshot = cache.snapshot({}, assumed={})
        placement = place(snapshot, group, options)
        samples.append((time.perf_counter() - started) * 1000.0)
        check(cache, snapshot, group, placement.assignments, key)
        placed = len(placement.assignments)
    rss, peak = memory_mib()
    return dict(path=path, gang=len(group.members), key=key, repeats=repeats,
                p50_ms=round(percentile(samples, 50), 2), p99_ms=round(percentile(samples, 99), 2),
                placed=placed, rss_mib=round(rss, 1), peak_rss_mib=round(peak, 1))


def measure(nodes: int, pods: int, gang: int, repeats: int, small_repeats: int, zone_nodes: int = ZONE_NODES,
            progress: Callable[[str], None] = print) -> list[Row]:
    """Every measurement in this process (``run`` calls it in a fresh one): one row each."""
    where = layout(nodes, pods, gang, zone_nodes)
    cache = ClusterCache()
    size = dict(nodes=nodes, pods=pods, zone_nodes=zone_nodes)
    rows = [dict(size, **sync(cache, where))]
    Heap().settle()  # as phalanx serve does once the caches are synced
    progress(_line(rows[-1]))
    rows.append(dict(size, **first_snapshot(cache)))
    progress(_line(rows[-1]))
    for kind, obj in gang_objects("big", gang, LABEL_ZONE, nodes) + gang_objects("small", SMALL_GANG, "", nodes):
        if not cache.apply(kind, "ADDED", obj):
            raise BenchFailed(f"the cache refused {kind} {obj['metadata']['name']}")
    zones, with_room = zone_room(cache, gang)
    for path in PATHS:
        row = dict(size, what=f"cycle: {gang:,}-pod zone gang", zones=zones, zones_with_room=with_room,
                   **time_cycles(cache, f"{NAMESPACE}/big", path, repeats, LABEL_ZONE))
        rows.append(row)
        progress(_line(row))
    for path in PATHS:
        row = dict(size, what=f"cycle: {SMALL_GANG}-pod gang", **time_cycles(
            cache, f"{NAMESPACE}/small", path, small_repeats, ""))
        rows.append(row)
        progress(_line(row))
    for row in rows:
        row.update(targets(row))
    return rows


def targets(row: Row) -> Row:
    """The row's targets and whether each is met: {"targets": {"p99 ≤ 50 ms": False}} (none: {})."""
    names = {"start-up sync": ["sync", "rss"]}.get(row["what"], [])
    if "zones" in row:
        names = [f"gang {row['path']}"]
    held = {text: row[field] <= limit for field, limit, text in (TARGETS[n] for n in names)}
    return {"targets": held} if held else {}


def run(nodes: int, pods: int, gang: int, repeats: int, small_repeats: int, zone_nodes: int = ZONE_NODES) -> list[Row]:
    """:func:`measure` in a fresh spawned process, so its memory is a serve-like process's."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(measure, nodes, pods, gang, repeats, small_repeats, zone_nodes).result()


# -- reporting ------------------------------------------------------------------------------
def _line(row: Row) -> str:
    if "p50_ms" in row:
        return (f"{row['what']} ({row['path']}): p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms, "
                f"{row['placed']} placed, RSS {row['rss_mib']:.0f} MiB")
    return f"{row['what']}: {row['seconds']} s, RSS {row['rss_mib']:.0f} MiB, peak {row['peak_rss_mib']:.0f} MiB"


def markdown(rows: list[Row]) -> str:
    zone_nodes = rows[0]["zone_nodes"] if rows else ZONE_NODES
    out = ["Simulated cluster (no API server, no kubelet): 8-GPU nodes, racks of 32, "
           f"zones of {zone_nodes} nodes; the bound pods hold 1 GPU each.", "",
           "| nodes | pods | what | path | p50 / p99 | seconds | RSS (peak) MiB | target |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        timing = f"{r['p50_ms']} / {r['p99_ms']} ms" if "p50_ms" in r else ""
        what = r["what"]
        if "placed" in r:
            room = f", {r['zones_with_room']} of {r['zones']} zones with room" if "zones" in r else ""
            what += f" ({r['placed']:,} placed{room})"
        target = "; ".join(f"{text}: {'MET' if met else 'MISSED'}" for text, met in r.get("targets", {}).items())
        out.append(f"| {r['nodes']:,} | {r['pods']:,} | {what} | {r.get('path', '')} | {timing} | "
                   f"{r.get('seconds', '')} | {r['rss_mib']:.0f} ({r['peak_rss_mib']:.0f}) | {target} |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, None, json_path)
