"""PodGroup writes conditional on the version they were computed from (docs/design.md:
phalanx/fenced-podgroup-writes): another writer's condition is never dropped, a write a frozen
leader had begun does not land over the new leader's, and phalanx's own writes in a row do not
trip over a cache that has not seen them yet."""

from __future__ import annotations

import threading

import pytest

from cluster import names
from cluster.apiserver import guarded_annotations_patch
from cluster.backend import Expected, WriteError
from cluster.cache import ClusterCache
from cluster.sim import SimCluster
from cycle.dispatch import Dispatcher
from cycle.leading import LeaderWriter
from cycle.metrics import CycleMetrics
from cycle.status import StatusWriter

from .k8s_objects import podgroup
from .test_leadership import Switch

KEY = "default/db"


def conditions(sim: SimCluster) -> dict[str, tuple[str, str]]:
    obj = sim.get("PodGroup", KEY)
    return {c["type"]: (c["status"], c["message"]) for c in (obj.get("status") or {}).get("conditions") or []}


def scheduler_condition(message: str) -> dict:
    return {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


@pytest.fixture
def sim() -> SimCluster:
    s = SimCluster()
    s.create(podgroup("db", min_count=2))
    return s


def written(dispatcher: Dispatcher) -> None:
    assert dispatcher.flush(timeout=10.0)


class Crossed:
    """The simulated cluster, where kube-scheduler writes its condition on the PodGroup just
    before phalanx's first status write lands (after phalanx computed it)."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim, self.calls, self.refused = sim, 0, 0

    def __getattr__(self, name):
        return getattr(self.sim, name)

    def patch_podgroup_status(self, namespace, name, status, resource_version=""):
        self.calls += 1
        if self.calls == 1:
            current = (self.sim.get("PodGroup", KEY).get("status") or {}).get("conditions") or []
            self.sim.patch_podgroup_status(namespace, name, {"conditions": current + [scheduler_condition("k-s")]})
        try:
            return self.sim.patch_podgroup_status(namespace, name, status, resource_version)
        except WriteError:
            self.refused += 1
            raise


def test_a_status_write_never_drops_a_condition_another_writer_put_there_meanwhile(sim):
    writer = Crossed(sim)
    dispatcher = Dispatcher(backoff=0.01)
    status = StatusWriter(sim.cache, writer, dispatcher)
    try:
        status.set_status(KEY, False, names.REASON_UNSCHEDULABLE, "no rack has 2 free GPUs")
        written(dispatcher)
    finally:
        dispatcher.close()
    assert writer.refused == 1  # the write computed before kube-scheduler's: refused, then made again
    assert conditions(sim) == {"PodGroupScheduled": ("False", "k-s"),
                               names.CONDITION_INITIALLY_SCHEDULED: ("False", "no rack has 2 free GPUs")}


class Frozen:
    """The simulated cluster behind a serve frozen with its first ``method`` write in flight: the
    write waits (computed, precondition and all) until the test lets it go."""

    def __init__(self, sim: SimCluster, method: str = "patch_podgroup_status") -> None:
        self.sim, self.method = sim, method
        self.in_flight, self.go = threading.Event(), threading.Event()
        self.frozen = True

    def __getattr__(self, name):
        call = getattr(self.sim, name)
        if name != self.method:
            return call

        def held(*args, **kwargs):
            if self.frozen:
                self.frozen = False
                self.in_flight.set()
                assert self.go.wait(10.0)
            return call(*args, **kwargs)
        return held


def test_a_write_a_frozen_leader_had_begun_does_not_land_over_the_new_leader_s(sim):
    old_leading, metrics = Switch(True), CycleMetrics()
    frozen = Frozen(sim)
    old_dispatcher, new_dispatcher = Dispatcher(backoff=0.01), Dispatcher(backoff=0.01)
    old = StatusWriter(sim.cache, LeaderWriter(frozen, old_leading, metrics), old_dispatcher)
    new = StatusWriter(sim.cache, sim, new_dispatcher)
    try:
        old.set_status(KEY, False, names.REASON_UNSCHEDULABLE, "the old leader's word")
        assert frozen.in_flight.wait(10.0)  # computed on the version before; the serve freezes
        old_leading.on = False  # meanwhile its Lease expired and another serve took over
        new.set_status(KEY, False, names.REASON_UNSCHEDULABLE, "the new leader's word")
        written(new_dispatcher)
        frozen.go.set()  # the old serve resumes: its write goes out
        written(old_dispatcher)
    finally:
        frozen.go.set()
        old_dispatcher.close()
        new_dispatcher.close()
    assert conditions(sim) == {names.CONDITION_INITIALLY_SCHEDULED: ("False", "the new leader's word")}
    outcomes = {s.labels["outcome"]: s.value for family in metrics.registry.collect()
                if family.name == names.METRIC_API_WRITES.removesuffix("_total")
                for s in family.samples if s.name.endswith("_total") and s.labels["kind"] == "podgroup_status"}
    assert outcomes == {"failed": 1.0, "standby": 1.0}  # refused by the API server, then not made again


def test_phalanx_s_own_writes_in_a_row_do_not_conflict_with_a_cache_that_lags(sim):
    """The cache saw the PodGroup once and nothing since: each write is conditional on the
    version the one before made."""
    lagging = ClusterCache()
    lagging.apply("PodGroup", "ADDED", sim.get("PodGroup", KEY))
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name):
            return getattr(sim, name)

        def patch_podgroup_status(self, namespace, name, status, resource_version=""):
            calls.append(resource_version)
            return sim.patch_podgroup_status(namespace, name, status, resource_version)

    dispatcher = Dispatcher(backoff=0.01)
    status = StatusWriter(lagging, Counting(), dispatcher)
    try:
        status.set_status(KEY, False, names.REASON_UNSCHEDULABLE, "first")
        written(dispatcher)
        status.set_status(KEY, True, names.REASON_SCHEDULED, "second")
        written(dispatcher)
    finally:
        dispatcher.close()
    first = lagging.podgroups[KEY].resource_version
    assert len(calls) == 2 and calls[0] == first and calls[1] != first  # no refusal, no retry
    assert conditions(sim) == {names.CONDITION_INITIALLY_SCHEDULED: ("True", "second")}


def test_the_record_write_waits_for_the_cache_to_see_the_newer_version_then_lands(sim):
    """The synchronous placement record: refused because kube-scheduler wrote the group a moment
    before, it is made again once the cache has that version — the plan does not fail."""
    writer = Crossed(sim)
    dispatcher = Dispatcher(backoff=0.01)
    status = StatusWriter(sim.cache, writer, dispatcher)
    try:
        status.write_record(KEY, "n-0-0:db-0 n-0-1:db-1", "2 pods going to binding in r0", flush_seconds=5.0)
    finally:
        dispatcher.close()
    assert writer.refused == 1
    got = conditions(sim)
    assert got["PodGroupScheduled"] == ("False", "k-s")
    assert got[names.CONDITION_PLACEMENT] == ("True", "n-0-0:db-0 n-0-1:db-1")
    assert got[names.CONDITION_INITIALLY_SCHEDULED][0] == "True"


class CrossedAnnotation:
    """The simulated cluster, where kube-scheduler's pod-group cycle writes the group's condition
    just before phalanx's placement annotation lands (plugin mode: the record's write)."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim, self.refused, self.calls = sim, 0, 0

    def __getattr__(self, name):
        return getattr(self.sim, name)

    def annotate_podgroup(self, namespace, name, annotations, resource_version="", expect=None):
        self.calls += 1
        if self.calls == 1:
            self.sim.patch_podgroup_status(namespace, name, {"conditions": [scheduler_condition("k-s")]})
        try:
            return self.sim.annotate_podgroup(namespace, name, annotations, resource_version, expect)
        except WriteError:
            self.refused += 1
            raise


def test_the_record_annotation_lands_at_once_beside_kube_scheduler_s_condition(sim):
    """The record on the annotation (kube-scheduler writes the condition) is guarded on the
    annotation, not the group's version: kube-scheduler's status write a moment before does not
    refuse it (conditional on the version, about every other gang paid a refused write and a wait)."""
    writer = CrossedAnnotation(sim)
    dispatcher = Dispatcher(backoff=0.01)
    status = StatusWriter(sim.cache, writer, dispatcher)
    try:
        status.write_record(KEY, "n-0-0:db-0 n-0-1:db-1", None, flush_seconds=5.0)
    finally:
        dispatcher.close()
    assert (writer.calls, writer.refused) == (1, 0)
    obj = sim.get("PodGroup", KEY)
    assert obj["metadata"]["annotations"][names.ANNOTATION_PLACEMENT] == "n-0-0:db-0 n-0-1:db-1"
    assert conditions(sim)["PodGroupScheduled"] == ("False", "k-s")


def test_a_record_annotation_a_frozen_leader_had_begun_does_not_land_over_the_new_leader_s(sim):
    old_leading, metrics = Switch(True), CycleMetrics()
    frozen = Frozen(sim, "annotate_podgroup")
    dispatcher = Dispatcher(backoff=0.01)
    old = StatusWriter(sim.cache, LeaderWriter(frozen, old_leading, metrics), dispatcher)
    new = StatusWriter(sim.cache, sim, dispatcher)
    outcome: list[BaseException] = []

    def old_writes() -> None:
        try:
            old.write_record(KEY, "n-0-0:db-0 n-0-1:db-1", None, flush_seconds=0.5)
        except BaseException as err:  # noqa: BLE001 - what the old leader's plan sees
            outcome.append(err)

    thread = threading.Thread(target=old_writes)
    try:
        thread.start()
        assert frozen.in_flight.wait(10.0)
        old_leading.on = False  # its Lease expired; the new leader records the gang elsewhere
        new.write_record(KEY, "n-1-0:db-0 n-1-1:db-1", None, flush_seconds=5.0)
        frozen.go.set()
        thread.join(10.0)
    finally:
        frozen.go.set()
        dispatcher.close()
    assert sim.get("PodGroup", KEY)["metadata"]["annotations"][names.ANNOTATION_PLACEMENT] == "n-1-0:db-0 n-1-1:db-1"
    assert outcome and isinstance(outcome[0], WriteError)  # the old leader's plan fails, nothing bound


def test_the_record_annotation_written_then_removed_over_a_cache_that_lags(sim):
    """phalanx's own record, then its removal, while the cache still shows the group without it:
    the removal expects what the write left, and lands."""
    lagging = ClusterCache()
    lagging.apply("PodGroup", "ADDED", sim.get("PodGroup", KEY))
    dispatcher = Dispatcher(backoff=0.01)
    status = StatusWriter(lagging, sim, dispatcher)
    try:
        status.write_record(KEY, "n-0-0:db-0 n-0-1:db-1", None, flush_seconds=0.0)
        lagging.apply("PodGroup", "MODIFIED", sim.get("PodGroup", KEY))
        status.remove_record(KEY, "no longer fits")
        written(dispatcher)
    finally:
        dispatcher.close()
    assert names.ANNOTATION_PLACEMENT not in (sim.get("PodGroup", KEY)["metadata"].get("annotations") or {})


def test_the_guarded_annotation_patch_tests_what_it_expects_and_nothing_else():
    key = names.ANNOTATION_PLACEMENT
    path = "/metadata/annotations/" + key.replace("/", "~1")
    assert guarded_annotations_patch({key: "a"}, Expected(False, {key: None})) == [
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {"op": "add", "path": "/metadata/annotations", "value": {key: "a"}}]
    assert guarded_annotations_patch({key: "b"}, Expected(True, {key: None})) == [
        {"op": "test", "path": path, "value": None}, {"op": "add", "path": path, "value": "b"}]
    assert guarded_annotations_patch({key: "c"}, Expected(True, {key: "b"})) == [
        {"op": "test", "path": path, "value": "b"}, {"op": "add", "path": path, "value": "c"}]
    assert guarded_annotations_patch({key: None}, Expected(True, {key: "c"})) == [
        {"op": "test", "path": path, "value": "c"}, {"op": "remove", "path": path}]
