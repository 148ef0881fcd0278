"""The running controller: watches feed a work queue of StatefulSet keys; workers reconcile them.

Threads, each simple: one list+watch loop per resource (StatefulSets, Workloads, PodGroups), a
pool of workers, a periodic resync, and the leader elector. Workers only run while this replica
holds the Lease. A key is never processed by two workers at once; a failed key comes back after an
exponential backoff (50 ms doubling to 60 s), so an API server that refuses Workloads is retried
without a hot loop — and, because the pod webhook admits no pod of an opted-in StatefulSet until
its PodGroup exists, no such pod runs outside its group meanwhile.

Every reconcile (watch event, periodic resync, the start-up list) also repairs pods admitted
without their PodGroup while the webhook was unreachable (``Reconciler.repair_unstamped``); a
StatefulSet whose recreated pods keep arriving unstamped (the webhook still down) is repaired again
only after a backoff (5 s doubling to 5 min), never in a hot delete loop.

State is bounded by the live StatefulSets: every per-StatefulSet entry (the last watched UID,
repair backoff, unstamped-bound counts, event de-duplication) goes on its DELETED event, on a
re-list that no longer lists it, and when a reconcile finds it gone. A reconcile reads the
StatefulSet live, never from the watch cache, so a deleted one never gets new objects.
"""

from __future__ import annotations

import datetime as dt
import heapq
import logging
import queue
import threading
import time
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from cluster import apiserver, kinds, names
from cluster.kube import KubeError, api_path
from cluster.sizes import collection_sizes

from . import lws
from .leader import LeaderElector
from .objects import BUILTIN, CRD, Flavor
from .reconciler import CreationFailed, Reconciler, StatefulSetGone

log = logging.getLogger(__name__)

REPAIR_BASE_DELAY = 5.0  # seconds before a StatefulSet's unstamped pods are deleted a second time
REPAIR_MAX_DELAY = 300.0
LWS_RELEASE_DELAY = 0.3  # seconds between creating an LWS's PodGroup and releasing its pods


#: seconds between two reconciles of a StatefulSet for changes of its scheduling annotation
#: (``phalanx controller --scheduling-settle``)
DEFAULT_SCHEDULING_SETTLE = 5.0

def discover_flavor(kube: Any) -> Flavor:
    """The flavor ``phalanx serve`` detects too (one rule, cluster.apiserver.detect_flavor)."""
    return BUILTIN if apiserver.detect_flavor(kube) == apiserver.BUILTIN else CRD


class WorkQueue:
    """Keys to reconcile: deduplicated, delayed adds, one worker per key, per-key backoff."""

    def __init__(self, base_delay: float = 0.05, max_delay: float = 60.0):
        self.base_delay, self.max_delay = base_delay, max_delay
        self._cond = threading.Condition()
        self._heap: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}
        self._active: set[str] = set()
        self._again: set[str] = set()
        self._failures: dict[str, int] = {}
        self._closed = False

    def add(self, key: str, delay: float = 0.0) -> None:
        with self._cond:
            due = time.monotonic() + delay
            if key in self._active:
                self._again.add(key)
            elif key not in self._due or due < self._due[key]:
                self._due[key] = due
                heapq.heappush(self._heap, (due, key))
                self._cond.notify()

    def get(self) -> str | None:
        """The next due key (None once closed); the caller must call ``done`` or ``retry``."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded entry
                if self._heap and self._heap[0][0] <= now:
                    _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._active.add(key)
                    return key
                self._cond.wait(self._heap[0][0] - now if self._heap else None)
            return None

    def done(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)
            self._finish(key, 0.0)

    def retry(self, key: str) -> float:
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
            delay: float = min(self.max_delay, self.base_delay * 2 ** n)
            self._finish(key, delay)
            return delay

    def _finish(self, key: str, delay: float) -> None:
        self._active.discard(key)
        if key in self._again or delay:
            self._again.discard(key)
            self.add(key, delay)  # the condition's lock is re-entrant

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Watcher(threading.Thread):
    """List, then watch, one collection; every object seen goes to ``handle``. Relists on 410 Gone
    and on any error (after a pause)."""

    def __init__(self, kube: Any, path: str, handle: Callable[[str, Mapping[str, Any]], None], halt: threading.Event,
                 on_list: Callable[[list[dict[str, Any]]], None] | None = None):
        super().__init__(name=f"watch {path}", daemon=True)
        self.kube, self.path, self.handle, self.halt = kube, path, handle, halt
        self.on_list = on_list  # told the whole list first: what it lacks is gone (missed DELETEDs)

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                items, rv = self.kube.list_pages(self.path)
                if self.on_list is not None:
                    self._guarded("list", self.on_list, items)
                for obj in items:
                    self._guarded("ADDED", self.handle, "ADDED", obj)
                while not self.halt.is_set():
                    for raw in self.kube.watch(self.path, rv, timeout_seconds=60):
                        if self.halt.is_set():
                            return
                        event = kinds.watch_event(raw)
                        if event.type == "ERROR":
                            raise KubeError("WATCH", self.path, event.error_code, "")
                        rv = event.resource_version or rv
                        if event.type != "BOOKMARK":
                            self._guarded(event.type, self.handle, event.type, event.object)
            except Exception as err:  # noqa: BLE001 — a watch must survive anything; relist
                if not self.halt.is_set():
                    log.info("watch %s: %s; relisting", self.path, err)
                    self.halt.wait(1.0)

    def _guarded(self, what: str, call: Callable[..., None], *args: Any) -> None:
        """``call(*args)``; a malformed object is skipped with a warning (a re-list would stop at it
        again)."""
        try:
            call(*args)
        except kinds.MalformedObject as err:
            log.warning("watch %s: %s skipped: %s", self.path, what, err)


class EventRecorder:
    """Core/v1 Events on the StatefulSet, posted by a background thread (off the reconcile path);
    the same event is not repeated within ``quiet`` seconds. What it remembers for that is bounded:
    entries older than ``quiet`` are swept, and ``forget(uid)`` drops a deleted object's."""

    def __init__(self, kube: Any, instance: str, quiet: float = 300.0):
        self.kube, self.instance, self.quiet = kube, instance, quiet
        self._recent: dict[str, dict[tuple[str, str], float]] = {}  # uid -> (reason, message) -> sent at
        self._swept = time.monotonic()
        self._lock = threading.Lock()
        self._outbox: queue.SimpleQueue[tuple[kinds.Meta, str, dict[str, Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._post_loop, name="events", daemon=True).start()

    def _post_loop(self) -> None:
        while True:
            subject, reason, body = self._outbox.get()
            try:
                self.kube.create(api_path("v1", "events", subject.namespace), body)
            except KubeError as err:
                log.warning("event %s on %s/%s: %s", reason, subject.namespace, subject.name, err)

    def event(self, obj: Any, kind: str, reason: str, message: str) -> None:
        """An Event on ``obj`` (a StatefulSet or LeaderWorkerSet, read or raw)."""
        subject = kinds.workload_owner(obj)
        meta = subject.meta
        uid, key = meta.uid, (reason, message)
        now = time.monotonic()
        with self._lock:
            if now - self._swept >= self.quiet:
                self._sweep(now)
            sent = self._recent.setdefault(uid, {})
            if now - sent.get(key, -self.quiet) < self.quiet:
                return
            sent[key] = now
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = kinds.event_json(meta, subject.api_version, subject.kind, kind, reason, message, stamp, self.instance)
        self._outbox.put((meta, reason, body))

    def _sweep(self, now: float) -> None:
        for uid in list(self._recent):
            sent = self._recent[uid]
            for key in [k for k, at in sent.items() if now - at >= self.quiet]:
                del sent[key]
            if not sent:
                del self._recent[uid]
        self._swept = now

    def forget(self, uid: str | None) -> None:
        with self._lock:
            self._recent.pop(uid or "", None)

    def remembered(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._recent.values())


class Controller:
    """Watches, queue, workers and leader election around one :class:`Reconciler`."""
    # the rule's one home (docs/design.md: KEP-6277/creation-errors-metric)

    def __init__(self, kube: Any, identity: str, lease_namespace: str = "kube-system", workers: int = 16,
                 resync_period: float = 30.0, lease_duration: float = 15.0, renew_deadline: float = 10.0,
                 retry_period: float = 2.0, flavor: Flavor | None = None,
                 registry: CollectorRegistry | None = None, on_lost_leadership: Callable[[], None] | None = None,
                 scheduling_settle: float = DEFAULT_SCHEDULING_SETTLE):
        self.kube = kube
        self.flavor = flavor or discover_flavor(kube)
        self.registry = registry or CollectorRegistry()
        self.creation_errors = Counter(names.METRIC_STS_WORKLOAD_ERRORS.removesuffix("_total"),
                                       "Workload or PodGroup creations for StatefulSets that failed",
                                       registry=self.registry)
        self.unstamped_deleted = Counter(
            names.METRIC_UNSTAMPED_PODS_DELETED.removesuffix("_total"),
            "Unbound pods of StatefulSets admitted without their PodGroup, deleted to be recreated through the webhook",
            registry=self.registry)
        self.unstamped_bound = Gauge(names.METRIC_UNSTAMPED_PODS_BOUND,
                                     "Bound pods of StatefulSets without their PodGroup (reported, never deleted)",
                                     registry=self.registry)
        self.unstamped_bound.set_function(self._unstamped_bound_total)
        self.recorder = EventRecorder(kube, identity)
        self.reconciler = Reconciler(kube, self.flavor, self.recorder, self.creation_errors.inc)
        self.lws = lws.LwsReconciler(kube, self.flavor, self.recorder, self.creation_errors.inc)
        self._known_lws: set[str] = set()  # keys of the LeaderWorkerSets watched (what resync queues)
        self.queue = WorkQueue()
        self.workers, self.resync_period = workers, resync_period
        self._halt = threading.Event()
        self._known: dict[str, str] = {}  # key -> UID of the StatefulSet as last watched (what resync lists)
        self._repairs: dict[str, tuple[int, float]] = {}  # key -> (repairs in a row, next allowed at)
        self._unstamped_bound: dict[str, int] = {}  # key -> bound pods without their PodGroup
        # a StatefulSet flapping its scheduling annotation is reconciled at most once per settle
        # period for it: key -> (the annotation as last seen, when the next change may be reconciled)
        self.scheduling_settle = scheduling_settle
        self._scheduling_seen: dict[str, tuple[str | None, float]] = {}
        self._state_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.elector = LeaderElector(kube, lease_namespace, names.CONTROLLER_LEASE, identity, lease_duration,
                                     renew_deadline, retry_period, on_started=self._start_workers,
                                     on_lost=on_lost_leadership or self.stop)

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> "Controller":
        paths = [(api_path("apps/v1", "statefulsets"), self._on_statefulset, self._on_statefulset_list),
                 (f"/apis/{self.flavor.api_version}/workloads", self._on_scheduling_object,
                  lambda items: self._on_scheduling_list("workloads", items)),
                 (f"/apis/{self.flavor.api_version}/podgroups", self._on_scheduling_object,
                  lambda items: self._on_scheduling_list("podgroups", items))]
        if "leaderworkersets" in (self.kube.served_resources(names.LWS_API_VERSION) or set()):
            paths.append((lws.lws_path(), self._on_leaderworkerset, self._on_leaderworkerset_list))
        for path, handle, on_list in paths:
            self._spawn(Watcher(self.kube, path, handle, self._halt, on_list))
        self._spawn(threading.Thread(target=self._resync_loop, name="resync", daemon=True))
        self.elector.start()
        return self

    def stop(self, release_lease: bool = True) -> None:
        """Stop every thread; ``release_lease=False`` leaves the Lease to expire (like a crash)."""
        self._halt.set()
        self.queue.close()
        if threading.current_thread() is not self.elector:
            self.elector.stop(release=release_lease)

    def _spawn(self, thread: threading.Thread) -> None:
        self._threads.append(thread)
        thread.start()

    def _start_workers(self) -> None:
        for i in range(self.workers):
            self._spawn(threading.Thread(target=self._work, name=f"worker-{i}", daemon=True))

    # -- events in -----------------------------------------------------------------------------
    def _on_leaderworkerset(self, kind: str, obj: Mapping[str, Any]) -> None:
        meta = kinds.meta_of(obj, "LeaderWorkerSet")
        key = lws.lws_key(meta.namespace, meta.name)
        with self._state_lock:
            if kind == "DELETED":
                self._known_lws.discard(key)
                self.recorder.forget(meta.uid)
                return
            self._known_lws.add(key)
        self.queue.add(key)

    def _on_leaderworkerset_list(self, items: list[dict[str, Any]]) -> None:
        with self._state_lock:
            self._known_lws = {lws.lws_key(m.namespace, m.name) for m in _metas(items, "LeaderWorkerSet")}

    def _on_statefulset(self, kind: str, sts: Mapping[str, Any]) -> None:
        meta = kinds.meta_of(sts, "StatefulSet")
        if (owner_key := lws.key_of(meta)) is not None:
            self.queue.add(owner_key)  # an LWS's leader or worker StatefulSet: its pods changed
        key = meta.key
        if kind == "DELETED":
            self._forget(key, meta.uid or None)
            return
        uid = meta.uid
        with self._state_lock:
            old = self._known.get(key)
            self._known[key] = uid
        if old is not None and old != uid:
            self._forget_state(key, old)  # replaced under the same name
        self.queue.add(key, self._settle(key, meta.annotations.get(names.ANNOTATION_SCHEDULING)))

    def _settle(self, key: str, scheduling: str | None) -> float:
        """How long to wait before reconciling StatefulSet ``key`` whose scheduling annotation is now
        ``scheduling``: 0 unless the annotation changed within the settle period of its last change
        (then the reconcile waits for the period's end and reads the last value: a flapping
        annotation costs one reconcile per period, not one per flap)."""
        now = time.monotonic()
        with self._state_lock:
            seen = self._scheduling_seen.get(key)
            if seen is None or seen[0] == scheduling:
                self._scheduling_seen[key] = (scheduling, seen[1] if seen else now)
                return 0.0
            delay = max(0.0, seen[1] - now)
            self._scheduling_seen[key] = (scheduling, now + delay + self.scheduling_settle)
            return delay

    def _on_statefulset_list(self, items: list[dict[str, Any]]) -> None:
        """A (re-)list: StatefulSets it lacks were deleted while the watch was down."""
        listed = {m.key: m.uid or None for m in _metas(items, "StatefulSet")}
        with self._state_lock:
            gone = [(k, uid) for k, uid in self._known.items() if listed.get(k) != uid]
        for key, uid in gone:
            self._forget(key, uid)

    def _forget(self, key: str, uid: str | None) -> None:
        """Drop what is kept for the StatefulSet ``key`` with ``uid`` (a successor's entry stays)."""
        with self._state_lock:
            cached = self._known.get(key)
            if cached is not None and uid is not None and cached != uid:
                stale = True  # a successor took the name: its entries stay
            else:
                stale = False
                self._known.pop(key, None)
        if stale:
            self.recorder.forget(uid)
        else:
            self._forget_state(key, uid)

    def _forget_state(self, key: str, uid: str | None) -> None:
        with self._state_lock:
            self._repairs.pop(key, None)
            self._unstamped_bound.pop(key, None)
            self._scheduling_seen.pop(key, None)
        self.recorder.forget(uid)

    def _on_scheduling_list(self, resource: str, items: list[dict[str, Any]]) -> None:
        self.reconciler.prune_created(resource, {m.uid for m in _metas(items, resource)})

    def _on_scheduling_object(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A Workload or PodGroup event (one handler for both: ``obj``'s kind tells them apart)."""
        meta = kinds.meta_of(obj, "Workload or PodGroup")
        if kind == "ADDED" and self.reconciler.created_here(meta.uid):
            return  # the sync that created it has done its work: no second sync per object
        if kind == "DELETED":
            self.reconciler.forget_created(meta.uid)
        if kinds.kind_of(obj) == "PodGroup" and meta.deleting:
            self.queue.add(f"podgroup:{meta.key}")
        ctrl = meta.controller
        if ctrl and ctrl.kind == "StatefulSet":
            self.queue.add(f"{meta.namespace}/{ctrl.name}")
        elif (owner_key := lws.key_of(meta)) is not None:
            self.queue.add(owner_key)

    def sizes(self) -> dict[str, int]:
        """Entries of every long-lived collection of the controller (``cluster.sizes.collection_sizes``)."""
        return collection_sizes(self, "controller")

    def kick(self, namespace: str, name: str, delay: float = 0.0) -> None:
        self.queue.add(f"{namespace}/{name}", delay)

    def _resync_loop(self) -> None:
        while not self._halt.wait(self.resync_period):
            with self._state_lock:
                keys = list(self._known) + list(self._known_lws)
            for key in keys:
                self.queue.add(key)

    def _unstamped_bound_total(self) -> int:
        with self._state_lock:
            return sum(self._unstamped_bound.values())

    def state_sizes(self) -> dict[str, int]:
        """How much the controller keeps, per structure (bounded by the live StatefulSets)."""
        with self._state_lock:
            sizes = {"known": len(self._known), "repairs": len(self._repairs),
                     "unstamped_bound": len(self._unstamped_bound), "known_lws": len(self._known_lws)}
        with self.queue._cond:
            sizes.update(queue_due=len(self.queue._due), queue_heap=len(self.queue._heap),
                         queue_active=len(self.queue._active), queue_again=len(self.queue._again),
                         queue_failures=len(self.queue._failures))
        sizes.update(created=self.reconciler.created_count(), events=self.recorder.remembered())
        return sizes

    # -- work ----------------------------------------------------------------------------------
    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            if not self.elector.is_leader():
                self.queue.done(key)
                continue
            try:
                self.reconcile(key)
                self.queue.done(key)
            except (CreationFailed, KubeError) as err:
                delay = self.queue.retry(key)
                log.warning("reconcile %s: %s (retry in %.2fs)", key, err, delay)
            except kinds.MalformedObject as err:  # a retry cannot mend it: its next change (or resync) will
                self.queue.done(key)
                log.warning("reconcile %s: %s", key, err)
            except Exception:  # noqa: BLE001 — a bug must not kill the worker
                log.exception("reconcile %s", key)
                self.queue.retry(key)

    def reconcile(self, key: str) -> None:
        if key.startswith("podgroup:"):
            ns, name = key.removeprefix("podgroup:").split("/", 1)
            raw = self.kube.get_or_none(self.flavor.path("podgroups", ns, name))
            if raw is None:
                return
            podgroup = kinds.podgroup(raw)
            if self.reconciler.finish_cascade(podgroup) or (
                    not self.flavor.builtin and not self.reconciler.release_finalizer(podgroup)):
                self.queue.add(key, 0.5)  # look again while the PodGroup still exists
            return
        if key.startswith(lws.KEY_PREFIX):
            ns, name = key.removeprefix(lws.KEY_PREFIX).split("/", 1)
            alive, again = self.lws.reconcile_lws(ns, name)
            if not alive:
                with self._state_lock:
                    self._known_lws.discard(key)
            elif again:
                self.queue.add(key, LWS_RELEASE_DELAY)
            return
        ns, name = key.split("/", 1)
        with self._state_lock:
            cached = self._known.get(key)
        # Live, never the watch cache: a StatefulSet deleted while its key waited in the queue (or
        # one a re-list still showed) must not get its Workload and PodGroup re-created.
        raw = self.kube.get_or_none(api_path("apps/v1", "statefulsets", ns, name))
        if raw is None:
            self._forget(key, cached)
            return
        sts = kinds.statefulset(raw)
        if sts.meta.deleting:
            return
        try:
            found = self.reconciler.sync(sts)
        except StatefulSetGone:
            return  # deleted under the sync; its DELETED event (or the next reconcile) forgets it
        if found.podgroup is not None:
            self.reconciler.release_pods(sts, found.podgroup, found.pods)
        self._repair(key, sts, found)

    def _repair(self, key: str, sts: kinds.StatefulSet, found: Any) -> None:
        """Repair unstamped pods, with a per-StatefulSet backoff between repeated deletions."""
        now = time.monotonic()
        with self._state_lock:
            streak, allowed_at = self._repairs.get(key, (0, 0.0))
        result = self.reconciler.repair_unstamped(sts, found, delete=now >= allowed_at)
        with self._state_lock:
            if result.deleted:
                self._repairs[key] = (streak + 1, now + min(REPAIR_MAX_DELAY, REPAIR_BASE_DELAY * 2 ** streak))
            elif not result.deferred:
                self._repairs.pop(key, None)  # nothing left to repair: the webhook works again
            if result.bound:
                self._unstamped_bound[key] = len(result.bound)
            else:
                self._unstamped_bound.pop(key, None)
        if result.deleted:
            self.unstamped_deleted.inc(len(result.deleted))
            log.info("%s: deleted unbound pods admitted without their PodGroup: %s", key, ", ".join(result.deleted))
        if result.deferred:
            self.queue.add(key, max(0.0, allowed_at - now))


def _metas(items: list[dict[str, Any]], kind: str) -> list[kinds.Meta]:
    return [kinds.meta_of(o, kind) for o in items]
