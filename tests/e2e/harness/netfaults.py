"""Network faults and a throttling API server for the fault suite, through a real fault proxy.

Toxiproxy's server (``github.com/Shopify/toxiproxy/v2`` at ``TOXIPROXY_VERSION``, built by
``hack/build-toxiproxy.sh`` into ``${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/toxiproxy/<version>/``)
runs as a process on loopback; :class:`Toxiproxy` drives it through its HTTP API (proxies, toxics,
enabling and disabling a proxy). :class:`NetFaultRun` is the fault driver of ``harness/faults.py``
with two TCP proxies in place before anything starts:

- the **serve link**: kube-scheduler's way to ``phalanx serve`` — the extender's ``urlPrefix``
  (extender mode) or the plugin's gRPC ``address`` (plugin mode) point at the proxy;
- the **apiserver link**: ``phalanx serve``'s (and the in-process controller's) kubeconfig names the
  proxy as its server; TCP passthrough keeps TLS end to end (the serving certificate carries
  ``IP:127.0.0.1``). phalanx authenticates there as its own user, ``phalanx-netfaults`` (bound to
  cluster-admin; not in ``system:masters``, which API Priority and Fairness exempts).

The test itself, kube-scheduler and the kubelet stand-in talk to the API server directly: what
the invariants read is the truth, not what the proxy lets through.

Fault kinds (one per shot, at a moment read from the API as for the kills; ``FAULT_SECONDS``
bounds how long each lasts, drawn per shot):

- ``net-blackhole-<link>``: Toxiproxy's ``timeout`` toxic with timeout 0 on both directions: bytes
  are swallowed and connections stay open (the caller's own timeout fires);
- ``net-reset-<link>``: ``reset_peer`` (timeout 0) on both directions: every connection that
  carries data is reset (TCP RST);
- ``net-latency-<link>``: ``latency`` of 100 ms to 5 s (jitter a tenth of it) on the answers;
- ``net-bandwidth-<link>``: ``bandwidth`` of 4 to 64 KB/s on the answers;
- ``net-partition-<link>``: the proxy disabled (its connections closed, new ones refused), then
  enabled again: a partition that heals;
- ``api-throttle``: the API server itself throttles phalanx's writes — a FlowSchema matching the
  ``phalanx-netfaults`` user's create/update/patch/delete sends them to a PriorityLevelConfiguration
  (``flowcontrol.apiserver.k8s.io/v1``) with one nominal share, nothing to borrow and
  ``limitResponse: Reject``, so writes beyond its few seats get a real 429 with ``Retry-After``;
  plus a latency toxic of 100 ms to 1 s on the apiserver link: slow and throttled;
- ``api-refuse``: the same with no share at all: every write of phalanx's is answered 429 (with
  ``Retry-After``) while it lasts (2 to 8 s), so a write may spend client-go's 10 retries and fail.
  ``rejected_429`` in the shot's row counts the rejections (the API server's
  ``apiserver_flowcontrol_rejected_requests_total`` for the level). Both start before the shot's
  pods are created (moment ``before``): the API server takes a moment to apply a flow-control
  change, and a small gang would be placed before it.

After each shot (the fault healed, the system at rest) the invariants of the kills hold, and:

- ``not_bound_in_time``: a live gang that fits the free room (on one rack when it asks for one) is
  still unbound ``BIND_BOUND_S[fault]`` seconds after the fault healed;
- ``status_lost``: a live gang with minCount members bound whose PodGroup lacks
  ``PodGroupInitiallyScheduled=True`` ``STATUS_BOUND_S`` seconds after rest (no status write lost);
- ``plain_blocked`` (plugin mode, serve-link outages: blackhole, reset, partition): a plain pod
  created while the link is down is not bound within ``PLAIN_BOUND_S`` (the plugin's circuit
  breaker must let plain pods schedule; the fault is held until it binds or the bound passes);
- ``serve_threads`` / ``serve_rss``: ``phalanx serve``'s thread count above its baseline plus
  ``THREAD_SLACK`` where the growth is not a pool of ``BOUNDED_POOLS`` within its bound (serve's
  ``phalanx_threads`` gauge names each Python thread's pool; ``/proc/<pid>/task/*/comm`` the
  native threads that name themselves), or its resident memory above ``RSS_SLACK`` times its
  baseline (from ``/proc/<pid>/status``, at rest; the baseline is taken at rest after the first
  shot of each serve process).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from cluster import names

from .binaries import read_versions
from .controlplane import ControlPlane
from .faults import PHASES, FaultConfig, FaultRun, retry, run_faults
from .nodes import RACK
from .process import Component, free_port

PHALANX_USER = "phalanx-netfaults"
FLOW = "phalanx-netfaults"
LINKS = ("serve", "apiserver")
FAULTS = ("blackhole", "reset", "latency", "bandwidth", "partition")
NET_KINDS = tuple(f"net-{f}-{link}" for link in LINKS for f in FAULTS) + ("api-throttle", "api-refuse")
API_KINDS = ("api-throttle", "api-refuse")
OUTAGES = ("blackhole", "reset", "partition")  # the link carries nothing while they last
#: how long a fault lasts (s), drawn uniformly per shot
FAULT_SECONDS = {"blackhole": (2.0, 12.0), "reset": (2.0, 12.0), "latency": (3.0, 10.0),
                 "bandwidth": (3.0, 10.0), "partition": (2.0, 12.0), "throttle": (5.0, 15.0),
                 "refuse": (2.0, 8.0)}
LATENCY_MS = (100, 5000)
THROTTLE_LATENCY_MS = (100, 1000)
BANDWIDTH_KBPS = (4, 16, 64)
#: a gang that fits is bound within this long after its fault healed (s): the barrier timeout, a
#: plan's TTL and kube-scheduler's backoff for pods that came back unschedulable (up to 10 s) are
#: all inside it; a throttled API server spends up to client-go's 10 Retry-After waits more
BIND_BOUND_S = {"blackhole": 60.0, "reset": 60.0, "latency": 60.0, "bandwidth": 60.0, "partition": 60.0,
                "throttle": 75.0, "refuse": 75.0}
PLAIN_BOUND_S = 30.0
#: a bound gang's PodGroupInitiallyScheduled=True is on its status within this long after rest (s):
#: the dispatcher's backoff (at most 5 s) after client-go's Retry-After waits
STATUS_BOUND_S = 30.0
THREAD_SLACK = 16
#: phalanx serve's pools that start threads lazily and keep them, and their bounds with the flags
#: the rig starts serve with (``--grpc-workers`` 32, the binder's 16, group preemption's evictions'
#: 16): their growth up to the bound is not a leak
BOUNDED_POOLS = {"phalanx-grpc": 32, "phalanx-bind": 16, "phalanx-evict": 16}
RSS_SLACK = 1.5
SERVE_LINK_OUTAGE_BOUND = 40.0  # a plugin-mode outage is held at most this long (plain-pod probe)


class MissingToxiproxy(RuntimeError):
    """Toxiproxy has not been built (run ``make e2e`` or hack/build-toxiproxy.sh)."""


def toxiproxy_binary() -> Path:
    version = read_versions()["TOXIPROXY_VERSION"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "phalanx" / "toxiproxy" / version / "toxiproxy-server"
    if not os.access(path, os.X_OK):
        raise MissingToxiproxy(f"toxiproxy-server {version} not built: nothing at {path}. Run `make e2e` or "
                               "`bash hack/build-toxiproxy.sh` first.")
    return path


class Toxiproxy:
    """toxiproxy-server on a free loopback port, and a small client of its HTTP API."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.component = Component("toxiproxy", [str(toxiproxy_binary()), "-host", "127.0.0.1", "-port",
                                                 str(self.port)], workdir / "logs" / "toxiproxy.log", cwd=workdir)
        self.component.wait_ready(lambda: bool(self._call("GET", "/version")), timeout=30)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (loopback)
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"toxiproxy {method} {path}: HTTP {err.code}: {err.read()[:300]!r}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")

    def proxy(self, name: str, upstream_port: int) -> int:
        """A proxy ``name`` from a free loopback port to ``upstream_port``; its listen port."""
        listen = free_port()
        self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{listen}",
                                        "upstream": f"127.0.0.1:{upstream_port}", "enabled": True})
        return listen

    def toxic(self, proxy: str, kind: str, attributes: dict[str, int], stream: str = "downstream") -> str:
        """Add a toxic of ``kind`` (``latency``, ``bandwidth``, ``timeout``, ``reset_peer`` ...) on
        ``stream`` (``downstream``: the answers; ``upstream``: the requests); its name."""
        name = f"{kind}-{stream}"
        self._call("POST", f"/proxies/{proxy}/toxics", {"name": name, "type": kind, "stream": stream,
                                                         "toxicity": 1.0, "attributes": attributes})
        return name

    def toxics(self, proxy: str) -> list[dict]:
        return self._call("GET", f"/proxies/{proxy}/toxics") or []

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

    def heal(self, proxy: str) -> None:
        """Every toxic of ``proxy`` removed and the proxy enabled."""
        for toxic in self.toxics(proxy):
            self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")
        self.set_enabled(proxy, True)

    def stop(self) -> None:
        self.component.stop()


# --- API Priority and Fairness: a real 429 for phalanx's writes --------------------------------

FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"


def throttle_objects(user: str, shares: int = 1) -> tuple[dict, dict]:
    """A PriorityLevelConfiguration with ``shares`` nominal shares (0: no seat at all), nothing lent
    or borrowed and Reject beyond its seats, and a FlowSchema sending ``user``'s writes to it."""
    level = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
             "metadata": {"name": FLOW},
             "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": shares, "lendablePercent": 0,
                                                     "borrowingLimitPercent": 0,
                                                     "limitResponse": {"type": "Reject"}}}}
    schema = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": FLOW},
              "spec": {"priorityLevelConfiguration": {"name": FLOW}, "matchingPrecedence": 200,
                       "distinguisherMethod": {"type": "ByUser"},
                       "rules": [{"subjects": [{"kind": "User", "user": {"name": user}}],
                                  "resourceRules": [{"verbs": ["create", "update", "patch", "delete"],
                                                     "apiGroups": ["*"], "resources": ["*"],
                                                     "namespaces": ["*"], "clusterScope": True}]}]}}
    return level, schema


def rejected_writes(rest: Any) -> int:
    """Requests the API server rejected (429) at the throttling priority level so far, from its
    ``apiserver_flowcontrol_rejected_requests_total`` metric."""
    total = 0
    for line in retry(lambda: rest.text("/metrics")).splitlines():
        if line.startswith("apiserver_flowcontrol_rejected_requests_total{") and f'priority_level="{FLOW}"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def set_throttle(rest: Any, on: bool, shares: int = 1) -> None:
    """Throttle phalanx's writes (``on``; ``shares`` as in :func:`throttle_objects`), waiting until
    the API server's flow-control configuration took the FlowSchema in (its ``Dangling``
    condition written), or stop throttling them."""
    level, schema = throttle_objects(PHALANX_USER, shares)
    if on:
        retry(lambda: rest.create(f"{FLOWCONTROL}/prioritylevelconfigurations", level))
        retry(lambda: rest.create(f"{FLOWCONTROL}/flowschemas", schema))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                c.get("type") == "Dangling" for c in (retry(lambda: rest.get(f"{FLOWCONTROL}/flowschemas/{FLOW}"))
                                                      .get("status") or {}).get("conditions") or []):
            time.sleep(0.1)
    else:
        retry(lambda: rest.delete(f"{FLOWCONTROL}/flowschemas/{FLOW}", missing_ok=True))
        retry(lambda: rest.delete(f"{FLOWCONTROL}/prioritylevelconfigurations/{FLOW}", missing_ok=True))


# --- phalanx serve's footprint ----------------------------------------------------------------

def proc_footprint(pid: int) -> tuple[int, int]:
    """(resident memory in KiB, threads) of process ``pid``, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def thread_pools(port: int) -> dict[str, int]:
    """phalanx serve's Python threads by pool (its ``phalanx_threads`` gauge), {} when not read."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    pools = {}
    for line in text.splitlines():
        if line.startswith(names.METRIC_THREADS + "{"):
            label, value = line.rsplit(" ", 1)
            pools[label.split('pool="', 1)[1].rsplit('"', 1)[0]] = int(float(value))
    return pools


def pool_growth(pools: dict[str, int], baseline: dict[str, int]) -> tuple[dict[str, int], int]:
    """Each pool's threads above its baseline, and how many of them no bound in ``BOUNDED_POOLS``
    covers (a pool that starts threads lazily and keeps them grows up to its bound, once)."""
    grown = {p: n - baseline.get(p, 0) for p, n in pools.items() if n > baseline.get(p, 0)}
    unbounded = sum(n for p, n in grown.items() if pools[p] > BOUNDED_POOLS.get(p, 0))
    return grown, unbounded


def thread_census(pid: int) -> dict[str, int]:
    """How many of process ``pid``'s threads carry each kernel name (``/proc/<pid>/task/*/comm``):
    threads that name themselves (gRPC core's, for one) apart from those that inherit the process's."""
    names: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended while being read
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


# --- the driver ---------------------------------------------------------------------------------

def split_kind(kind: str) -> tuple[str, str]:
    """``net-latency-apiserver`` -> (``latency``, ``apiserver``); ``api-throttle`` -> (``throttle``,
    ``apiserver``)."""
    if kind in ("api-throttle", "api-refuse"):
        return kind[4:], "apiserver"
    _, fault, link = kind.split("-", 2)
    return fault, link


def draw_sequence(cfg: FaultConfig, weights: dict[str, float]) -> tuple[str, ...]:
    """The kinds of all ``cfg.faults`` shots, ``cfg.sequence`` first, the rest drawn from
    ``weights`` (the kills' kinds and the network ones) with a generator of ``cfg.seed``'s own."""
    rng = random.Random(f"net-{cfg.seed}")
    kinds = [k for k, w in weights.items() if w]
    more = max(0, cfg.faults - len(cfg.sequence))
    if not more:
        return tuple(cfg.sequence[:cfg.faults])
    return tuple(cfg.sequence) + tuple(rng.choices(kinds, weights=[weights[k] for k in kinds], k=more))


class NetFaultRun(FaultRun):
    """:class:`~harness.faults.FaultRun` with the two links proxied and the network kinds."""

    def __init__(self, plane: ControlPlane, cfg: FaultConfig):
        super().__init__(plane, cfg)
        self.proxy = Toxiproxy(plane.workdir)
        self.links: dict[str, str] = {}
        self.healed_at = 0.0
        self.fault = ""
        self.footprints: list[dict] = []
        self.baseline: tuple[int, int, int] | None = None  # (serve start, rss KiB, threads)
        self.baseline_census: dict[str, int] = {}  # the baseline's threads by kernel name
        self.baseline_pools: dict[str, int] = {}  # and by serve's pools (phalanx_threads)
        self.rejected_before = 0
        self.armed_at: float | None = None
        # the API server's faults start before their shot's pods exist: their moment is "before"
        phases = list(cfg.phases)
        draw = random.Random(f"phases-{cfg.seed}")
        for kind in cfg.sequence[len(phases):]:
            phases.append("before" if kind in API_KINDS else
                          draw.choice(PHASES[1:4] if kind == "apiserver" else PHASES))
        self.cfg = replace(cfg, phases=tuple(phases))

    # -- wiring ---------------------------------------------------------------------------------
    def setup(self) -> None:
        rig, tag = self.rig, self.scheduler_name[-8:]
        serve_link = f"serve-{tag}"
        if rig.mode == "plugin":
            assert rig.grpc_port is not None
            rig.scheduler_dials = (rig.serve_port, self.proxy.proxy(serve_link, rig.grpc_port))
        else:
            rig.scheduler_dials = (self.proxy.proxy(serve_link, rig.serve_port), None)
        api_link = f"apiserver-{tag}"
        api_port = int(str(self.plane.server).rsplit(":", 1)[1])
        rig.serve_kubeconfig = self._phalanx_kubeconfig(self.proxy.proxy(api_link, api_port))
        self.links = {"serve": serve_link, "apiserver": api_link}
        super().setup()
        if self.controller is not None:  # the controller's replicas dial through the proxy too
            from cluster.kube import Kube

            self.controller.stop()
            self.controller.kube = Kube(str(rig.serve_kubeconfig))
            self.controller.start()

    def _phalanx_kubeconfig(self, port: int) -> Path:
        """phalanx's own user (cluster-admin, outside ``system:masters``) against ``port``."""
        plane = self.plane
        assert plane.pki is not None
        cert = plane.pki.client(PHALANX_USER, PHALANX_USER)
        retry(lambda: plane.rest.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{PHALANX_USER}",
                                        missing_ok=True))
        retry(lambda: plane.rest.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": PHALANX_USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PHALANX_USER}]}))
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "proxied",
                  "clusters": [{"name": "proxied", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                               "certificate-authority": str(plane.pki.ca_cert)}}],
                  "users": [{"name": PHALANX_USER, "user": {"client-certificate": str(cert.cert),
                                                            "client-key": str(cert.key)}}],
                  "contexts": [{"name": "proxied", "context": {"cluster": "proxied", "user": PHALANX_USER}}]}
        path = plane.workdir / f"{PHALANX_USER}.kubeconfig"
        path.write_text(json.dumps(config, indent=2))
        return path

    def teardown(self) -> None:
        try:
            set_throttle(self.rest, False)
        except Exception as err:  # noqa: BLE001 - best effort
            self.cfg.log(f"teardown: {err!r}")
        try:
            super().teardown()
        finally:
            self.proxy.stop()

    # -- faults ---------------------------------------------------------------------------------
    def shot(self, index: int, kind: str) -> dict:
        """The API server's throttling is in place before the shot's pods exist (its flow-control
        configuration takes a moment to apply: a small gang would be placed before it)."""
        if kind in API_KINDS:
            self.armed_at = self.kill(kind)
        try:
            return super().shot(index, kind)
        finally:
            self.armed_at = None

    def kill(self, kind: str) -> float:
        if kind not in NET_KINDS:
            return super().kill(kind)
        if self.armed_at is not None:
            return self.armed_at
        fault, link = split_kind(kind)
        proxy, rng = self.links[link], self.rng
        self.fault = fault
        if fault == "blackhole":
            for stream in ("upstream", "downstream"):
                self.proxy.toxic(proxy, "timeout", {"timeout": 0}, stream)
        elif fault == "reset":
            for stream in ("upstream", "downstream"):
                self.proxy.toxic(proxy, "reset_peer", {"timeout": 0}, stream)
        elif fault == "latency":
            ms = rng.randint(*LATENCY_MS)
            self.proxy.toxic(proxy, "latency", {"latency": ms, "jitter": ms // 10})
        elif fault == "bandwidth":
            self.proxy.toxic(proxy, "bandwidth", {"rate": rng.choice(BANDWIDTH_KBPS)})
        elif fault == "partition":
            self.proxy.set_enabled(proxy, False)
        else:  # throttle (a few seats) or refuse (none)
            ms = rng.randint(*THROTTLE_LATENCY_MS)
            self.proxy.toxic(proxy, "latency", {"latency": ms, "jitter": ms // 10})
            self.rejected_before = rejected_writes(self.rest)
            set_throttle(self.rest, True, shares=1 if fault == "throttle" else 0)
        return time.monotonic()

    def bring_back(self, kind: str, killed_at: float) -> dict:
        if kind not in NET_KINDS:
            self.fault = ""
            return super().bring_back(kind, killed_at)
        fault, link = split_kind(kind)
        lasts = round(self.rng.uniform(*FAULT_SECONDS[fault]), 2)
        out: dict[str, Any] = {"downtime_s": lasts, "link": link,
                               "toxics": [t["type"] for t in self.proxy.toxics(self.links[link])]}
        if link == "serve" and fault in OUTAGES and self.rig.mode == "plugin":
            out["plain_bound_s"] = self._plain_probe(killed_at)
        time.sleep(max(0.0, killed_at + lasts - time.monotonic()))
        if fault in ("throttle", "refuse"):
            out["rejected_429"] = rejected_writes(self.rest) - self.rejected_before
            set_throttle(self.rest, False)
        self.proxy.heal(self.links[link])
        self.healed_at = time.monotonic()
        out["recovery_s"] = round(self.healed_at - killed_at, 2)
        return out

    def _plain_probe(self, since: float) -> float | None:
        """A plain pod created while the serve link is down; seconds until it was bound (None:
        not within ``PLAIN_BOUND_S``)."""
        unit = self.create_plain()
        self.post_pods([(unit.name, self._pod(unit.name, unit.name, None))])
        t0 = time.monotonic()
        with self.changed:
            while time.monotonic() - t0 < PLAIN_BOUND_S:
                found = self.pods.objects.get(unit.name)
                if found is not None and found["spec"].get("nodeName"):
                    return round(time.monotonic() - t0, 2)
                self.changed.wait(0.1)
        return None

    # -- after the fault ----------------------------------------------------------------------------
    def check(self, pods: list[dict], groups: list[dict], shot: dict) -> list[dict]:
        violations: list[dict] = []
        if shot["kind"] in NET_KINDS:
            fault, _ = split_kind(shot["kind"])
            waited, pods, groups, late = self.wait_bound(BIND_BOUND_S[fault])
            shot["bound_wait_s"] = waited
            violations += [{"type": "not_bound_in_time", "bound_s": BIND_BOUND_S[fault], **g,
                            "serve": self.serve_view(g["group"])} for g in late]
            if "plain_bound_s" in shot and shot["plain_bound_s"] is None:
                violations.append({"type": "plain_blocked", "bound_s": PLAIN_BOUND_S})
            lost, pods, groups = self.wait_status(STATUS_BOUND_S)
            violations += [{"type": "status_lost", "bound_s": STATUS_BOUND_S, "group": g} for g in lost]
        violations += super().check(pods, groups, shot)
        violations += self.check_footprint(shot)
        return violations

    def wait_bound(self, bound: float) -> tuple[float, list[dict], list[dict], list[dict]]:
        """Until no live gang that fits the free room is unbound, at most ``bound`` seconds after
        the fault healed: (seconds waited after the heal, pods, groups, the gangs still unbound)."""
        while True:
            pods, groups = self.snapshot()
            late = self.fitting_unbound(pods, groups)
            waited = time.monotonic() - self.healed_at
            if not late or waited > bound:
                return round(waited, 2), pods, groups, late
            time.sleep(0.5)

    def wait_status(self, bound: float) -> tuple[list[str], list[dict], list[dict]]:
        """Until every live gang with minCount members bound has its PodGroup's
        ``PodGroupInitiallyScheduled=True`` (the status write the dispatcher retries through a
        throttled or unreachable API server), at most ``bound`` seconds: the gangs still without."""
        deadline = time.monotonic() + bound
        while True:
            pods, groups = self.snapshot()
            lost = []
            for g in groups:
                unit = self.units.get(g["metadata"]["name"])
                if unit is None or unit.deleted or unit.kind != "gang":
                    continue
                bound_n = sum(1 for p in pods if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                              and (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == unit.name)
                conditions = (g.get("status") or {}).get("conditions") or []
                if bound_n >= unit.min_count and not any(c.get("type") == names.CONDITION_INITIALLY_SCHEDULED and c.get("status") == "True"
                                                         for c in conditions):
                    lost.append(unit.name)
            if not lost or time.monotonic() > deadline:
                return lost, pods, groups
            time.sleep(0.5)

    def fitting_unbound(self, pods: list[dict], groups: list[dict]) -> list[dict]:
        """Live gangs with nothing bound whose minCount fits the free CPUs now (one pod, one CPU;
        on one rack's nodes when the gang asks for a rack)."""
        used: dict[str, int] = {}
        for p in pods:
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"):
                used[p["spec"]["nodeName"]] = used.get(p["spec"]["nodeName"], 0) + 1
        free_by_rack: dict[str, int] = {}
        for name in self.node_names:
            rack = name.rsplit("-", 2)[-2]  # <prefix>-r<k>-<i>
            free_by_rack[rack] = free_by_rack.get(rack, 0) + max(0, self.cfg.cpu_per_node - used.get(name, 0))
        out = []
        for g in groups:
            unit = self.units.get(g["metadata"]["name"])
            if unit is None or unit.deleted or unit.kind != "gang" or g["metadata"].get("deletionTimestamp"):
                continue
            members = [p for p in pods if (p["spec"].get("schedulingGroup") or {}).get("podGroupName")
                       == unit.name and not p["metadata"].get("deletionTimestamp")]
            if len(members) < unit.min_count or any(p["spec"].get("nodeName") for p in members):
                continue
            room = max(free_by_rack.values(), default=0) if unit.rack else sum(free_by_rack.values())
            if unit.min_count <= room:
                out.append({"group": unit.name, "min_count": unit.min_count, "rack": unit.rack, "room": room,
                            "topology": RACK if unit.rack else None, "events": self.reasons(unit.name)[-8:]})
        return out

    def serve_view(self, group: str) -> dict:
        """What phalanx serve says of ``group`` (its dashboard's view: plan, explanation, the last
        events of its timeline, condition), as evidence of a violation; {} when serve does not answer."""
        url = f"http://127.0.0.1:{self.rig.serve_port}/api/v1/podgroups/{self.ns}/{group}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                view = json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError):
            return {}
        if isinstance(view.get("timeline"), list):
            view["timeline"] = view["timeline"][-12:]
        view["pods"] = [{k: p.get(k) for k in ("name", "node", "phase", "gated")} for p in view.get("pods") or []]
        try:  # the write dispatcher's counters: were the retry touches (kind "nudge") written?
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rig.serve_port}/metrics", timeout=5) as response:
                view["dispatch"] = [line for line in response.read().decode().splitlines()
                                    if line.startswith((names.METRIC_DISPATCH_WRITES, names.METRIC_DISPATCH_QUEUED))]
        except (OSError, urllib.error.URLError):
            pass
        return view

    def check_footprint(self, shot: dict) -> list[dict]:
        serve = self.rig.serve
        if serve is None or not serve.alive():
            return []
        rss, threads = proc_footprint(serve.proc.pid)
        census, pools = thread_census(serve.proc.pid), thread_pools(self.rig.serve_port)
        shot.update(serve_rss_kib=rss, serve_threads=threads, serve_thread_names=census, serve_thread_pools=pools)
        starts = self.rig.serve_starts
        if self.baseline is None or self.baseline[0] != starts:
            self.baseline = (starts, rss, threads)
            self.baseline_census, self.baseline_pools = census, pools
            return []
        _, base_rss, base_threads = self.baseline
        out = []
        # the kernel's count (native threads too: gRPC core's name themselves) and serve's own by
        # pool: threads beyond the slack that no pool's bound explains
        grown, unbounded = pool_growth(pools, self.baseline_pools)
        native = {n: k - self.baseline_census.get(n, 0) for n, k in census.items()
                  if n != "python" and k > self.baseline_census.get(n, 0)}
        if threads > base_threads + THREAD_SLACK and (unbounded + sum(native.values()) > THREAD_SLACK or not pools):
            out.append({"type": "serve_threads", "threads": threads, "baseline": base_threads, "slack": THREAD_SLACK,
                        "pools_grown": grown, "native_grown": native})
        if rss > base_rss * RSS_SLACK:
            out.append({"type": "serve_rss", "rss_kib": rss, "baseline_kib": base_rss, "factor": RSS_SLACK})
        return out


NET_VIOLATIONS = ("not_bound_in_time", "status_lost", "plain_blocked", "serve_threads", "serve_rss")


def run_net_faults(plane: ControlPlane, cfg: FaultConfig, weights: dict[str, float]) -> tuple[dict, list[dict]]:
    """Like :func:`harness.faults.run_faults`, with the links proxied: ``cfg.faults`` shots whose
    kinds are ``cfg.sequence`` and then drawn from ``weights`` (kill kinds and ``NET_KINDS``)."""
    return run_faults(plane, replace(cfg, sequence=draw_sequence(cfg, weights)), NetFaultRun)
