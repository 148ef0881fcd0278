"""The cache and the API-server backend under bad input and faults: malformed objects are skipped
and counted, 410 Gone forces a re-list, errors back off, staleness turns readiness false, and a
re-list brings everything back. The API server here is a scripted fake; tests/e2e/test_faults.py
does the same against the real one."""

from __future__ import annotations

import threading
import time

from cluster.apiserver import ApiServerBackend
from cluster.cache import ClusterCache
from cluster.kube import KubeError

from .k8s_objects import node, pod


def test_malformed_objects_are_skipped_counted_and_lose_nothing():
    cache = ClusterCache()
    assert cache.apply("Node", "ADDED", node("good"))
    bad_quantity = node("good")
    bad_quantity["status"]["allocatable"]["cpu"] = "many"
    assert not cache.apply("Node", "MODIFIED", bad_quantity)
    assert cache.nodes["good"].allocatable["cpu"] == 64000  # the previous record is kept
    assert not cache.apply("Pod", "ADDED", {"metadata": {"name": "no-uid"}})
    assert not cache.apply("Node", "ADDED", {"metadata": {}})
    assert not cache.apply("PodGroup", "ADDED", {"metadata": {"name": "pg"},
                                                 "spec": {"schedulingPolicy": {"gang": {"minCount": "x"}}}})
    assert not cache.apply("Gadget", "ADDED", {"metadata": {"name": "g"}})
    assert not cache.apply("Pod", "ADDED", "not an object")
    assert cache.skipped == 6 and list(cache.nodes) == ["good"]


class FakeKube:
    """Scripted list/watch: ``lists`` and ``watches`` are consumed per call; an exception in the
    script is raised, a list of events is streamed."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lists: dict[str, list] = {}
        self.watches: dict[str, list] = {}
        self.list_calls: dict[str, int] = {}

    def served_resources(self, group_version):
        return {"podgroups", "workloads"}

    def list_pages(self, path):
        with self.lock:
            self.list_calls[path] = self.list_calls.get(path, 0) + 1
            script = self.lists.get(path) or [([], "1")]
            step = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(step, Exception):
            raise step
        return step

    def watch(self, path, resource_version, timeout_seconds=240):
        with self.lock:
            script = self.watches.get(path) or []
            step = script.pop(0) if script else None
        if step is None:
            time.sleep(0.05)
            return
        if isinstance(step, Exception):
            raise step
        yield from step


def wait(probe, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not probe():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_410_gone_relists_and_errors_back_off_then_recover():
    kube = FakeKube()
    pods = "/api/v1/pods"
    first, second = pod("a"), pod("b")
    first["metadata"]["uid"], second["metadata"]["uid"] = "uid-a", "uid-b"
    kube.lists[pods] = [([first], "5"), ([second], "9")]
    kube.watches[pods] = [
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}],
        KubeError("WATCH", pods, 500, "boom"),
    ]
    cache = ClusterCache()
    backend = ApiServerBackend(kube, cache, stale_after=60)
    backend.start()
    try:
        wait(lambda: kube.list_calls.get(pods, 0) >= 2)  # the 410 forced a re-list
        wait(lambda: set(r.pod.name for r in cache.pods.values()) == {"b"})  # re-list replaced the records
        assert backend.relists >= 7  # 6 kinds once, pods twice
    finally:
        backend.stop()


class RecordedWaits(threading.Event):
    """The backend's stop event, noting the waits of one watch's thread (and not waiting)."""

    def __init__(self, thread_name="watch-Pod"):
        super().__init__()
        self.thread_name = thread_name
        self.waits: list[float] = []

    def wait(self, timeout=None):
        if threading.current_thread().name == self.thread_name:
            self.waits.append(timeout)
            return self.is_set()
        return super().wait(timeout)


def test_a_watch_that_had_delivered_retries_after_the_first_wait_not_the_built_up_one():
    """Failures in a row double the wait (0.2, 0.4, 0.8 s); a stream that delivered events and then
    broke starts over from the first wait (a past outage's 10 s kept phalanx's view that far behind
    once the link healed)."""
    kube = FakeKube()
    pods = "/api/v1/pods"
    event = pod("a")
    event["metadata"].update(uid="uid-a", resourceVersion="7")

    def delivers_then_breaks():
        yield {"type": "ADDED", "object": event}
        raise ConnectionError("Response ended prematurely")

    kube.watches[pods] = [KubeError("WATCH", pods, 0, "refused")] * 3 + [delivers_then_breaks(),
                                                                         KubeError("WATCH", pods, 0, "refused")]
    cache = ClusterCache()
    backend = ApiServerBackend(kube, cache, stale_after=60)
    backend._stop = waits = RecordedWaits()
    backend.start()
    try:
        wait(lambda: len(waits.waits) >= 5)
    finally:
        backend.stop()
    assert waits.waits[:5] == [0.2, 0.4, 0.8, 0.2, 0.4]
    assert "uid-a" in cache.pods


def test_readiness_turns_false_when_watches_go_stale_and_true_again():
    kube = FakeKube()
    cache = ClusterCache()
    backend = ApiServerBackend(kube, cache, stale_after=0.3)
    backend.start()
    try:
        assert backend.wait_synced(5)
        for kind in backend.fresh_at:
            backend.fresh_at[kind] = time.monotonic()
        assert backend.ready()[0]
        for kind in backend.fresh_at:
            backend.fresh_at[kind] -= 10
        ok, why = backend.ready()
        assert not ok and "stale" in why
        for kind in backend.fresh_at:
            backend.fresh_at[kind] = time.monotonic()
        assert backend.ready()[0]
    finally:
        backend.stop()


def test_cache_keeps_serving_while_the_api_server_is_down():
    kube = FakeKube()
    pods = "/api/v1/pods"
    down = KubeError("LIST", pods, 0, "transport error: connection refused")
    kube.lists["/api/v1/nodes"] = [([node("n1")], "3")]
    kube.watches["/api/v1/nodes"] = [down] * 50
    cache = ClusterCache()
    backend = ApiServerBackend(kube, cache, stale_after=0.2)
    backend.start()
    try:
        wait(lambda: "n1" in cache.nodes)
        time.sleep(0.4)
        assert "n1" in cache.nodes  # still served from the cache
        assert not backend.ready()[0]
    finally:
        backend.stop()


def test_an_optional_kind_not_served_is_said_once_not_warned_at_every_retry(caplog):
    """ProvisioningRequest's CRD is usually not installed: phalanx notes it once (INFO) and keeps
    looking quietly, instead of a warning every 10 s for the life of the process."""
    from cluster import names
    from cluster.kube import api_path
    kube = FakeKube()
    path = api_path(names.PROVISIONING_API_VERSION, "provisioningrequests")
    kube.lists[path] = [KubeError("LIST", path, 404, "404 page not found")]
    backend = ApiServerBackend(kube, ClusterCache(), stale_after=60)
    backend._stop = waits = RecordedWaits("watch-ProvisioningRequest")
    with caplog.at_level("DEBUG", logger="phalanx.apiserver"):
        backend.start()
        try:
            wait(lambda: len(waits.waits) >= 5)
        finally:
            backend.stop()
    mine = [r for r in caplog.records if "ProvisioningRequest" in r.getMessage()]
    assert [r.levelname for r in mine if r.levelname != "DEBUG"] == ["INFO"], [r.getMessage() for r in mine]
    assert len(mine) >= 5 and backend.synced["ProvisioningRequest"]
