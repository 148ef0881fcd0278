"""``phalanx bench soak --real``: the soak on the real loopback control plane of the e2e tests.

The control plane of the fault suite (``tests/e2e/harness/faults.py``: etcd, kube-apiserver,
kube-controller-manager with the real StatefulSet controller, KWOK running bound pods),
``phalanx serve`` as a process with kube-scheduler calling it as its extender (the shipped
configuration), phalanx's StatefulSet controller and webhooks in this process. Nothing is killed;
the churn is: gang StatefulSets (priority class ``soak-low``) created, scaled and deleted through
phalanx's controller (it writes their Workloads and PodGroups); bare high-priority gangs
(``soak-high``: PodGroup + pods) that preempt StatefulSet pods when the cluster is full (a victim
StatefulSet's controller recreates its pods); nodes added, and removed after a drain (cordoned,
the barrier's time waited, the units with a pod on it deleted). At the end every unit is deleted
and, at rest, a last sample shows what each collection holds once the churn is gone.

Every ``interval`` seconds a sample: ``phalanx serve``'s RSS and threads (``/proc``), every entry
of its ``phalanx_internal_entries`` gauge (``WorkloadCycle.sizes``), the controller's collections
(``Controller.sizes``, in this process), live pods, PodGroups and nodes, and the window's filter
latency from serve's ``phalanx_extender_request_duration_seconds{verb="filter"}`` histogram
(p50/p99 as the bucket bound the window's quantile falls in). Every ``rest_every`` seconds the
churn pauses until the cluster is at rest (the fault suite's rule) and the fault suite's at-rest
invariants are checked (``partial_gang``, ``unplanned_node``, ``unrecorded_bind``, ``lost_pod``,
``crash``; ``disruption_target`` only on pods no preemption may pick: the high-priority gangs) —
a StatefulSet's gang partly bound at rest only counts when its missing members would fit the free
CPUs (it may have been scaled up or lost members to preemption with no room left; those are
counted as ``partial_no_room``) — plus
``fits_unbound``: a live gang with nothing bound while the cluster has its minCount of CPUs free
(every pod requests one CPU of an 8-CPU node, so that many always fit), at two rests in a row
(kube-scheduler retries an unschedulable pod on a cluster event or after minutes, not at once).
"""

from __future__ import annotations

import pathlib
import sys
import threading
import time
import urllib.request
from typing import Any, Callable

from prometheus_client.parser import text_string_to_metric_families

from cluster import names

from . import E2E, control_plane_binaries
from .soak_samples import SOAK_HISTORY_GROUPS, churn_step, memory_summary, proc_smaps, proc_status, record_sample

LOW, HIGH = "soak-low", "soak-high"


def histogram_window(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The bucket bound (ms) the ``q`` quantile of the observations between two cumulative
    histogram readings (``le -> count``) falls in; None without observations."""
    bounds = sorted(after)
    deltas = [after[b] - before.get(b, 0.0) for b in bounds]
    total = deltas[-1] if deltas else 0.0
    if total <= 0:
        return None
    for bound, count in zip(bounds, deltas, strict=True):
        if count >= q * total:
            return round(bound * 1000, 2) if bound != float("inf") else None
    return None


def scrape(port: int) -> tuple[dict[str, int], dict[float, float], int]:
    """serve's /metrics: collection sizes, the filter latency histogram (le -> cumulative count),
    filter calls."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    sizes: dict[str, int] = {}
    buckets: dict[float, float] = {}
    calls = 0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == names.METRIC_INTERNAL_ENTRIES:
                sizes[s.labels["collection"]] = int(s.value)
            elif s.name == names.METRIC_EXTENDER_LATENCY + "_bucket" and s.labels.get("verb") == "filter":
                buckets[float(s.labels["le"])] = s.value
            elif s.name == names.METRIC_EXTENDER_LATENCY + "_count" and s.labels.get("verb") == "filter":
                calls = int(s.value)
    return sizes, buckets, calls


class RealSoak:
    def __init__(self, duration: float, interval: float, seed: int = 0, rest_every: float = 90.0,
                 racks: int = 3, nodes_per_rack: int = 8, log: Callable[[str], None] = print,
                 memory_trace: pathlib.Path | None = None, pause: tuple[float, float] = (0.5, 2.0)) -> None:
        """``memory_trace``: a directory for serve's memory trace (``phalanx serve --memory-trace``,
        a diagnostic that slows serve), summarised into the result; None: no trace. ``pause``: the
        bounds of the random wait between two actions, seconds."""
        self.duration, self.interval, self.seed, self.rest_every, self.log = duration, interval, seed, rest_every, log
        self.memory_trace = memory_trace
        self.pause = pause
        self.racks, self.nodes_per_rack = racks, nodes_per_rack
        self.samples: list[dict] = []
        self.rests: list[dict] = []
        self.violations: list[dict] = []
        self.actions: dict[str, int] = {}
        self.created = {"units": 0, "pods": 0, "nodes": 0}

    # -- run ----------------------------------------------------------------------------------
    def run(self) -> dict:
        control_plane_binaries("soak")
        from harness.faults import fault_control_plane

        with fault_control_plane("phalanx-bench-soak-") as plane:
            result = self.run_on(plane)
            plane.keep_logs = plane.keep_logs or bool(self.violations)
        return result

    def run_on(self, plane: Any) -> dict:
        """The soak on ``plane`` (a control plane with KWOK running its nodes, nothing else on it)."""
        sys.path.insert(0, str(E2E))
        from harness import priority_class
        from harness.faults import FaultConfig, FaultRun

        # the fault suite's run, with no faults: its setup (nodes, watches, serve, kube-scheduler,
        # controller and webhooks), its units, its rest rule and its invariants
        self.fr = fr = FaultRun(plane, FaultConfig(seed=self.seed, faults=0, kinds={"controller": 1.0},
                                                   racks=self.racks, nodes_per_rack=self.nodes_per_rack,
                                                   rest_timeout=90.0, log=self.log,
                                                   serve_args=self._serve_args()))
        for name, value in ((LOW, 0), (HIGH, 1000)):
            plane.rest.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}", missing_ok=True)
            plane.rest.create("/apis/scheduling.k8s.io/v1/priorityclasses", priority_class(name, value))
        self.added: list[str] = []
        self.high: set[str] = set()
        self.suspects: set[str] = set()  # gangs that fitted unbound at the last rest
        self.halt = threading.Event()
        try:
            fr.setup()
            self.started = time.monotonic()
            self._last: tuple[dict[float, float], int] = ({}, 0)
            sampler = threading.Thread(target=self._sample_loop, name="soak-sampler", daemon=True)
            self.sample()
            sampler.start()
            end = self.started + self.duration
            next_rest = self.started + self.rest_every
            while time.monotonic() < end:
                self.act()
                if time.monotonic() >= next_rest:
                    self.rest()
                    next_rest = time.monotonic() + self.rest_every
                time.sleep(fr.rng.uniform(*self.pause))
            self.rest()
            self.halt.set()
            sampler.join(timeout=self.interval + 30)
            self.sample()
            for unit in self._live():  # the drain: every unit deleted, then at rest
                fr.delete_unit(unit)
            self.rest()
            self.sample()["drained"] = True
        finally:
            self.halt.set()
            fr.teardown()
        result = {"mode": "real control plane", "seed": self.seed, "duration_s": self.duration,
                "interval_s": self.interval,
                "cluster": f"{fr.cfg.racks} racks x {fr.cfg.nodes_per_rack} nodes x {fr.cfg.cpu_per_node} CPUs "
                           f"(+ up to 6 added), one-CPU pods",
                "history_groups": SOAK_HISTORY_GROUPS,
                "actions": self.actions, "created": self.created, "rests": self.rests,
                "violations": self.violations, "samples": self.samples}
        if self.memory_trace is not None:
            result["memory_trace"] = memory_summary(self.memory_trace)
        return result

    def _serve_args(self) -> tuple[str, ...]:
        args: tuple[str, ...] = ("--history-groups", str(SOAK_HISTORY_GROUPS))
        if self.memory_trace is not None:
            every = max(60.0, min(300.0, self.duration / 12))  # a dozen looks, one to five minutes apart
            args += ("--memory-trace", str(self.memory_trace), "--memory-trace-every", f"{every:.0f}")
        return args

    # -- churn --------------------------------------------------------------------------------
    def _live(self, kind: str | None = None) -> list[Any]:
        return [u for u in self.fr.units.values() if not u.deleted and (kind is None or u.kind == kind)]

    def act(self) -> str:
        fr, rng = self.fr, self.fr.rng
        load = fr._live_cpu() / max(1, self._capacity())
        live, sts = self._live(), self._live("sts")
        return churn_step(rng, self.actions, {
            "sts_create": (3.0 if load < 0.9 else 0.5, self._sts_create),
            "sts_scale": (2.0, sts and (lambda: self._sts_scale(rng.choice(sts)))),
            "delete": (0.5 if load < 0.9 else 2.0, live and (lambda: fr.delete_unit(rng.choice(live)))),
            "high_gang": (0.8, self._high_gang),
            "node_add": (0.2 if len(self.added) < 6 else 0.0, self._node_add),
            "node_remove": (0.2 if self.added else 0.0, self._node_remove)})

    def _capacity(self) -> int:
        return len(self.fr.node_names) * self.fr.cfg.cpu_per_node

    def _sts_create(self) -> None:
        from harness import statefulset
        from harness.faults import UNIT_LABEL, Unit, retry

        fr = self.fr
        replicas = fr.rng.choice((2, 3, 4, 6, 8))
        name = fr._name("sts")
        fr.units[name] = Unit(name, "sts", replicas, min_count=replicas, size=replicas, created=time.monotonic())
        body = statefulset(name, replicas, scheduling={"schedulingPolicy": {"gang": {}}}, labels={UNIT_LABEL: name},
                           scheduler_name=fr.scheduler_name, priority_class_name=LOW)
        retry(lambda: fr.rest.create(f"/apis/apps/v1/namespaces/{fr.ns}/statefulsets", body))
        self.created["units"] += 1
        self.created["pods"] += replicas

    def _sts_scale(self, unit: Any) -> None:
        from harness.faults import retry

        fr = self.fr
        new = max(1, unit.size + fr.rng.choice((-2, -1, 1, 2, 3)))
        if new == unit.size:
            return
        path = f"/apis/apps/v1/namespaces/{fr.ns}/statefulsets/{unit.name}"
        retry(lambda: fr.rest.patch(path, {"spec": {"replicas": new}}))
        self.created["pods"] += max(0, new - unit.size)
        unit.size = unit.min_count = unit.cpu = new

    def _high_gang(self) -> None:
        from harness import pod
        from harness.faults import UNIT_LABEL

        fr = self.fr
        size = fr.rng.choice((2, 4, 8))
        unit = fr.create_gang(size, rack=False)
        self.high.add(unit.name)
        # the room it preempts is given back: the oldest units go until the offered load is the capacity
        bodies = [(unit.name, pod(f"{unit.name}-{i}", podgroup_name=unit.name, labels={UNIT_LABEL: unit.name},
                                  scheduler_name=fr.scheduler_name, priority_class_name=HIGH)) for i in range(size)]
        fr.post_pods(bodies)
        self.created["units"] += 1
        self.created["pods"] += size

    def _node_add(self) -> None:
        from harness import create_node
        from harness.faults import retry

        fr = self.fr
        name = f"{fr.node_prefix}-added-{fr._name('n')}"
        retry(lambda: create_node(fr.rest, name, cpu=fr.cfg.cpu_per_node, rack=f"rack-{fr.rng.randrange(self.racks)}"))
        fr.node_names.append(name)
        self.added.append(name)
        self.created["nodes"] += 1

    def _node_remove(self) -> None:
        from harness import delete_node
        from harness.faults import UNIT_LABEL, retry

        fr = self.fr
        name = self.added.pop(fr.rng.randrange(len(self.added)))
        # cordoned first, and the barrier's time given to bindings already under way: no pod
        # lands on the node after the units on it were listed
        retry(lambda: fr.rest.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}}))
        time.sleep(fr.cfg.barrier_timeout + 2)
        pods = retry(lambda: fr.rest.list_items(f"/api/v1/namespaces/{fr.ns}/pods"))
        on_node = {(p["metadata"].get("labels") or {}).get(UNIT_LABEL) for p in pods
                   if p["spec"].get("nodeName") == name}
        for unit in self._live():
            if unit.name in on_node:
                fr.delete_unit(unit)
        retry(lambda: delete_node(fr.rest, name))
        fr.node_names.remove(name)

    # -- invariants ---------------------------------------------------------------------------
    def rest(self) -> None:
        fr = self.fr
        t0 = time.monotonic()
        rest_s, pods, groups, at_rest = fr.wait_rest()
        free = self._capacity() - sum(1 for p in pods if p["spec"].get("nodeName")
                                      and not p["metadata"].get("deletionTimestamp"))
        found, partial_no_room = [], 0

        def no_room(partial: dict) -> bool:  # a StatefulSet scaled up or preempted, no room for the rest
            return partial["group"] not in self.high and partial["min_count"] - len(partial["bound"]) > free

        for v in fr.check(pods, groups, {"kind": "churn"}):
            if v["type"] == "disruption_target" and v["pod"].rsplit("-", 1)[0] not in self.high:
                continue  # a StatefulSet's pod preempted by a high-priority gang
            if v["type"] == "partial_gang" and no_room(v):
                partial_no_room += 1
                continue
            found.append(v)
        # the fault suite's rest waits for no partial gang: one that waits for room keeps it from rest
        unsettled = [p for p in fr.partial(pods, groups) if not no_room(p)]
        if not at_rest and (unsettled or not fr.partial(pods, groups)):
            found.append({"type": "no_rest", "partial": unsettled, "free": free})
        suspects, self.suspects = self.suspects, set()
        for g in groups:
            from harness.faults import _min_count, _owner

            unit = fr.units.get(_owner(g) or g["metadata"]["name"])
            min_count = _min_count(g)
            if unit is None or unit.deleted or min_count is None or g["metadata"].get("deletionTimestamp"):
                continue
            members = [p for p in pods if (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
                       == g["metadata"]["name"] and not p["metadata"].get("deletionTimestamp")]
            if len(members) >= min_count and not any(p["spec"].get("nodeName") for p in members) \
                    and min_count <= free:
                self.suspects.add(g["metadata"]["name"])
                if g["metadata"]["name"] not in suspects:
                    continue  # kube-scheduler may not have retried it yet: a violation at the next rest
                conditions = (g.get("status") or {}).get("conditions") or []
                found.append({"type": "fits_unbound", "group": g["metadata"]["name"], "min_count": min_count,
                              "free": free, "conditions": [c.get("message", "") for c in conditions][:2]})
        for v in found:
            v["t"] = round(time.monotonic() - self.started, 1)
            self.violations.append(v)
            self.log(f"VIOLATION {str(v)[:500]}")
        self.rests.append({"t": round(t0 - self.started, 1), "rest_s": round(rest_s, 1), "at_rest": at_rest,
                           "gangs": fr.gang_states(pods, groups), "partial_no_room": partial_no_room,
                           "violations": len(found)})

    # -- samples ------------------------------------------------------------------------------
    def _sample_loop(self) -> None:
        while not self.halt.wait(self.interval):
            try:
                self.sample()
            except Exception as err:  # noqa: BLE001 - a missed sample is said, the run goes on
                self.log(f"sample failed: {err!r}")

    def sample(self) -> dict:
        fr = self.fr
        serve = fr.rig.serve
        sizes, buckets, calls = scrape(fr.rig.serve_port)
        controller = fr.controller.controller
        if controller is not None:
            sizes.update(controller.sizes())
        before, calls_before = self._last
        self._last = (buckets, calls)
        from harness import SCHEDULING_API

        rest = fr.rest
        live = {"pods": len(rest.list_items("/api/v1/pods")),
                "groups": len(rest.list_items(f"/apis/{SCHEDULING_API}/podgroups")),
                "nodes": len(rest.list_items("/api/v1/nodes"))}
        status = proc_status(serve.proc.pid) if serve is not None else {"rss_kib": 0, "threads": 0}
        mappings = proc_smaps(serve.proc.pid) if serve is not None else {}
        driver = proc_status()
        row = record_sample(self.samples, self.log, time.monotonic() - self.started, status, live, calls - calls_before,
                            histogram_window(before, buckets, 0.5), histogram_window(before, buckets, 0.99), sizes,
                            len(self.violations), driver=driver, smaps_kib=mappings)
        self.log(f"          (driver process, the controller in it: rss {driver['rss_kib'] / 1024:.1f} MiB)")
        return row


__all__ = ["RealSoak", "histogram_window", "scrape"]
