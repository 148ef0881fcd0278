"""``phalanx bench soak``: hours of churn, then: did anything grow, slow down or break?

Two drivers, one report (:func:`analyse`, :func:`markdown`, :func:`plot`):

- **simulated** (default): the served extender (``extender.server.build``) on the simulated cluster
  (``cluster/sim.py``) with the simulated kube-scheduler (``bench/scheduler_sim.py``, PostFilter
  and per-group backoff on) calling it over HTTP. A seeded churn generator, one action every
  ``step`` seconds: gang StatefulSets created (the simulated StatefulSet controller makes the pods;
  the driver writes the PodGroup as phalanx's controller would, minCount = replicas), scaled
  (minCount follows) and deleted; LeaderWorkerSet-style groups (a leader and its workers in one
  gang) rolled to a new revision (the old group deleted, the next one created, as LWS replaces a
  group); priorities 0 / 100 / 1000 with the cluster offered about 100-130% of its GPUs, so higher
  gangs preempt lower ones; nodes added, and removed after their units are drained.
- **real control plane** (``--real``): :mod:`bench.soak_real`.

Every ``interval`` seconds a sample: the process's RSS and threads, the size of every long-lived
collection of the cycle and its cache (``WorkloadCycle.sizes``, one walker over every component:
``cluster/sizes.py``), live objects, and the window's filter latency (p50/p99 of the extender's
filter call as the simulated kube-scheduler timed it; the extender has no PreFilter — plugin mode's
PreFilter is timed by ``phalanx bench plugin``). Continuously: every bound gang member must be on a
node a plan of phalanx named for it (``unplanned_bind``). Every ``rest_every`` seconds the churn
pauses until the cluster is at rest (no plan planned or binding, no bind in flight, no binding
change for ``quiet`` s) and: no gang is partly bound (``partial_gang``) — unless it grew (scaled up:
its running members cannot be unbound) or lost members to preemption (``disruptionMode`` single;
half the gangs are ``all``) and its missing members have no room (counted as ``partial_no_room``);
no unbound gang fits the free capacity (``fits_unbound``); room is counted outside the nodes
phalanx's starvation holds keep for another gang. A gang found short is given ``grace`` seconds
more, the churn still paused (a retry can still be due: both per-group backoffs run up to 10 s);
whole by then, it is reported as late (``bound_in_grace``), else it is the violation. A rest not
reached within ``rest_timeout`` is ``no_rest``.

Flatness, after warm-up (the first ``warmup`` fraction of the samples): the least-squares slope per
hour, and the last third of the post-warm-up samples against the first third (means). A collection
is *bounded* when its largest size never exceeded the largest number of live objects (pods + groups
+ nodes) — maps keyed by pod, group or node cannot hold more unless they leak; one with a limit of
its own (``name<=N``) when it stayed within it — and *flat* when its last-third mean is at most 25%
(or 16 entries) above the first third's. At the end every unit is deleted and, at rest, a last
sample must find every collection back to its size at the start (plus the nodes the run added; the
node snapshot's per-shape caches, ``cycle.cache.base.*``, are rebuilt with the nodes, and histories
with a limit of their own keep the past: neither is drained): ``left_over_after_drain`` names those
that are not.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from cluster import names
from cluster.sim import SimCluster
from cycle.plans import PlanState

from . import run_suite
from .soak_samples import SOAK_HISTORY_GROUPS, churn_step, proc_status, record_sample

NS = "soak"
GPU = "nvidia.com/gpu"
FULL = dict(duration=3600.0, interval=20.0, seeds=1)
QUICK = dict(duration=300.0, interval=5.0, seeds=1)
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
GROWTH = 0.25  # a collection is flat when its last third is at most this much above its first third
GROWTH_ENTRIES = 16  # ... or at most this many entries above it (small maps jitter)
PRIORITIES = (0, 0, 100, 100, 1000)
# the cache's snapshot of the nodes, rebuilt whenever a node changes; its caches are keyed by pod
# shape (constraint signature), so they hold up to one entry per shape seen since: not drained
SNAPSHOT_BASE = "cycle.cache.base."


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


# -- the simulated churn -----------------------------------------------------------------------
@dataclass
class SimUnit:
    name: str
    kind: str  # sts | lws
    replicas: int
    gpus: int
    priority: int
    rack: bool
    revision: int = 0
    all_or_nothing: bool = False  # disruptionMode all: one member disrupted, the whole group goes


@dataclass
class SimSoak:
    """The simulated run's state; :meth:`run` drives it."""

    duration: float
    interval: float
    seed: int = 0
    step: float = 0.3
    rest_every: float = 60.0
    quiet: float = 12.0
    rest_timeout: float = 90.0
    grace: float = 25.0  # > both per-group backoff caps (10 s) and a try: see _grace
    racks: int = 4
    nodes_per_rack: int = 6
    log: Callable[[str], None] = print
    samples: list[dict] = field(default_factory=list)
    rests: list[dict] = field(default_factory=list)
    violations: list[dict] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from bench.scheduler_sim import SimulatedScheduler
        from extender.server import ServeOptions, build

        self.rng = random.Random(self.seed)
        self.sim = SimCluster()
        self.sim.add_nodes(zones=1, racks_per_zone=self.racks, nodes_per_rack=self.nodes_per_rack, gpus=8)
        self.phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="",
                                          http_threads=200, barrier_timeout=10.0, plan_ttl=30.0,
                                          history_groups=SOAK_HISTORY_GROUPS), sim=self.sim).start()
        self.cycle = self.phalanx.cycle
        self.planned: dict[str, set[str]] = {}  # pod uid -> nodes a plan named for it
        self._planned_lock = threading.Lock()
        self.cycle.subscribe(self._on_event)
        self.scheduler = SimulatedScheduler(self.sim, self.phalanx.port, bind_threads=200, post_filter=True,
                                            backoff=0.25)
        self.units: dict[str, SimUnit] = {}
        self.scaled: set[str] = set()  # groups scaled up since they were last seen whole at rest
        self.disrupted: set[str] = set()  # groups a member of which was evicted since then
        evict = self.sim.evict

        def recording_evict(namespace: str, name: str, uid: str, message: str, respect_pdb: bool) -> None:
            pod = self.sim.get("Pod", f"{namespace}/{name}")
            if pod is not None:
                self.disrupted.add((pod["spec"].get("schedulingGroup") or {}).get("podGroupName", ""))
            evict(namespace, name, uid, message, respect_pdb)

        self.sim.evict = recording_evict  # type: ignore[method-assign]  # phalanx's writer is the simulation
        self.added_nodes: list[str] = []
        self.counter = 0
        self.created = {"units": 0, "pods": 0, "nodes": 0}
        self.halt = threading.Event()
        self.paused = threading.Event()

    def _on_event(self, kind: str, data: Any) -> None:
        if kind == "planned":
            with self._planned_lock:
                for uid, node in dict(data.get("assignments") or {}).items():
                    self.planned.setdefault(uid, set()).add(node)
        elif kind == "reslotted":  # two identical members of a plan traded their planned nodes
            uids = {f"{p['metadata'].get('namespace')}/{p['metadata']['name']}": p["metadata"]["uid"]
                    for p in self.sim.list("Pod")}
            with self._planned_lock:
                for key, node in ((data.get("pod"), data.get("node")), (data.get("partner"), data.get("was"))):
                    if key in uids and node:
                        self.planned.setdefault(uids[key], set()).add(node)

    # the simulated kube-scheduler: its own thread, paused never (it is the cluster's scheduler)
    def _schedule(self) -> None:
        self.scheduler.run_forever(self.halt, interval=0.05)

    # -- actions ---------------------------------------------------------------------------------
    def _gpus_offered(self) -> int:
        return sum(u.replicas * u.gpus for u in self.units.values())

    def _capacity(self) -> int:
        return 8 * len(self.sim.list("Node"))

    def _create(self, kind: str, replicas: int | None = None, gpus: int | None = None,
                priority: int | None = None, rack: bool | None = None, revision: int = 0,
                name: str | None = None) -> SimUnit:
        rng = self.rng
        self.counter += 1
        gpus = gpus or rng.choice((1, 2, 4, 8))
        replicas = replicas or (rng.choice((2, 3, 4)) if kind == "lws" else rng.choice((1, 2, 4, 8)))
        unit = SimUnit(name or f"{kind}-{self.counter}", kind, replicas, gpus,
                       rng.choice(PRIORITIES) if priority is None else priority,
                       (gpus * replicas <= 8 * self.nodes_per_rack // 2 and rng.random() < 0.3) if rack is None
                       else rack, revision, rng.random() < 0.5)
        group = self._group_name(unit)
        spec: dict = {"schedulingPolicy": {"gang": {"minCount": unit.replicas}}, "priority": unit.priority}
        if unit.rack:
            spec["schedulingConstraints"] = {"topology": [{"key": names.LABEL_RACK}]}
        if unit.all_or_nothing:
            spec["disruptionMode"] = {"all": {}}
        self.sim.create({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                         "metadata": {"name": group, "namespace": NS}, "spec": spec})
        template = {"metadata": {"labels": {"unit": unit.name}},
                    "spec": {"priority": unit.priority, "schedulingGroup": {"podGroupName": group},
                             "containers": [{"name": "c", "resources": {"requests": {
                                 "cpu": "1", GPU: str(unit.gpus)}}}]}}
        self.sim.create({"apiVersion": "apps/v1", "kind": "StatefulSet",
                         "metadata": {"name": group, "namespace": NS},
                         "spec": {"replicas": unit.replicas, "podManagementPolicy": "Parallel",
                                  "template": template}})
        self.units[unit.name] = unit
        self.created["units"] += 1
        self.created["pods"] += unit.replicas
        return unit

    @staticmethod
    def _group_name(unit: SimUnit) -> str:
        return f"{unit.name}-r{unit.revision}" if unit.kind == "lws" else unit.name

    def _delete(self, unit: SimUnit) -> None:
        group = self._group_name(unit)
        self.sim.delete("StatefulSet", f"{NS}/{group}")  # its pods go with it (ownerReferences)
        self.sim.delete("PodGroup", f"{NS}/{group}")
        del self.units[unit.name]

    def _scale(self, unit: SimUnit) -> None:
        new = max(1, unit.replicas + self.rng.choice((-2, -1, 1, 2)))
        if new == unit.replicas:
            return
        key = f"{NS}/{unit.name}"

        def min_count(obj: dict) -> None:
            obj["spec"]["schedulingPolicy"]["gang"]["minCount"] = new

        def replicas(obj: dict) -> None:
            obj["spec"]["replicas"] = new

        # as phalanx's controller keeps them: minCount up before the pods come, down after they go
        first, second = (("PodGroup", min_count), ("StatefulSet", replicas)) if new > unit.replicas else \
            (("StatefulSet", replicas), ("PodGroup", min_count))
        self.sim.update(first[0], key, first[1])
        self.sim.update(second[0], key, second[1])
        self.created["pods"] += max(0, new - unit.replicas)
        if new > unit.replicas:
            self.scaled.add(unit.name)
        unit.replicas = new

    def _rollout(self, unit: SimUnit) -> None:
        self._delete(unit)
        self._create("lws", unit.replicas, unit.gpus, unit.priority, unit.rack, unit.revision + 1, unit.name)

    def _node_add(self) -> None:
        self.counter += 1
        rack = self.rng.randrange(self.racks)
        name = f"added-{self.counter}"
        self.sim.create({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": {
            names.LABEL_HOSTNAME: name, names.LABEL_ZONE: "zone-0", names.LABEL_RACK: f"z0-r{rack}"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"},
                       "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        self.added_nodes.append(name)
        self.created["nodes"] += 1

    def _node_remove(self) -> None:
        """Drain a node (delete the units with a pod on it, as an operator drains gang jobs), then
        delete it. Prefers nodes the run added; never below the initial count."""
        if not self.added_nodes:
            return
        name = self.added_nodes.pop(self.rng.randrange(len(self.added_nodes)))
        on_node = {(p["metadata"].get("labels") or {}).get("unit") for p in self.sim.list("Pod")
                   if p["spec"].get("nodeName") == name}
        for unit in [u for u in self.units.values() if u.name in on_node]:
            self._delete(unit)
        self.sim.delete("Node", name)

    def act(self) -> str:
        rng = self.rng
        load = self._gpus_offered() / max(1, self._capacity())
        units = list(self.units.values())
        sts = [u for u in units if u.kind == "sts"]
        lws = [u for u in units if u.kind == "lws"]
        return churn_step(rng, self.actions, {
            "create": (3.0 if load < 1.0 else (1.0 if load < 1.3 else 0.2),
                       lambda: self._create(rng.choice(("sts", "sts", "lws")))),
            "delete": (0.5 if load < 1.0 else 2.0, units and (lambda: self._delete(rng.choice(units)))),
            "scale": (1.5, sts and (lambda: self._scale(rng.choice(sts)))),
            "rollout": (1.0, lws and (lambda: self._rollout(rng.choice(lws)))),
            "node_add": (0.15 if len(self.added_nodes) < 8 else 0.0, self._node_add),
            "node_remove": (0.15 if self.added_nodes else 0.0, self._node_remove)})

    # -- observation -----------------------------------------------------------------------------
    def _gang_state(self) -> dict[str, tuple[int, int, list[dict]]]:
        """group -> (minCount, bound, members) of the live gangs."""
        members: dict[str, list[dict]] = {}
        for p in self.sim.list("Pod"):
            group = (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
            if group:
                members.setdefault(group, []).append(p)
        out = {}
        for g in self.sim.list("PodGroup"):
            name = g["metadata"]["name"]
            mine = members.get(name, [])
            out[name] = (int(g["spec"]["schedulingPolicy"]["gang"]["minCount"]),
                         sum(1 for p in mine if p["spec"].get("nodeName")), mine)
        return out

    def check_planned(self) -> None:
        with self._planned_lock:
            planned = {uid: set(nodes) for uid, nodes in self.planned.items()}
        for p in self.sim.list("Pod"):
            node, uid = p["spec"].get("nodeName"), p["metadata"]["uid"]
            grouped = (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
            if node and grouped and node not in planned.get(uid, ()):
                self._violation({"type": "unplanned_bind", "pod": p["metadata"]["name"], "node": node,
                                 "planned": sorted(planned.get(uid, ()))})

    def _violation(self, v: dict) -> None:
        v["t"] = round(time.monotonic() - self.started, 1)
        self.violations.append(v)
        self.log(f"VIOLATION {json.dumps(v)[:3000]}")

    def _fits(self, min_count: int, gpus: int, rack: bool, free: dict[str, int], racks: dict[str, str]) -> bool:
        per_domain: dict[str, int] = {}
        for node, room in free.items():
            domain = racks.get(node, "") if rack else ""
            per_domain[domain] = per_domain.get(domain, 0) + room // gpus
        return max(per_domain.values(), default=0) >= min_count

    def rest(self) -> dict:
        """Pause the churn until the cluster is at rest; check the at-rest invariants."""
        t0 = time.monotonic()
        last, since = None, time.monotonic()
        at_rest = False
        while time.monotonic() - t0 < self.rest_timeout:
            state = self._gang_state()
            placed = {p["metadata"]["uid"]: p["spec"].get("nodeName") for _, _, ms in state.values() for p in ms}
            if placed != last:
                last, since = placed, time.monotonic()
            # a bound plan is forgotten at the next call once the cache shows its bindings: not busy
            busy = self.scheduler.inflight() > 0 or any(
                p.state in (PlanState.PLANNED, PlanState.BINDING) for p in list(self.cycle.book.values()))
            if not busy and time.monotonic() - since >= self.quiet:
                at_rest = True
                break
            time.sleep(0.5)
        state = self._gang_state()
        found = []
        if not at_rest:
            now = self.cycle.clock()
            found.append({"type": "no_rest", "inflight": self.scheduler.inflight(), "plans": [
                {"group": p.group, "state": p.state.value if p.state else None, "age_s": round(now - p.created, 1),
                 "members": len(p.assignments), "arrived": len(p.arrived), "answered": len(p.answered),
                 "bound": len(p.bound)} for p in list(self.cycle.book.values())]})
        # room per node outside the nodes another gang's starvation hold keeps
        snapshot = self.cycle.cache.snapshot()
        gpu = snapshot.resources.index(GPU) if GPU in snapshot.resources else None
        holds = list(self.cycle.queue_policies.holds)
        racks = {n["metadata"]["name"]: n["metadata"]["labels"].get(names.LABEL_RACK, "")
                 for n in self.sim.list("Node")}

        def room(group: str, rack_of: str = "") -> dict[str, int]:
            held = np.zeros(len(snapshot.nodes), dtype=bool)
            for h in holds:
                if h.holder != f"{NS}/{group}" and len(h.nodes) == len(snapshot.nodes):
                    held |= h.nodes
            return {n.name: int(snapshot.free[i, gpu]) for i, n in enumerate(snapshot.nodes)
                    if not held[i] and gpu is not None and (not rack_of or racks.get(n.name) == rack_of)}

        partial_no_room = 0
        for group, (min_count, bound, members) in state.items():
            unit = self.units.get(members[0]["metadata"].get("labels", {}).get("unit", "")) if members else None
            if unit is None or gpu is None:
                continue
            if bound >= min_count:
                self.scaled.discard(group)
                self.disrupted.discard(group)
            elif bound:
                # partly bound at rest: only a gang that grew (scaled up) or lost members to
                # preemption (disruptionMode single) may be, and only while its missing members
                # have no room (in its bound members' rack when it is rack-constrained)
                cause = "scaled up" if group in self.scaled else "disrupted" if group in self.disrupted else ""
                rack_of = next((racks.get(p["spec"]["nodeName"], "") for p in members if p["spec"].get("nodeName")),
                               "") if unit.rack else ""
                has_room = self._fits(min_count - bound, unit.gpus, False, room(group, rack_of), racks)
                if cause and not has_room:
                    partial_no_room += 1
                else:
                    found.append({"type": "partial_gang", "group": group, "min_count": min_count, "bound": bound,
                                  "cause": cause or "none", "room_for_the_rest": has_room,
                                  "why": self.cycle.explanations.get(f"{NS}/{group}", "")})
            elif members and self._fits(min_count, unit.gpus, unit.rack, room(group), racks):
                # a gang that fits the free capacity must be bound
                found.append({"type": "fits_unbound", "group": group, "min_count": min_count, "gpus": unit.gpus,
                              "rack": unit.rack, "holds": len(holds),
                              "why": self.cycle.explanations.get(f"{NS}/{group}", "")})
        found, late = self._grace(found)
        for v in found:
            self._violation(v)
        row = {"t": round(t0 - self.started, 1), "rest_s": round(time.monotonic() - t0, 1), "at_rest": at_rest,
               "gangs": len(state), "bound": sum(1 for m, b, _ in state.values() if b >= m > 0),
               "partial_no_room": partial_no_room, "bound_in_grace": late, "violations": len(found)}
        self.rests.append(row)
        return row

    def _grace(self, found: list[dict]) -> tuple[list[dict], list[dict]]:
        """Give each gang found short at a rest ``grace`` seconds more (the churn still paused) to
        bind: the rest rule (no binding change for ``quiet`` s) does not see a retry still due —
        the simulated scheduler's and phalanx's per-group backoffs each run up to 10 s, and a
        capacity change wakes the group only at its next try. A gang whole within the grace is
        returned as late (with how long it took), not as a violation; one still short stays a
        violation, with what phalanx and the scheduler held for it."""
        short = {v["group"]: v for v in found if v["type"] in ("fits_unbound", "partial_gang")}
        if not short:
            return found, []
        t0, late = time.monotonic(), []
        while short and time.monotonic() - t0 < self.grace:
            time.sleep(0.5)
            state = self._gang_state()
            for group in list(short):
                min_count, bound, _ = state.get(group, (0, 0, []))
                if group not in state or bound >= min_count:
                    late.append({"group": group, "type": short.pop(group)["type"],
                                 "after_s": round(time.monotonic() - t0, 1), "gone": group not in state})
        for group, v in short.items():
            key = f"{NS}/{group}"
            attempt = self.cycle.queue.failed.get(key)
            retry = self.scheduler.backoff_of(key)
            v.update(grace_s=self.grace, why=self.cycle.explanations.get(key, v.get("why", "")),
                     phalanx_backoff=None if attempt is None else {
                         "failures": attempt.failures, "retry_in_s": round(attempt.retry_at - self.cycle.clock(), 1)},
                     scheduler_retry_in_s=retry, scheduler_last_try=self.scheduler.last_try(key),
                     plans=[p.state.value for p in list(self.cycle.book.values()) if p.group == key])
        gone = {x["group"] for x in late}
        return [v for v in found if v.get("group") not in gone], late

    def sample(self, window_started: float) -> dict:
        filters, self.scheduler.filter_ms = self.scheduler.filter_ms, []
        # housekeeping of the simulation (not of phalanx): its event log is trimmed as the API
        # server's event TTL would, the simulated scheduler forgets pods and groups that are gone
        del self.sim.events[:]
        live_pods = self.sim.list("Pod")
        groups = {g["metadata"]["name"] for g in self.sim.list("PodGroup")}
        self.scaled &= groups
        self.disrupted &= groups
        self.scheduler.forget({p["metadata"]["uid"] for p in live_pods})
        with self._planned_lock:
            for uid in set(self.planned) - {p["metadata"]["uid"] for p in live_pods}:
                del self.planned[uid]
        self.check_planned()
        sizes = self.cycle.sizes()
        sizes = {k: v for k, v in sizes.items() if not k.startswith("cycle.writer.")}  # the simulation's store
        live = {"pods": len(live_pods), "groups": len(self.sim.list("PodGroup")), "nodes": len(self.sim.list("Node")),
                "bound": sum(1 for p in live_pods if p["spec"].get("nodeName"))}
        row = record_sample(self.samples, self.log, time.monotonic() - self.started, proc_status(), live,
                            len(filters), pct(filters, 50), pct(filters, 99), sizes, len(self.violations))
        return row

    def run(self) -> dict:
        self.started = time.monotonic()
        scheduler = threading.Thread(target=self._schedule, name="soak-scheduler", daemon=True)
        scheduler.start()
        end = self.started + self.duration
        next_sample = self.started + self.interval
        next_rest = self.started + self.rest_every
        window = self.started
        try:
            self.sample(window)
            while time.monotonic() < end:
                self.act()
                now = time.monotonic()
                if now >= next_rest:
                    self.rest()
                    next_rest = time.monotonic() + self.rest_every
                if time.monotonic() >= next_sample:
                    self.sample(window)
                    window = time.monotonic()
                    next_sample = window + self.interval
                time.sleep(self.step)
            self.rest()
            self.sample(window)
            for unit in list(self.units.values()):  # the drain: every unit deleted, then at rest
                self._delete(unit)
            self.rest()
            self.sample(time.monotonic())["drained"] = True
        finally:
            self.halt.set()
            scheduler.join(timeout=30)
            self.scheduler.close()
            self.phalanx.stop()
        return {"mode": "simulated", "seed": self.seed, "duration_s": self.duration, "interval_s": self.interval,
                "cluster": f"{self.racks} racks x {self.nodes_per_rack} nodes x 8 GPUs (+ up to 8 added)",
                "history_groups": SOAK_HISTORY_GROUPS,
                "actions": self.actions, "created": self.created, "rests": self.rests,
                "violations": self.violations, "samples": self.samples}


# -- analysis and report -----------------------------------------------------------------------
def analyse(run: dict, warmup: float = 0.25) -> dict:
    """Flatness after warm-up (see the module docstring)."""
    drained = next((s for s in run["samples"] if s.get("drained")), None)
    samples = [s for s in run["samples"] if not s.get("drained")]
    start = max(1, int(len(samples) * warmup))
    post = samples[start:]
    third = max(1, len(post) // 3)
    first, last = post[:third], post[-third:]
    t = np.array([s["t"] for s in post], dtype=float) / 3600.0

    def slope(values: list[float]) -> float:
        if len(values) < 2 or np.ptp(t) == 0:
            return 0.0
        return float(np.polyfit(t, np.array(values, dtype=float), 1)[0])

    def mean(rows: list[dict], get: Callable[[dict], Any]) -> float:
        vals = [get(r) for r in rows if get(r) is not None]
        return float(np.mean(vals)) if vals else 0.0

    peak_live = max((sum(s["live"].get(k, 0) for k in ("pods", "groups", "nodes")) for s in post), default=0)
    keys = sorted({k for s in post for k in s["sizes"]})
    collections = {}
    for k in keys:
        values = [s["sizes"].get(k, 0) for s in post]
        a = float(np.mean([r["sizes"].get(k, 0) for r in first])) if first else 0.0
        b = float(np.mean([r["sizes"].get(k, 0) for r in last])) if last else 0.0
        collections[k] = {"first": round(a, 1), "last": round(b, 1), "max": max(values),
                          "slope_per_h": round(slope(values), 1),
                          "flat": b <= max(a * (1 + GROWTH), a + GROWTH_ENTRIES),
                          "bounded": max(values) <= _cap(k) if _cap(k) is not None
                          else k.endswith("[*]") or max(values) <= peak_live}
    windows = [{"t": s["t"], "p50": s["filter_p50_ms"], "p99": s["filter_p99_ms"], "calls": s["filter_calls"]}
               for s in samples]
    rss_first, rss_last = mean(first, lambda r: r["rss_kib"]), mean(last, lambda r: r["rss_kib"])
    p99_first, p99_last = mean(first, lambda r: r["filter_p99_ms"]), mean(last, lambda r: r["filter_p99_ms"])
    left_over = {}
    if drained is not None:  # after the drain every collection is back to its size at the start
        base, added = samples[0]["sizes"], drained["live"]["nodes"] - samples[0]["live"]["nodes"]
        left_over = {k: {"start": base.get(k, 0), "drained": v} for k, v in drained["sizes"].items()
                     if v > base.get(k, 0) + max(0, added) and not k.startswith(SNAPSHOT_BASE)
                     and _cap(k) is None}
    return {
        "samples": len(samples), "warmup_samples": start, "peak_live_objects": peak_live,
        "left_over_after_drain": left_over, "drained": drained is not None,
        "rss_mib": {"start_after_warmup": round(post[0]["rss_kib"] / 1024, 1) if post else None,
                    "end": round(samples[-1]["rss_kib"] / 1024, 1) if samples else None,
                    "first_third": round(rss_first / 1024, 1), "last_third": round(rss_last / 1024, 1),
                    "slope_mib_per_h": round(slope([s["rss_kib"] / 1024 for s in post]), 1)},
        "threads": {"first_third": round(mean(first, lambda r: r["threads"]), 1),
                    "last_third": round(mean(last, lambda r: r["threads"]), 1), "max": max(
                        (s["threads"] for s in post), default=0)},
        "filter_p99_ms": {"first_third": round(p99_first, 2), "last_third": round(p99_last, 2),
                          "slope_ms_per_h": round(slope([s["filter_p99_ms"] or 0.0 for s in post]), 2)},
        "collections": collections,
        "growing": sorted(k for k, c in collections.items() if not c["flat"]),
        "unbounded": sorted(k for k, c in collections.items() if not c["bounded"]),
        "windows": windows,
        "violations": len(run["violations"]),
        "violation_types": _count(v["type"] for v in run["violations"]),
    }


def _cap(key: str) -> int | None:
    """The limit a collection declares (``name<=N``, see cluster/sizes.py), or None."""
    head, sep, cap = key.removesuffix("[*]").rpartition("<=")
    return int(cap) if sep and head and cap.isdigit() else None


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _grace_note(rests: list[dict]) -> str:
    """The gangs found short at a rest that were whole within the grace (simulated runs)."""
    late = [x for r in rests for x in r.get("bound_in_grace") or []]
    if not late:
        return ""
    return (f"; {len(late)} gang(s) short at a rest were whole within the grace, "
            f"after {', '.join(str(x['after_s']) for x in late)} s")


def markdown(rows: list[dict]) -> str:
    out = []
    for run in rows:
        a = run["analysis"]
        out += [f"### {run['mode']} soak, {run['duration_s'] / 60:.0f} min (seed {run['seed']})", "",
                f"Cluster: {run['cluster']}. "
                f"Churn: {', '.join(f'{k} {v}' for k, v in sorted(run['actions'].items()))}; "
                f"created {', '.join(f'{v} {k}' for k, v in run['created'].items())}. "
                f"Rests: {len(run['rests'])} ({sum(not r['at_rest'] for r in run['rests'])} not reached"
                f"{_grace_note(run['rests'])}). "
                f"Samples: {a['samples']} every {run['interval_s']:.0f} s, the first {a['warmup_samples']} warm-up. "
                + (f"serve's dashboard history kept {run['history_groups']} groups (`--history-groups`)."
                   if run.get("history_groups") else ""),
                "",
                f"**Invariant violations: {a['violations']}** {a['violation_types'] or ''}", "",
                "| after warm-up | first third | last third | slope per hour |", "|---|---:|---:|---:|",
                f"| RSS MiB | {a['rss_mib']['first_third']} | {a['rss_mib']['last_third']} | "
                f"{a['rss_mib']['slope_mib_per_h']} |",
                f"| threads | {a['threads']['first_third']} | {a['threads']['last_third']} | |",
                f"| filter p99 ms (per-window mean) | {a['filter_p99_ms']['first_third']} | "
                f"{a['filter_p99_ms']['last_third']} | {a['filter_p99_ms']['slope_ms_per_h']} |", "",
                f"RSS after warm-up {a['rss_mib']['start_after_warmup']} MiB, at the end {a['rss_mib']['end']} MiB. "
                f"Collections: {len(a['collections'])}; growing (last third > first third + "
                f"{GROWTH:.0%} and + {GROWTH_ENTRIES}): {', '.join(a['growing']) or 'none'}; above the peak of "
                f"live objects ({a['peak_live_objects']}): {', '.join(a['unbounded']) or 'none'}. "
                f"After the drain (every unit deleted, at rest), above its size at the start (+ nodes added): "
                f"{', '.join(f'{k} {v}' for k, v in a['left_over_after_drain'].items()) or 'none'}.", "",
                "| collection | first third | last third | max | slope per hour |", "|---|---:|---:|---:|---:|"]
        busiest = sorted(a["collections"].items(), key=lambda kv: -kv[1]["max"])
        out += [f"| `{k}` | {c['first']} | {c['last']} | {c['max']} | {c['slope_per_h']} |"
                for k, c in busiest if c["max"] > 0]
        step = max(1, len(a["windows"]) // 12)
        out += ["", "| window end (s) | filter calls | p50 ms | p99 ms |", "|---:|---:|---:|---:|"]
        out += [f"| {w['t']:.0f} | {w['calls']} | {w['p50']} | {w['p99']} |" for w in a["windows"][::step]]
        out += memory_markdown(run.get("memory_trace"))
        out.append("")
    return "\n".join(out)


def memory_markdown(trace: dict | None) -> list[str]:
    """serve's memory trace, when the run had one: each owner of its memory, and what grew."""
    if not trace or "mib" not in trace:
        return [] if not trace else ["", f"Memory trace: {trace.get('note', '')}"]
    out = ["", f"**serve's memory trace** ({trace['looks']} looks; from {trace['from_s'] / 60:.0f} min, after the "
               f"warm-up, to {trace['to_s'] / 60:.0f} min; threads {trace['threads'][0]} → {trace['threads'][1]})",
           "", "| MiB | first | last | per hour |", "|---|---:|---:|---:|"]
    out += [f"| {k} | {v['first']} | {v['last']} | {v['per_hour']} |" for k, v in trace["mib"].items()]
    if trace.get("grew"):
        out += ["", "| Python allocation site (innermost phalanx frame first) | grew KiB | live KiB | blocks |",
                "|---|---:|---:|---:|"]
        for row in trace["grew"]:
            frames = [f for f in row["frames"] if not any(part in f for part in ("site-packages/", "/lib/python"))
                      and not f.startswith("python3.")]
            where = " ← ".join((frames or row["frames"])[:3])
            out.append(f"| `{where}` | {row['grew'] / 1024:.0f} | {row['size'] / 1024:.0f} | {row['count']} |")
    return out


def plot(run: dict, path: pathlib.Path) -> None:
    """RSS and threads, the collections (the ten largest), filter p50/p99 per window, over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = run["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(10, 11), sharex=True)
    ax = axes[0]
    ax.plot(t, [s["rss_kib"] / 1024 for s in samples], label="RSS MiB")
    ax.set_ylabel("RSS (MiB)")
    ax2 = ax.twinx()
    ax2.plot(t, [s["threads"] for s in samples], color="tab:gray", linestyle=":", label="threads")
    ax2.set_ylabel("threads")
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    warm = samples[run["analysis"]["warmup_samples"]]["t"] / 60 if samples else 0
    for a in axes:
        a.axvline(warm, color="tab:red", linestyle="--", linewidth=0.8)
    ax.set_title(f"phalanx soak ({run['mode']}, {run['duration_s'] / 60:.0f} min): "
                 f"{run['analysis']['violations']} invariant violations; dashed: end of warm-up")
    ax = axes[1]
    largest = sorted(run["analysis"]["collections"], key=lambda k: -run["analysis"]["collections"][k]["max"])[:10]
    for k in largest:
        ax.plot(t, [s["sizes"].get(k, 0) for s in samples], label=k, linewidth=1)
    ax.plot(t, [sum(s["live"].get(k, 0) for k in ("pods", "groups", "nodes")) for s in samples], color="black",
            linestyle="--", label="live pods + groups + nodes")
    ax.set_ylabel("entries")
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    ax = axes[2]
    ax.plot(t, [s["filter_p50_ms"] for s in samples], label="filter p50")
    ax.plot(t, [s["filter_p99_ms"] for s in samples], label="filter p99")
    ax.set_ylabel("ms per window")
    ax.set_xlabel("minutes")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- entry point -------------------------------------------------------------------------------
def run(duration: float, interval: float, seeds: int = 1, real: bool = False,
        memory_trace: str | None = None) -> list[dict]:
    seed = int(os.environ.get("PHALANX_SOAK_SEED", "0"))
    rows = []
    for s in range(seed, seed + seeds):
        if real:
            from .soak_real import RealSoak

            trace = pathlib.Path(memory_trace) / f"seed-{s}" if memory_trace else None
            result = RealSoak(duration=duration, interval=interval, seed=s, memory_trace=trace).run()
        else:
            result = SimSoak(duration=duration, interval=interval, seed=s).run()
        result["analysis"] = analyse(result)
        rows.append(result)
    return rows


def main(quick: bool, json_path: str | None, seeds: int | None = None, duration: float | None = None,
         real: bool = False, memory_trace: str | None = None) -> int:
    params: dict = dict(QUICK if quick else FULL)
    if duration:
        params["duration"] = duration
    params["real"] = real
    if memory_trace:
        params["memory_trace"] = memory_trace
    name = "soak-real" if real else "soak"
    json_path = json_path or str(RESULTS / f"{name}{'-quick' if quick else ''}.json")
    code = run_suite(run, markdown, params, seeds, json_path)
    rows = json.loads(pathlib.Path(json_path).read_text())
    for i, row in enumerate(rows):
        plot(row, pathlib.Path(json_path).with_suffix(f"{'' if i == 0 else f'.{i}'}.png"))
    return code
