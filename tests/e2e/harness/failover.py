"""High availability of phalanx: two scheduler replicas on one control plane, the leader killed.

A *replica* is what one scheduler pod runs: kube-scheduler (``extender`` mode, the shipped
extender configuration) or phalanx-scheduler (``plugin`` mode, the shipped plugin profile) and its
own ``phalanx serve`` on loopback ports. The schedulers leader-elect on one coordination.k8s.io
Lease with short timings (:data:`LEASE`); each runs in a UTS namespace of its own with the
replica's name as host name (``unshare --uts``; kube-scheduler's identity is ``<hostname>_<uuid>``),
and its serve runs with ``--leader-lease NAMESPACE/NAME --leader-identity <replica>``: it acts (plans,
touches pods, binds, writes records, status, events) only while its scheduler holds the Lease, and
otherwise keeps its caches warm and writes nothing (``phalanx_leading`` 1 or 0 on its /metrics).

**Who wrote what** is counted by the API server, not by phalanx: each replica's serve authenticates
as a user of its own (a client certificate outside ``system:masters``, bound to cluster-admin), and
an API Priority and Fairness FlowSchema per replica matches that user's write verbs, so
``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`` (plus the rejected ones)
counts every write that replica's serve sent (:class:`WriteCounter`).

A *case* (:class:`FailoverCase`): its own namespace (or the caller's), racks of one-CPU-per-pod
nodes its pods select by a label, replica A started first and leading, B a standby; gang
StatefulSets (required in one rack) through phalanx's controller and the real StatefulSet
controller; A killed (SIGKILL of the whole process group of its scheduler and of its serve: the pod
dies) or frozen (SIGSTOP: a partitioned node) when the first member is bound; B takes over. Times
are read from a pod watch (wall clock, one machine) and the Lease's ``acquireTime``; they are
measured, never asserted. At rest, the fault suite's invariants (``faults.py``): no gang partly
bound, no member bound where no placement record of its group put it, no pod lost.

Callers: ``tests/e2e/test_failover.py`` (one kill and one freeze per mode) and
:func:`run_failover_bench` (the kill repeated, median and max per mode; for ``phalanx bench
failover``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .controlplane import MODE_BINARY, ControlPlane, _insecure_get, phalanx_scheduler_config
from .faults import Watch, _min_count, bind_violations, namespace_snapshot, record_text, retry
from .nodes import RACK, create_node, delete_node
from .objects import SCHEDULING_API, statefulset
from .process import Component, free_port

ROOT = Path(__file__).resolve().parents[3]
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
LEASES = "/apis/coordination.k8s.io/v1"
GROUP = "phalanx-e2e-failover"  # the replicas' serve users' group, bound to cluster-admin
PRIORITY_LEVEL = "workload-high"  # an upstream default level: the FlowSchemas only count, never throttle
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
REPLICAS = ("replica-a", "replica-b")
RUN_LABEL = "failover.phalanx.dev/run"  # on the case's nodes; its pods select them by it
CPU1 = {"cpu": "1"}
LEADING = "phalanx_leading"


@dataclass(frozen=True)
class LeaseTimings:
    """kube-scheduler's leaderElection timings (it requires duration > renew > 1.2 x retry)."""
    duration: float = 4.0
    renew: float = 3.0
    retry: float = 1.0

    def config(self, namespace: str, name: str) -> dict:
        return {"leaderElect": True, "resourceLock": "leases", "resourceNamespace": namespace,
                "resourceName": name, "leaseDuration": f"{self.duration:g}s",
                "renewDeadline": f"{self.renew:g}s", "retryPeriod": f"{self.retry:g}s"}


LEASE = LeaseTimings()


def serve_user(identity: str) -> str:
    return f"phalanx-failover-{identity}"


def flowschema_name(identity: str, kind: str) -> str:
    return f"e2e-failover-writes-{identity}-{kind}"


def metric(text: str, name: str, **labels: str) -> float | None:
    """The sum of the samples of ``name`` whose labels include ``labels``; None when there is none."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if any(f'{k}="{v}"' not in line for k, v in labels.items()):
            continue
        total += float(line.rsplit(" ", 1)[1])
        found = True
    return total if found else None


# --- writes, counted by the API server -------------------------------------------------------------

#: the kinds of writes told apart, each by a FlowSchema of its own per replica: (resources,
#: matchingPrecedence); ``other`` catches every write the others do not
WRITE_KINDS = {"binding": (["pods/binding"], 50), "eviction": (["pods/eviction"], 50),
               "pod": (["pods", "pods/status"], 50), "podgroup": (["podgroups", "podgroups/status"], 50),
               "event": (["events"], 50), "other": (["*"], 51)}


class WriteCounter:
    """Each replica's serve writes, counted by the API server's flow control (see the module doc),
    by kind (:data:`WRITE_KINDS`). ``install()`` once per control plane (idempotent),
    ``remove()`` at the end."""

    def __init__(self, plane: ControlPlane, identities: tuple[str, ...] = REPLICAS):
        self.plane, self.rest, self.identities = plane, plane.rest, identities

    def schemas(self) -> list[str]:
        return [flowschema_name(i, kind) for i in self.identities for kind in WRITE_KINDS]

    def install(self) -> "WriteCounter":
        rest = self.rest
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": GROUP},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": GROUP}]}
        retry(lambda: rest.delete(f"{RBAC}/clusterrolebindings/{GROUP}", missing_ok=True))
        retry(lambda: rest.create(f"{RBAC}/clusterrolebindings", binding))
        for identity in self.identities:
            for kind, (resources, precedence) in WRITE_KINDS.items():
                name = flowschema_name(identity, kind)
                schema = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                          "metadata": {"name": name},
                          "spec": {"priorityLevelConfiguration": {"name": PRIORITY_LEVEL},
                                   "matchingPrecedence": precedence, "distinguisherMethod": {"type": "ByUser"},
                                   "rules": [{"subjects": [{"kind": "User", "user": {"name": serve_user(identity)}}],
                                              "resourceRules": [{"verbs": WRITE_VERBS, "apiGroups": ["*"],
                                                                 "resources": resources, "namespaces": ["*"],
                                                                 "clusterScope": True}]}]}}
                retry(lambda: rest.delete(f"{FLOWCONTROL}/flowschemas/{name}", missing_ok=True))
                retry(lambda: rest.create(f"{FLOWCONTROL}/flowschemas", schema))
        # the API server's flow-control configuration took them in once it wrote their status
        deadline = time.monotonic() + 30
        for name in self.schemas():
            path = f"{FLOWCONTROL}/flowschemas/{name}"
            while not any(c.get("type") == "Dangling" and c.get("status") == "False"
                          for c in (retry(lambda: rest.get(path)).get("status") or {}).get("conditions") or []):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"FlowSchema {path} not taken in by the API server")
                time.sleep(0.1)
        return self

    def remove(self) -> None:
        for name in self.schemas():
            retry(lambda: self.rest.delete(f"{FLOWCONTROL}/flowschemas/{name}", missing_ok=True))
        retry(lambda: self.rest.delete(f"{RBAC}/clusterrolebindings/{GROUP}", missing_ok=True))

    def kubeconfig(self, identity: str) -> Path:
        """The serve of ``identity`` authenticates as its own user (group ``GROUP``, cluster-admin)."""
        assert self.plane.pki is not None
        cert = self.plane.pki.client(f"failover-{identity}-serve", serve_user(identity), GROUP)
        return self.plane.write_kubeconfig(f"failover-{identity}-serve", cert.cert, cert.key)

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Writes so far (dispatched + rejected) by replica and kind, since the API server started."""
        text = retry(lambda: self.rest.text("/metrics"))
        return {identity: {kind: int(sum(metric(text, m, flow_schema=flowschema_name(identity, kind)) or 0 for m in (
            "apiserver_flowcontrol_dispatched_requests_total", "apiserver_flowcontrol_rejected_requests_total")))
            for kind in WRITE_KINDS} for identity in self.identities}

    def counts(self) -> dict[str, int]:
        """Writes so far by replica."""
        return {identity: sum(kinds.values()) for identity, kinds in self.by_kind().items()}


# --- one replica: a scheduler and its serve ----------------------------------------------------------

class Replica:
    """kube-scheduler (or phalanx-scheduler) in its own UTS namespace named ``identity``, and its
    ``phalanx serve`` with ``--leader-lease``/``--leader-identity``."""

    def __init__(self, plane: ControlPlane, mode: str, identity: str, label: str):
        self.plane, self.mode, self.identity, self.label = plane, mode, identity, label
        self.serve_port = free_port()
        self.grpc_port = free_port() if mode == "plugin" else None
        self.scheduler_port = free_port()
        self.serve: Component | None = None
        self.scheduler: Component | None = None
        self.frozen = False

    @property
    def logs(self) -> Path:
        return self.plane.workdir / "logs"

    def start_serve(self, kubeconfig: Path, lease: str, scheduler_name: str, barrier_timeout: float,
                    serve_args: tuple[str, ...] = ()) -> None:
        argv = [sys.executable, "-m", "phalanx_cli.main", "serve", "--kubeconfig", str(kubeconfig),
                "--http-addr", f"127.0.0.1:{self.serve_port}",
                "--grpc-addr", f"127.0.0.1:{self.grpc_port}" if self.grpc_port else "off", "--http-threads", "300",
                "--barrier-timeout", str(barrier_timeout), "--plan-ttl", "30", "--insecure-loopback-no-auth",
                "--plan-ahead-for", scheduler_name,
                "--leader-lease", lease, "--leader-identity", self.identity, *serve_args]
        self.serve = Component(f"{self.label}-{self.identity}-serve", argv,
                               self.logs / f"{self.label}-{self.identity}-serve.log", cwd=ROOT)
        # up and synced (a standby keeps its caches warm: it answers /readyz as the leader does)
        self.serve.wait_ready(lambda: self.http("/readyz")[0] == 200, timeout=120)

    def start_scheduler(self, lease_namespace: str, lease_name: str, scheduler_name: str, barrier_timeout: float,
                        timings: LeaseTimings) -> None:
        config = phalanx_scheduler_config(self.mode, self.serve_port, self.grpc_port, barrier_timeout,
                                          scheduler_name)
        name = f"{self.label}-{self.identity}-scheduler"
        kubeconfig = self.plane.component_kubeconfig(f"failover-{self.identity}-scheduler", "system:kube-scheduler")
        config["clientConnection"] = {**(config.get("clientConnection") or {}), "kubeconfig": str(kubeconfig)}
        config["leaderElection"] = timings.config(lease_namespace, lease_name)
        config_path = self.plane.workdir / f"{name}.config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        binary = str(self.plane.binaries.path(MODE_BINARY[self.mode]))
        # unshare without --fork execs sh, which execs the scheduler: one pid, signalled directly
        argv = ["unshare", "--uts", "sh", "-c", f'hostname {self.identity} && exec "$0" "$@"', binary,
                f"--config={config_path}",
                f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--bind-address=127.0.0.1", f"--secure-port={self.scheduler_port}",
                f"--cert-dir={self.plane.workdir / (name + '-certs')}", "--v=2"]
        self.scheduler = Component(name, argv, self.logs / f"{name}.log", cwd=self.plane.workdir)
        # /healthz: up (a standby is not the leader; leader election's own check passes for it)
        port = self.scheduler_port
        self.scheduler.wait_ready(lambda: _insecure_get(f"https://127.0.0.1:{port}/healthz")[0] == 200, timeout=60)

    # -- observation --------------------------------------------------------------------------------
    def http(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.serve_port}{path}", timeout=timeout) as answer:
                return answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, ""

    def metrics(self, attempts: int = 1, timeout: float = 10.0) -> str | None:
        """serve's /metrics; None when it does not answer (``attempts`` tries of ``timeout`` s: a
        loaded machine makes a scrape slow)."""
        for _ in range(attempts):
            try:
                status, text = self.http("/metrics", timeout=timeout)
            except OSError:
                continue
            if status == 200:
                return text
        return None

    def leading(self) -> float | None:
        """serve's ``phalanx_leading`` (1 acting, 0 standby); None when serve does not answer within
        a few seconds (a frozen serve never does)."""
        text = self.metrics(timeout=5.0)
        return None if text is None else metric(text, LEADING)

    def api_writes(self) -> dict[str, int] | None:
        """serve's own count of its API writes by outcome (``phalanx_api_writes_total``: written,
        failed, standby = refused by a standby); None when serve does not answer."""
        text = self.metrics(attempts=3)
        if text is None:
            return None
        return {outcome: int(metric(text, "phalanx_api_writes_total", outcome=outcome) or 0)
                for outcome in ("written", "failed", "standby")}

    def scheduler_exited(self) -> int | None:
        return None if self.scheduler is None or self.scheduler.alive() else self.scheduler.proc.returncode

    # -- faults -------------------------------------------------------------------------------------
    def _components(self) -> list[Component]:
        return [c for c in (self.scheduler, self.serve) if c is not None and c.alive()]

    def signal(self, sig: int) -> None:
        """``sig`` to the scheduler's and serve's process groups, back to back (one pod)."""
        for c in self._components():
            try:
                os.killpg(c.proc.pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGSTOP:
            self.frozen = True
        elif sig == signal.SIGCONT:
            self.frozen = False

    def kill(self) -> None:
        live = self._components()
        self.signal(signal.SIGKILL)
        for c in live:
            c.proc.wait(10)

    def stop(self) -> None:
        if self.frozen:
            self.signal(signal.SIGCONT)
        for c in (self.scheduler, self.serve):
            if c is not None:
                c.stop()


# --- a case: two replicas, gangs, a fault ----------------------------------------------------------

def _wall(stamp: str | None) -> float | None:
    """A Lease MicroTime (RFC 3339 with microseconds) as a Unix time."""
    if not stamp:
        return None
    return _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass
class Gang:
    name: str
    size: int


@dataclass
class FaultResult:
    """What one fault showed; times in seconds from the fault (``None``: not seen)."""
    mode: str
    fault: str
    lease: LeaseTimings
    gangs: int
    size: int
    bound_at_fault: dict[str, int] = field(default_factory=dict)  # gang -> members bound at the fault
    holder_at_fault: str = ""
    writes_before: dict[str, int] = field(default_factory=dict)  # writes by replica from its start to the fault
    b_serve_writes_before: dict[str, int] | None = None  # B's serve's own phalanx_api_writes_total at the fault
    takeover_s: float | None = None  # the fault -> B's scheduler acquired the Lease (its acquireTime)
    b_leading_s: float | None = None  # the fault -> B's serve first seen reporting phalanx_leading 1
    next_bind_s: float | None = None  # the fault -> the first bind after B acquired the Lease
    last_gang_s: float | None = None  # the fault -> the last gang member bound (every gang whole)
    binds_in_flight: int = 0  # binds not listed at the fault, seen before B acquired (A's requests already sent)
    rest_s: float | None = None
    at_rest: bool = False
    violations: list[dict] = field(default_factory=list)

    def summary(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}s"
        caught = {g: n for g, n in self.bound_at_fault.items() if n}
        return (f"{self.mode} {self.fault}: lease {self.lease.duration:g}s/{self.lease.renew:g}s/{self.lease.retry:g}s "
                f"(duration/renew/retry), {self.gangs} gangs of {self.size}, bound at the fault {caught}; "
                f"B acquired the Lease +{s(self.takeover_s)}, B's serve leading +{s(self.b_leading_s)}, "
                f"next bind +{s(self.next_bind_s)}, last gang bound +{s(self.last_gang_s)} "
                f"({self.binds_in_flight} binds in flight from A after the fault); "
                f"writes before the fault {self.writes_before} (B's serve says {self.b_serve_writes_before}); "
                f"at rest {self.at_rest} after {s(self.rest_s)}, "
                f"violations {len(self.violations)}")


class FailoverCase:
    """Two replicas on ``plane`` in ``mode``, gang StatefulSets through ``controller`` (a registered
    ``phalanx_controller.PhalanxController``), one fault. ``namespace``: the caller's (it deletes
    it), else one of the case's own. ``close()`` stops every process and deletes the nodes (and the
    case's own namespace)."""

    def __init__(self, plane: ControlPlane, mode: str, counter: WriteCounter, namespace: str | None = None,
                 label: str = "failover", racks: int = 4, nodes_per_rack: int = 4, cpu_per_node: int = 2,
                 barrier_timeout: float = 12.0, timings: LeaseTimings = LEASE, log: Callable[[str], None] = print):
        self.plane, self.rest, self.mode, self.counter = plane, plane.rest, mode, counter
        self.tag = uuid.uuid4().hex[:6]
        self.own_namespace = namespace is None
        self.ns = namespace or f"failover-{self.tag}"
        self.label = f"{label}-{mode}-{self.tag}"
        self.scheduler_name = f"phalanx-failover-{self.tag}"
        self.lease_name = "phalanx-scheduler"
        self.barrier_timeout, self.timings, self.log = barrier_timeout, timings, log
        self.racks, self.nodes_per_rack, self.cpu_per_node = racks, nodes_per_rack, cpu_per_node
        self.node_names: list[str] = []
        self.rack_of: dict[str, str] = {}
        self.replicas = {i: Replica(plane, mode, i, self.label) for i in REPLICAS}
        self.a, self.b = self.replicas[REPLICAS[0]], self.replicas[REPLICAS[1]]
        self.gangs: dict[str, Gang] = {}
        self.baseline: dict[str, dict[str, int]] = {}
        self.changed = threading.Condition()
        self.bind_wall: dict[str, float] = {}  # pod -> wall time its binding was first seen
        self.uids: dict[str, str] = {}  # pod -> the uid first seen (a pod replaced or gone is lost)
        self.records: dict[str, dict[str, set[str]]] = {}  # podgroup -> pod -> nodes ever recorded
        self.watches: list[Watch] = []
        self.bound_at_fault: set[str] = set()  # pods the API server held bound right after the fault

    # -- set-up -----------------------------------------------------------------------------------------
    def setup(self) -> "FailoverCase":
        if self.own_namespace:
            retry(lambda: self.rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                  "metadata": {"name": self.ns}}))
        for r in range(self.racks):
            for i in range(self.nodes_per_rack):
                name = f"fo-{self.tag}-r{r}-{i}"
                create_node(self.rest, name, cpu=self.cpu_per_node, rack=f"rack-{r}", labels={RUN_LABEL: self.tag})
                self.node_names.append(name)
                self.rack_of[name] = f"rack-{r}"
        from cluster.kube import Kube

        kube = Kube(str(self.plane.admin_kubeconfig), timeout=10)
        self.pods = Watch(kube, f"/api/v1/namespaces/{self.ns}/pods", self.changed, self._pod_seen)
        self.groups = Watch(kube, f"/apis/{SCHEDULING_API}/namespaces/{self.ns}/podgroups", self.changed,
                            self._record_seen)
        self.watches = [self.pods, self.groups]
        for w in self.watches:
            w.start()
        return self

    def start_replicas(self) -> None:
        """A first, until its serve leads and its scheduler holds the Lease; then B, a standby."""
        self.baseline = self.counter.by_kind()
        lease = f"{self.ns}/{self.lease_name}"
        for replica in (self.a, self.b):
            replica.start_serve(self.counter.kubeconfig(replica.identity), lease, self.scheduler_name,
                                self.barrier_timeout)
            replica.start_scheduler(self.ns, self.lease_name, self.scheduler_name, self.barrier_timeout,
                                    self.timings)
            if replica is self.a:
                self.wait(lambda: self.holder().startswith(f"{self.a.identity}_"), 60,
                          "replica A's scheduler holds the Lease")
                self.wait(lambda: self.a.leading() == 1, 60, "replica A's serve reports phalanx_leading 1")
        self.wait(lambda: self.b.leading() == 0, 60, "replica B's serve reports phalanx_leading 0")
        assert self.holder().startswith(f"{self.a.identity}_"), self.lease()

    def close(self) -> None:
        for w in self.watches:
            w.halt.set()
        for replica in self.replicas.values():
            try:
                replica.stop()
            except Exception as err:  # noqa: BLE001 - stop the others too
                self.log(f"stopping {replica.identity}: {err!r}")
        try:
            for name in list(self.gangs):
                retry(lambda: self.rest.delete(f"/apis/apps/v1/namespaces/{self.ns}/statefulsets/{name}",
                                               missing_ok=True))
            if self.own_namespace:
                retry(lambda: self.rest.delete(f"/api/v1/namespaces/{self.ns}", missing_ok=True))
                retry(lambda: self.rest.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods",
                                                params={"gracePeriodSeconds": 0}))
            for name in self.node_names:
                delete_node(self.rest, name)
        except Exception as err:  # noqa: BLE001 - best effort
            self.log(f"cleanup: {err!r}")

    # -- observation ------------------------------------------------------------------------------------
    def _pod_seen(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        self.uids.setdefault(name, pod["metadata"]["uid"])
        if pod["spec"].get("nodeName") and name not in self.bind_wall:
            self.bind_wall[name] = time.time()

    def _record_seen(self, group: dict) -> None:
        raw = record_text(group)
        if not raw:
            return
        try:
            for pod_name, node in (json.loads(raw).get("pods") or {}).items():
                self.records.setdefault(group["metadata"]["name"], {}).setdefault(pod_name, set()).add(node)
        except (ValueError, AttributeError):
            pass

    def lease(self) -> dict:
        return retry(lambda: self.rest.get_or_none(f"{LEASES}/namespaces/{self.ns}/leases/{self.lease_name}")) or {}

    def holder(self) -> str:
        return str((self.lease().get("spec") or {}).get("holderIdentity") or "")

    def writes(self) -> dict[str, int]:
        """Writes by replica since the replicas started (the API server's count)."""
        return {i: sum(kinds.values()) for i, kinds in self.writes_by_kind().items()}

    def writes_by_kind(self) -> dict[str, dict[str, int]]:
        now = self.counter.by_kind()
        return {i: {k: n - self.baseline.get(i, {}).get(k, 0) for k, n in kinds.items()} for i, kinds in now.items()}

    @staticmethod
    def wait(probe: Callable[[], Any], timeout: float, message: str, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{message} (not within {timeout:.0f}s)")
            time.sleep(interval)

    def members(self, gang: str) -> list[dict]:
        return [p for p in list(self.pods.objects.values())
                if (p["metadata"].get("labels") or {}).get("app") == gang
                and not p["metadata"].get("deletionTimestamp")]

    def bound(self, gangs: list[str] | None = None) -> dict[str, int]:
        return {g: sum(1 for p in self.members(g) if p["spec"].get("nodeName"))
                for g in (self.gangs if gangs is None else gangs)}

    def whole(self) -> bool:
        counts = self.bound()
        return bool(counts) and all(counts[g] == gang.size and len(self.members(g)) == gang.size
                                    for g, gang in self.gangs.items())

    # -- gangs ------------------------------------------------------------------------------------------
    def create_gangs(self, count: int, size: int, prefix: str = "gang") -> list[str]:
        """``count`` gang StatefulSets of ``size`` one-CPU replicas, each required in one rack."""
        made = []
        for i in range(count):
            name = f"{prefix}-{i}"
            body = statefulset(name, size, requests=CPU1, scheduler_name=self.scheduler_name,
                               node_selector={RUN_LABEL: self.tag},
                               scheduling={"schedulingPolicy": {"gang": {}},
                                           "schedulingConstraints": {"topology": [{"key": RACK}]}})
            retry(lambda: self.rest.create(f"/apis/apps/v1/namespaces/{self.ns}/statefulsets", body))
            self.gangs[name] = Gang(name, size)
            made.append(name)
        return made

    def wait_whole(self, timeout: float, message: str = "every gang bound whole") -> None:
        with self.changed:
            deadline = time.monotonic() + timeout
            while not self.whole():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{message} (not within {timeout:.0f}s): bound {self.bound()}, "
                                       f"lease holder {self.holder()!r}, leading A={self.a.leading()} "
                                       f"B={self.b.leading()}")
                self.changed.wait(0.2)

    def wait_first_bind(self, gangs: list[str], timeout: float = 60.0) -> dict[str, int]:
        """Until a member of one of ``gangs`` is bound; their bound counts."""
        with self.changed:
            deadline = time.monotonic() + timeout
            while True:
                counts = self.bound(gangs)
                if any(counts.values()):
                    return counts
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no gang member bound within {timeout:.0f}s; lease holder {self.holder()!r}")
                self.changed.wait(0.02)

    # -- the fault --------------------------------------------------------------------------------------
    def fault(self, kind: str, gangs: int, size: int) -> tuple[FaultResult, float]:
        """Create the gangs, and at the first member bound take replica A down: ``kill`` (SIGKILL
        of its scheduler and serve) or ``freeze`` (SIGSTOP of both). Returns the result so far and
        the fault's wall time."""
        result = FaultResult(self.mode, kind, self.timings, gangs, size)
        made = self.create_gangs(gangs, size)
        self.wait_first_bind(made)
        sig = signal.SIGKILL if kind == "kill" else signal.SIGSTOP
        if kind == "kill":
            self.a.kill()
        else:
            self.a.signal(sig)
        fault_at = time.time()
        # what the API server holds right after the fault (the watch may lag a few binds behind)
        pods = retry(lambda: self.rest.list_items(f"/api/v1/namespaces/{self.ns}/pods"))
        self.bound_at_fault = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
        result.bound_at_fault = {g: sum(1 for p in pods if p["spec"].get("nodeName") and not p["metadata"].get(
            "deletionTimestamp") and (p["metadata"].get("labels") or {}).get("app") == g) for g in made}
        # read while the Lease still names A: B's serve cannot have acted before this
        result.writes_before = self.writes()
        result.b_serve_writes_before = self.b.api_writes()
        result.holder_at_fault = self.holder()
        self.log(f"[{self.mode}] {kind} of replica A at bound {result.bound_at_fault}; "
                 f"writes so far {result.writes_before}; Lease holder {result.holder_at_fault!r}")
        return result, fault_at

    def takeover(self, result: FaultResult, fault_at: float, timeout: float = 90.0) -> None:
        """Until B's scheduler holds the Lease, B's serve leads and every gang is whole; the times."""
        self.wait(lambda: self.holder().startswith(f"{self.b.identity}_"), timeout,
                  "replica B's scheduler acquires the Lease", interval=0.1)
        self.wait(lambda: self.b.leading() == 1, timeout, "replica B's serve reports phalanx_leading 1", interval=0.1)
        result.b_leading_s = time.time() - fault_at
        acquired = _wall((self.lease().get("spec") or {}).get("acquireTime"))
        result.takeover_s = None if acquired is None else acquired - fault_at
        self.wait_whole(timeout)
        with self.changed:
            after = sorted(t for pod, t in self.bind_wall.items() if pod not in self.bound_at_fault)
        since = acquired if acquired is not None else fault_at
        result.binds_in_flight = sum(1 for t in after if t <= since)
        mine = [t for t in after if t > since]
        result.next_bind_s = mine[0] - fault_at if mine else None
        result.last_gang_s = max(self.bind_wall[p["metadata"]["name"]] for g in self.gangs
                                 for p in self.members(g)) - fault_at

    # -- rest and invariants ----------------------------------------------------------------------------
    def snapshot(self) -> tuple[list[dict], list[dict]]:
        return namespace_snapshot(self.rest, self.ns, self._record_seen)

    def wait_rest(self, result: FaultResult | None = None, quiet: float = 3.0,
                  timeout: float = 60.0) -> tuple[list[dict], list[dict]]:
        """No binding change for ``quiet`` s and no gang partly bound (bounded by ``timeout``)."""
        t0, last, since = time.monotonic(), None, time.monotonic()
        while True:
            pods, groups = self.snapshot()
            placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
            if placed != last:
                last, since = placed, time.monotonic()
            at_rest = time.monotonic() - since >= quiet and not self.partial(pods, groups)
            if at_rest or time.monotonic() - t0 > timeout:
                if result is not None:
                    result.rest_s, result.at_rest = time.monotonic() - t0, at_rest
                return pods, groups
            time.sleep(0.5)

    def partial(self, pods: list[dict], groups: list[dict]) -> list[dict]:
        out = []
        for g in groups:
            min_count = _min_count(g)
            if min_count is None or g["metadata"].get("deletionTimestamp"):
                continue
            members = [p for p in pods if (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
                       == g["metadata"]["name"] and not p["metadata"].get("deletionTimestamp")]
            bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in members if p["spec"].get("nodeName")}
            if 0 < len(bound) < min_count:
                out.append({"group": g["metadata"]["name"], "min_count": min_count, "bound": bound,
                            "record": record_text(g)})
        return out

    def check(self, pods: list[dict], groups: list[dict]) -> list[dict]:
        """The fault suite's at-rest invariants (``faults.FaultRun.check``) for this case's gangs,
        and each gang whole."""
        violations = [{"type": "partial_gang", **p} for p in self.partial(pods, groups)]
        gang_of = {g["metadata"]["name"]: g for g in groups}
        by_name = {p["metadata"]["name"]: p for p in pods}
        for p in pods:
            meta, spec = p["metadata"], p["spec"]
            group = (spec.get("schedulingGroup") or {}).get("podGroupName")
            if not spec.get("nodeName"):
                continue
            if not group or group not in gang_of:
                violations.append({"type": "ungrouped_bind", "pod": meta["name"], "node": spec["nodeName"]})
                continue
            violations += bind_violations(meta["name"], spec["nodeName"], group, self.records)
        for name, uid in self.uids.items():
            now = by_name.get(name)
            if now is None or now["metadata"]["uid"] != uid:
                violations.append({"type": "lost_pod", "pod": name, "uid": uid,
                                   "now": None if now is None else now["metadata"]["uid"]})
        for gang in self.gangs.values():
            members = [p for p in pods if (p["metadata"].get("labels") or {}).get("app") == gang.name
                       and not p["metadata"].get("deletionTimestamp")]
            n = sum(1 for p in members if p["spec"].get("nodeName"))
            if len(members) != gang.size or n != gang.size:
                violations.append({"type": "gang_not_whole", "gang": gang.name, "pods": len(members), "bound": n})
            racks = {self.rack_of.get(p["spec"]["nodeName"], p["spec"]["nodeName"]) for p in members
                     if p["spec"].get("nodeName")}
            if len(racks) > 1:
                violations.append({"type": "rack_split", "gang": gang.name, "racks": sorted(racks)})
        return violations

    # -- the whole pod-kill round (the test's and the benchmark's) ----------------------------------
    def kill_round(self, gangs: int = 6, size: int = 4) -> FaultResult:
        result, fault_at = self.fault("kill", gangs, size)
        self.takeover(result, fault_at)
        pods, groups = self.wait_rest(result)
        result.violations = self.check(pods, groups)
        self.log(result.summary())
        return result


# --- the benchmark ----------------------------------------------------------------------------------

def run_failover_bench(plane: ControlPlane, rounds: int, modes: tuple[str, ...] = ("extender", "plugin"),
                       gangs: int = 6, size: int = 4, timings: LeaseTimings = LEASE,
                       log: Callable[[str], None] = print, controller: Any = None,
                       counter: WriteCounter | None = None) -> dict:
    """The pod-kill failover ``rounds`` times per mode, each round on fresh replicas, namespace and
    nodes: two replicas, gangs created, A killed at the first member bound, B takes over. Returns
    per mode the rounds and the median and max of kill -> next bind and kill -> last gang bound
    (and of B's Lease acquisition), with every violation seen. ``controller`` (a registered
    ``PhalanxController``) and ``counter`` (an installed :class:`WriteCounter`): the caller's, else
    the run's own (started, and stopped or removed at the end)."""
    own_counter = counter is None
    counter = counter or WriteCounter(plane).install()
    own_controller = controller is None
    if own_controller:
        sys.path.insert(0, str(ROOT / "tests" / "e2e"))
        from phalanx_controller import PhalanxController

        controller = PhalanxController(plane)
        controller.start()
        controller.register()
    out: dict[str, Any] = {"lease": vars(timings), "gangs": gangs, "size": size, "modes": {}}
    try:
        for mode in modes:
            rows: list[FaultResult] = []
            for i in range(rounds):
                case = FailoverCase(plane, mode, counter, label=f"bench{i}", timings=timings, log=log)
                try:
                    case.setup()
                    case.start_replicas()
                    rows.append(case.kill_round(gangs, size))
                finally:
                    case.close()
            out["modes"][mode] = summarize(rows)
    finally:
        if own_controller:
            controller.close()
        if own_counter:
            counter.remove()
    return out


def summarize(rows: list[FaultResult]) -> dict:
    def stats(values: list[float | None]) -> dict:
        seen = [v for v in values if v is not None]
        return {"median": round(statistics.median(seen), 3) if seen else None,
                "max": round(max(seen), 3) if seen else None, "missing": len(values) - len(seen)}
    return {"rounds": len(rows),
            "next_bind_s": stats([r.next_bind_s for r in rows]),
            "last_gang_s": stats([r.last_gang_s for r in rows]),
            "takeover_s": stats([r.takeover_s for r in rows]),
            "violations": [v for r in rows for v in r.violations],
            "standby_writes_before_kill": sum(r.writes_before.get(REPLICAS[1], 0) for r in rows),
            "rows": [r.summary() for r in rows]}
