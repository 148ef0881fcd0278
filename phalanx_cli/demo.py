"""``phalanx demo``: the whole system on a simulated cluster, in one process, in under a minute.

It starts a simulated cluster (2 zones x 8 racks x 16 nodes of 8 GPUs, plus CPU-only nodes),
phalanx as ``phalanx serve`` runs it (workload-cycle service, HTTP extender, dashboard), and a
simulated kube-scheduler (:class:`bench.scheduler_sim.SimulatedScheduler`) that drives the real
extender protocol in a background loop. Then it creates, one after the other, the KEP-6277 user
stories, LeaderWorkerSet-shaped groups, a gang that cannot fit, a higher-priority gang that
preempts a ``disruptionMode: all`` group, and a stream of acme-kalos trace jobs on simulated time,
prints what landed where and why, and keeps serving the dashboard until interrupted (or
``--duration`` seconds).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from typing import Callable, Iterator, TextIO

from bench.scheduler_sim import SimulatedScheduler
from bench.traces import DataMissing, acme_jobs, data_dir
from cluster import names
from cluster.names import GRPC_PORT
from cluster.sim import SimCluster
from controller.whatif import compile_objects
from extender.server import Phalanx, ServeOptions, build

from . import demo_workloads as w

ZONES, RACKS, NODES, GPUS = 2, 8, 16, 8
CPU_NODES = 8
SETTLED = ("scheduled", "unschedulable")
#: Simulated seconds per wall second for the trace; trace durations are capped (see trace_stream).
TIME_SCALE = 600.0
MAX_JOB_SECONDS = 6 * 3600.0
JOB_EVERY = 0.5  # wall seconds between trace arrivals
TICK = 0.25


def demo_cluster() -> SimCluster:
    sim = SimCluster()
    sim.add_nodes(zones=ZONES, racks_per_zone=RACKS, nodes_per_rack=NODES, gpus=GPUS)
    for i in range(CPU_NODES):
        name = f"cpu-{i}"
        alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
        sim.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {names.LABEL_HOSTNAME: name, names.LABEL_ZONE: "zone-0",
                                                          names.LABEL_RACK: "z0-cpu"}},
                    "status": {"allocatable": alloc, "capacity": dict(alloc)}})
    return sim


class Demo:
    def __init__(self, port: int, out: TextIO, grpc_port: int | None = GRPC_PORT) -> None:
        self.out = out
        self.sim = demo_cluster()
        # the dashboard and gRPC (explain, whatif) on loopback for whoever runs the demo: no API
        # server to review a token with
        grpc_addr = "off" if grpc_port is None else f"127.0.0.1:{grpc_port}"
        options = ServeOptions(insecure_loopback_no_auth=True, http_addr=f"127.0.0.1:{port}", grpc_addr=grpc_addr,
                               http_threads=400, barrier_timeout=20.0, plan_ttl=60.0,
                               compile_manifest=compile_objects)  # the dashboard's what-if form
        self.phalanx: Phalanx = build(options, sim=self.sim)
        self.cycle = self.phalanx.cycle
        self.plans: dict[str, dict] = {}  # group -> the last 'planned' event
        self.preemptions: dict[str, dict] = {}
        self.cycle.subscribe(self._on_event)
        self.stop = threading.Event()
        self.scheduler: SimulatedScheduler | None = None
        self._threads: list[threading.Thread] = []
        self.finished = 0  # trace jobs done

    def _on_event(self, kind: str, data) -> None:
        if kind == "planned":
            self.plans[data["group"]] = dict(data)
        elif kind == "preempting":
            self.preemptions[data["group"]] = dict(data)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.phalanx.port}/"

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # -- running ---------------------------------------------------------------------------
    def start(self) -> None:
        self.phalanx.start()
        self.scheduler = SimulatedScheduler(self.sim, self.phalanx.port, bind_threads=400, post_filter=True,
                                            backoff=1.0)
        self._spawn("demo-scheduler", lambda: self.scheduler.run_forever(self.stop, interval=TICK))

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self.phalanx.stop()

    def state(self, key: str) -> str:
        return "preempting" if key in self.cycle.preemption.nominations else self.cycle.group_state(key)

    def settle(self, keys: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop.is_set():
            if all(self.state(k) in SETTLED for k in keys):
                return
            self.stop.wait(0.1)

    def create(self, workload: w.Workload, timeout: float = 30.0) -> None:
        for obj in workload.objects:
            self.sim.create(obj)
        self.settle(workload.groups, timeout)

    # -- telling ---------------------------------------------------------------------------
    def where(self, key: str) -> str:
        members = self.cycle.cache.members(key)
        nodes = {m.pod.node for m in members if m.pod.node}
        labels = [self.cycle.cache.nodes[n].labels for n in nodes if n in self.cycle.cache.nodes]
        racks = sorted({lab.get(names.LABEL_RACK, "?") for lab in labels})
        zones = sorted({lab.get(names.LABEL_ZONE, "?") for lab in labels})
        shown = ", ".join(racks[:4]) + (f" (+{len(racks) - 4})" if len(racks) > 4 else "")
        bound = sum(1 for m in members if m.pod.node)
        plural = "s" if len(nodes) != 1 else ""
        return (f"{bound}/{len(members)} pods bound on {len(nodes)} node{plural} in {'/'.join(zones)}, "
                f"rack{'s' if len(racks) > 1 else ''} {shown}")

    def how(self, key: str) -> str:
        plan = self.plans.get(key)
        return f"{plan['path']}, {plan['ms']:.0f} ms" if plan else ""

    def report(self, workload: w.Workload) -> None:
        if workload.title:
            self.say(f"  {workload.title}")
        for key in workload.groups:
            state = self.state(key)
            if state == "scheduled":
                self.say(f"    ✓ {key}: {self.where(key)} — {self.how(key)}")
            else:
                why = self.cycle.explanations.get(key, "")
                self.say(f"    ✗ {key}: {state}{' — ' + why if why else ''}")

    def rack_of(self, key: str) -> str:
        for m in self.cycle.cache.members(key):
            node = self.cycle.cache.nodes.get(m.pod.node)
            if node is not None:
                return node.labels.get(names.LABEL_RACK, "")
        return ""

    # -- the script ------------------------------------------------------------------------
    def run_scenarios(self) -> None:
        section = ""
        for workload in [*w.stories(), *w.leaderworkersets(), w.composite(), w.too_big()]:
            if workload.section != section:
                section = workload.section
                self.say(f"\n{section}")
            self.create(workload)
            self.report(workload)
        self.preempt()

    def preempt(self) -> None:
        self.say("\nPreemption")
        rack = self.rack_of(f"{w.NS}/shards")
        if not rack:
            self.say("  skipped: demo/shards is not bound, so there is nothing to preempt")
            return
        self.fill_rack(rack)
        urgent = w.urgent(rack)
        for obj in urgent.objects:
            self.sim.create(obj)
        key = urgent.groups[0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stop.is_set():
            if self.state(key) == "scheduled" and self.state(f"{w.NS}/shards") in SETTLED:
                break
            self.stop.wait(0.1)
        self.say(f"  {urgent.title}")
        fired = self.preemptions.get(key)
        if fired:
            units = ", ".join(fired.get("units") or ())
            self.say(f"    ⚡ {key} preempted {len(fired.get('victims') or ())} pods as whole units: {units}")
        self.report(w.Workload("", "", [key]))
        self.say(f"    ↻ {w.NS}/shards (disruptionMode all, priority 10) was evicted whole; its StatefulSet "
                 f"recreated the pods: {self.state(f'{w.NS}/shards')}"
                 + (f", now {self.where(f'{w.NS}/shards')}" if self.state(f"{w.NS}/shards") == "scheduled" else ""))

    def fill_rack(self, rack: str) -> None:
        """Keep the rest of the shards' rack busy with other work, so the urgent gang must preempt."""
        cache = self.cycle.cache
        free = [n for n in sorted(cache.nodes) if cache.nodes[n].labels.get(names.LABEL_RACK) == rack
                and not cache.pods_by_node.get(n)]
        for n in free:
            self.sim.create(w.pod(f"batch-{n}", {"nodeName": n, "priority": 500, "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "16", w.GPU: "8"}}}]}, "Job", "batch"))

    def trace_stream(self) -> None:
        """acme-kalos jobs in arrival order, one every JOB_EVERY wall seconds, on simulated time:
        TIME_SCALE simulated seconds per wall second, durations capped at MAX_JOB_SECONDS."""
        try:
            jobs = acme_jobs(data_dir(), cores_per_gpu=64 // GPUS)
        except DataMissing as err:
            self.say(f"\nTrace: skipped — {err}")
            return
        self.say(f"\nTrace: streaming {len(jobs)} acme-kalos gangs (namespace trace), one every {JOB_EVERY} s, "
                 f"simulated time x{TIME_SCALE:.0f}, durations capped at {MAX_JOB_SECONDS / 3600:.0f} h")
        self._spawn("demo-trace", lambda: self._stream(jobs))

    def _stream(self, jobs) -> None:
        last_report = time.monotonic()
        for name, job in self._jobs_forever(jobs):
            for obj in w.trace_job(job, name, min(job.duration, MAX_JOB_SECONDS), NODES):
                self.sim.create(obj)
            waited = 0.0
            while waited < JOB_EVERY and not self.stop.is_set():
                self.stop.wait(TICK)
                waited += TICK
                self.sim.advance(TICK * TIME_SCALE)
            self._collect_finished()
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                self.say(f"  trace: {self.trace_counts()}")
            if self.stop.is_set():
                return

    @staticmethod
    def _jobs_forever(jobs) -> Iterator[tuple[str, object]]:
        rounds = 0
        while True:
            for job in jobs:
                yield (job.id if not rounds else f"{job.id}-r{rounds}"), job
            rounds += 1

    def _collect_finished(self) -> None:
        """A finished Job's PodGroup and pods are deleted (as a TTL controller would)."""
        for pg in self.sim.list("PodGroup"):
            meta = pg["metadata"]
            if meta["namespace"] != "trace":
                continue
            pods = [p for p in self.sim.list("Pod") if p["metadata"]["namespace"] == "trace"
                    and p["spec"].get("schedulingGroup", {}).get("podGroupName") == meta["name"]]
            if pods and all((p.get("status") or {}).get("phase") == "Succeeded" for p in pods):
                for p in pods:
                    self.sim.delete("Pod", f"trace/{p['metadata']['name']}")
                self.sim.delete("PodGroup", f"trace/{meta['name']}")
                self.finished += 1

    def trace_counts(self) -> str:
        keys = [k for k in self.cycle.cache.podgroups if k.startswith("trace/")]
        states = Counter(self.state(k) for k in keys)
        used = sum(u.get(w.GPU, 0) for u in list(self.cycle.cache.usage.values()))
        total = sum(n.allocatable.get(w.GPU, 0) for n in list(self.cycle.cache.nodes.values()))
        return (f"{self.finished} finished, " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                + f"; GPUs in use {used}/{total}")


def run_demo(port: int = 8080, duration: float | None = None, headless: bool = False, out: TextIO | None = None,
             grpc_port: int | None = GRPC_PORT) -> int:
    import sys

    out = out or sys.stdout
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    demo = Demo(port, out, grpc_port)
    done = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: (done.set(), demo.stop.set()))
    started = time.monotonic()
    try:
        demo.start()
    except (OSError, RuntimeError) as err:  # a port in use (HTTP: OSError; gRPC: RuntimeError)
        demo.close()
        raise SystemExit(f"phalanx demo: {err} (--port and --grpc-port choose others; 0: any free one)") from None
    nodes = ZONES * RACKS * NODES
    demo.say(f"phalanx demo — simulated cluster: {ZONES} zones x {RACKS} racks x {NODES} nodes of {GPUS} GPUs "
             f"({nodes} nodes, {nodes * GPUS:,} GPUs) + {CPU_NODES} CPU-only nodes")
    demo.say("kube-scheduler's part is played by a simulated scheduler over the real extender protocol "
             "(filter, prioritize, bind, preempt)")
    demo.say(f"dashboard: {demo.url}" + ("" if headless else "   ← open it in a browser; Ctrl-C stops the demo"))
    if demo.phalanx.grpc is not None:
        addr = f"127.0.0.1:{demo.phalanx.grpc.port}"
        flag = "" if addr == f"127.0.0.1:{GRPC_PORT}" else f" --grpc-addr {addr}"
        demo.say(f"gRPC: {addr}   ← try: phalanx explain demo/too-big{flag}; "
                 f"phalanx whatif -f examples/gang-statefulset.yaml{flag}")
    try:
        demo.run_scenarios()
        demo.trace_stream()
        demo.say(f"\nscenarios done in {time.monotonic() - started:.0f} s; serving {demo.url} "
                 + (f"for {duration:.0f} s" if duration else "until interrupted (Ctrl-C)"))
        done.wait(None if duration is None else max(0.0, duration - (time.monotonic() - started)))
    finally:
        demo.close()
    return 0
