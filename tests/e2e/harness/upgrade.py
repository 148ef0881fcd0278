"""``helm upgrade`` (and ``helm rollback``) of phalanx's chart with ``scheduler.replicas=2`` while
gangs bind: the scheduler Deployment's pods run as processes, rolled the way the Deployment
controller and the kubelet would roll them.

A :class:`SchedulerPod` is one pod of the rendered scheduler Deployment: its scheduler container
(kube-scheduler, or phalanx-scheduler in plugin mode) and its ``phalanx serve`` container, each a
process in a UTS namespace of its own whose host name is the pod's name (``unshare --uts``, as in
``failover.py``), so kube-scheduler's Lease identity is ``<pod name>_<uuid>`` and serve, which gets
exactly its container's args (``--leader-lease``, no ``--leader-identity``), follows the Lease by
its host name as in a cluster. Only what needs a pod network differs: listen addresses are
loopback ports of the pod's own, and ``--kubeconfig=in-cluster`` / the mounted configuration file
become files holding the same credentials and content (the caller builds them).

:meth:`SchedulerPod.start` starts both containers at once; :meth:`SchedulerPod.wait_ready` is the
kubelet's readiness (both containers' ``/readyz``); :meth:`SchedulerPod.sigterm` and
:meth:`SchedulerPod.wait_stopped` are the kubelet stopping a pod: SIGTERM to each container's
main process, SIGKILL of what is left of the container (its process group) after the grace period.

:class:`UpgradeCase` is a :class:`failover.FailoverCase` (nodes in racks, gang StatefulSets
through phalanx's controller, pod and PodGroup watches, the fault suite's invariants at rest) whose
Lease is the release's and whose replicas are :class:`SchedulerPod` objects; it remembers when each
gang was created and what the API server held when each old pod was stopped.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .controlplane import ControlPlane, _insecure_get
from .failover import LEADING, LEASES, FailoverCase, _wall, metric
from .faults import record_text, retry
from .process import Component, free_port
from .tools import flag_value, override_flags


def uts(hostname: str, argv: list[str]) -> list[str]:
    """``argv`` in a new UTS namespace named ``hostname`` (unshare without --fork execs sh, which
    execs ``argv``: one pid, the one a signal goes to, as a container's main process)."""
    return ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$0" "$@"', *argv]


def pod_suffix(rng: random.Random) -> str:
    """Five characters as the ReplicaSet controller's generated pod names end with."""
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


@dataclass
class Stopped:
    """One old pod stopped the way the kubelet stops it, and what the API server held then.

    A gang is *caught* by a leader's stop when it was partly bound at the moment the old pod could
    bind no more and its successor could not bind yet: the earlier of the old pod's containers gone
    and the next holder's ``acquireTime`` (bindings read from the pod watch). Its members bound
    after that were bound by the successor."""
    pod: str
    revision: str
    leading: bool  # its kube-scheduler held the Lease at the SIGTERM
    moment: str = ""  # what the SIGTERM waited for: a wave's first record or binding
    sigterm_at: float = 0.0  # wall clock
    exited_s: float | None = None  # SIGTERM -> both containers gone
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    killed: list[str] = field(default_factory=list)  # containers still running after the grace period
    bound_at_sigterm: dict[str, int] = field(default_factory=dict)  # gang -> members bound (API server)
    full: set[str] = field(default_factory=set)  # gangs whole at the SIGTERM
    records: dict[str, dict] = field(default_factory=dict)  # PodGroup -> its record's pods, at the SIGTERM (else exit)
    released: bool | None = None  # the Lease's holder was seen empty (kube-scheduler released it)
    next_holder: str = ""
    acquired_s: float | None = None  # SIGTERM -> the next holder's acquireTime
    next_leading_s: float | None = None  # SIGTERM -> a serve reports phalanx_leading 1 again
    next_bind_s: float | None = None  # SIGTERM -> the first binding after the next holder acquired
    cut_s: float | None = None  # SIGTERM -> min(exit, acquired): the moment gangs are caught at
    caught: dict[str, dict] = field(default_factory=dict)  # gang -> {group, bound_pods, record}
    caught_whole_s: dict[str, float] = field(default_factory=dict)  # caught gang -> whole, from SIGTERM

    def summary(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}s"
        partly = {g: n for g, n in self.bound_at_sigterm.items() if n and g not in self.full}
        return (f"stopped {self.pod} (revision {self.revision}, {'leader' if self.leading else 'standby'}) at "
                f"{self.moment}: exited +{s(self.exited_s)} {sorted(set(self.exit_codes.values()))}"
                f"{' SIGKILLed ' + str(self.killed) if self.killed else ''}; partly bound at SIGTERM {partly}"
                + (f"; Lease released {self.released}, next holder {self.next_holder.split('_')[0]!r} "
                   f"acquired +{s(self.acquired_s)}, its serve leading +{s(self.next_leading_s)}, "
                   f"next bind +{s(self.next_bind_s)}; partly bound at +{s(self.cut_s)} "
                   f"{ {g: len(c['bound_pods']) for g, c in self.caught.items()} }, whole "
                   f"{ {g: round(t, 2) for g, t in self.caught_whole_s.items()} }" if self.leading else ""))

class SchedulerPod:
    """One pod of the scheduler Deployment as two processes (see the module doc). ``scheduler_command``
    and ``serve_args`` are the containers' own; ``config`` the KubeSchedulerConfiguration of the
    mounted ConfigMap; ``binary`` the scheduler executable, ``phalanx`` serve's."""

    def __init__(self, plane: ControlPlane, name: str, revision: str, scheduler_command: list[str],
                 serve_args: list[str], config: dict, binary: Path, phalanx: Path,
                 scheduler_kubeconfig: Path, serve_kubeconfig: Path, viewer_token: str):
        self.plane, self.name, self.revision = plane, name, revision
        self.viewer_token = viewer_token
        self.http_port, self.health_port, self.grpc_port, self.secure_port = (free_port() for _ in range(4))
        logs = plane.workdir / "logs"
        # serve: its container's args; listen addresses on the pod's loopback ports, its token
        http_addr, grpc_addr = flag_value(serve_args, "--http-addr"), flag_value(serve_args, "--grpc-addr")
        self.serve_args = override_flags(serve_args, {
            "--kubeconfig": str(serve_kubeconfig), "--http-addr": f"127.0.0.1:{self.http_port}",
            "--health-addr": f"127.0.0.1:{self.health_port}", "--grpc-addr": f"127.0.0.1:{self.grpc_port}"})
        # the scheduler's configuration: where the container reaches serve on the pod's loopback
        config = json.loads(json.dumps(config))
        config.setdefault("clientConnection", {})["kubeconfig"] = str(scheduler_kubeconfig)
        for extender in config.get("extenders") or []:
            assert extender["urlPrefix"] == f"http://{http_addr}/scheduler", (extender, http_addr)
            extender["urlPrefix"] = f"http://127.0.0.1:{self.http_port}/scheduler"
        for profile in config.get("profiles") or []:
            for entry in profile.get("pluginConfig") or []:
                if entry.get("name") == "Phalanx":
                    assert entry["args"]["address"] == grpc_addr, (entry, grpc_addr)
                    entry["args"]["address"] = f"127.0.0.1:{self.grpc_port}"
        self.config = config
        config_path = plane.workdir / f"{name}.kube-scheduler-config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        assert Path(scheduler_command[0]).name == binary.name, (scheduler_command, binary)
        command = [str(binary)] + [f"--config={config_path}" if a.startswith("--config=") else a
                                   for a in scheduler_command[1:]]
        # serving: the pod's port 10259 becomes a loopback port; delegated authn/z with its token
        command += [f"--authentication-kubeconfig={scheduler_kubeconfig}",
                    f"--authorization-kubeconfig={scheduler_kubeconfig}",
                    "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                    "--bind-address=127.0.0.1", f"--secure-port={self.secure_port}",
                    f"--cert-dir={plane.workdir / (name + '-certs')}", "--v=2"]
        self.scheduler_argv = uts(name, command)
        self.serve_argv = uts(name, [str(phalanx), *self.serve_args])
        self.serve_log, self.scheduler_log = logs / f"{name}-phalanx.log", logs / f"{name}-kube-scheduler.log"
        self.serve: Component | None = None
        self.scheduler: Component | None = None
        self.started_at = 0.0

    # -- the kubelet ----------------------------------------------------------------------------------
    def start(self) -> "SchedulerPod":
        """Both containers at once (a pod's containers start together)."""
        self.started_at = time.time()
        self.serve = Component(f"{self.name}-phalanx", self.serve_argv, self.serve_log, cwd=self.plane.workdir)
        self.scheduler = Component(f"{self.name}-kube-scheduler", self.scheduler_argv, self.scheduler_log,
                                   cwd=self.plane.workdir)
        return self

    def wait_ready(self, timeout: float = 120.0) -> str:
        """Until both containers' readiness probes pass (the pod Ready); serve's /readyz text."""
        assert self.serve is not None and self.scheduler is not None
        port = self.secure_port
        self.scheduler.wait_ready(lambda: _insecure_get(f"https://127.0.0.1:{port}/readyz")[0] == 200, timeout)
        self.serve.wait_ready(lambda: self.readyz()[0] == 200, timeout)
        return self.readyz()[1]

    def sigterm(self) -> float:
        """SIGTERM to each container's main process, back to back; the wall time."""
        at = time.time()
        for c in (self.scheduler, self.serve):
            if c is not None and c.alive():
                c.proc.send_signal(signal.SIGTERM)
        return at

    def wait_stopped(self, grace: float) -> tuple[dict[str, int | None], list[str]]:
        """The kubelet after SIGTERM: a container still running after ``grace`` s is SIGKILLed; a
        container's other processes (serve's solver workers) go with it. Exit codes, and the
        containers that had to be killed."""
        deadline, killed = time.monotonic() + grace, []
        for c in (self.scheduler, self.serve):
            if c is None:
                continue
            try:
                c.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(c.name)
            _killpg(c.proc.pid)
            c.proc.wait(10)
            c.stop()  # closes its log
        return {c.name: c.proc.returncode for c in (self.scheduler, self.serve) if c is not None}, killed

    def kill(self) -> None:
        """Clean-up: whatever still runs of this pod."""
        for c in (self.scheduler, self.serve):
            if c is not None:
                _killpg(c.proc.pid)
                try:
                    c.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
                c.stop()

    def alive(self) -> bool:
        return any(c is not None and c.alive() for c in (self.scheduler, self.serve))

    # -- observation ----------------------------------------------------------------------------------
    def readyz(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=5) as answer:
                return answer.status, answer.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def get(self, path: str, timeout: float = 10.0) -> str | None:
        """serve's HTTP port with the viewer's token (its /metrics and dashboard need one)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}",
                                         headers={"Authorization": f"Bearer {self.viewer_token}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (loopback)
                return answer.read().decode(errors="replace")
        except (OSError, urllib.error.HTTPError):
            return None

    def leading(self) -> float | None:
        text = self.get("/metrics", timeout=5.0)
        return None if text is None else metric(text, LEADING)

    def api_writes(self) -> dict[str, int] | None:
        text = self.get("/metrics")
        if text is None:
            return None
        return {outcome: int(metric(text, "phalanx_api_writes_total", outcome=outcome) or 0)
                for outcome in ("written", "failed", "standby")}

    def placement_path(self, group_key: str) -> str | None:
        """The solver path of the last plan this serve made for the group (``record``: finished
        from its placement record); None when it made none."""
        text = self.get(f"/api/v1/podgroups/{group_key}")
        if not text:
            return None
        return ((json.loads(text).get("placement")) or {}).get("path")


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def hostname_for(replicaset: str, rng: random.Random) -> str:
    return f"{replicaset}-{pod_suffix(rng)}"


class UpgradeCase(FailoverCase):
    """A :class:`FailoverCase` on the release's Lease, with :class:`SchedulerPod` replicas (the caller
    starts and stops them) and a record of gang creation times and of every old pod stopped."""

    def __init__(self, plane: ControlPlane, mode: str, lease: str, scheduler_name: str, *, racks: int,
                 label: str = "upgrade", log: Any = print):
        super().__init__(plane, mode, counter=None, label=label, racks=racks, nodes_per_rack=4, cpu_per_node=2,
                         log=log)  # type: ignore[arg-type]  # no write counting here
        self.lease_ns, self.lease_name = lease.split("/", 1)
        self.scheduler_name = scheduler_name
        self.created_at: dict[str, float] = {}
        self.stops: list[Stopped] = []
        self.pods_running: list[SchedulerPod] = []

    def lease(self) -> dict:
        return retry(lambda: self.rest.get_or_none(f"{LEASES}/namespaces/{self.lease_ns}/leases/{self.lease_name}")) or {}

    def holder_pod(self) -> SchedulerPod | None:
        holder = self.holder()
        return next((p for p in self.pods_running if holder.startswith(p.name + "_")), None)

    def close(self) -> None:
        for p in self.pods_running:
            p.kill()
        super().close()

    # -- gangs ----------------------------------------------------------------------------------------
    def create_wave(self, count: int, size: int, prefix: str) -> list[str]:
        made = self.create_gangs(count, size, prefix=prefix)
        now = time.time()
        for g in made:
            self.created_at[g] = now
        return made

    def bound_counts(self, pods: list[dict]) -> dict[str, int]:
        out = {g: 0 for g in self.gangs}
        for p in pods:
            app = (p["metadata"].get("labels") or {}).get("app")
            if app in out and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"):
                out[app] += 1
        return out

    def waits(self) -> dict[str, float]:
        """Gang -> seconds from its StatefulSet's creation to its last member bound (watch time)."""
        out = {}
        with self.changed:
            for g, created in self.created_at.items():
                times = [self.bind_wall.get(p["metadata"]["name"]) for p in self.members(g)]
                if times and all(times):
                    out[g] = max(times) - created
        return out

    def partly_bound_spans(self) -> dict[str, float]:
        """Gang -> seconds from its first member bound to its last (watch time): how long it was
        partly bound."""
        out = {}
        with self.changed:
            for g in self.gangs:
                times = [self.bind_wall.get(p["metadata"]["name"]) for p in self.members(g)]
                if times and all(times):
                    out[g] = max(times) - min(times)
        return out

    # -- stopping an old pod ------------------------------------------------------------------------------
    def wait_binding(self, gangs: list[str], timeout: float = 60.0) -> str:
        """Until one of ``gangs`` starts binding as the API server shows it: its placement record on
        its PodGroup (written before any member binds), or a member bound. What was seen."""
        with self.changed:
            deadline = time.monotonic() + timeout
            while True:
                recorded = [g for g in self.records if g.rsplit("-", 1)[0] in gangs]
                if recorded:
                    return f"record of {recorded[0]}"
                bound = {g: n for g, n in self.bound(gangs).items() if n}
                if bound:
                    return f"bound {bound}"
                if time.monotonic() > deadline:
                    raise TimeoutError(f"none of {gangs} started binding within {timeout:.0f}s")
                self.changed.wait(0.01)

    def stop_pod(self, pod: SchedulerPod, wave: list[str], grace: float) -> Stopped:
        """Stop ``pod`` as the kubelet does as soon as one gang of ``wave`` starts binding; what the
        API server held at the SIGTERM."""
        moment = self.wait_binding(wave)
        stopped = Stopped(pod.name, pod.revision, self.holder().startswith(pod.name + "_"), moment)
        holders: list[str] = []
        done = threading.Event()

        def watch_lease() -> None:  # the holders the Lease names until another pod's takes it
            while not done.is_set():
                h = self.holder()
                if not holders or holders[-1] != h:
                    holders.append(h)
                if h and not h.startswith(pod.name + "_"):
                    return
                done.wait(0.05)
        watcher = threading.Thread(target=watch_lease, daemon=True)
        stopped.sigterm_at = pod.sigterm()
        if stopped.leading:
            watcher.start()
        pods, groups = self.snapshot()
        stopped.bound_at_sigterm = self.bound_counts(pods)
        stopped.full = {g for g, n in stopped.bound_at_sigterm.items() if n == self.gangs[g].size}
        stopped.records = self._records(groups)
        stopped.exit_codes, stopped.killed = pod.wait_stopped(grace)
        stopped.exited_s = time.time() - stopped.sigterm_at
        self.pods_running.remove(pod)
        _, groups = self.snapshot()
        stopped.records = {**self._records(groups), **stopped.records}
        if stopped.leading:
            watcher.join(30)
            done.set()
            stopped.released = "" in holders  # kube-scheduler released it (ReleaseOnCancel)
        self.stops.append(stopped)
        return stopped

    @staticmethod
    def _records(groups: list[dict]) -> dict[str, dict]:
        out = {}
        for g in groups:
            raw = record_text(g)
            if raw:
                out[g["metadata"]["name"]] = json.loads(raw).get("pods") or {}
        return out

    def after_leader_stop(self, stopped: Stopped, timeout: float = 90.0) -> None:
        """Until another pod's kube-scheduler holds the Lease, its serve leads and the gangs caught
        partly bound are whole; the times, from the SIGTERM."""
        t0 = stopped.sigterm_at
        holder = self.wait(lambda: (h := self.holder()) and not h.startswith(stopped.pod + "_") and h, timeout,
                           f"a pod other than {stopped.pod} holds the Lease", interval=0.05)
        stopped.next_holder = holder
        pod = self.wait(self.holder_pod, timeout, "the Lease holder is a running pod")
        self.wait(lambda: pod.leading() == 1, timeout, f"{pod.name}'s serve reports phalanx_leading 1", interval=0.1)
        stopped.next_leading_s = time.time() - t0
        acquired = _wall((self.lease().get("spec") or {}).get("acquireTime"))
        stopped.acquired_s = None if acquired is None else acquired - t0
        exited = t0 + (stopped.exited_s or 0.0)
        cut = min(exited, acquired) if acquired is not None else exited
        stopped.cut_s = cut - t0
        with self.changed:
            for g, gang in self.gangs.items():
                members = self.members(g)
                before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in members
                          if self.bind_wall.get(p["metadata"]["name"], cut + 1) <= cut}
                if 0 < len(before) < gang.size:
                    group = next((p["spec"].get("schedulingGroup") or {}).get("podGroupName") for p in members)
                    stopped.caught[g] = {"group": group, "bound_pods": before,
                                         "record": stopped.records.get(group)}
            deadline = time.monotonic() + timeout
            while not all(self.bound().get(g, 0) == self.gangs[g].size for g in stopped.caught):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gangs caught partly bound at {stopped.pod}'s stop not whole: {self.bound()}")
                self.changed.wait(0.2)
            since = acquired if acquired is not None else t0
            later = sorted(t for t in self.bind_wall.values() if t > since)
            stopped.next_bind_s = later[0] - t0 if later else None
            for g in stopped.caught:
                stopped.caught_whole_s[g] = max(self.bind_wall[p["metadata"]["name"]] for p in self.members(g)) - t0

    def finished_from_records(self, pods: list[dict], stops: list[Stopped]) -> list[dict]:
        """Per gang caught partly bound by one of ``stops``: where its members unbound then went,
        against what its placement record said at the stop."""
        now = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        out = []
        for stopped in stops:
            for gang, caught in stopped.caught.items():
                record = caught["record"] or {}
                late = {name: now.get(name) for name in record if name not in caught["bound_pods"]}
                out.append({"gang": gang, "group": caught["group"], "stopped": stopped.pod,
                            "bound_then": len(caught["bound_pods"]), "late": late,
                            "as_recorded": bool(late) and all(record.get(n) == node for n, node in late.items())})
        return out
