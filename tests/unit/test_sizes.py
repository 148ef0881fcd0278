"""The collection walker behind ``WorkloadCycle.sizes`` / ``Controller.sizes`` and the
``phalanx_internal_entries`` gauge (cluster/sizes.py), and the soak benchmark's analysis."""

from __future__ import annotations

import threading
from collections import deque

import pytest
from prometheus_client import generate_latest

from bench.soak_bench import analyse
from bench.soak_real import histogram_window
from cluster import names
from cluster.sim import SimCluster
from cluster.sizes import collection_sizes
from cycle import WorkloadCycle
from cycle.metrics import CycleMetrics, thread_pool


class Leaf:  # a class of this test module: not phalanx's, so never walked into
    def __init__(self) -> None:
        self.hidden = {1: 2}


def test_walker_counts_collections_and_follows_phalanx_objects_once():
    sim = SimCluster()
    sim.add_nodes(zones=1, racks_per_zone=1, nodes_per_rack=3)
    root = Leaf()
    root.__dict__.update(by_node={"a": {1, 2}, "b": {3}}, order=deque([1, 2]), tags=[1], cache=sim.cache,
                         again=sim.cache, foreign=Leaf(), _private={"x": 1}, number=7)
    sizes = collection_sizes(root, "root")
    assert sizes["root.by_node"] == 2 and sizes["root.by_node[*]"] == 3
    assert sizes["root.order"] == 2 and sizes["root.tags"] == 1 and sizes["root.private"] == 1
    assert sizes["root.cache.nodes"] == 3  # walked into phalanx's own object ...
    assert not any(k.startswith("root.again.") for k in sizes)  # ... once, under its first path
    assert not any(k.startswith("root.foreign") for k in sizes) and "root.number" not in sizes
    assert "root.hidden" in sizes  # the root itself is walked whatever its class


def test_walker_follows_listeners_and_names_limits():
    from extender.dashboard.history import GROUP_CAPACITY, GroupHistory

    history = GroupHistory()
    root = Leaf()
    root.__dict__.update(listeners=[history.on_cycle_event],
                         ring=deque([1, 2, 3], maxlen=5), many=[history] * 100)
    sizes = collection_sizes(root, "root")
    assert sizes["root.ring<=5"] == 3
    assert f"root.listeners[GroupHistory].groups<={GROUP_CAPACITY}" in sizes  # a bound method's object
    assert "root.many" in sizes and not any(k.startswith("root.many[") for k in sizes)  # long lists are data
    assert not any("SIZE_CAPS" in k for k in sizes)  # the limits are not a collection of the history


def test_history_keeps_its_configured_number_of_groups_and_names_it():
    from extender.dashboard.history import GROUP_CAPACITY, GroupHistory
    from phalanx_cli.main import HISTORY_GROUPS

    assert HISTORY_GROUPS == GROUP_CAPACITY  # the CLI's default is the history's
    history = GroupHistory(capacity=3)
    for i in range(5):
        history.on_cycle_event("unschedulable", {"group": f"ns/g{i}", "reason": "no room"})
    assert list(history.groups) == ["ns/g2", "ns/g3", "ns/g4"]  # the oldest forgotten first
    root = Leaf()
    root.__dict__.update(listeners=[history.on_cycle_event])
    assert collection_sizes(root, "root")["root.listeners[GroupHistory].groups<=3"] == 3
    with pytest.raises(ValueError, match="at least 1 group"):
        GroupHistory(capacity=0)


def test_cycle_sizes_cover_its_helpers_and_are_exported():
    sim = SimCluster()
    sim.add_nodes(zones=1, racks_per_zone=1, nodes_per_rack=4)
    cycle = WorkloadCycle(sim.cache, sim)
    try:
        sizes = cycle.sizes()
        for key in ("cycle.book.plans", "cycle.verdicts.by_uid", "cycle.parked.by_group", "cycle.cache.pods",
                    "cycle.queue.failed", "cycle.preemption.nominations", "cycle.dispatcher.queues"):
            assert key in sizes, key
        assert sizes["cycle.cache.nodes"] == 4
        text = generate_latest(cycle.metrics.registry).decode()
        assert f'{names.METRIC_INTERNAL_ENTRIES}{{collection="cycle.cache.nodes"}} 4.0' in text
    finally:
        cycle.close()


def test_threads_are_exported_by_pool_so_a_pool_growing_is_told_from_a_leak():
    assert thread_pool("phalanx-grpc_3") == "phalanx-grpc" and thread_pool("CP Server Thread-12") == "CP Server Thread"
    assert thread_pool("Thread-7 (_evict)") == "Thread (_evict)" and thread_pool("watch-Pod") == "watch-Pod"
    metrics = CycleMetrics()
    started, stop = [], threading.Event()
    for i in range(3):
        started.append(threading.Thread(target=stop.wait, name=f"test-pool_{i}", daemon=True))
        started[-1].start()
    try:
        text = generate_latest(metrics.registry).decode()
        assert f'{names.METRIC_THREADS}{{pool="test-pool"}} 3.0' in text
        assert f'{names.METRIC_THREADS}{{pool="MainThread"}} 1.0' in text
    finally:
        stop.set()
        for t in started:
            t.join()
    assert 'pool="test-pool"' not in generate_latest(metrics.registry).decode()


def test_histogram_window_reads_the_quantile_bucket_of_the_window():
    before = {0.001: 10.0, 0.01: 10.0, 0.1: 10.0, float("inf"): 10.0}
    after = {0.001: 10.0, 0.01: 108.0, 0.1: 110.0, float("inf"): 110.0}  # 100 new: 98 <= 10 ms, 2 <= 100 ms
    assert histogram_window(before, after, 0.5) == 10.0
    assert histogram_window(before, after, 0.99) == 100.0
    assert histogram_window(after, after, 0.99) is None


def _sample(t: float, size: int, live: int, drained: bool = False) -> dict:
    row = {"t": t, "rss_kib": 1024, "threads": 10, "filter_p50_ms": 1.0, "filter_p99_ms": 2.0, "filter_calls": 5,
           "live": {"pods": live, "groups": 0, "nodes": 0}, "sizes": {"m": size, "flat": 3}}
    if drained:
        row["drained"] = True
    return row


def test_a_collection_with_a_limit_is_bounded_by_it_and_not_drained():
    rows = [_sample(60.0 * i, 0, 40) for i in range(12)] + [_sample(800.0, 0, 0, drained=True)]
    for i, row in enumerate(rows):
        row["sizes"]["history<=100"] = min(100, 30 * i)
    a = analyse({"samples": rows, "violations": []})
    assert "history<=100" not in a["unbounded"] and a["left_over_after_drain"] == {}
    rows[5]["sizes"]["history<=100"] = 101
    assert analyse({"samples": rows, "violations": []})["unbounded"] == ["history<=100"]


def test_analysis_tells_a_growing_map_from_a_flat_one():
    growing = [_sample(60.0 * i, 10 * i, 40) for i in range(12)] + [_sample(800.0, 100, 0, drained=True)]
    a = analyse({"samples": growing, "violations": []})
    assert a["growing"] == ["m"] and a["unbounded"] == ["m"]  # 110 entries > 40 live objects
    assert a["left_over_after_drain"] == {"m": {"start": 0, "drained": 100}}
    flat = [_sample(60.0 * i, 20 + i % 2, 40) for i in range(12)] + [_sample(800.0, 0, 0, drained=True)]
    a = analyse({"samples": flat, "violations": []})
    assert a["growing"] == [] and a["unbounded"] == [] and a["left_over_after_drain"] == {}


# -- the leaks the soak found ------------------------------------------------------------------------
def test_a_node_has_no_usage_entry_once_its_last_bound_pod_is_gone(sim):
    """Per-node usage kept a zeroed entry for every node that ever ran a pod, deleted nodes
    included: with nodes coming and going (autoscaling) it only grew."""
    from .k8s_objects import node, pod

    sim.create(node("short-lived", gpus=4))
    sim.create(pod("a", node="short-lived"))
    sim.create(pod("b", node="n-0-0"))
    assert set(sim.cache.usage) == {"short-lived", "n-0-0"}
    sim.delete("Pod", "default/a")
    sim.delete("Node", "short-lived")
    assert set(sim.cache.usage) == {"n-0-0"}
    sim.delete("Pod", "default/b")
    assert sim.cache.usage == {}
    assert sim.cache.snapshot().free.sum() == sim.cache.snapshot().allocatable.sum()  # nothing charged


def test_a_deleted_group_is_forgotten_by_the_queue_policies_at_the_next_requeue_pass(sim, cycle):
    """``bound_at`` (when each group bound, for lost-work preemption) was pruned only when a
    starvation hold was refreshed, i.e. only while some gang waited: after a busy spell it kept
    every deleted group."""
    from .k8s_objects import podgroup

    sim.create(podgroup("g", min_count=1))
    cycle.status.emit("bound", group="default/g", assignments={})
    assert "default/g" in cycle.queue_policies.bound_at
    sim.delete("PodGroup", "default/g")
    cycle.requeue.prune()
    assert cycle.queue_policies.bound_at == {}


def test_the_simulated_soak_runs_a_short_churn_and_drains():
    """The simulated soak builds its served extender like the benchmarks do (loopback, no
    authentication: a simulated cluster has no API server to review tokens) and its drain empties
    the cluster; a few seconds of churn, no invariant violated."""
    from bench.soak_bench import SimSoak

    result = SimSoak(duration=4.0, interval=2.0, quiet=1.5, rest_every=600.0, log=lambda _: None).run()
    assert result["violations"] == []
    assert sum(result["actions"].values()) > 0 and result["created"]["units"] > 0
    last = result["samples"][-1]
    assert last["drained"] and last["live"]["pods"] == 0 and last["live"]["groups"] == 0


class _Queue:
    failed: dict = {}


class _Cycle:
    queue, explanations, book = _Queue(), {}, {}

    @staticmethod
    def clock() -> float:
        return 0.0


class _Scheduler:
    @staticmethod
    def backoff_of(unit: str) -> float | None:
        return 4.0

    @staticmethod
    def last_try(unit: str) -> dict | None:
        return {"pod": "b-0", "candidates": 3, "passed": 0, "reason": "no room", "ago_s": 2.0}


def test_a_gang_short_at_a_rest_is_late_when_whole_within_the_grace_and_a_violation_when_not():
    from bench.soak_bench import SimSoak

    soak = object.__new__(SimSoak)  # the rest's grace only: no served extender behind it
    soak.grace, soak.cycle, soak.scheduler = 1.2, _Cycle(), _Scheduler()
    states = iter([{"a": (3, 1, []), "b": (2, 0, [])}, {"a": (3, 3, []), "b": (2, 0, [])}])
    soak._gang_state = lambda: next(states, {"b": (2, 0, [])})
    found = [{"type": "partial_gang", "group": "a"}, {"type": "fits_unbound", "group": "b"},
             {"type": "no_rest", "inflight": 1}]
    kept, late = soak._grace(found)
    assert [x["group"] for x in late] == ["a"] and late[0]["after_s"] < 1.2 and not late[0]["gone"]
    assert [v["type"] for v in kept] == ["fits_unbound", "no_rest"]
    assert kept[0]["grace_s"] == 1.2 and kept[0]["scheduler_retry_in_s"] == 4.0 and kept[0]["plans"] == []
    assert kept[0]["scheduler_last_try"]["candidates"] == 3  # what the scheduler saw and was told
