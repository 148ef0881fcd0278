"""``phalanx bench cache``: initial sync and per-event cost of the watch cache.

Generated objects shaped like a real cluster's (8-GPU nodes with zone/rack labels and
conditions; pods with two containers, requests, labels, ownerReferences and status) are
serialised into list pages of 500 and fed to :class:`cluster.cache.ClusterCache` exactly as the
API server backend does: ``json.loads`` of each page, then ``replace``. This measures phalanx's
side of an initial sync (decode, convert, index) — not the API server or the network. Then pod
MODIFIED events are applied one by one to time a single watch event.
"""

from __future__ import annotations

import gc
import json
import statistics
import time

from bench import run_suite
from cluster.cache import ClusterCache
from cluster.names import LABEL_HOSTNAME, LABEL_RACK, LABEL_ZONE

PAGE = 500


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def node_json(i: int, zone_nodes: int = 1024) -> dict:
    """Node ``i`` of racks of 32 nodes and zones of ``zone_nodes``."""
    name = f"node-{i:05d}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": f"n-{i}", "resourceVersion": str(i),
                     "labels": {LABEL_HOSTNAME: name, LABEL_RACK: f"rack-{i // 32:03d}",
                                LABEL_ZONE: f"zone-{i // zone_nodes}", "kubernetes.io/os": "linux",
                                "node.kubernetes.io/instance-type": "gpu-8x"}},
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24"},
        "status": {"capacity": {"cpu": "96", "memory": "1024Gi", "nvidia.com/gpu": "8", "pods": "110"},
                   "allocatable": {"cpu": "95500m", "memory": "1000Gi", "nvidia.com/gpu": "8", "pods": "110"},
                   "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                                   "lastHeartbeatTime": "2026-11-29T00:00:00Z", "reason": "KubeletReady"}
                                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]},
    }


def pod_json(i: int, nodes: int) -> dict:
    group = f"job-{i // 8}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{group}-{i % 8}", "namespace": f"team-{i % 20}", "uid": f"p-{i}",
                     "resourceVersion": str(100000 + i), "labels": {"app": group, "team": str(i % 20)},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": group,
                                          "uid": f"s-{i // 8}", "controller": True}]},
        "spec": {"nodeName": f"node-{i % nodes:05d}", "schedulingGroup": {"podGroupName": group},
                 "priority": 1000, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "main", "image": "registry.example/train:1",
                                 "resources": {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
                                               "limits": {"nvidia.com/gpu": "1"}}},
                                {"name": "sidecar", "image": "registry.example/log:1",
                                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
        "status": {"phase": "Running", "podIP": f"10.1.{i // 250 % 250}.{i % 250}",
                   "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]},
    }


def pages(objects: list[dict]) -> list[bytes]:
    return [json.dumps({"items": objects[i:i + PAGE]}).encode() for i in range(0, len(objects), PAGE)]


def run(nodes: int, pods: int, events: int) -> dict:
    node_pages = pages([node_json(i) for i in range(nodes)])
    pod_pages = pages([pod_json(i, nodes) for i in range(pods)])
    gc.collect()
    base = _rss_mib()
    cache = ClusterCache()
    started = time.perf_counter()
    for kind, raw_pages in (("Node", node_pages), ("Pod", pod_pages)):
        items = []
        for page in raw_pages:
            items.extend(json.loads(page)["items"])
        cache.replace(kind, items)
        del items
    sync_s = time.perf_counter() - started
    gc.collect()
    cache_mib = _rss_mib() - base
    samples = []
    for i in range(events):
        obj = pod_json(i % pods, nodes)
        obj["metadata"]["resourceVersion"] = str(10**7 + i)
        obj["status"]["phase"] = "Running" if i % 2 else "Pending"
        t = time.perf_counter()
        cache.apply("Pod", "MODIFIED", obj)
        samples.append((time.perf_counter() - t) * 1e6)
    samples.sort()
    snap_started = time.perf_counter()
    cache.snapshot()  # first one builds the node part (again only when a node changes)
    first_ms = (time.perf_counter() - snap_started) * 1000
    steady = []
    for _ in range(20):
        t = time.perf_counter()
        cache.snapshot()
        steady.append((time.perf_counter() - t) * 1000)
    return {"nodes": nodes, "pods": pods, "initial_sync_s": round(sync_s, 2),
            "cache_rss_mib": round(cache_mib, 1), "event_p50_us": round(statistics.median(samples), 1),
            "event_p99_us": round(samples[int(len(samples) * 0.99) - 1], 1), "snapshot_first_ms": round(first_ms, 1),
            "snapshot_ms": round(statistics.median(steady), 2),
            "skipped": cache.skipped}


def markdown(rows: list[dict]) -> str:
    out = ["| nodes | pods | initial sync | cache RSS | watch event p50 / p99 | snapshot (first / steady) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['nodes']:,} | {r['pods']:,} | {r['initial_sync_s']} s | {r['cache_rss_mib']:.0f} MiB | "
                   f"{r['event_p50_us']} / {r['event_p99_us']} µs | {r['snapshot_first_ms']} / {r['snapshot_ms']} ms |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    size = dict(nodes=1_000, pods=10_000, events=2_000) if quick else dict(nodes=10_000, pods=100_000, events=20_000)
    return run_suite(lambda **p: [run(**p)], markdown, size, None, json_path)
