"""Pods/s on the real control plane: kube-scheduler + phalanx against kube-scheduler with upstream's
in-tree gang scheduling (GenericWorkload + TopologyAwareWorkloadScheduling), same nodes, same gangs,
one after the other in one run. It prints the numbers (a measurement, not a timed assertion);
the behaviour checked is that every gang lands whole and inside one rack under both schedulers.

Run alone for the README's table:  .venv/bin/python -m pytest tests/e2e/test_throughput.py -s
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from harness import RACK, create, create_node, pod, podgroup, scheduler_config, wait_all_bound

from .conftest import PHALANX_SCHEDULER_CONFIG

NODES = int(os.environ.get("PHALANX_THROUGHPUT_NODES", "500"))
HOSTNAME = "kubernetes.io/hostname"
RACK_SIZE = 20  # 500 nodes -> 25 racks
CASES = ((8, 8, False), (64, 2, False), (8, 8, True))  # (gang size, gangs, hostname anti-affinity)


def gang_pod(scheduler_name, gang, g, i, anti):
    """A gang member; with ``anti`` it carries required anti-affinity on the hostname against its
    own gang, as a quorum database's chart writes it."""
    group = f"{scheduler_name}-{gang}-{'a' if anti else ''}{g}"
    body = pod(f"{group}-{i}", group, {"cpu": "1"}, labels={"gang": group}, scheduler_name=scheduler_name)
    if anti:
        body["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"gang": group}}, "topologyKey": HOSTNAME}]}}
    return body


@pytest.fixture(scope="module")
def big_cluster(rest):
    names = [f"tp-{i:04d}" for i in range(NODES)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: create_node(rest, n, cpu="16", memory="64Gi",
                                            rack=f"tp-rack-{int(n[3:]) // RACK_SIZE:02d}"), names))
    yield names
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: rest.delete(f"/api/v1/nodes/{n}"), names))


def run_gangs(rest, namespace, scheduler_name, gang, count, anti=False):
    groups = [f"{scheduler_name}-{gang}-{'a' if anti else ''}{g}" for g in range(count)]
    for group in groups:
        create(rest, podgroup(group, min_count=gang, topology_key=RACK), namespace)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda args: create(rest, gang_pod(scheduler_name, gang, args[0], args[1], anti), namespace),
                      [(g, i) for g in range(count) for i in range(gang)]))
    placements = [wait_all_bound(rest, namespace, count=gang, timeout=300, podgroup=group) for group in groups]
    elapsed = time.monotonic() - started
    for placement in placements:
        racks = {rest.get(f"/api/v1/nodes/{n}")["metadata"]["labels"][RACK] for n in placement.values()}
        assert len(racks) == 1, f"{scheduler_name}: a gang spans racks {racks}"
        if anti:
            assert len(set(placement.values())) == gang, f"{scheduler_name}: anti-affinity gang shares a node"
    return gang * count / elapsed


def test_pods_per_second_phalanx_vs_in_tree(rest, namespace, big_cluster, phalanx, start_scheduler):
    results = {}
    config = yaml.safe_load(PHALANX_SCHEDULER_CONFIG.read_text())
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{phalanx.port}/scheduler"
    config["profiles"] = [{"schedulerName": "phalanx"}]
    sched = start_scheduler(config)
    for gang, count, anti in CASES:
        results[("phalanx", gang, anti)] = run_gangs(rest, namespace, "phalanx", gang, count, anti)
    sched.stop()
    sched = start_scheduler(scheduler_config("in-tree"),
                            feature_gates={"GenericWorkload": True, "TopologyAwareWorkloadScheduling": True})
    for gang, count, anti in CASES:
        results[("in-tree", gang, anti)] = run_gangs(rest, namespace, "in-tree", gang, count, anti)
    sched.stop()
    print(f"\nthroughput on the real control plane, {NODES} nodes in racks of {RACK_SIZE}, rack constraint:")
    for gang, _, anti in CASES:
        ours, theirs = results[("phalanx", gang, anti)], results[("in-tree", gang, anti)]
        what = f"gangs of {gang:>3}{' + hostname anti-affinity' if anti else ''}"
        print(f"  {what}: phalanx {ours:7.1f} pods/s, in-tree {theirs:7.1f} pods/s, ratio {ours / theirs:.2f}")
    assert all(v > 0 for v in results.values())
