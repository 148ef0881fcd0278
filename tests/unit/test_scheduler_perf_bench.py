"""``phalanx bench scheduler-perf``'s reading of upstream's output: the data items scheduler_perf
writes (its DataItems JSON) and phalanx serve's usage record become one row, and the table puts each
scheduler's throughput beside in-tree's of the same run."""

from __future__ import annotations

import json
import pathlib

from prometheus_client import CollectorRegistry, generate_latest

from bench import scheduler_perf_bench as perf
from cycle.metrics import CycleMetrics


def _item(metric: str, unit: str, data: dict, result: str = "not applicable") -> dict:
    return {"data": data, "unit": unit, "labels": {"Metric": metric, "Name": "BenchmarkPerfScheduling/x/y/ns",
                                                    "result": result, "plugin": "not applicable"}}


def _write_run(out: pathlib.Path, throughput: float, usage: dict | None = None) -> None:
    out.mkdir()
    items = [
        _item("SchedulingThroughput", "pods/s", {"Average": throughput, "Perc50": 9.0, "Perc90": 33.0, "Perc99": 69.9}),
        _item("scheduler_podgroup_scheduling_attempt_duration_seconds", "ms",
              {"Average": 86.46, "Perc99": 245.07}, result="scheduled"),
        _item("scheduler_podgroup_scheduling_attempt_duration_seconds", "ms",
              {"Average": 999.0, "Perc99": 999.0}, result="unschedulable"),
        _item("SchedulingDuration", "s", {"Duration": 213.83}),
        _item("heap_memory_usage", "MB", {"Max": 517.2}),
        {"data": None, "unit": "", "labels": {"Metric": "not applicable"}},
    ]
    (out / "BenchmarkPerfScheduling_benchmark_gangscheduling-plugin_2026.json").write_text(
        json.dumps({"version": "v1", "dataItems": items}))
    if usage:
        (out / "BenchmarkPerfScheduling_x.usage.json").write_text(json.dumps(usage))


def test_a_run_becomes_a_row_with_the_scheduled_attempts_and_serves_usage(tmp_path: pathlib.Path) -> None:
    _write_run(tmp_path / "run", 13.88, {"cpu_seconds": 91.99, "max_rss_mib": 197.66})
    row = perf.read_results(tmp_path / "run")
    assert row == {"throughput_avg": 13.9, "throughput_p50": 9.0, "throughput_p90": 33.0, "throughput_p99": 69.9,
                   "podgroup_attempt_ms_avg": 86.46, "podgroup_attempt_ms_p99": 245.07, "scheduling_s": 213.8,
                   "scheduler_heap_max_mb": 517, "serve_cpu_s": 92.0, "serve_rss_mib": 198}


def test_serves_plan_requests_are_read_from_its_metrics_at_the_end(tmp_path: pathlib.Path) -> None:
    """serve.go keeps serve's /metrics beside its log: the members that reached kube-scheduler's
    PreFilter without their plan in the mirror become columns of the row."""
    metrics = CycleMetrics(CollectorRegistry())
    metrics.plan_requests.labels(plan="held").inc(327)
    metrics.plan_requests.labels(plan="made").inc(5)
    _write_run(tmp_path / "run", 13.88)
    (tmp_path / "run" / "BenchmarkPerfScheduling_x.metrics.txt").write_bytes(generate_latest(metrics.registry))
    row = perf.read_results(tmp_path / "run")
    assert (row["plan_requests_held"], row["plan_requests_made"]) == (327, 5)
    assert "plan_requests_none" not in row


def test_a_run_that_wrote_nothing_is_an_empty_row(tmp_path: pathlib.Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "BenchmarkPerfScheduling_benchmark_t_2026.json").write_text('{"version": "v1", "dataItems": null}')
    assert perf.read_results(tmp_path / "run") == {}


def test_the_table_gives_each_scheduler_its_ratio_to_in_tree_of_the_same_run() -> None:
    rows = [{"workload": "G/w", "scheduler": "in-tree", "status": "ok", "throughput_avg": 120.0, "seed": 0},
            {"workload": "G/w", "scheduler": "plugin", "status": "ok", "throughput_avg": 60.0, "seed": 0,
             "serve_cpu_s": 31.0, "serve_rss_mib": 190},
            {"workload": "G/w", "scheduler": "extender", "status": "failed: timed out", "seed": 0}]
    lines = perf.markdown(rows).splitlines()
    assert "| 0.50× |" in lines[3] and "31.0 / 190" in lines[3]
    assert "| 1.00× |" in lines[2]
    assert "failed: timed out" in lines[4] and "×" not in lines[4].split("|")[7]


def test_workloads_are_read_from_upstreams_files_and_an_unknown_name_lists_the_known(tmp_path: pathlib.Path) -> None:
    topic = tmp_path / "podgroup" / "gangscheduling"
    topic.mkdir(parents=True)
    (topic / "performance-config.yaml").write_text(
        "- name: GangScheduling\n  workloads:\n  - name: 10Nodes_3Gangs\n    labels: [integration-test, short]\n"
        "    params: {initNodes: 10, initPodGroups: 3, podsPerGroup: 3}\n")
    for other in ("tas", "basicscheduling"):
        (tmp_path / "podgroup" / other).mkdir()
        (tmp_path / "podgroup" / other / "performance-config.yaml").write_text("[]\n")
    preemption = tmp_path / "workload_preemption"
    preemption.mkdir()
    (preemption / "performance-config.yaml").write_text(
        "- name: GangPreemptionBasic\n  workloads:\n  - name: 100Nodes_10PreemptorGangs_10Pods_Evicting_1000InitPods\n"
        "    labels: [performance]\n    params: {initNodes: 100, initPods: 1000, preemptorPodGroups: 10, "
        "podsPerGroup: 10}\n")
    (w,) = perf.workloads(tmp_path, ["GangScheduling/10Nodes_3Gangs"])
    assert (w.nodes, w.pods, w.labels, w.topic_dir) == (10, 9, ("integration-test", "short"), topic)
    # a preemption workload counts its preemptors' pods (the pods it measures), not the victims
    (w,) = perf.workloads(tmp_path, ["GangPreemptionBasic/100Nodes_10PreemptorGangs_10Pods_Evicting_1000InitPods"])
    assert (w.nodes, w.pods, w.topic_dir) == (100, 100, preemption)
    try:
        perf.workloads(tmp_path, ["GangScheduling/nope"])
    except SystemExit as err:
        assert "GangScheduling/10Nodes_3Gangs" in str(err)
    else:
        raise AssertionError("an unknown workload was accepted")


def test_the_preemption_table_gives_medians_beside_in_trees_and_says_what_failed() -> None:
    from bench import preemption_perf_bench as preemption

    def row(scheduler: str, seconds: float, p99: float, status: str = "ok") -> dict:
        return {"workload": "GangPreemptionBasic/w", "scheduler": scheduler, "status": status, "scheduling_s": seconds,
                "podgroup_attempt_ms_p99": p99, "evicted_pods": 1000, "evicted_groups": 0, "partial_groups": 0}

    rows = [row("in-tree", 10, 100), row("in-tree", 12, 120), row("in-tree", 30, 90),
            row("plugin", 20, 400), row("plugin", 24, 300), row("plugin", 99, 999, "timed out after 900 s")]
    table = {r["scheduler"]: r for r in preemption.medians(rows)}
    assert (table["in-tree"]["scheduling_s"], table["in-tree"]["ok"]) == (12, 3)
    # a round that did not finish is left out of the medians and said
    assert (table["plugin"]["scheduling_s"], table["plugin"]["ok"], table["plugin"]["rounds"]) == (22, 2, 3)
    text = preemption.markdown(rows)
    assert "| GangPreemptionBasic / w | plugin | 2/3 | 22 | 0.55× |" in text
    assert "timed out after 900 s" in text


def test_a_failed_run_says_why_from_its_log(tmp_path: pathlib.Path) -> None:
    """The reason is what a test's assertion prints (the log is not kept where the suite runs): a
    failure of phalanx serve the harness started is named, and an unknown one gives the log's tail."""
    log = tmp_path / "benchmark.log"
    log.write_text("I1207 starting\n--- FAIL: BenchmarkPerfScheduling/G/w\n    perf_test.go:107: phalanx serve exited before it was ready (exit status 2)"
                   "; see x.serve.log\n--- FAIL: BenchmarkPerfScheduling\nFAIL\n")
    assert "phalanx serve exited before it was ready (exit status 2)" in perf._failure(log)
    log.write_text("".join(f"line {i}\n" for i in range(20)) + "exit status 1\n")
    why = perf._failure(log)
    assert "line 19" in why and "exit status 1" in why and "line 10" not in why
