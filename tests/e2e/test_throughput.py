"""Pods/s on the real control plane, every scheduling mode side by side in one run, same nodes, same
gangs: phalanx's plugin mode (phalanx-scheduler: kube-scheduler v1.37.2 with phalanx's framework
plugin, gRPC to phalanx serve), phalanx's extender mode (kube-scheduler + the HTTP extender) and
kube-scheduler with upstream's in-tree gang scheduling (GenericWorkload +
TopologyAwareWorkloadScheduling); and plain pods (no group) under phalanx-scheduler, the extender
and a stock kube-scheduler. Beside them a ceiling, no scheduler at all: the same pods created with
``spec.nodeName`` already set (each gang on nodes of one rack), the rate at which this test and
this control plane create pods and see them bound; no scheduler's figure can exceed it, so a
target ratio above ceiling / in-tree cannot be met on this machine. Each round runs every mode once, in an order rotated per round, on an
emptied cluster; the numbers are medians over the rounds. It prints them (a measurement, not a timed assertion); the
behaviour checked is that every gang lands whole and inside one rack (and on distinct nodes with
anti-affinity) under every scheduler, and every plain pod binds.

Run alone for the table in docs/benchmarks.md (3 rounds, 2,000 nodes):
  PHALANX_THROUGHPUT_ROUNDS=3 PHALANX_THROUGHPUT_NODES=2000 .venv/bin/python -m pytest tests/e2e/test_throughput.py -s
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from harness import RACK, create, create_node, phalanx_scheduler_config, pod, podgroup, scheduler_config
from harness.faults import Rig, Watch

from cluster.kube import Kube

from .conftest import PHALANX_BARRIER_SECONDS

NODES = int(os.environ.get("PHALANX_THROUGHPUT_NODES", "500"))
ROUNDS = int(os.environ.get("PHALANX_THROUGHPUT_ROUNDS", "1"))
PLAIN_PODS = int(os.environ.get("PHALANX_THROUGHPUT_PLAIN", "200"))
HOSTNAME = "kubernetes.io/hostname"
RACK_SIZE = 20  # 500 nodes -> 25 racks
#: (gang size, gangs, hostname anti-affinity, rack constraint): rack gangs, and the small gangs
#: most clusters run most of (LWS replicas, quorum sets) without a topology constraint
CASES = ((8, 8, False, True), (64, 2, False, True), (8, 8, True, True), (3, 100, False, False),
         (2, 150, False, False))
GANG_MODES = ("phalanx-plugin", "phalanx-extender", "in-tree", "preset")
PLAIN_MODES = ("phalanx-plugin", "phalanx-extender", "stock", "preset")
PRESET = "preset"  # no scheduler: spec.nodeName set at creation (the ceiling)
# "gangs" or "plain" runs only that half (the printed table then has only its rows); "small" only
# the small gangs without topology
ONLY = os.environ.get("PHALANX_THROUGHPUT_ONLY", "")
GANG_CASES = tuple(c for c in CASES if not c[3]) if ONLY == "small" else CASES
SETTLE = 3.0  # seconds of quiet before each mode's run


def gang_pod(run, gang, g, i, anti, scheduler_name, node=None):
    """A gang member; with ``anti`` it carries required anti-affinity on the hostname against its
    own gang, as a quorum database's chart writes it. ``node``: created bound there (the ceiling)."""
    group = f"{run}-{gang}-{'a' if anti else ''}{g}"
    body = pod(f"{group}-{i}", group, {"cpu": "1"}, labels={"gang": group, "run": run}, scheduler_name=scheduler_name)
    if node:
        body["spec"]["nodeName"] = node
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
        list(pool.map(lambda n: rest.delete(f"/api/v1/nodes/{n}", missing_ok=True), names))


#: kube-scheduler's API client limits, the same for every mode: the defaults (50 qps, burst 100)
#: cap whatever binds through kube-scheduler (plugin mode, in-tree, stock) near 30-90 pods/s here,
#: while the extender binds through phalanx's own client
CLIENT = {"qps": 500, "burst": 1000}


def _with_client(config):
    config.setdefault("clientConnection", {}).update(CLIENT)
    return config


class _NoScheduler:
    def stop(self):
        pass


@pytest.fixture(scope="module")
def phalanx(control_plane):
    """``phalanx serve`` as deployed: its own process (the CLI), extender and gRPC ports both open.
    Not in this test's process, whose threads create the pods and poll for them."""
    rig = Rig(control_plane, "unused", PHALANX_BARRIER_SECONDS, mode="plugin",
              plan_ahead=("phalanx-plugin", "phalanx-extender"))
    rig.start_serve()
    yield rig
    assert rig.serve is not None
    rig.serve.stop()


def start(control_plane, phalanx, mode):
    """The scheduler of ``mode``, its profile named after the mode, with the same client limits."""
    if mode == PRESET:
        return _NoScheduler()
    if mode in ("phalanx-plugin", "phalanx-extender"):
        config = phalanx_scheduler_config(mode.removeprefix("phalanx-"), phalanx.serve_port, phalanx.grpc_port,
                                          PHALANX_BARRIER_SECONDS)
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


WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
_REQUEST = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_writes(rest) -> Counter:
    """The API server's count of write requests so far, by "resource[/subresource] VERB" (its
    apiserver_request_total metric; leases left out: leader election and node heartbeats renew
    them whatever the scheduler does)."""
    counts: Counter = Counter()
    for line in rest.text("/metrics").splitlines():
        m = _REQUEST.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m[1]))
        if labels.get("verb") not in WRITES or labels.get("resource") == "leases":
            continue
        what = labels.get("resource", "") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        counts[f"{what} {labels['verb']}"] += int(float(m[2]))
    return counts


class Usage:
    """What placing pods cost, per mode: API writes and CPU seconds by process (the control
    plane's components, the scheduler of the mode, phalanx serve and this test's client), summed
    over the runs with the pods they placed. On a machine whose cores are all busy during a run
    (this one has 2), pods/s follows the CPU a pod costs in all of them together."""

    def __init__(self, rest, control_plane, serve):
        self.rest, self.control_plane, self.serve = rest, control_plane, serve
        self.writes: dict[str, Counter] = {}
        self.cpu: dict[str, Counter] = {}
        self.pods: Counter = Counter()

    def _processes(self, mode):
        for c in self.control_plane.components:
            yield ("scheduler" if c.name == mode else c.name), c.proc.pid
        yield "phalanx serve", self.serve.serve.proc.pid
        yield "test client", os.getpid()

    def _cpu(self, mode) -> Counter:
        seconds: Counter = Counter()
        for name, pid in self._processes(mode):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seconds[name] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        return seconds

    def start(self, mode):
        return api_writes(self.rest), self._cpu(mode)

    def stop(self, mode, started, pods, created):
        writes, cpu = api_writes(self.rest), self._cpu(mode)
        writes.subtract(started[0])
        writes["pods POST"] -= created
        cpu.subtract(started[1])
        self.writes.setdefault(mode, Counter()).update({k: v for k, v in writes.items() if v > 0})
        self.cpu.setdefault(mode, Counter()).update({k: v for k, v in cpu.items() if v > 0})
        self.pods[mode] += pods

    def report(self, label):
        print(f"  {label}: API writes per pod beyond its creation; CPU ms per pod by process:")
        for mode, pods in self.pods.items():
            writes = self.writes.get(mode, Counter())
            top = ", ".join(f"{k} {v / pods:.2f}" for k, v in writes.most_common() if v / pods >= 0.05)
            cpu = self.cpu.get(mode, Counter())
            per = ", ".join(f"{k} {1000 * v / pods:.1f}" for k, v in cpu.most_common())
            print(f"    {mode}: writes {sum(writes.values()) / pods:.2f} ({top}); "
                  f"CPU {1000 * sum(cpu.values()) / pods:.1f} ({per})")


class Bound:
    """Watches the namespace's pods (harness.faults.Watch: list, then watch) from before a run's
    pods are created and notes the moment the last of the run's ``count`` pods is bound: no polling
    (a LIST every few milliseconds would cost the API server as much as some of what is measured),
    no poll interval in the figure."""

    def __init__(self, kube, namespace, run, count):
        self.run_label, self.count = run, count
        self.placed: dict[str, str] = {}
        self.at = 0.0  # time.monotonic() when the last pod was seen bound
        self.done = threading.Event()
        self.watch = Watch(kube, f"/api/v1/namespaces/{namespace}/pods", threading.Condition(), self._seen)
        self.watch.start()

    def _seen(self, obj):
        if (obj["metadata"].get("labels") or {}).get("run") == self.run_label and obj["spec"].get("nodeName"):
            self.placed[obj["metadata"]["name"]] = obj["spec"]["nodeName"]
            if len(self.placed) >= self.count and not self.done.is_set():
                self.at = time.monotonic()
                self.done.set()
                self.watch.halt.set()

    def wait(self, timeout=300.0):
        """pod name -> node once all are bound; the moment is ``at``."""
        if not self.done.wait(timeout):
            self.watch.halt.set()
            raise TimeoutError(f"{self.run_label}: {len(self.placed)} of {self.count} pods bound")
        return dict(self.placed)


def clear(rest, namespace, run):
    rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
                 params={"labelSelector": f"run={run}", "gracePeriodSeconds": 0})
    deadline = time.monotonic() + 120
    while rest.list_items(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"run={run}"):
        assert time.monotonic() < deadline, f"{run}: pods not gone"
        time.sleep(0.2)


def run_gangs(rest, kube, namespace, racks, run, scheduler_name, gang, count, anti, usage, racked=True):
    groups = [f"{run}-{gang}-{'a' if anti else ''}{g}" for g in range(count)]
    for group in groups:
        create(rest, podgroup(group, min_count=gang, topology_key=RACK if racked else None), namespace)
    measured = usage.start(scheduler_name)
    by_rack: dict[str, list[str]] = {}
    for node, rack in sorted(racks.items()):
        by_rack.setdefault(rack, []).append(node)
    rack_nodes = list(by_rack.values())

    def preset(g, i):  # the ceiling's node: gang g on rack g, one member per node in turn
        nodes = rack_nodes[g % len(rack_nodes)]
        return nodes[i % len(nodes)] if scheduler_name == PRESET else None

    bound = Bound(kube, namespace, run, gang * count)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda gi: create(rest, gang_pod(run, gang, gi[0], gi[1], anti, scheduler_name,
                                                       preset(*gi)), namespace),
                      [(g, i) for g in range(count) for i in range(gang)]))
    placed = bound.wait()
    elapsed = bound.at - started
    usage.stop(scheduler_name, measured, gang * count, gang * count)
    for group in groups:
        nodes = [n for name, n in placed.items() if name.rsplit("-", 1)[0] == group]
        assert len(nodes) == gang, f"{scheduler_name}: {group} has {len(nodes)} pods"
        assert not racked or len({racks[n] for n in nodes}) == 1, f"{scheduler_name}: {group} spans racks"
        if anti:
            assert len(set(nodes)) == gang, f"{scheduler_name}: anti-affinity gang {group} shares a node"
    clear(rest, namespace, run)
    return gang * count / elapsed


def run_plain(rest, kube, namespace, racks, run, scheduler_name, usage):
    nodes = sorted(racks)

    def body(i):
        plain = pod(f"{run}-{i}", None, {"cpu": "100m"}, labels={"run": run}, scheduler_name=scheduler_name)
        if scheduler_name == PRESET:
            plain["spec"]["nodeName"] = nodes[i % len(nodes)]
        return plain

    measured = usage.start(scheduler_name)
    bound = Bound(kube, namespace, run, PLAIN_PODS)
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: create(rest, body(i), namespace), range(PLAIN_PODS)))
    bound.wait()
    elapsed = bound.at - started
    usage.stop(scheduler_name, measured, PLAIN_PODS, PLAIN_PODS)
    clear(rest, namespace, run)
    return PLAIN_PODS / elapsed


def test_pods_per_second_plugin_extender_in_tree_and_stock(rest, namespace, big_cluster, phalanx, control_plane):
    samples: dict[tuple, list[float]] = {}
    kube = Kube(str(control_plane.admin_kubeconfig))
    usage = {kind: Usage(rest, control_plane, phalanx) for kind in ("gangs", "small", "plain")}
    for r in range(ROUNDS):
        # gang modes, then plain modes, each pass in an order rotated per round (a mode is not
        # always measured right after the same other mode's clean-up); a pause lets the previous
        # run's deletions settle in phalanx serve
        passes = ((GANG_MODES, "gangs"), (PLAIN_MODES, "plain"))
        for modes, kind in passes:
            if ONLY and ONLY != kind and not (ONLY == "small" and kind == "gangs"):
                continue
            for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                # phalanx serve is paused while a mode without it runs: it takes no CPU from it
                pause = not mode.startswith("phalanx-")
                if pause:
                    os.kill(phalanx.serve.proc.pid, signal.SIGSTOP)
                time.sleep(SETTLE)
                sched = start(control_plane, phalanx, mode)
                try:
                    if kind == "gangs":
                        for gang, count, anti, racked in GANG_CASES:
                            run = f"{mode}-r{r}-g{gang}{'a' if anti else ''}{'' if racked else 'n'}"
                            samples.setdefault((mode, gang, anti, racked), []).append(
                                run_gangs(rest, kube, namespace, big_cluster, run, mode, gang, count, anti,
                                          usage["small" if gang <= 3 else "gangs"], racked))
                    else:
                        samples.setdefault((mode, "plain"), []).append(
                            run_plain(rest, kube, namespace, big_cluster, f"{mode}-r{r}-p", mode, usage["plain"]))
                finally:
                    sched.stop()
                    if pause:
                        os.kill(phalanx.serve.proc.pid, signal.SIGCONT)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\nthroughput on the real control plane, {NODES} nodes in racks of {RACK_SIZE}, rack constraint, "
          f"median of {ROUNDS} round(s), pods/s:")
    print("  | nodes | case | plugin | extender | in-tree | plugin/in-tree | extender/in-tree | "
          "ceiling (preset nodeName) | ceiling/in-tree |")
    for gang, count, anti, racked in GANG_CASES if ONLY != "plain" else ():
        plugin, extender, tree, ceiling = (med[(m, gang, anti, racked)] for m in GANG_MODES)
        what = (f"{count} gangs of {gang:>2}{' + hostname anti-affinity' if anti else ''}"
                f"{'' if racked else ', no topology'}")
        print(f"  | {NODES} | {what} | {plugin:.1f} | {extender:.1f} | {tree:.1f} | {plugin / tree:.2f} | "
              f"{extender / tree:.2f} | {ceiling:.1f} | {ceiling / tree:.2f} |")
    if ONLY not in ("plain", "small"):
        usage["gangs"].report("rack gang pods (gangs of 8 and 64), every case and round")
    if ONLY != "plain":
        usage["small"].report("small gang pods (gangs of 2 and 3, no topology), every case and round")
    if ONLY in ("gangs", "small"):
        return
    plugin, extender, stock, ceiling = (med[(m, "plain")] for m in PLAIN_MODES)
    print(f"  | {NODES} | {PLAIN_PODS} plain pods | plugin {plugin:.1f} | extender {extender:.1f} | "
          f"stock {stock:.1f} | plugin/stock {plugin / stock:.2f} | extender/stock {extender / stock:.2f} | "
          f"ceiling {ceiling:.1f} |")
    usage["plain"].report("plain pods")
    print("  samples:", {"/".join(map(str, k)): [round(x, 1) for x in v] for k, v in samples.items()})
    assert all(v > 0 for v in med.values())
