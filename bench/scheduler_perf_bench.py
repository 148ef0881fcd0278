"""``phalanx bench scheduler-perf``: upstream's own scheduler benchmark, three schedulers side by side.

kube-scheduler's ``test/integration/scheduler_perf`` (k8s.io/kubernetes v1.37.2) runs its workloads
— ``GangScheduling``, ``TopologyAwareScheduling`` and ``BasicScheduling`` in ``podgroup/`` — against
an API server it starts in-process, with fake nodes and no kubelet, and measures
``SchedulingThroughput`` (pods bound per second, sampled every second) and the scheduler's metrics.
``bench/scheduler_perf`` (Go) runs those workload files as published with one of three schedulers:
upstream's in-tree gang scheduling (its own configuration), phalanx's plugin mode
(``scheduler-config/kube-scheduler-plugin-config.yaml``) and phalanx's extender mode
(``scheduler-config/kube-scheduler-config.yaml``); in the phalanx modes ``phalanx serve`` runs as a
process against the benchmark's API server. This module builds it (``hack/build-scheduler-perf.sh``,
etcd from ``hack/build-k8s.sh``), runs each chosen workload with the three schedulers one after the
other, and writes one row per workload and scheduler.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import run_suite
from cluster import names

REPO = pathlib.Path(__file__).resolve().parents[1]
SCHEDULERS = ("in-tree", "plugin", "extender")
TOPICS = {"GangScheduling": "podgroup/gangscheduling", "TopologyAwareScheduling": "podgroup/tas",
          "BasicScheduling": "podgroup/basicscheduling",
          # workload-aware preemption: high-priority gangs that must evict pods or lower gangs to fit
          "GangPreemptionBasic": "workload_preemption", "GangPreemptionPodGroups": "workload_preemption",
          "GangPreemptionAffinity": "workload_preemption"}
# the workloads of the published table: every GangScheduling and TopologyAwareScheduling size that
# finishes here in the three schedulers, and BasicScheduling's smallest for scale (see
# docs/benchmarks.md for the ones left out and why)
FULL = ("GangScheduling/5000Nodes_1000Gangs_3000Pods", "GangScheduling/5000Nodes_3Gangs_3000Pods_1000PerGroup",
        "TopologyAwareScheduling/5000Nodes_750Gangs_3000Pods",
        "TopologyAwareScheduling/5000Nodes_3Gangs_3000Pods_1000PerGroup",
        "BasicScheduling/5000Nodes_1000Groups_3000Pods")
# upstream's integration-test workloads (what make e2e runs through tests/e2e/test_scheduler_perf.py)
QUICK = ("GangScheduling/10Nodes_3Gangs", "GangScheduling/100Nodes_10Gangs",
         "TopologyAwareScheduling/10Nodes_3Gangs", "TopologyAwareScheduling/100Nodes_10Gangs")
TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Workload:
    """One workload of an upstream test case: ``case/name`` with its labels and size."""

    case: str
    name: str
    labels: tuple[str, ...]
    nodes: int
    pods: int
    topic_dir: pathlib.Path

    @property
    def id(self) -> str:
        return f"{self.case}/{self.name}"


@dataclass(frozen=True)
class Build:
    """The benchmark binary and upstream's scheduler_perf folder (its etcd sits beside the binary)."""

    binary: pathlib.Path
    upstream: pathlib.Path

    @property
    def module_cache(self) -> pathlib.Path:
        """The Go module cache ``upstream`` sits in (``.../k8s.io/kubernetes@VERSION/test/...``)."""
        head, sep, _ = str(self.upstream).partition("/k8s.io/kubernetes@")
        if not sep:
            raise RuntimeError(f"upstream's scheduler_perf folder {self.upstream} is not in a Go module cache")
        return pathlib.Path(head)


def build() -> Build:
    """Build etcd (with the e2e control plane) and the benchmark binary; raise with the step's output
    when a build fails."""
    for script in ("build-k8s.sh", "build-scheduler-perf.sh"):
        done = subprocess.run(["bash", str(REPO / "hack" / script)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"hack/{script} failed:\n{done.stderr[-4000:]}")
    binary, upstream = done.stdout.strip().splitlines()[-2:]
    return Build(pathlib.Path(binary), pathlib.Path(upstream))


def workloads(upstream: pathlib.Path, ids: tuple[str, ...] | list[str]) -> list[Workload]:
    """The named workloads (``Case/Workload``) read from upstream's files; an unknown name is an error
    listing the known ones."""
    known: dict[str, Workload] = {}
    for case_name, topic in TOPICS.items():
        topic_dir = upstream / topic
        for case in yaml.safe_load((topic_dir / "performance-config.yaml").read_text()):
            if case["name"] != case_name:
                continue
            for w in case["workloads"]:
                params = w.get("params", {})
                nodes = int(params.get("initNodes", 0))
                groups = int(params.get("initPodGroups") or params.get("preemptorPodGroups")
                             or params.get("highPriorityGroups") or 0)  # the measured pods' groups
                per_group = int(params.get("podsPerGroup", 1))
                known[f"{case_name}/{w['name']}"] = Workload(case_name, w["name"], tuple(w.get("labels", [])), nodes,
                                                             groups * per_group, topic_dir)
    missing = [i for i in ids if i not in known]
    if missing:
        raise SystemExit(f"scheduler-perf: unknown workload(s) {', '.join(missing)}; known: {', '.join(sorted(known))}")
    return [known[i] for i in ids]


#: phalanx serve plans ahead for the profile the harness's scheduler configurations put phalanx in
#: (upstream's pod templates name no schedulerName), as the chart does for its own profile
PLAN_AHEAD = "--plan-ahead-for default-scheduler"


def run_one(b: Build, w: Workload, scheduler: str, out: pathlib.Path, timeout: float = TIMEOUT_S,
            pods_timeout: str = "", serve_args: str = "") -> dict[str, Any]:
    """Run one workload with one scheduler; the row of its results (``status`` says whether every pod
    was scheduled, else why not). ``pods_timeout`` (a Go duration) replaces upstream's 10 minutes
    for the pods to be scheduled; ``serve_args`` are appended to phalanx serve's arguments."""
    out.mkdir(parents=True, exist_ok=True)
    label = "integration-test" if "integration-test" in w.labels else "performance"
    argv = [str(b.binary), "-test.run=^$", f"-test.bench=^BenchmarkPerfScheduling$/^{w.case}$/^{w.name}$",
            "-test.benchtime=1x", "-test.timeout=0", f"-perf-scheduling-label-filter={label}",
            f"-data-items-dir={out}", f"-phalanx-scheduler={scheduler}", f"-phalanx-topic-dir={w.topic_dir}",
            f"-phalanx-repo={REPO}", f"-phalanx-bin={pathlib.Path(sys.executable).parent / 'phalanx'}",
            f"-phalanx-log-dir={out}", f"-phalanx-serve-args={PLAN_AHEAD} {serve_args}".strip()]
    if pods_timeout:
        argv.append(f"-phalanx-pods-timeout={pods_timeout}")
    env = {**os.environ, "PATH": f"{b.binary.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           # a -trimpath build: the test API server's certificates, under the Go module cache
           "TEST_SRCDIR": str(b.module_cache), "TEST_WORKSPACE": "."}
    started = time.monotonic()
    log = out / "benchmark.log"
    with log.open("w") as f:
        try:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    row: dict[str, Any] = {"workload": w.id, "scheduler": scheduler, "nodes": w.nodes, "pods": w.pods,
                           "wall_s": round(time.monotonic() - started, 1)}
    if rc is None:
        row["status"] = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        row["status"] = "failed: " + _failure(log)
    else:
        row["status"] = "ok"
    row.update(read_results(out))
    row["log"] = str(log)
    return row


#: lines of the benchmark's log that say why a workload failed: upstream's harness, the Go test
#: runner, and the phalanx serve the harness starts (bench/scheduler_perf/serve.go)
_FAILURE_MARKS = ("FATAL ERROR", "Error running workload", "error in waiting for pods", "panic:",
                  "phalanx serve exited", "phalanx serve not ready")


def _failure(log: pathlib.Path) -> str:
    """Why the run failed, from its log: the first line that says so and the two after it, else the
    log's last lines — enough to read in a test's assertion, where the log itself is not kept."""
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if any(mark in line for mark in _FAILURE_MARKS):
            return " ".join(s.strip() for s in lines[i:i + 3])[:600]
    tail = " | ".join(s.strip() for s in lines[-6:] if s.strip())
    return f"exit status non-zero (see {log}); its last lines: {tail[-600:]}"


_METRICS = {
    "SchedulingThroughput": "throughput",
    "scheduler_podgroup_scheduling_attempt_duration_seconds": "podgroup_attempt_ms",
    "scheduler_podgroup_scheduling_algorithm_duration_seconds": "podgroup_algorithm_ms",
}


def read_results(out: pathlib.Path) -> dict[str, Any]:
    """What one run wrote: the data items upstream's benchmark stores (throughput average and
    percentiles, the pod-group attempt and algorithm latencies, the scheduling duration, heap) and
    the usage record of phalanx serve (CPU seconds, peak RSS)."""
    row: dict[str, Any] = {}
    for path in glob.glob(str(out / "BenchmarkPerfScheduling_benchmark_*.json")):
        for item in json.loads(pathlib.Path(path).read_text()).get("dataItems") or []:
            labels, data = item.get("labels", {}), item.get("data") or {}
            metric = labels.get("Metric")
            if metric == "SchedulingThroughput":
                for key, name in (("Average", "avg"), ("Perc50", "p50"), ("Perc90", "p90"), ("Perc99", "p99")):
                    row[f"throughput_{name}"] = round(data.get(key, 0.0), 1)
            elif metric in _METRICS and labels.get("result") in ("scheduled", "not applicable"):
                prefix = _METRICS[metric]
                row[f"{prefix}_avg"] = round(data.get("Average", 0.0), 2)
                row[f"{prefix}_p99"] = round(data.get("Perc99", 0.0), 2)
            elif metric == "SchedulingDuration":
                row["scheduling_s"] = round(data.get("Duration", 0.0), 1)
            elif metric == "heap_memory_usage":
                row["scheduler_heap_max_mb"] = round(data.get("Max", 0.0))
    for path in glob.glob(str(out / "*.evictions.json")):  # every scheduler's victims (evictions.go)
        count = json.loads(pathlib.Path(path).read_text())
        for key in ("evicted_pods", "evicted_groups", "partial_groups"):
            row[key] = count.get(key, 0)
    for path in glob.glob(str(out / "*.metrics.txt")):  # serve's /metrics at the end (serve.go)
        row.update(_plan_requests(pathlib.Path(path).read_text()))
    for path in glob.glob(str(out / "*.usage.json")):
        usage = json.loads(pathlib.Path(path).read_text())
        row["serve_cpu_s"] = round(usage.get("cpu_seconds", 0.0), 1)
        row["serve_rss_mib"] = round(usage.get("max_rss_mib", 0.0))
    return row


def _plan_requests(text: str) -> dict[str, int]:
    """How many members reached kube-scheduler's PreFilter without their plan in the plugin's mirror
    (plugin mode), by whether serve held the plan already, made it on the call, or had none."""
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == names.METRIC_PLAN_REQUESTS.removesuffix("_total"):
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[f"plan_requests_{sample.labels['plan']}"] = int(sample.value)
    return counts


def run(workload_ids: tuple[str, ...], schedulers: tuple[str, ...] = SCHEDULERS, seeds: int = 1) -> list[dict]:
    """Each workload with each scheduler, one after the other (side by side in one run), ``seeds``
    times."""
    b = build()
    chosen = workloads(b.upstream, workload_ids)
    rows = []
    with tempfile.TemporaryDirectory(prefix="phalanx-scheduler-perf-") as tmp:
        for seed in range(seeds):
            for w in chosen:
                for scheduler in schedulers:
                    out = pathlib.Path(tmp) / f"{seed}-{w.case}-{w.name}-{scheduler}"
                    row = run_one(b, w, scheduler, out)
                    row["seed"] = seed
                    if w.pods and row.get("scheduling_s"):
                        row["pods_per_s"] = round(w.pods / row["scheduling_s"], 1)
                    print(f"{w.id} {scheduler}: {row['status']}, throughput avg {row.get('throughput_avg')} pods/s, "
                          f"scheduling {row.get('scheduling_s')} s", flush=True)
                    row.pop("log", None)
                    rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    """One line per workload and scheduler, with the ratio of its throughput to in-tree's in the same
    run; where the workloads preempt, the victims each scheduler evicted."""
    preempting = any("evicted_pods" in r for r in rows)
    lines = ["| workload | scheduler | status | throughput avg (pods/s) | p50 | p99 | × in-tree | "
             "scheduling (s) | pod-group attempt avg / p99 (ms) | phalanx serve CPU (s) / RSS (MiB) |"
             + (" evicted pods / groups (partial) |" if preempting else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if preempting else "")]
    base = {(r["workload"], r.get("seed", 0)): r for r in rows if r["scheduler"] == "in-tree"}
    for r in rows:
        ref = base.get((r["workload"], r.get("seed", 0)))
        ratio = ""
        if ref and ref.get("throughput_avg") and r.get("throughput_avg") is not None:
            ratio = f"{r['throughput_avg'] / ref['throughput_avg']:.2f}×"
        attempt = (f"{r['podgroup_attempt_ms_avg']} / {r['podgroup_attempt_ms_p99']}"
                   if "podgroup_attempt_ms_avg" in r else "")
        serve = f"{r['serve_cpu_s']} / {r['serve_rss_mib']}" if "serve_cpu_s" in r else "—"
        lines.append(f"| {r['workload']} | {r['scheduler']} | {r['status']} | {r.get('throughput_avg', '')} | "
                     f"{r.get('throughput_p50', '')} | {r.get('throughput_p99', '')} | {ratio} | "
                     f"{r.get('scheduling_s', '')} | {attempt} | {serve} |"
                     + (f" {r.get('evicted_pods', '')} / {r.get('evicted_groups', '')} "
                        f"({r.get('partial_groups', '')}) |" if preempting else ""))
    return "\n".join(lines)


def main(quick: bool, json_path: str | None, seeds: int | None = None, workloads_arg: str | None = None) -> int:
    ids = QUICK if quick else FULL
    if workloads_arg:
        ids = tuple(w.strip() for w in workloads_arg.split(",") if w.strip())
    return run_suite(run, markdown, dict(workload_ids=ids, seeds=1), seeds, json_path)
