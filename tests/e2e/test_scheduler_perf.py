"""Upstream's own scheduler benchmark, scheduler_perf (k8s.io/kubernetes v1.37.2), with phalanx.

Its ``integration-test`` workloads of ``GangScheduling`` (3 gangs of 3 pods on 10 nodes, 10 gangs of
3 on 100) and ``TopologyAwareScheduling`` (the same with a required rack) run, from upstream's
workload files as published, with phalanx's plugin mode and its extender mode (``phalanx serve`` a
process against the benchmark's own API server, see bench/scheduler_perf). Upstream's harness fails a
workload unless every pod it created is scheduled (bound to a node) before its timeout: a gang
bound whole is the only way there, since phalanx binds no member of a gang before all are
reserved. A negative control shows the check bites: with phalanx serve's gRPC endpoint off, plugin
mode binds nothing and the workload fails. ``phalanx bench scheduler-perf`` runs the 5,000-node
workloads with in-tree gang scheduling beside (docs/benchmarks.md).
"""

from __future__ import annotations

import pathlib

import pytest

from bench import scheduler_perf_bench as perf


@pytest.fixture(scope="module")
def built() -> perf.Build:
    return perf.build()


@pytest.mark.parametrize("scheduler", ["plugin", "extender"])
@pytest.mark.parametrize("workload", perf.QUICK)
def test_upstream_workload_binds_every_pod(built: perf.Build, workload: str, scheduler: str,
                                           tmp_path: pathlib.Path) -> None:
    (w,) = perf.workloads(built.upstream, [workload])
    row = perf.run_one(built, w, scheduler, tmp_path, timeout=600, pods_timeout="180s")
    assert row["status"] == "ok", f"{workload} under phalanx {scheduler} mode: {row['status']} (log: {row['log']})"
    # the benchmark measured the run (its SchedulingDuration data item) and phalanx serve ran
    assert row.get("scheduling_s", 0) > 0, row
    assert row.get("serve_cpu_s", 0) > 0, row


def test_unplaced_pods_fail_the_workload(built: perf.Build, tmp_path: pathlib.Path) -> None:
    """Negative control: phalanx serve without its gRPC endpoint, so the plugin is never answered
    and no gang member binds; upstream's wait for the pods then fails the workload."""
    (w,) = perf.workloads(built.upstream, ["GangScheduling/10Nodes_3Gangs"])
    row = perf.run_one(built, w, "plugin", tmp_path, timeout=600, pods_timeout="10s", serve_args="--grpc-addr off")
    assert row["status"].startswith("failed"), row
    assert "scheduled" in row["status"], row["status"]
