"""A simulated kube-scheduler that drives phalanx over the real extender HTTP protocol.

It is a simulation of kube-scheduler's loop, only as deep as the demo and the benchmarks need:
pending pods (no node, no scheduling gates) are taken highest priority first, then oldest; an
in-tree-style filter keeps the nodes with room (requests vs free capacity including pods it has
assumed), and then the extender is asked exactly as kube-scheduler asks it (``nodeCacheCapable``
mode: ``NodeNames``): ``filter``, ``prioritize`` when more than one node is left, and ``bind``
in a background thread per pod, as kube-scheduler's binding cycle does. A pod the extender
rejects waits for the next round (kube-scheduler retries extender rejections on any event).

Two options make it closer to a long-running kube-scheduler, for the demo's background loop
(:meth:`run_forever`): ``post_filter`` — a group pod no node fits goes to the extender's ``preempt``
verb, as kube-scheduler's PostFilter does (phalanx plans group preemption there); ``backoff`` —
a rejected group waits before its members are tried again (initial seconds, doubling up to 10 s,
per PodGroup, as a gang is requeued as one), so an infeasible gang costs one cycle per backoff,
not one per member per round.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import orjson

from cluster import names as names_mod
from cluster.cache import ClusterCache
from cluster.convert import pod_from_json, pod_group_name
from cluster.sim import SimCluster

log = logging.getLogger("phalanx.scheduler_sim")
MAX_BACKOFF = 10.0


@dataclass
class RoundStats:
    attempted: int = 0
    bound: int = 0
    rejected: int = 0
    bind_errors: list[str] = field(default_factory=list)


class ExtenderClient:
    """Keep-alive HTTP client for the extender, one connection per thread."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 120.0):
        self.host, self.port, self.timeout = host, port, timeout
        self._local = threading.local()

    def post(self, verb: str, body: dict) -> object:
        payload = orjson.dumps(body)
        for attempt in range(2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                self._local.conn = conn
            try:
                conn.request("POST", f"/scheduler/{verb}", payload, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                raise RuntimeError(f"extender {verb}: HTTP {resp.status}: {data[:200]!r}")
            return orjson.loads(data)
        raise RuntimeError("unreachable")


class SimulatedScheduler:
    def __init__(self, sim: SimCluster, port: int, bind_threads: int = 1100, post_filter: bool = False,
                 backoff: float = 0.0):
        self.sim = sim
        self.post_filter = post_filter
        self.backoff = backoff
        self._backoff: dict[str, tuple[float, float]] = {}  # group (or pod uid) -> (retry at, delay)
        self._retried: dict[str, str | None] = {}  # pod uid -> its retry annotation when last tried
        self._last_try: dict[str, dict] = {}  # group (or pod uid) -> what its last try saw and was told
        self.cache: ClusterCache = sim.cache
        self.client = ExtenderClient(port)
        self._binder = ThreadPoolExecutor(max_workers=bind_threads, thread_name_prefix="sim-bind")
        self._inflight: set[str] = set()
        self._lock = threading.Lock()
        self.filter_ms: list[float] = []

    def close(self) -> None:
        self._binder.shutdown(wait=True)

    def inflight(self) -> int:
        """Bind calls sent and not yet answered."""
        with self._lock:
            return len(self._inflight)

    def forget(self, live: set[str]) -> None:
        """Forget what is kept per pod and per group for pods no longer in ``live`` (uids) and
        groups none of them names: a long run's scheduler state stays bounded."""
        units = {self._unit(p) for p in self.sim.list("Pod") if p["metadata"]["uid"] in live}
        for uid in set(self._retried) - live:
            self._retried.pop(uid, None)
        for unit in set(self._backoff) - units:
            self._backoff.pop(unit, None)
        for unit in set(self._last_try) - units:
            self._last_try.pop(unit, None)

    def pending(self) -> list[dict]:
        pods = [p for p in self.sim.list("Pod")
                if not p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")
                and p["metadata"]["uid"] not in self._inflight
                and (p.get("status") or {}).get("phase", "Pending") == "Pending"]
        return sorted(pods, key=lambda p: (-(p["spec"].get("priority") or 0), p["metadata"]["creationTimestamp"],
                                           p["metadata"]["name"]))

    def run_round(self, wait: bool = True) -> RoundStats:
        """One pass over the pending pods; with ``wait``, until their bind calls returned. While
        it waits, a pending pod whose ``scheduling.phalanx.dev/retry`` annotation changed is tried
        again at once, as kube-scheduler requeues a pod on its update (phalanx touches members it
        answered "no node" once their group's plan forms)."""
        stats = RoundStats()
        snapshot = self.cache.snapshot()
        free = snapshot.free.astype(np.int64).copy()
        names = np.array([n.name for n in snapshot.nodes], dtype=object)
        futures: list = []
        now = time.monotonic()
        for pod_json in self.pending():
            self._attempt(pod_json, snapshot, free, names, stats, futures, now)
        if wait:
            while any(not f.done() for f in futures):
                for pod_json in self._touched():
                    self._attempt(pod_json, snapshot, free, names, stats, futures, time.monotonic(), touched=True)
                time.sleep(0.02)
            for f in futures:
                f.result()
        return stats

    def _touched(self) -> list[dict]:
        """Pending pods whose retry annotation changed since they were last tried."""
        out = []
        for pod_json in self.pending():
            mark = (pod_json["metadata"].get("annotations") or {}).get(names_mod.ANNOTATION_RETRY)
            if mark and mark != self._retried.get(pod_json["metadata"]["uid"]):
                out.append(pod_json)
        return out

    def _attempt(self, pod_json: dict, snapshot, free, names, stats: RoundStats, futures: list, now: float,
                 touched: bool = False) -> None:
        unit = self._unit(pod_json)
        uid = pod_json["metadata"]["uid"]
        self._retried[uid] = (pod_json["metadata"].get("annotations") or {}).get(names_mod.ANNOTATION_RETRY)
        if not touched and self._backoff.get(unit, (0.0, 0.0))[0] > now:
            return
        stats.attempted += 1
        pod = pod_from_json(pod_json)
        vec, unknown = snapshot.request_vector(pod.spec.requests)
        if unknown:
            stats.rejected += 1
            return
        fits = snapshot.eligibility(pod.spec).mask & np.all(free >= vec, axis=1)
        candidates = names[fits].tolist()
        self._last_try[unit] = {"at": now, "pod": pod_json["metadata"]["name"], "candidates": len(candidates)}
        if not candidates:
            stats.rejected += 1
            if self.post_filter and pod_group_name(pod_json):
                self.client.post("preempt", {"Pod": pod_json, "NodeNameToMetaVictims": {}})
            self._back_off(unit, now)
            return
        args = {"Pod": pod_json, "Nodes": None, "NodeNames": candidates}
        started = time.perf_counter()
        result = self.client.post("filter", args)
        self.filter_ms.append((time.perf_counter() - started) * 1000)
        feasible = result.get("NodeNames") or []
        failed = result.get("FailedNodes") or result.get("FailedAndUnresolvableNodes") or {}
        self._last_try[unit].update(passed=len(feasible), reason=next(iter(failed.values()), "")[:300]
                                    or (result.get("Error") or "")[:300])
        if not feasible:
            stats.rejected += 1
            self._back_off(unit, now)
            return
        self._backoff.pop(unit, None)
        node = feasible[0]
        if len(feasible) > 1:
            scores = self.client.post("prioritize", {**args, "NodeNames": feasible})
            order = {name: i for i, name in enumerate(feasible)}
            node = max(scores, key=lambda h: (h["Score"], -order.get(h["Host"], 0)))["Host"]
        i = snapshot.index[node]
        free[i] -= vec  # assume, as kube-scheduler's cache does, until the binding lands
        with self._lock:
            self._inflight.add(uid)
        futures.append(self._binder.submit(self._bind, pod_json, node, stats))

    @staticmethod
    def _unit(pod_json: dict) -> str:
        group = pod_group_name(pod_json)
        return f"{pod_json['metadata'].get('namespace', 'default')}/{group}" if group else pod_json["metadata"]["uid"]

    def backoff_of(self, unit: str) -> float | None:
        """Seconds until ``unit`` (a group's namespace/name, or a pod's uid) is tried again, or
        None when it is not backing off."""
        entry = self._backoff.get(unit)
        return None if entry is None else round(max(0.0, entry[0] - time.monotonic()), 1)

    def last_try(self, unit: str) -> dict | None:
        """What ``unit``'s last try saw (its candidates after the scheduler's own filters) and was
        told (the extender's passed nodes and first reason), with how long ago; None: never tried."""
        entry = self._last_try.get(unit)
        return None if entry is None else {**{k: v for k, v in entry.items() if k != "at"},
                                          "ago_s": round(time.monotonic() - entry["at"], 1)}

    def _back_off(self, unit: str, now: float) -> None:
        if self.backoff:
            delay = min(MAX_BACKOFF, self._backoff.get(unit, (0.0, self.backoff / 2))[1] * 2)
            self._backoff[unit] = (now + delay, delay)

    def run_forever(self, stop: threading.Event, interval: float = 0.25) -> None:
        """kube-scheduler's loop, for the demo: rounds that do not wait for their binds (the
        barrier holds those in their own threads), every ``interval`` seconds until ``stop``."""
        while not stop.is_set():
            try:
                self.run_round(wait=False)
            except Exception:  # noqa: BLE001 - a scheduler keeps scheduling; say what went wrong
                log.exception("simulated scheduling round failed")
            stop.wait(interval)

    def _bind(self, pod_json: dict, node: str, stats: RoundStats) -> None:
        meta = pod_json["metadata"]
        try:
            reply = self.client.post("bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                              "PodUID": meta["uid"], "Node": node})
            if reply.get("Error"):
                stats.bind_errors.append(reply["Error"])
            else:
                stats.bound += 1
        except Exception as err:  # noqa: BLE001 - a failed bind is requeued, as kube-scheduler does
            stats.bind_errors.append(str(err))
        finally:
            with self._lock:
                self._inflight.discard(meta["uid"])

    def run_until_settled(self, max_rounds: int = 50) -> RoundStats:
        """Rounds until a round binds nothing new; totals over all rounds."""
        total = RoundStats()
        for _ in range(max_rounds):
            stats = self.run_round()
            total.attempted += stats.attempted
            total.bound += stats.bound
            total.rejected += stats.rejected
            total.bind_errors += stats.bind_errors
            if stats.bound == 0:
                break
        return total
