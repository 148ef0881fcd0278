"""The fault suite's driver: kill components of the real control plane at moments picked from what
the API shows, let the system come to rest, and check the at-rest invariants from the API objects.

One implementation for both callers: ``tests/e2e/test_faults.py`` (a handful of faults, asserts 0
violations) and ``phalanx bench faults`` (``bench/faults_bench.py``, >= 200 kills).

A run (``run_faults(plane, FaultConfig(...))``, on a control plane that nothing else uses):
``phalanx serve`` as a subprocess (SIGKILLed and restarted on the same ports), a kube-scheduler with
the shipped extender configuration pointed at it (``mode="plugin"``: phalanx-scheduler with the
shipped plugin profile, talking to serve's gRPC port), phalanx's StatefulSet controller and webhooks
in this process (``tests/e2e/phalanx_controller.py``), racks of one-CPU-per-pod nodes, and watches
on the namespace's pods, PodGroups (every placement record ever written is kept) and events.

Each fault is one *shot*: make room (the oldest units are deleted by the test), create a victim
gang (4, 16 or 64 pods, some with a rack constraint, some with minCount below the size) together
with companion gangs and plain pods racing for the same room, wait for the chosen moment, kill:

- ``serve``: SIGKILL of ``phalanx serve``, restarted after a short random downtime;
- ``scheduler``: SIGKILL of kube-scheduler (or phalanx-scheduler), restarted with the same arguments;
- ``apiserver``: SIGKILL of kube-apiserver mid-barrier (the mechanism of the API-server restart
  test: the same argv respawned), then readiness;
- ``controller``: the controller's leader stopped without releasing its Lease (the harness runs
  the controller in-process, so a crash is a stop that leaves the Lease to expire) while a gang
  StatefulSet scales; a new replica takes over.
- ``node-deleted``, ``node-notready``: a node lost under a running ``disruptionMode: all`` gang
  (``node_faults.py``): the gang must go whole and, re-created, bind whole within a bound.

The moments (phases) are read from the victim gang's state at the kill: ``before`` (pods exist, no
plan seen), ``planned`` (serve's ``/api/v1/plans`` showed the gang's plan: members are arriving at the barrier),
``recorded`` (the placement record is on the PodGroup, nothing bound yet), ``binding`` (k of N
bound, k drawn per shot), ``bound`` (all bound); ``FaultConfig.phases`` fixes those of the first shots. Then the system must come to rest (no binding
change for ``rest_quiet`` s and no partial gang, within ``rest_timeout``) and the invariants hold:

- ``partial_gang``: a gang with 0 < bound < minCount at rest;
- ``unplanned_node``: a gang member bound to a node that no placement record of its group named;
  ``unrecorded_bind``: a gang member bound while no record of its group ever named it;
- ``lost_pod``: a pod the test created is gone (or replaced) although the test did not delete it;
- ``disruption_target``: a pod got a ``DisruptionTarget`` condition (no scenario preempts);
- ``crash``: a component exited that the test did not kill;
- ``controller``: after a controller fault, not exactly one Workload and one PodGroup for the
  StatefulSet, minCount not the new replica count, or not all replicas bound.

The seed fixes every choice (kinds, sizes, phases, k, downtimes); timing on a shared machine does
not repeat exactly, so a violation's record carries its evidence (pods, nodes, records, events).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from cluster import names
from cluster.kube import KubeError

from .binaries import locate
from .controlplane import MODE_BINARY, ControlPlane, Scheduler, _insecure_get, phalanx_scheduler_config
from .nodes import RACK, create_node, delete_node
from .objects import SCHEDULING_API, pod, podgroup, statefulset
from .process import Component, free_port

ROOT = Path(__file__).resolve().parents[3]
PLACEMENT = names.ANNOTATION_PLACEMENT  # the record too long for its condition (or an earlier version's)
PLACEMENT_CONDITION = names.CONDITION_PLACEMENT
UNIT_LABEL = "faults.phalanx.dev/unit"


def namespace_snapshot(rest: Any, ns: str, seen: Callable[[dict], None]) -> tuple[list[dict], list[dict]]:
    """The pods and PodGroups of ``ns`` as the API server holds them (retried), each PodGroup handed
    to ``seen`` first (a run's record of every placement record it saw)."""
    pods = retry(lambda: rest.list_items(f"/api/v1/namespaces/{ns}/pods"))
    groups = retry(lambda: rest.list_items(f"/apis/{SCHEDULING_API}/namespaces/{ns}/podgroups"))
    for g in groups:
        seen(g)
    return pods, groups


def bind_violations(pod: str, node: str, group: str, records: dict[str, dict[str, set[str]]]) -> list[dict]:
    """A bound member's violations: bound with no placement record of its group naming it
    (``unrecorded_bind``), or on a node no record of its group put it (``unplanned_node``);
    ``records``: group -> pod -> every node a record of the group named for it."""
    recorded = records.get(group, {}).get(pod)
    if not recorded:
        return [{"type": "unrecorded_bind", "pod": pod, "node": node, "group": group,
                 "records": sorted(records.get(group, {}))[:8]}]
    if node not in recorded:
        return [{"type": "unplanned_node", "pod": pod, "node": node, "recorded": sorted(recorded), "group": group}]
    return []


def record_text(podgroup: dict) -> str:
    """The placement record on a PodGroup as the API server holds it: its condition's message
    while True, else the annotation; "" when there is none."""
    conditions = (podgroup.get("status") or {}).get("conditions") or []
    condition = next((c for c in conditions if c.get("type") == PLACEMENT_CONDITION), None)
    if condition and condition.get("status") == "True":
        return str(condition.get("message") or "")
    return (podgroup["metadata"].get("annotations") or {}).get(PLACEMENT) or ""
KINDS = ("serve", "scheduler", "apiserver", "controller", "node-deleted", "node-notready")  # node-*: node_faults.py
PHASES = ("before", "planned", "recorded", "binding", "bound")
VIOLATIONS = ("partial_gang", "unplanned_node", "unrecorded_bind", "lost_pod", "disruption_target", "crash",
              "controller")


@dataclass
class FaultConfig:
    seed: int = 0
    faults: int = 8
    kinds: dict[str, float] = field(default_factory=lambda: {"serve": 0.5, "scheduler": 0.25, "apiserver": 0.1,
                                                             "controller": 0.15,
                                                             "node-deleted": 0.08, "node-notready": 0.08})
    sequence: tuple[str, ...] = ()  # kinds of the first shots, in order (then drawn from ``kinds``)
    phases: tuple[str, ...] = ()  # the moments of the first shots' kills, in order (then drawn)
    mode: str = "extender"  # or "plugin": phalanx-scheduler with the framework plugin
    sizes: dict[int, float] = field(default_factory=lambda: {4: 0.45, 16: 0.35, 64: 0.2})
    racks: int = 3
    nodes_per_rack: int = 8
    cpu_per_node: int = 8
    # above kube-scheduler's longest pod backoff (podMaxBackoffSeconds, 10 s; phalanx serve warns
    # below it): with 8 s, members of a gang of 16 backed off after a reset on the serve link came
    # back spread wider than the barrier, which timed out again and again (network-fault run)
    barrier_timeout: float = 12.0
    rest_quiet: float = 3.0
    rest_timeout: float = 75.0
    trigger_timeout: float = 25.0
    max_companions: int = 2
    max_plain: int = 8
    serve_args: tuple[str, ...] = ()  # more flags of phalanx serve (the soak bounds its dashboard history)
    log: Callable[[str], None] = print


def _transient(err: BaseException) -> bool:
    if isinstance(err, KubeError):  # status 0: the API server could not be reached
        return err.status == 0 or err.status >= 500 or err.status == 429
    return isinstance(err, (urllib.error.URLError, ConnectionError, OSError, TimeoutError))


def retry(fn: Callable[[], Any], timeout: float = 120.0) -> Any:
    """``fn()``, retried while the API server is away (connection errors, 5xx, 429)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - retried only when transient
            if not _transient(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


# --- watches -------------------------------------------------------------------------------------

class Watch(threading.Thread):
    """List-then-watch one collection, re-listing after any error; ``objects`` by name, ``seen``
    called with every object observed (list or event)."""

    def __init__(self, kube: Any, path: str, changed: threading.Condition,
                 seen: Callable[[dict], None] | None = None):
        super().__init__(daemon=True, name=f"faults-watch-{path.rsplit('/', 1)[-1]}")
        self.kube, self.path, self.changed, self.seen = kube, path, changed, seen
        self.objects: dict[str, dict] = {}
        self.halt = threading.Event()

    def _put(self, obj: dict) -> None:
        self.objects[obj["metadata"]["name"]] = obj
        if self.seen:
            self.seen(obj)

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                listed = self.kube.get(self.path)
                rv = listed["metadata"]["resourceVersion"]
                with self.changed:
                    self.objects = {}
                    for obj in listed.get("items") or []:
                        self._put(obj)
                    self.changed.notify_all()
                while not self.halt.is_set():
                    for event in self.kube.watch(self.path, rv, timeout_seconds=30):
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise RuntimeError(f"watch error: {obj}")
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            with self.changed:
                                self._put(obj)
                                self.changed.notify_all()
                        elif event.get("type") == "DELETED":
                            with self.changed:
                                self.objects.pop(obj["metadata"]["name"], None)
                                self.changed.notify_all()
                        if self.halt.is_set():
                            return
            except Exception:  # noqa: BLE001 - API server away, 410, stream cut: re-list
                self.halt.wait(0.3)


# --- the processes -------------------------------------------------------------------------------

class Rig:
    """phalanx serve (subprocess) + kube-scheduler with phalanx in ``mode`` (extender, or
    phalanx-scheduler with the plugin on serve's gRPC port), both restartable."""

    def __init__(self, plane: ControlPlane, scheduler_name: str, barrier_timeout: float, mode: str = "extender",
                 plan_ahead: tuple[str, ...] | None = None, serve_args: tuple[str, ...] = ()):
        self.serve_args = serve_args  # more flags of phalanx serve
        self.plane, self.scheduler_name, self.barrier_timeout, self.mode = plane, scheduler_name, barrier_timeout, mode
        # as the chart deploys it: serve plans ahead for the profile (or the profiles given)
        self.plan_ahead = (scheduler_name,) if plan_ahead is None else plan_ahead
        self.serve_port = free_port()
        self.grpc_port = free_port() if mode == "plugin" else None
        self.serve: Component | None = None
        self.scheduler: Scheduler | None = None
        self.serve_starts = 0
        # what serve dials for the API server and kube-scheduler dials for serve ((http, grpc) port):
        # the real ones, or a fault proxy's (harness/netfaults.py)
        self.serve_kubeconfig = plane.admin_kubeconfig
        self.scheduler_dials: tuple[int, int | None] | None = None

    # phalanx serve
    def start_serve(self) -> None:
        argv = [sys.executable, "-m", "phalanx_cli.main", "serve", "--kubeconfig", str(self.serve_kubeconfig),
                "--http-addr", f"127.0.0.1:{self.serve_port}",
                "--grpc-addr", f"127.0.0.1:{self.grpc_port}" if self.grpc_port else "off", "--http-threads", "300",
                "--barrier-timeout", str(self.barrier_timeout), "--plan-ttl", "30",
                "--insecure-loopback-no-auth"]  # the rig polls /readyz on loopback
        for profile in self.plan_ahead:
            argv += ["--plan-ahead-for", profile]
        argv += self.serve_args
        self.serve_starts += 1
        self.serve = Component("phalanx-serve", argv, self.plane.workdir / "logs" / "phalanx-serve.log", cwd=ROOT)
        with open(self.serve.log, "ab") as f:
            f.write(f"\n===== phalanx serve start #{self.serve_starts} at {time.time():.3f} =====\n".encode())
        url = f"http://127.0.0.1:{self.serve_port}/readyz"
        self.serve.wait_ready(lambda: urllib.request.urlopen(url, timeout=2).status == 200, timeout=120)

    def kill_serve(self) -> None:
        _sigkill(self.serve)

    # kube-scheduler
    def start_scheduler(self) -> None:
        http, grpc = self.scheduler_dials or (self.serve_port, self.grpc_port)
        config = phalanx_scheduler_config(self.mode, http, grpc, self.barrier_timeout, self.scheduler_name)
        binary = MODE_BINARY[self.mode]
        # plugin mode at -v=2: the plugin logs its reservations stream ending (and reconnecting)
        self.scheduler = self.plane.start_scheduler(config, name=f"{binary}-{self.scheduler_name}", binary=binary,
                                                    extra_args=("--v=2",) if self.mode == "plugin" else ())

    def kill_scheduler(self) -> None:
        assert self.scheduler is not None
        _sigkill(self.scheduler.component)

    def restart_scheduler(self) -> None:
        assert self.scheduler is not None
        old = self.scheduler.component
        if old in self.plane.components:
            self.plane.components.remove(old)
        new = self.plane._spawn(old.name, old.argv)
        port = self.scheduler.port
        new.wait_ready(lambda: _insecure_get(f"https://127.0.0.1:{port}/readyz")[0] == 200, timeout=90)
        self.scheduler = Scheduler(component=new, port=port, config_path=self.scheduler.config_path)

    # kube-apiserver
    def apiserver(self) -> Component:
        return next(c for c in self.plane.components if c.name == "kube-apiserver")

    def kill_apiserver(self) -> None:
        _sigkill(self.apiserver())

    def restart_apiserver(self) -> None:
        old = self.apiserver()
        self.plane.components.remove(old)
        new = self.plane._spawn("kube-apiserver", old.argv)
        new.wait_ready(lambda: self.plane.rest.text("/readyz") == "ok", timeout=120)

    def dead(self) -> list[str]:
        """Components that exited although nobody killed them."""
        out = [c.name for c in self.plane.components if not c.alive()]
        if self.serve is not None and not self.serve.alive():
            out.append("phalanx-serve")
        return out

    def stop(self) -> None:
        if self.serve is not None:
            self.serve.stop()
        if self.scheduler is not None:
            self.scheduler.stop()


def _sigkill(component: Component | None) -> None:
    if component is None or not component.alive():
        return
    component.proc.kill()
    component.proc.wait(10)
    component._log_file.close()


# --- the driver ----------------------------------------------------------------------------------

@dataclass
class Unit:
    """What the test created together and deletes together: a gang, a plain pod, a StatefulSet."""
    name: str
    kind: str  # gang | plain | sts
    cpu: int
    min_count: int = 0
    size: int = 0
    rack: bool = False
    created: float = 0.0
    deleted: bool = False


class FaultRun:
    def __init__(self, plane: ControlPlane, cfg: FaultConfig):
        from cluster.kube import Kube

        self.plane, self.cfg, self.rest = plane, cfg, plane.rest
        self.rng = random.Random(cfg.seed)
        self.kube = Kube(str(plane.admin_kubeconfig), timeout=10)
        tag = f"{cfg.seed}-{uuid.uuid4().hex[:4]}"
        self.ns = f"faults-{tag}"
        self.node_prefix = f"fault-{tag}"
        self.scheduler_name = f"phalanx-faults-{tag}"
        self.rig = Rig(plane, self.scheduler_name, cfg.barrier_timeout, cfg.mode, serve_args=cfg.serve_args)
        self.changed = threading.Condition()
        self.records: dict[str, dict[str, set[str]]] = {}  # podgroup -> pod -> nodes ever recorded
        self.events: dict[str, list[str]] = {}  # podgroup -> reasons seen, in order
        self.planned_seen: set[str] = set()  # podgroups serve was seen holding a plan for
        self.units: dict[str, Unit] = {}
        self.created_pods: dict[str, tuple[str, str]] = {}  # pod name -> (uid, unit)
        self.node_names: list[str] = []
        self.controller: Any = None
        self.rows: list[dict] = []
        self.counter = 0
        self.controller_restarts = 0
        self.started = time.monotonic()

    # -- bookkeeping of observations --------------------------------------------------------
    def _record_seen(self, obj: dict) -> None:
        raw = record_text(obj)
        if not raw:
            return
        try:
            data = json.loads(raw)
            for pod_name, node in (data.get("pods") or {}).items():
                self.records.setdefault(obj["metadata"]["name"], {}).setdefault(pod_name, set()).add(node)
        except (ValueError, AttributeError):
            pass

    def _event_seen(self, obj: dict) -> None:
        regarding = obj.get("regarding") or {}
        if regarding.get("kind") == "PodGroup":
            seen = self.events.setdefault(regarding.get("name", ""), [])
            key = obj["metadata"]["name"]
            if key not in seen:
                seen.append(key)
                seen.append(obj.get("reason", ""))

    def reasons(self, group: str) -> list[str]:
        return self.events.get(group, [])[1::2]

    # -- setup and teardown -------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}})
        for r in range(cfg.racks):
            for i in range(cfg.nodes_per_rack):
                name = f"{self.node_prefix}-r{r}-{i}"
                create_node(self.rest, name, cpu=cfg.cpu_per_node, rack=f"rack-{r}")
                self.node_names.append(name)
        base = f"/api/v1/namespaces/{self.ns}"
        self.pods = Watch(self.kube, f"{base}/pods", self.changed)
        self.groups = Watch(self.kube, f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/podgroups", self.changed,
                            self._record_seen)
        self.eventw = Watch(self.kube, f"/apis/events.k8s.io/v1/namespaces/{self.ns}/events", self.changed,
                            self._event_seen)
        for w in (self.pods, self.groups, self.eventw):
            w.start()
        self.rig.start_serve()
        self.rig.start_scheduler()
        if cfg.kinds.get("controller") or "controller" in cfg.sequence:
            sys.path.insert(0, str(ROOT / "tests" / "e2e"))
            from phalanx_controller import PhalanxController

            self.controller = PhalanxController(self.plane)
            self.controller.start()
            self.controller.register()

    def teardown(self) -> None:
        for w in (getattr(self, "pods", None), getattr(self, "groups", None), getattr(self, "eventw", None)):
            if w is not None:
                w.halt.set()
        try:
            if self.controller is not None:
                self.controller.close()
        finally:
            self.rig.stop()
            try:
                self.rest.delete(f"/api/v1/namespaces/{self.ns}", missing_ok=True)
                self.rest.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods", params={"gracePeriodSeconds": 0})
                for n in self.node_names:
                    delete_node(self.rest, n)
            except Exception as err:  # noqa: BLE001 - best effort
                self.cfg.log(f"teardown: {err!r}")

    # -- workload -----------------------------------------------------------------------------
    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    @property
    def capacity(self) -> int:
        return self.cfg.racks * self.cfg.nodes_per_rack * self.cfg.cpu_per_node

    def _live_cpu(self) -> int:
        return sum(u.cpu for u in self.units.values() if not u.deleted)

    def make_room(self, need: int, exact: bool = False) -> None:
        """Delete the oldest units until ``need`` CPUs more fit (up to a small seeded overflow: plain
        pods and gangs must sometimes race for too little room). ``exact``: no overflow, and units
        still waiting for room go first (a StatefulSet scaling up must find room for its new
        members: its running members cannot be unbound, so without room it stays below minCount)."""
        overflow = 0 if exact else self.rng.choice([0, 0, 0, 4, 8])
        if exact:
            pods = retry(lambda: self.rest.list_items(f"/api/v1/namespaces/{self.ns}/pods"))
            waiting = {(p["metadata"].get("labels") or {}).get(UNIT_LABEL) for p in pods
                       if not p["spec"].get("nodeName")}
            for unit in [u for u in self.units.values() if not u.deleted and u.name in waiting]:
                self.delete_unit(unit)
        for unit in sorted((u for u in self.units.values() if not u.deleted), key=lambda u: u.created):
            if self._live_cpu() + need <= self.capacity + overflow:
                break
            self.delete_unit(unit)

    def delete_unit(self, unit: Unit) -> None:
        unit.deleted = True
        base = f"/api/v1/namespaces/{self.ns}"
        if unit.kind == "sts":
            retry(lambda: self.rest.delete(f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{unit.name}", missing_ok=True))
        retry(lambda: self.rest.request("DELETE", f"{base}/pods", params={
            "labelSelector": f"{UNIT_LABEL}={unit.name}", "gracePeriodSeconds": 0}))
        if unit.kind == "gang":
            retry(lambda: self.rest.delete(f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/podgroups/{unit.name}", missing_ok=True))

    def _pod(self, name: str, unit: str, group: str | None) -> dict:
        body = pod(name, podgroup_name=group, labels={UNIT_LABEL: unit}, scheduler_name=self.scheduler_name)
        return body

    def create_gang(self, size: int, rack: bool, min_count: int | None = None) -> Unit:
        name = self._name(f"g{size}{'r' if rack else ''}")
        unit = Unit(name, "gang", size, min_count or size, size, rack, time.monotonic())
        self.units[name] = unit
        retry(lambda: self.rest.create(f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/podgroups",
                                     podgroup(name, min_count=unit.min_count, topology_key=RACK if rack else None)))
        return unit

    def create_plain(self) -> Unit:
        name = self._name("plain")
        unit = Unit(name, "plain", 1, created=time.monotonic())
        self.units[name] = unit
        return unit

    def post_pods(self, bodies: list[tuple[str, dict]]) -> None:
        """Create pods concurrently (gang members and plain pods interleaved: they race)."""
        def post(item: tuple[str, dict]) -> None:
            unit, body = item
            created = retry(lambda: self._post_once(body))
            self.created_pods[body["metadata"]["name"]] = (created["metadata"]["uid"], unit)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(post, bodies))

    def _post_once(self, body: dict) -> dict:
        try:
            return self.rest.create(f"/api/v1/namespaces/{self.ns}/pods", body)
        except KubeError as err:
            if err.status == 409:  # created before the connection broke
                return self.rest.get(f"/api/v1/namespaces/{self.ns}/pods/{body['metadata']['name']}")
            raise

    # -- observed state -------------------------------------------------------------------------
    def members(self, group: str) -> list[dict]:
        return [p for p in self.pods.objects.values()
                if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == group]

    def phase(self, unit: Unit) -> tuple[str, int]:
        members = self.members(unit.name)
        bound = sum(1 for p in members if p["spec"].get("nodeName"))
        if bound >= unit.size:
            return "bound", bound
        if bound:
            return "binding", bound
        if unit.name in self.records:
            return "recorded", 0
        if self._planned(unit.name):
            return "planned", 0
        return "before", 0

    def _planned(self, group: str) -> bool:
        """Whether serve has held a plan for ``group`` (its dashboard's plans; once seen, for good:
        phalanx writes no event per plan)."""
        if group not in self.planned_seen:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.rig.serve_port}/api/v1/plans"
                                            f"?namespace={self.ns}", timeout=2) as answer:
                    rows = json.load(answer)["plans"]
            except (OSError, ValueError, KeyError):
                return False  # serve down (a fault) or answering nothing usable: not seen
            self.planned_seen.update(r["name"] for r in rows)
        return group in self.planned_seen

    def wait_phase(self, unit: Unit, want: str, k: int) -> bool:
        """Until the victim reaches ``want`` (``binding``: at least k bound); False on timeout."""
        order = {p: i for i, p in enumerate(PHASES)}
        deadline = time.monotonic() + self.cfg.trigger_timeout
        with self.changed:
            while time.monotonic() < deadline:
                phase, bound = self.phase(unit)
                if want == "binding" and bound >= k:
                    return True
                if want != "binding" and order[phase] >= order[want]:
                    return True
                self.changed.wait(0.05)
        return False

    # -- faults ---------------------------------------------------------------------------------
    def kill(self, kind: str) -> float:
        """Kill ``kind`` (``bring_back`` restarts it); returns the monotonic time of the kill."""
        {"serve": self.rig.kill_serve, "scheduler": self.rig.kill_scheduler, "apiserver": self.rig.kill_apiserver,
         "controller": lambda: self.controller.stop(release_lease=False),  # a crash: the Lease just expires
         }[kind]()
        return time.monotonic()

    def bring_back(self, kind: str, killed_at: float) -> dict:
        downtime = round(self.rng.uniform(0.0, 1.5), 2)
        time.sleep(max(0.0, killed_at + downtime - time.monotonic()))
        {"serve": self.rig.start_serve, "scheduler": self.rig.restart_scheduler,
         "apiserver": self.rig.restart_apiserver, "controller": self.controller.start}[kind]()
        return {"downtime_s": downtime, "recovery_s": round(time.monotonic() - killed_at, 2)}

    def shot(self, index: int, kind: str) -> dict:
        if kind == "controller":
            return self.controller_shot(index)
        rng = self.rng
        size = rng.choices(list(self.cfg.sizes), weights=list(self.cfg.sizes.values()))[0]
        rack = size <= 16 and rng.random() < 0.4
        min_count = size - size // 4 if size == 16 and rng.random() < 0.3 else size
        want = rng.choice(("planned", "recorded", "binding")) if kind == "apiserver" else rng.choice(PHASES)
        if index < len(self.cfg.phases):
            want = self.cfg.phases[index]
        k = rng.randint(1, max(1, size - 1))
        companions = [(rng.choice((4, 16)), rng.random() < 0.4) for _ in range(rng.randint(0, self.cfg.max_companions))]
        plain = rng.randint(0, self.cfg.max_plain)
        self.make_room(size + sum(s for s, _ in companions) + plain)
        victim = self.create_gang(size, rack, min_count)
        units = [victim] + [self.create_gang(s, r) for s, r in companions]
        bodies = [(u.name, self._pod(f"{u.name}-{i}", u.name, u.name)) for u in units for i in range(u.size)]
        for _ in range(plain):
            u = self.create_plain()
            bodies.append((u.name, self._pod(u.name, u.name, None)))
        rng.shuffle(bodies)
        if want == "before":  # killed while the members are still being created; the rest follow
            cut = rng.randint(1, len(bodies))
            self.post_pods(bodies[:cut])
            with self.changed:
                observed, bound_at_kill = self.phase(victim)
            killed_at, reached = self.kill(kind), True
            self.post_pods(bodies[cut:])
        else:
            self.post_pods(bodies)
            reached = self.wait_phase(victim, want, k)
            with self.changed:
                observed, bound_at_kill = self.phase(victim)
            killed_at = self.kill(kind)
        done = self.bring_back(kind, killed_at)
        return {"i": index, "kind": kind, "victim": victim.name, "size": size, "min_count": min_count, "rack": rack,
                "companions": len(companions), "plain": plain, "wanted": want, "k": k if want == "binding" else None,
                "reached": reached, "phase": observed, "bound_at_kill": bound_at_kill, **done}

    def controller_shot(self, index: int) -> dict:
        """A gang StatefulSet scales while the controller's leader dies."""
        rng = self.rng
        r0 = rng.randint(2, 4)
        r1 = r0 + rng.choice((2, 4)) if rng.random() < 0.8 else max(1, r0 - 1)
        self.make_room(max(r0, r1), exact=True)
        name = self._name("sts")
        unit = Unit(name, "sts", max(r0, r1), min_count=r1, size=r1, created=time.monotonic())
        self.units[name] = unit
        sts_path = f"/apis/apps/v1/namespaces/{self.ns}/statefulsets"
        body = statefulset(name, r0, scheduling={"schedulingPolicy": {"gang": {}}}, labels={UNIT_LABEL: name},
                           scheduler_name=self.scheduler_name)
        retry(lambda: self.rest.create(sts_path, body))
        deadline = time.monotonic() + self.cfg.trigger_timeout
        while time.monotonic() < deadline and self._sts_bound(name) < r0:
            time.sleep(0.2)
        before = self._sts_bound(name)
        want = rng.choice(("patched", "workload", "podgroup", "new-pod"))
        retry(lambda: self.rest.patch(f"{sts_path}/{name}", {"spec": {"replicas": r1}}))
        deadline = time.monotonic() + 10
        reached = True
        if want == "patched":
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            while not self._scale_step(name, want, r0, r1):
                if time.monotonic() > deadline:
                    reached = False
                    break
                time.sleep(0.03)
        done = self.bring_back("controller", self.kill("controller"))
        return {"i": index, "kind": "controller", "victim": name, "size": r1, "min_count": r1, "rack": False,
                "companions": 0, "plain": 0, "wanted": want, "k": None, "reached": reached,
                "phase": f"scale {r0}->{r1}", "bound_at_kill": before, **done}

    def _sts_pods(self, name: str) -> list[dict]:
        return [p for p in list(self.pods.objects.values())
                if (p["metadata"].get("labels") or {}).get(UNIT_LABEL) == name
                and not p["metadata"].get("deletionTimestamp")]

    def _sts_bound(self, name: str) -> int:
        return sum(1 for p in self._sts_pods(name) if p["spec"].get("nodeName"))

    def _scale_step(self, name: str, step: str, r0: int, replicas: int) -> bool:
        if step == "new-pod":  # a pod added (or, scaling down, one going away)
            return len(self._sts_pods(name)) != r0
        groups = [g for g in self.groups.objects.values() if _owner(g) == name]
        if step == "podgroup":
            return any(_min_count(g) == replicas for g in groups)
        workloads = retry(lambda: self.rest.list_items(f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/workloads"))
        return any(_owner(w) == name and (w["spec"]["podGroupTemplates"][0]["schedulingPolicy"].get("gang") or {})
                   .get("minCount") == replicas for w in workloads)

    # -- rest and invariants ----------------------------------------------------------------------
    def snapshot(self) -> tuple[list[dict], list[dict]]:
        return namespace_snapshot(self.rest, self.ns, self._record_seen)

    def partial(self, pods: list[dict], groups: list[dict]) -> list[dict]:
        out = []
        for g in groups:
            unit = self.units.get(_owner(g) or g["metadata"]["name"])
            if unit is None or unit.deleted or g["metadata"].get("deletionTimestamp"):
                continue
            min_count = _min_count(g)
            if min_count is None:
                continue
            members = [p for p in pods if (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
                       == g["metadata"]["name"] and not p["metadata"].get("deletionTimestamp")]
            bound = [p for p in members if p["spec"].get("nodeName")]
            if 0 < len(bound) < min_count:
                out.append({"group": g["metadata"]["name"], "min_count": min_count, "members": len(members),
                            "bound": {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound},
                            "record": record_text(g),
                            "events": self.reasons(g["metadata"]["name"])[-12:]})
        return out

    def wait_rest(self) -> tuple[float, list[dict], list[dict], bool]:
        t0 = time.monotonic()
        last, since = None, time.monotonic()
        while True:
            pods, groups = self.snapshot()
            placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
            if placed != last:
                last, since = placed, time.monotonic()
            quiet = time.monotonic() - since
            need = self.cfg.rest_quiet * (2 if self._unbound_with_room(pods, groups) else 1)
            if quiet >= need and not self.partial(pods, groups) and not self._sts_unsettled(groups):
                return time.monotonic() - t0, pods, groups, True
            if time.monotonic() - t0 > self.cfg.rest_timeout:
                return time.monotonic() - t0, pods, groups, False
            time.sleep(0.5)

    def _unbound_with_room(self, pods: list[dict], groups: list[dict]) -> bool:
        """A live gang with nothing bound while the cluster has its CPUs free (it may yet bind)."""
        free = self.capacity - sum(1 for p in pods if p["spec"].get("nodeName"))
        for g in groups:
            unit = self.units.get(_owner(g) or g["metadata"]["name"])
            if unit is None or unit.deleted or _min_count(g) is None:
                continue
            if not any(p["spec"].get("nodeName") for p in pods
                       if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == g["metadata"]["name"]) \
                    and _min_count(g) <= free:
                return True
        return False

    def gang_states(self, pods: list[dict], groups: list[dict]) -> dict:
        """Live gangs at rest: complete (>= minCount bound) or unbound."""
        out = {"complete": 0, "unbound": 0}
        for g in groups:
            unit = self.units.get(_owner(g) or g["metadata"]["name"])
            if unit is None or unit.deleted or _min_count(g) is None:
                continue
            n = sum(1 for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                    and (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == g["metadata"]["name"])
            out["complete" if n and n >= _min_count(g) else "unbound"] += 1
        return out

    def _sts_unsettled(self, groups: list[dict]) -> bool:
        """A StatefulSet of the test whose PodGroup is missing or whose minCount lags replicas."""
        for unit in self.units.values():
            if unit.kind == "sts" and not unit.deleted:
                mine = [g for g in groups if _owner(g) == unit.name]
                if len(mine) != 1 or _min_count(mine[0]) != unit.min_count:
                    return True
        return False

    def check(self, pods: list[dict], groups: list[dict], shot: dict) -> list[dict]:
        violations = [{"type": "partial_gang", **p} for p in self.partial(pods, groups)]
        by_name = {p["metadata"]["name"]: p for p in pods}
        gang_of = {g["metadata"]["name"]: g for g in groups}
        for p in pods:
            meta, spec = p["metadata"], p["spec"]
            group = (spec.get("schedulingGroup") or {}).get("podGroupName")
            unit = self.units.get((meta.get("labels") or {}).get(UNIT_LABEL, ""))
            if unit is not None and unit.deleted:
                continue
            for c in (p.get("status") or {}).get("conditions") or []:
                if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
                    violations.append({"type": "disruption_target", "pod": meta["name"], "condition": c})
            if group and spec.get("nodeName") and group in gang_of and _min_count(gang_of[group]) is not None:
                violations += bind_violations(meta["name"], spec["nodeName"], group, self.records)
        for name, (uid, unit_name) in self.created_pods.items():
            if self.units[unit_name].deleted:
                continue
            now = by_name.get(name)
            if now is None or now["metadata"]["uid"] != uid:
                violations.append({"type": "lost_pod", "pod": name, "uid": uid,
                                   "now": None if now is None else now["metadata"]["uid"]})
        if shot["kind"] == "controller":
            violations += self._check_sts(shot, pods, groups)
        for name in self.rig.dead():
            violations.append({"type": "crash", "component": name, "log": str(self.plane.workdir / "logs")})
        return violations

    def _check_sts(self, shot: dict, pods: list[dict], groups: list[dict]) -> list[dict]:
        name, replicas = shot["victim"], shot["size"]
        mine = [g for g in groups if _owner(g) == name]
        workloads = retry(lambda: self.rest.list_items(f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/workloads"))
        own_workloads = [w for w in workloads if _owner(w) == name]
        members = [p for p in pods if (p["metadata"].get("labels") or {}).get(UNIT_LABEL) == name
                   and not p["metadata"].get("deletionTimestamp")]
        bound = [p for p in members if p["spec"].get("nodeName")]
        problems = []
        if len(mine) != 1 or len(own_workloads) != 1:
            problems.append(f"{len(own_workloads)} Workloads and {len(mine)} PodGroups")
        elif _min_count(mine[0]) != replicas:
            problems.append(f"PodGroup minCount {_min_count(mine[0])}, replicas {replicas}")
        if len(members) != replicas or len(bound) != replicas:
            problems.append(f"{len(members)} pods, {len(bound)} bound, replicas {replicas}")
        if not problems:
            return []
        return [{"type": "controller", "sts": name, "problems": problems,
                 "pods": {p["metadata"]["name"]: p["spec"].get("nodeName") for p in members},
                 "gates": {p["metadata"]["name"]: [g["name"] for g in p["spec"].get("schedulingGates") or []]
                           for p in members}, **self._sts_evidence(name)}]

    def _sts_evidence(self, name: str) -> dict:
        """What the StatefulSet controller made of ``name``: the object's generation against its
        status, the Events about it, and kube-controller-manager's log lines naming it."""
        out: dict = {}
        try:
            sts = self.rest.get_or_none(f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{name}") or {}
            status = sts.get("status") or {}
            out["sts_status"] = {"generation": sts.get("metadata", {}).get("generation"),
                                 "observedGeneration": status.get("observedGeneration"),
                                 "replicas": status.get("replicas"), "spec_replicas": sts.get("spec", {}).get("replicas")}
            events = self.rest.list_items(f"/api/v1/namespaces/{self.ns}/events",
                                          fieldSelector=f"involvedObject.name={name}")
            out["sts_events"] = [f"{e.get('reason')}: {e.get('message')}" for e in events][-12:]
        except Exception as err:  # evidence only: the violation is already counted
            out["sts_evidence_error"] = str(err)
        kcm = next((c for c in self.plane.components if c.name == "kube-controller-manager"), None)
        if kcm is not None and kcm.log.exists():
            lines = kcm.log.read_text(errors="replace").splitlines()
            out["kcm_log"] = [line for line in lines if name in line or (
                "statefulset" in line.lower() and any(w in line.lower() for w in ("watch", "reflector", "error")))][-30:]
        return out

    def revive(self) -> None:
        """Bring back whatever died on its own, so the run goes on (the crash is already counted)."""
        dead = self.rig.dead()
        if "kube-apiserver" in dead:
            self.rig.restart_apiserver()
        if "phalanx-serve" in dead:
            self.rig.start_serve()
        if self.rig.scheduler is not None and not self.rig.scheduler.component.alive():
            self.rig.restart_scheduler()

    def keep_controller_leading(self) -> None:
        """``phalanx controller`` exits when it loses its Lease (e.g. the API server was away longer
        than the renew deadline) and its Deployment starts it again: do the same."""
        if self.controller is not None and self.controller.controller is not None \
                and not self.controller.controller.elector.is_leader():
            self.controller.stop(release_lease=False)
            self.controller.start()
            self.controller_restarts += 1

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        kinds = [k for k in KINDS if cfg.kinds.get(k)]
        for i in range(cfg.faults):
            kind = cfg.sequence[i] if i < len(cfg.sequence) else self.rng.choices(
                kinds, weights=[cfg.kinds[k] for k in kinds])[0]
            t0 = time.monotonic()
            self.keep_controller_leading()
            shot = self.shot(i, kind)
            rest_s, pods, groups, at_rest = self.wait_rest()
            violations = self.check(pods, groups, shot)
            victim = [p for p in pods if (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
                      == shot["victim"] or (p["metadata"].get("labels") or {}).get(UNIT_LABEL) == shot["victim"]]
            shot.update(seed=cfg.seed, rest_s=round(rest_s, 2), at_rest=at_rest, violations=violations,
                        victim_bound_at_rest=sum(1 for p in victim if p["spec"].get("nodeName")),
                        gangs_at_rest=self.gang_states(pods, groups),
                        shot_s=round(time.monotonic() - t0, 2))
            self.rows.append(shot)
            cfg.log(f"[seed {cfg.seed} #{i}] {kind:<10} {shot['victim']:<10} wanted {shot['wanted']:<9} "
                    f"killed at {shot['phase']:<12} bound {shot['bound_at_kill']:>2}, rest {rest_s:5.1f}s "
                    f"{'' if at_rest else '(NOT at rest) '}victim bound {shot['victim_bound_at_rest']}, "
                    f"live gangs {shot['gangs_at_rest']}, violations {len(violations)}"
                    + (f": {json.dumps(violations)[:600]}" if violations else ""))
            if violations:
                self.revive()
        return summarize(self.rows)


def _owner(obj: dict) -> str | None:
    """The StatefulSet controlling ``obj`` (the controller's Workloads and PodGroups), or None."""
    ref = next((r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
    return ref["name"] if ref and ref.get("kind") == "StatefulSet" else None


def _min_count(group: dict) -> int | None:
    gang = (group.get("spec", {}).get("schedulingPolicy") or {}).get("gang")
    return None if gang is None else int(gang.get("minCount") or 0)


def summarize(rows: list[dict]) -> dict:
    by_kind: dict[str, dict] = {}
    for r in rows:
        k = by_kind.setdefault(r["kind"], {"faults": 0, "phases": {}, "gangs": set(), "violations": 0,
                                           "not_at_rest": 0})
        k["faults"] += 1
        k["phases"][r["phase"] if r["kind"] != "controller" else r["wanted"]] = \
            k["phases"].get(r["phase"] if r["kind"] != "controller" else r["wanted"], 0) + 1
        k["gangs"].add(r["victim"])
        k["violations"] += len(r["violations"])
        k["not_at_rest"] += 0 if r["at_rest"] else 1
    for k in by_kind.values():
        k["gangs"] = len(k["gangs"])
    types: dict[str, int] = {}
    for r in rows:
        for v in r["violations"]:
            types[v["type"]] = types.get(v["type"], 0) + 1
    return {"faults": len(rows), "by_kind": by_kind, "violations": sum(types.values()), "violation_types": types}


@contextmanager
def fault_control_plane(prefix: str) -> Iterator[ControlPlane]:
    """A control plane of its own, with KWOK (a fault run kills its API server). Its work
    directory is removed afterwards unless ``plane.keep_logs`` was set or PHALANX_E2E_KEEP=1."""
    # The StatefulSet controller's own log at -v=4 (its syncs), the evidence of a ``controller``
    # violation where the StatefulSet's pods never appeared.
    binaries = locate()  # first: missing binaries leave no work directory behind
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix=prefix)), binaries,
                         controller_manager_args=("--vmodule=stateful*=4",))
    plane.keep_logs = os.environ.get("PHALANX_E2E_KEEP") == "1"
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
        if plane.keep_logs:
            sys.stderr.write(f"\nphalanx faults: logs kept in {plane.workdir}/logs\n")
        else:
            shutil.rmtree(plane.workdir, ignore_errors=True)


def run_faults(plane: ControlPlane, cfg: FaultConfig,
               driver: Callable[[ControlPlane, FaultConfig], FaultRun] | None = None) -> tuple[dict, list[dict]]:
    """Run ``cfg.faults`` shots on ``plane`` (a ``fault_control_plane``); the summary and one row per
    fault. ``driver``: a FaultRun of another kind (harness/netfaults.py); by default the kills and
    the node-loss kinds (harness/node_faults.py)."""
    from .node_faults import NodeLossRun  # FaultRun with the node-loss kinds

    run = (driver or NodeLossRun)(plane, cfg)
    try:
        run.setup()
        summary = run.run()
    finally:
        run.teardown()
    summary["gangs_created"] = sum(1 for u in run.units.values() if u.kind in ("gang", "sts"))
    summary["pods_created"] = len(run.created_pods)
    summary["serve_starts"] = run.rig.serve_starts
    summary["controller_restarts_after_lost_lease"] = run.controller_restarts
    return summary, run.rows
