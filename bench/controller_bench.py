"""``phalanx bench controller``: StatefulSet created -> its Workload and PodGroup exist.

On the real loopback control plane of the e2e tests (the pinned kube-apiserver, etcd and
kube-controller-manager; build them with ``hack/build-k8s.sh``), with phalanx's controller and
webhooks running in-process: ``count`` gang StatefulSets are created at once (one thread each),
and watches on Workloads and PodGroups time when both objects of each StatefulSet appear. Every
run also counts duplicates (a StatefulSet with more than one Workload or PodGroup), which must be 0.
The target is data: ``TARGET_P99_MS``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from . import control_plane_binaries, run_suite

TARGET_P99_MS = 200.0
FULL = dict(counts=(10, 50, 100), replicas=3, seeds=3)
QUICK = dict(counts=(50,), replicas=3, seeds=1)


def _watch_arrivals(kube: Any, path: str, rv: str, arrivals: dict[str, float], halt: threading.Event) -> None:
    """Record when each StatefulSet's object (by its controller owner) first appears."""
    while not halt.is_set():
        for event in kube.watch(path, rv, timeout_seconds=5):
            obj = event.get("object") or {}
            rv = obj.get("metadata", {}).get("resourceVersion", rv)
            owner = next((r for r in obj.get("metadata", {}).get("ownerReferences") or [] if r.get("controller")), None)
            if event.get("type") == "ADDED" and owner:
                arrivals.setdefault(owner["name"], time.perf_counter())
            if halt.is_set():
                return


def measure(rest: Any, kube: Any, namespace: str, count: int, replicas: int = 3,
            timeout: float = 60.0) -> dict:
    """Create ``count`` gang StatefulSets at once in ``namespace``; per-StatefulSet latency to both
    objects (ms), and duplicates. ``rest`` creates (harness client), ``kube`` watches."""
    from harness import statefulset  # the e2e harness' builders (tests/e2e on sys.path)

    api = "/apis/scheduling.k8s.io/v1beta1/namespaces/" + namespace
    arrivals: dict[str, dict[str, float]] = {"workloads": {}, "podgroups": {}}
    halt = threading.Event()
    watchers = []
    for resource in arrivals:
        rv = kube.get(f"{api}/{resource}")["metadata"]["resourceVersion"]
        t = threading.Thread(target=_watch_arrivals, args=(kube, f"{api}/{resource}", rv, arrivals[resource], halt),
                             daemon=True)
        t.start()
        watchers.append(t)
    started: dict[str, float] = {}
    gate = threading.Barrier(count)

    def create(i: int) -> None:
        name = f"sts-{i}"
        body = statefulset(name, replicas, scheduling={"schedulingPolicy": {"gang": {}}})
        gate.wait()
        started[name] = time.perf_counter()
        rest.create(f"/apis/apps/v1/namespaces/{namespace}/statefulsets", body)

    creators = [threading.Thread(target=create, args=(i,)) for i in range(count)]
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(
            name in arrivals["workloads"] and name in arrivals["podgroups"] for name in started):
        time.sleep(0.05)
    time.sleep(1.0)  # let any duplicate show up
    halt.set()
    latencies = [1000 * (max(arrivals["workloads"].get(n, np.inf), arrivals["podgroups"].get(n, np.inf)) - t0)
                 for n, t0 in started.items()]
    per_sts: dict[str, list[int]] = {n: [0, 0] for n in started}
    for i, resource in enumerate(("workloads", "podgroups")):
        for obj in kube.list_pages(f"{api}/{resource}")[0]:
            owner = next((r["name"] for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
            if owner in per_sts:
                per_sts[owner][i] += 1
    return {
        "count": count, "replicas": replicas,
        "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
        "max_ms": float(np.max(latencies)),
        "missing": sum(1 for c in per_sts.values() if c != [1, 1] and 0 in c),
        "duplicates": sum(1 for c in per_sts.values() if max(c) > 1),
    }


def run(counts: tuple[int, ...], replicas: int, seeds: int) -> list[dict]:
    binaries = control_plane_binaries("controller")
    from harness import ControlPlane
    from phalanx_controller import PhalanxController

    workdir = Path(tempfile.mkdtemp(prefix="phalanx-bench-controller-"))
    plane = ControlPlane(workdir, binaries).start()
    rows = []
    try:
        phalanx = PhalanxController(plane)
        phalanx.start()
        phalanx.register()
        for count in counts:
            for seed in range(seeds):
                ns = f"bench-{count}-{seed}-{uuid.uuid4().hex[:4]}"
                plane.rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}})
                rows.append({"seed": seed, **measure(plane.rest, phalanx.kube, ns, count, replicas)})
                plane.rest.delete(f"/api/v1/namespaces/{ns}", missing_ok=True)
        phalanx.close()
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [f"StatefulSet -> Workload + PodGroup (target p99 <= {TARGET_P99_MS:.0f} ms, 0 duplicates)", "",
             "| StatefulSets at once | seed | p50 ms | p99 ms | max ms | duplicates | missing |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['count']} | {r['seed']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} | "
              f"{r['duplicates']} | {r['missing']} |" for r in rows]
    return "\n".join(lines)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
