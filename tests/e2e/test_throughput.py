"""Pods/s on the real control plane, every scheduling mode side by side in one run, same nodes, same
gangs: phalanx's plugin mode (phalanx-scheduler: kube-scheduler v1.37.2 with phalanx's framework
plugin, gRPC to phalanx serve), phalanx's extender mode (kube-scheduler + the HTTP extender) and
kube-scheduler with upstream's in-tree gang scheduling (GenericWorkload +
TopologyAwareWorkloadScheduling); and plain pods (no group) under phalanx-scheduler, the extender
and a stock kube-scheduler. Each round runs every mode once, in an order rotated per round, on an
emptied cluster; the numbers are medians over the rounds. It prints them (a measurement, not a timed assertion); the
behaviour checked is that every gang lands whole and inside one rack (and on distinct nodes with
anti-affinity) under every scheduler, and every plain pod binds.

Run alone for the README's table (3 rounds, 2,000 nodes):
  PHALANX_THROUGHPUT_ROUNDS=3 PHALANX_THROUGHPUT_NODES=2000 .venv/bin/python -m pytest tests/e2e/test_throughput.py -s
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from harness import RACK, create, create_node, pod, podgroup, scheduler_config

from .conftest import phalanx_scheduler_config

NODES = int(os.environ.get("PHALANX_THROUGHPUT_NODES", "500"))
ROUNDS = int(os.environ.get("PHALANX_THROUGHPUT_ROUNDS", "1"))
PLAIN_PODS = int(os.environ.get("PHALANX_THROUGHPUT_PLAIN", "200"))
HOSTNAME = "kubernetes.io/hostname"
RACK_SIZE = 20  # 500 nodes -> 25 racks
CASES = ((8, 8, False), (64, 2, False), (8, 8, True))  # (gang size, gangs, hostname anti-affinity)
GANG_MODES = ("phalanx-plugin", "phalanx-extender", "in-tree")
PLAIN_MODES = ("phalanx-plugin", "phalanx-extender", "stock")
# "gangs" or "plain" runs only that half (the printed table then has only its rows)
ONLY = os.environ.get("PHALANX_THROUGHPUT_ONLY", "")
POLL = 0.05  # seconds between checks of the bound count (the resolution of a measurement)
SETTLE = 3.0  # seconds of quiet before each mode's run


def gang_pod(run, gang, g, i, anti, scheduler_name):
    """A gang member; with ``anti`` it carries required anti-affinity on the hostname against its
    own gang, as a quorum database's chart writes it."""
    group = f"{run}-{gang}-{'a' if anti else ''}{g}"
    body = pod(f"{group}-{i}", group, {"cpu": "1"}, labels={"gang": group, "run": run}, scheduler_name=scheduler_name)
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
    racks = {n: f"tp-rack-{int(n[3:]) // RACK_SIZE:02d}" for n in names}
    yield racks
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: rest.delete(f"/api/v1/nodes/{n}"), names))


#: kube-scheduler's API client limits, the same for every mode: the defaults (50 qps, burst 100)
#: cap whatever binds through kube-scheduler (plugin mode, in-tree, stock) near 30-90 pods/s here,
#: while the extender binds through phalanx's own client
CLIENT = {"qps": 500, "burst": 1000}


def _with_client(config):
    config.setdefault("clientConnection", {}).update(CLIENT)
    return config


def start(control_plane, phalanx, mode):
    """The scheduler of ``mode``, its profile named after the mode, with the same client limits."""
    if mode in ("phalanx-plugin", "phalanx-extender"):
        config = phalanx_scheduler_config(mode.removeprefix("phalanx-"), phalanx)
        if mode == "phalanx-plugin":
            config["profiles"][0]["schedulerName"] = mode
        else:
            config["profiles"] = [{"schedulerName": mode}]
        binary = "phalanx-scheduler" if mode == "phalanx-plugin" else "kube-scheduler"
        if not os.access(control_plane.binaries.path(binary), os.X_OK):
            pytest.fail(f"{binary} not built: run `bash hack/build-plugin.sh`", pytrace=False)
        return control_plane.start_scheduler(_with_client(config), binary=binary, name=mode)
    if mode == "in-tree":
        return control_plane.start_scheduler(_with_client(scheduler_config(mode)), name=mode, feature_gates={
            "GenericWorkload": True, "TopologyAwareWorkloadScheduling": True})
    return control_plane.start_scheduler(_with_client(scheduler_config(mode)), name=mode)


def wait_bound(rest, namespace, run, count, timeout=300.0):
    """pod name -> node once all ``count`` pods of ``run`` are bound (checked every POLL s)."""
    deadline = time.monotonic() + timeout
    while True:
        items = rest.list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"run={run}")
        placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items}
        if len(placed) == count and all(placed.values()):
            return placed
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run}: {sum(1 for v in placed.values() if v)} of {count} pods bound")
        time.sleep(POLL)


def clear(rest, namespace, run):
    rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                 params={"labelSelector": f"run={run}", "gracePeriodSeconds": 0})
    deadline = time.monotonic() + 120
    while rest.list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"run={run}"):
        assert time.monotonic() < deadline, f"{run}: pods not gone"
        time.sleep(0.2)


def run_gangs(rest, namespace, racks, run, scheduler_name, gang, count, anti):
    groups = [f"{run}-{gang}-{'a' if anti else ''}{g}" for g in range(count)]
    for group in groups:
        create(rest, podgroup(group, min_count=gang, topology_key=RACK), namespace)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda gi: create(rest, gang_pod(run, gang, gi[0], gi[1], anti, scheduler_name), namespace),
                      [(g, i) for g in range(count) for i in range(gang)]))
    placed = wait_bound(rest, namespace, run, gang * count)
    elapsed = time.monotonic() - started
    for group in groups:
        nodes = [n for name, n in placed.items() if name.rsplit("-", 1)[0] == group]
        assert len(nodes) == gang, f"{scheduler_name}: {group} has {len(nodes)} pods"
        assert len({racks[n] for n in nodes}) == 1, f"{scheduler_name}: {group} spans racks"
        if anti:
            assert len(set(nodes)) == gang, f"{scheduler_name}: anti-affinity gang {group} shares a node"
    clear(rest, namespace, run)
    return gang * count / elapsed


def run_plain(rest, namespace, run, scheduler_name):
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: create(rest, pod(f"{run}-{i}", None, {"cpu": "100m"}, labels={"run": run},
                                                 scheduler_name=scheduler_name), namespace), range(PLAIN_PODS)))
    wait_bound(rest, namespace, run, PLAIN_PODS)
    elapsed = time.monotonic() - started
    clear(rest, namespace, run)
    return PLAIN_PODS / elapsed


def test_pods_per_second_plugin_extender_in_tree_and_stock(rest, namespace, big_cluster, phalanx, control_plane):
    samples: dict[tuple, list[float]] = {}
    for r in range(ROUNDS):
        # gang modes, then plain modes, each pass in an order rotated per round (a mode is not
        # always measured right after the same other mode's clean-up); a pause lets the previous
        # run's deletions settle in phalanx serve, which shares this process with the pod creators
        passes = ((GANG_MODES, "gangs"), (PLAIN_MODES, "plain"))
        for modes, kind in passes:
            if ONLY and ONLY != kind:
                continue
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                time.sleep(SETTLE)
                sched = start(control_plane, phalanx, mode)
                try:
                    if kind == "gangs":
                        for gang, count, anti in CASES:
                            run = f"{mode}-r{r}-g{gang}{'a' if anti else ''}"
                            samples.setdefault((mode, gang, anti), []).append(
                                run_gangs(rest, namespace, big_cluster, run, mode, gang, count, anti))
                    else:
                        samples.setdefault((mode, "plain"), []).append(
                            run_plain(rest, namespace, f"{mode}-r{r}-p", mode))
                finally:
                    sched.stop()
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\nthroughput on the real control plane, {NODES} nodes in racks of {RACK_SIZE}, rack constraint, "
          f"median of {ROUNDS} round(s), pods/s:")
    for gang, count, anti in CASES if ONLY != "plain" else ():
        plugin, extender, tree = (med[(m, gang, anti)] for m in GANG_MODES)
        what = f"{count} gangs of {gang:>2}{' + hostname anti-affinity' if anti else ''}"
        print(f"  | {NODES} | {what} | {plugin:.1f} | {extender:.1f} | {tree:.1f} | {plugin / tree:.2f} | "
              f"{extender / tree:.2f} |")
    if ONLY == "gangs":
        return
    plugin, extender, stock = (med[(m, "plain")] for m in PLAIN_MODES)
    print(f"  | {NODES} | {PLAIN_PODS} plain pods | plugin {plugin:.1f} | extender {extender:.1f} | "
          f"stock {stock:.1f} | plugin/stock {plugin / stock:.2f} | extender/stock {extender / stock:.2f} |")
    print("  samples:", {"/".join(map(str, k)): [round(x, 1) for x in v] for k, v in samples.items()})
    assert all(v > 0 for v in med.values())
