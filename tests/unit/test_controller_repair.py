"""Repair after a pod-webhook outage, and state bounded by the live StatefulSets.

With ``failurePolicy: Ignore`` a StatefulSet's pods are admitted without their PodGroup reference
while the webhook is unreachable. The controller deletes the unbound ones (they come back through
the webhook, stamped) and reports the bound ones, never deleting them. A deleted StatefulSet never
gets new objects, and everything the controller keeps per StatefulSet goes when it goes.
"""

import time

import pytest

from cluster import names
from cluster.kube import KubeError
from controller import BUILTIN, CRD, PodMutator
from controller.objects import has_sync_gate, pod_patch
from controller.reconciler import Resolution
from controller.runtime import REPAIR_BASE_DELAY, Controller
from tests.unit.controller_fakes import FakeKube, apply_json_patch, statefulset, sts_pod

GANG = {"schedulingPolicy": {"gang": {}}}
STS = "/apis/apps/v1/namespaces/ns/statefulsets"
PODS = "/api/v1/namespaces/ns/pods"


class Recorder:
    """The controller's event recorder, kept (de-duplication and all), with what it was asked."""

    def __init__(self, real):
        self.real, self.seen = real, []

    def event(self, obj, kind, reason, message):
        self.seen.append((kind, reason, message))
        self.real.event(obj, kind, reason, message)

    def __getattr__(self, attr):
        return getattr(self.real, attr)


def make_controller(kube, flavor=BUILTIN):
    controller = Controller(kube, "me", flavor=flavor)
    controller.recorder = controller.reconciler.recorder = Recorder(controller.recorder)
    return controller


def reasons(controller):
    return [r for _, r, _ in controller.recorder.seen]


def pods(kube):
    return {p["metadata"]["name"]: p for p in kube.list_pages(PODS)[0]}


def admit(kube, controller, pod, flavor=BUILTIN):
    """The StatefulSet controller creating ``pod`` with the webhook up: stamped, gated."""
    found = controller.reconciler.sync(kube.get_or_none(f"{STS}/db"), write=False)
    assert found.podgroup is not None
    return kube.add(PODS, apply_json_patch(pod, pod_patch(pod, found.podgroup, flavor)))


def metric(controller, name):
    return controller.registry.get_sample_value(name)


def deleted_total(controller):
    return metric(controller, names.METRIC_UNSTAMPED_PODS_DELETED)


def bound_gauge(controller):
    return metric(controller, names.METRIC_UNSTAMPED_PODS_BOUND)


def podgroup(kube, flavor=BUILTIN):
    (group,) = kube.objects("podgroups", flavor.group)
    return group


@pytest.fixture
def kube():
    return FakeKube()


# -- repair ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flavor", [BUILTIN, CRD], ids=["builtin", "crd"])
def test_unbound_unstamped_pods_are_deleted_with_preconditions_and_counted(kube, flavor):
    controller = make_controller(kube, flavor)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    controller.reconcile("ns/db")  # Workload and PodGroup
    admit(kube, controller, sts_pod(sts, 0), flavor)
    admit(kube, controller, sts_pod(sts, 1), flavor)
    loose = kube.add(PODS, sts_pod(sts, 2))  # admitted while the webhook was down
    bodies = []
    real_delete = kube.delete
    kube.delete = lambda path, body=None: (bodies.append((path, body)), real_delete(path, body))[1]
    controller.reconcile("ns/db")
    assert sorted(pods(kube)) == ["db-0", "db-1"]
    assert bodies == [(f"{PODS}/db-2", {"preconditions": {"uid": loose["metadata"]["uid"],
                                                          "resourceVersion": loose["metadata"]["resourceVersion"]}})]
    assert deleted_total(controller) == 1 and bound_gauge(controller) == 0
    assert names.EVENT_UNSTAMPED_PODS_RECREATED in reasons(controller)
    assert all(not has_sync_gate(p) for p in pods(kube).values())  # the stamped ones are released
    # Recreated through the webhook: stamped, gated, then released; nothing more to repair.
    admit(kube, controller, sts_pod(sts, 2), flavor)
    controller.reconcile("ns/db")
    assert sorted(pods(kube)) == ["db-0", "db-1", "db-2"] and deleted_total(controller) == 1
    assert all(flavor.pod_group_of(p) == podgroup(kube, flavor)["metadata"]["name"] and not has_sync_gate(p)
               for p in pods(kube).values())
    assert controller._repairs == {}


def test_outage_before_the_objects_existed_creates_them_and_replaces_every_pod(kube):
    """Controller and webhook both down when the StatefulSet was created: its pods exist, unstamped
    and Pending. They do not count as "pods exist": the objects are created and the pods replaced."""
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    for i in range(3):
        kube.add(PODS, sts_pod(sts, i))
    controller.reconcile("ns/db")
    assert len(kube.objects("workloads")) == 1 and len(kube.objects("podgroups")) == 1
    assert pods(kube) == {} and deleted_total(controller) == 3
    assert reasons(controller)[:3] == [names.EVENT_WORKLOAD_CREATED, names.EVENT_PODGROUP_CREATED,
                                       names.EVENT_UNSTAMPED_PODS_RECREATED]
    for i in range(3):  # the StatefulSet controller recreates them; the webhook (up again) stamps them
        answer = PodMutator(kube, controller.reconciler, BUILTIN, wait=0.1).review(
            {"request": {"uid": "u", "operation": "CREATE", "namespace": "ns", "object": sts_pod(sts, i)}})
        assert answer["response"]["allowed"] and answer["response"].get("patch")
        admit(kube, controller, sts_pod(sts, i))
    controller.reconcile("ns/db")
    group = podgroup(kube)
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3
    assert all(p["spec"]["schedulingGroup"]["podGroupName"] == group["metadata"]["name"]
               and not has_sync_gate(p) for p in pods(kube).values())
    assert deleted_total(controller) == 3


def test_bound_unstamped_pods_are_reported_never_deleted_and_the_report_clears(kube):
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    controller.reconcile("ns/db")
    admit(kube, controller, sts_pod(sts, 0))
    kube.add(PODS, sts_pod(sts, 1, nodeName="n1"))
    kube.add(PODS, sts_pod(sts, 2, nodeName="n2"))
    kube.calls.clear()
    controller.reconcile("ns/db")
    assert not [c for c in kube.calls if c[0] == "DELETE"]
    (warning,) = [(k, m) for k, r, m in controller.recorder.seen if r == names.EVENT_UNSTAMPED_PODS_BOUND]
    assert warning[0] == "Warning"
    assert "db-1, db-2" in warning[1] and "kubectl delete pod -n ns db-1 db-2" in warning[1]
    assert f"PodGroup {podgroup(kube)['metadata']['name']} waits for them" in warning[1]
    assert podgroup(kube)["metadata"]["annotations"][names.ANNOTATION_UNSTAMPED_BOUND] == "db-1, db-2"
    assert bound_gauge(controller) == 2 and deleted_total(controller) == 0
    controller.reconcile("ns/db")  # resync: the same warning is not repeated, nothing patched again
    assert reasons(controller).count(names.EVENT_UNSTAMPED_PODS_BOUND) == 2
    assert controller.recorder.real.remembered() >= 1
    # The user deletes them when convenient; they come back stamped: the report goes.
    for name in ("db-1", "db-2"):
        kube.delete(f"{PODS}/{name}")
    admit(kube, controller, sts_pod(sts, 1))
    admit(kube, controller, sts_pod(sts, 2))
    controller.reconcile("ns/db")
    assert names.ANNOTATION_UNSTAMPED_BOUND not in podgroup(kube)["metadata"]["annotations"]
    assert bound_gauge(controller) == 0 and controller._unstamped_bound == {}


def test_bound_unstamped_pods_without_objects_create_nothing_and_delete_nothing(kube):
    """A pod runs outside any group: KEP-6277 creates no Workload once pods exist, and deleting the
    unbound siblings would only bring them back unstamped: nothing changes, a Warning says why."""
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    kube.add(PODS, sts_pod(sts, 0, nodeName="n1"))
    kube.add(PODS, sts_pod(sts, 1))
    controller.reconcile("ns/db")
    assert kube.objects("workloads") == [] and sorted(pods(kube)) == ["db-0", "db-1"]
    (message,) = [m for _, r, m in controller.recorder.seen if r == names.EVENT_UNSTAMPED_PODS_BOUND]
    assert "pods db-0 were admitted without a PodGroup" in message
    assert "phalanx creates no Workload or PodGroup" in message
    assert "kubectl scale statefulset -n ns db --replicas=0, then --replicas=3" in message
    assert bound_gauge(controller) == 1


def test_a_pod_bound_after_the_list_is_not_deleted(kube):
    """The resourceVersion precondition: the scheduler bound the pod between list and delete."""
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    group = controller.reconciler.sync(sts).podgroup
    listed = kube.add(PODS, sts_pod(sts, 0))
    kube.patch(f"{PODS}/db-0", [{"op": "add", "path": "/spec/nodeName", "value": "n1"}])
    result = controller.reconciler.repair_unstamped(sts, Resolution(group, pods=[listed]))
    assert result.deleted == [] and pods(kube)["db-0"]["spec"]["nodeName"] == "n1"


def test_terminal_terminating_and_foreign_group_pods_are_not_repaired(kube):
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    controller.reconcile("ns/db")
    done = sts_pod(sts, 0, nodeName="n1")
    done["status"] = {"phase": "Succeeded"}
    kube.add(PODS, done)
    going = sts_pod(sts, 1)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.add(PODS, going)
    kube.add(PODS, sts_pod(sts, 2, schedulingGroup={"podGroupName": "users-choice"}))
    kube.calls.clear()
    controller.reconcile("ns/db")
    assert not [c for c in kube.calls if c[0] == "DELETE"] and len(pods(kube)) == 3
    assert names.EVENT_UNSTAMPED_PODS_BOUND not in reasons(controller)


def test_a_podgroup_phalanx_did_not_create_is_never_annotated(kube):
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    controller.reconcile("ns/db")
    store = kube.store["apis/scheduling.k8s.io/v1beta1/podgroups"]
    (key,) = store
    store[key]["metadata"]["annotations"] = {}  # looks user-made now
    kube.add(PODS, sts_pod(sts, 0, nodeName="n1"))
    controller.reconcile("ns/db")
    assert podgroup(kube)["metadata"]["annotations"] == {}
    assert names.EVENT_UNSTAMPED_PODS_BOUND in reasons(controller)


def test_pods_that_keep_arriving_unstamped_are_deleted_again_only_after_a_backoff(kube, monkeypatch):
    """The webhook is still unreachable: each recreated pod is unstamped again. No hot delete loop:
    the second deletion waits REPAIR_BASE_DELAY, the third twice that."""
    now = [1000.0]
    monkeypatch.setattr("controller.runtime.time.monotonic", lambda: now[0])
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    controller.reconcile("ns/db")
    kube.add(PODS, sts_pod(sts, 0))
    controller.reconcile("ns/db")
    assert deleted_total(controller) == 1
    kube.add(PODS, sts_pod(sts, 0))  # back, unstamped again
    controller.reconcile("ns/db")
    assert deleted_total(controller) == 1 and "db-0" in pods(kube)
    assert controller.queue._due["ns/db"] == pytest.approx(time.monotonic() + REPAIR_BASE_DELAY, abs=1.0)
    now[0] += REPAIR_BASE_DELAY
    controller.reconcile("ns/db")
    assert deleted_total(controller) == 2
    kube.add(PODS, sts_pod(sts, 0))
    now[0] += REPAIR_BASE_DELAY  # not yet: the delay doubled
    controller.reconcile("ns/db")
    assert deleted_total(controller) == 2
    now[0] += REPAIR_BASE_DELAY
    controller.reconcile("ns/db")
    assert deleted_total(controller) == 3
    admit(kube, controller, sts_pod(sts, 0))  # the webhook is back
    controller.reconcile("ns/db")
    assert controller._repairs == {}


# -- deleted StatefulSets ---------------------------------------------------------------------------

def gc(kube, uid):
    """The garbage collector: dependents of the deleted owner ``uid`` go."""
    for resource, coll in list(kube.store.items()):
        if not resource.endswith(("/workloads", "/podgroups", "/pods")):
            continue
        for key in [k for k, o in list(coll.items())
                    if any(r.get("uid") == uid for r in o.get("metadata", {}).get("ownerReferences") or [])]:
            del coll[key]


def delete_sts(kube, name="db"):
    sts = kube.store["apis/apps/v1/statefulsets"].pop(("ns", name))
    gc(kube, sts["metadata"]["uid"])
    return sts


def test_a_statefulset_deleted_while_its_key_is_queued_gets_nothing(kube):
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    controller._on_statefulset("ADDED", sts)  # queued, and cached as watched
    delete_sts(kube)  # gone before a worker takes the key; its DELETED event not seen yet
    kube.calls.clear()
    controller.reconcile("ns/db")
    assert [c for c in kube.calls if c[0] == "POST"] == [] and kube.objects("workloads") == []
    assert controller._known == {}  # pruned without the DELETED event


def test_a_statefulset_deleted_during_the_sync_gets_no_objects(kube):
    controller = make_controller(kube)
    kube.add(STS, statefulset(scheduling=GANG))
    real_list = kube.list_pages

    def list_then_delete(path, **params):
        items = real_list(path, **params)
        if path.endswith("/workloads") and ("ns", "db") in kube.store["apis/apps/v1/statefulsets"]:
            delete_sts(kube)
        return items
    kube.list_pages = list_then_delete
    controller.reconcile("ns/db")  # no error: nothing to retry
    assert kube.objects("workloads") == [] and kube.objects("podgroups") == []


def test_a_terminating_statefulset_gets_no_objects(kube):
    controller = make_controller(kube)
    body = statefulset(scheduling=GANG)
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    controller._on_statefulset("ADDED", kube.add(STS, body))
    controller.reconcile("ns/db")
    assert kube.objects("workloads") == [] and kube.calls == []


def test_a_relist_forgets_statefulsets_deleted_while_the_watch_was_down(kube):
    controller = make_controller(kube)
    a = kube.add(STS, statefulset(name="a", scheduling=GANG))
    b = kube.add(STS, statefulset(name="b", scheduling=GANG))
    for sts in (a, b):
        controller._on_statefulset("ADDED", sts)
    replaced = dict(b, metadata=dict(b["metadata"], uid="uid-b-2"))
    controller._on_statefulset_list([replaced])  # a is gone; b was deleted and created again
    assert controller._known == {}  # b's successor is known once its ADDED event comes
    controller._on_statefulset("ADDED", replaced)
    assert controller._known == {"ns/b": "uid-b-2"}


def drain(controller):
    while controller.queue._due:
        key = controller.queue.get()
        controller.reconcile(key)
        controller.queue.done(key)


def test_ten_thousand_statefulsets_created_and_deleted_leave_every_structure_at_its_baseline(kube):
    """Through the fakes, as the watches would deliver them: ADDED, the sync, the ADDED events of
    the created objects, some repairs and reports; then deletion with its DELETED events, or with
    them missed (deleted while queued, or while the watch was down and a re-list followed)."""
    controller = make_controller(kube)
    controller.recorder = controller.reconciler.recorder = controller.recorder.real  # keep nothing in the test
    baseline = controller.state_sizes()
    assert set(baseline) >= {"known", "repairs", "unstamped_bound", "queue_due", "created", "events"}
    batch = 10  # alive at once, all in one namespace (the fake lists a namespace whole)
    for start in range(0, 10_000, batch):
        names_ = [f"s{i}" for i in range(start, start + batch)]
        for name in names_:
            controller._on_statefulset("ADDED", kube.add(STS, statefulset(name=name, scheduling=GANG)))
        drain(controller)
        for resource in ("workloads", "podgroups"):
            for obj in kube.objects(resource):
                controller._on_scheduling_object("ADDED", obj)
        for i, name in enumerate(names_):  # outage pods: some unbound (repaired), some bound (reported)
            sts = kube.get_or_none(f"{STS}/{name}")
            kube.add(PODS, sts_pod(sts, 0, **({"nodeName": "n1"} if i % 4 == 0 else {})))
            controller.queue.add(f"ns/{name}")
        drain(controller)
        bound = len(range(0, batch, 4))
        assert controller.state_sizes()["repairs"] == batch - bound
        assert controller.state_sizes()["unstamped_bound"] == bound
        for i, name in enumerate(names_):
            sts = delete_sts(kube, name)
            if i % 3 == 0:
                controller._on_statefulset("DELETED", sts)
            elif i % 3 == 1:
                controller.queue.add(f"ns/{name}")  # deleted while queued, DELETED event not seen
        for resource in ("workloads", "podgroups"):  # nothing re-created for any of them
            assert kube.objects(resource) == []
        controller._on_statefulset_list(kube.list_pages("/apis/apps/v1/statefulsets")[0])  # re-list
        drain(controller)
        kube.calls.clear(), kube.lists.clear()
    assert controller.state_sizes() == baseline
    assert kube.store.get("api/v1/pods", {}) == {}


def test_the_event_recorder_forgets_old_entries(kube, monkeypatch):
    now = [0.0]
    monkeypatch.setattr("controller.runtime.time.monotonic", lambda: now[0])
    controller = make_controller(kube)
    recorder = controller.recorder.real
    for i in range(50):
        recorder.event({"metadata": {"name": f"s{i}", "namespace": "ns", "uid": f"u{i}"}}, "Normal", "R", "m")
    assert recorder.remembered() == 50
    now[0] += recorder.quiet + 1
    recorder.event({"metadata": {"name": "x", "namespace": "ns", "uid": "ux"}}, "Normal", "R", "m")
    assert recorder.remembered() == 1
    recorder.forget("ux")
    assert recorder.remembered() == 0


def test_watch_deleted_event_of_a_created_object_forgets_it(kube):
    controller = make_controller(kube)
    controller.reconciler.sync(kube.add(STS, statefulset(scheduling=GANG)))
    assert controller.reconciler.created_count() == 2
    (workload,) = kube.objects("workloads")
    controller._on_scheduling_object("DELETED", workload)  # its ADDED was missed
    controller._on_scheduling_list("podgroups", [])  # a re-list without the PodGroup
    assert controller.reconciler.created_count() == 0


def test_kube_errors_of_a_repair_other_than_gone_or_changed_are_raised(kube):
    controller = make_controller(kube)
    sts = kube.add(STS, statefulset(scheduling=GANG))
    group = controller.reconciler.sync(sts).podgroup
    pod = kube.add(PODS, sts_pod(sts, 0))

    def refuse(path, body=None):
        raise KubeError("DELETE", path, 403, "{}")
    kube.delete = refuse
    with pytest.raises(KubeError):
        controller.reconciler.repair_unstamped(sts, Resolution(group, pods=[pod]))
