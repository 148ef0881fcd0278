"""``phalanx bench preemption-perf``: group preemption against in-tree, on upstream's own workloads.

kube-scheduler v1.37.2's scheduler_perf has a ``workload_preemption`` topic (k8s.io/kubernetes
``test/integration/scheduler_perf/workload_preemption``): high-priority gangs that do not fit a full
cluster and must preempt — ``GangPreemptionBasic`` (a 100-pod gang, or 10 gangs of 10, evicting
1,000 single low-priority pods on 100 nodes), ``GangPreemptionPodGroups`` (evicting lower-priority
gangs) and ``GangPreemptionAffinity`` (preemptors with required pod affinity). This suite runs
those files as published with the three schedulers of :mod:`bench.scheduler_perf_bench` one after
the other, ``seeds`` rounds, and reports per workload and scheduler the medians over the rounds of
what upstream measures (the preemptors' SchedulingThroughput where sampled, the time to schedule
every preemptor, the pod-group scheduling attempt latency avg and p99) and what it does not: the
pods and groups each scheduler evicted and the victim groups left partly running (counted from the
API server's watch the same way for all three, ``bench/scheduler_perf/evictions.go``). ``--quick``
runs the three 2-node ``integration-test`` workloads once: a gang of 2 evicting a few pods, timed in
whole seconds, so it checks the harness and the three schedulers, not their speed.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench import run_suite
from bench import scheduler_perf_bench as perf

FULL = ("GangPreemptionBasic/100Nodes_1PreemptorGang_100Pods_Evicting_1000InitPods",
        "GangPreemptionBasic/100Nodes_10PreemptorGangs_10Pods_Evicting_1000InitPods",
        "GangPreemptionPodGroups/100Nodes_1PreemptorGang_100Pods_Evicting_5LowPriorityGangs",
        "GangPreemptionPodGroups/100Nodes_10PreemptorGangs_10Pods_Evicting_50LowPriorityGangs",
        "GangPreemptionAffinity/100Nodes_1PreemptorGang_100Pods_Evicting_1000InitPods",
        "GangPreemptionAffinity/100Nodes_10PreemptorGangs_10Pods_Evicting_1000InitPods")
QUICK = ("GangPreemptionBasic/2Nodes_1PreemptorGang_2Pods_Evicting_10InitPods",
         "GangPreemptionPodGroups/2Nodes_1PreemptorGang_2Pods_Evicting_2LowPriorityGangs",
         "GangPreemptionAffinity/2Nodes_1PreemptorGang_2Pods_Evicting_10InitPods")
#: what the table gives, median over the rounds
MEASURES = ("scheduling_s", "throughput_avg", "podgroup_attempt_ms_avg", "podgroup_attempt_ms_p99",
            "evicted_pods", "evicted_groups", "partial_groups", "serve_cpu_s")


def medians(rows: list[dict]) -> list[dict[str, Any]]:
    """One row per workload and scheduler: each measure's median over the rounds that finished
    ("ok"), and how many did."""
    out: list[dict[str, Any]] = []
    keys = list(dict.fromkeys((r["workload"], r["scheduler"]) for r in rows))
    for workload, scheduler in keys:
        runs = [r for r in rows if r["workload"] == workload and r["scheduler"] == scheduler]
        done = [r for r in runs if r["status"] == "ok"]
        row: dict[str, Any] = {"workload": workload, "scheduler": scheduler, "rounds": len(runs), "ok": len(done)}
        for m in MEASURES:
            values = [r[m] for r in done if r.get(m) is not None]
            if values:
                middle = statistics.median(values)  # of an even count, a mean of two: kept whole where it is
                row[m] = int(middle) if float(middle).is_integer() else round(middle, 2)
        if len(done) < len(runs):
            row["failed"] = "; ".join(r["status"] for r in runs if r["status"] != "ok")[:300]
        out.append(row)
    return out


def _ratio(value: float | None, anchor: float | None, higher_is_better: bool) -> str:
    if not value or not anchor:
        return ""
    return f"{(value / anchor if higher_is_better else anchor / value):.2f}×"


def markdown(rows: list[dict]) -> str:
    """The medians beside in-tree's of the same rounds: × in-tree is speed (time to schedule every
    preemptor, in-tree's over this one's: above 1 is faster) and attempt p99 over in-tree's."""
    table = medians(rows)
    anchor = {r["workload"]: r for r in table if r["scheduler"] == "in-tree"}
    lines = ["| workload | scheduler | rounds ok | scheduling (s) | speed × in-tree | throughput avg (pods/s) | "
             "attempt avg / p99 (ms) | p99 ÷ in-tree's | evicted pods / groups (partial) | serve CPU (s) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        base = anchor.get(r["workload"], {})
        p99, base_p99 = r.get("podgroup_attempt_ms_p99"), base.get("podgroup_attempt_ms_p99")
        p99_ratio = f"{p99 / base_p99:.1f}" if p99 and base_p99 else ""
        lines.append(
            f"| {r['workload'].replace('/', ' / ')} | {r['scheduler']} | {r['ok']}/{r['rounds']} | "
            f"{r.get('scheduling_s', '')} | {_ratio(r.get('scheduling_s'), base.get('scheduling_s'), False)} | "
            f"{r.get('throughput_avg', '—')} | {r.get('podgroup_attempt_ms_avg', '')} / {p99 or ''} | {p99_ratio} | "
            f"{r.get('evicted_pods', '')} / {r.get('evicted_groups', '')} ({r.get('partial_groups', '')}) | "
            f"{r.get('serve_cpu_s', '—')} |")
    failed = [r for r in table if r.get("failed")]
    lines += [f"\n{r['workload']} {r['scheduler']}: {r['failed']}" for r in failed]
    return "\n".join(lines)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    ids = QUICK if quick else FULL
    return run_suite(perf.run, markdown, dict(workload_ids=ids, seeds=1 if quick else 3), seeds, json_path)
