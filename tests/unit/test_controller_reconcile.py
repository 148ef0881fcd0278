"""The reconciler's workflow against an in-memory API: discovery, creation, minCount sync,
ambiguity, foreign objects, composition, gates and finalizers; the work queue; leader election."""

import pytest

from cluster import names
from controller import BUILTIN, CRD, Reconciler, compile_workload, resolve
from controller.leader import LeaderElector
from controller.objects import has_sync_gate, pod_patch
from controller.reconciler import CreationFailed
from controller.runtime import WorkQueue
from tests.unit.controller_fakes import Events, FakeKube, apply_json_patch, statefulset, sts_pod

GANG = {"schedulingPolicy": {"gang": {}}}
STS = "/apis/apps/v1/namespaces/ns/statefulsets"
PODS = "/api/v1/namespaces/ns/pods"
WORKLOADS = "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/workloads"
PODGROUPS = "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups"


@pytest.fixture
def kube():
    return FakeKube()


@pytest.fixture
def events():
    return Events()


@pytest.fixture
def reconciler(kube, events):
    return Reconciler(kube, BUILTIN, events)


def add_sts(kube, **kwargs):
    kwargs.setdefault("scheduling", GANG)
    return kube.add(STS, statefulset(**kwargs))


def min_counts(kube):
    (workload,) = kube.objects("workloads")
    (podgroup,) = kube.objects("podgroups")
    return (workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"],
            podgroup["spec"]["schedulingPolicy"]["gang"]["minCount"])


def test_creates_workload_then_podgroup_with_events(kube, events, reconciler):
    sts = add_sts(kube)
    found = reconciler.sync(sts)
    assert [c for c in kube.calls if c[0] == "POST"] == [("POST", WORKLOADS), ("POST", PODGROUPS)]
    assert events.reasons() == [names.EVENT_WORKLOAD_CREATED, names.EVENT_PODGROUP_CREATED]
    (workload,) = kube.objects("workloads")
    assert found.podgroup["metadata"]["ownerReferences"][1]["uid"] == workload["metadata"]["uid"]
    assert found.podgroup["spec"]["workloadRef"]["workloadName"] == workload["metadata"]["name"]


def test_nothing_without_scheduling(kube, events, reconciler):
    sts = add_sts(kube, scheduling=None)
    assert reconciler.sync(sts).podgroup is None
    assert kube.calls == [] and events.seen == []


def test_second_sync_creates_nothing_and_patches_nothing(kube, reconciler):
    sts = add_sts(kube)
    first = reconciler.sync(sts).podgroup
    kube.calls.clear()
    assert reconciler.sync(sts).podgroup["metadata"]["uid"] == first["metadata"]["uid"]
    assert kube.calls == []


def test_read_only_sync_never_writes(kube, events, reconciler):
    sts = add_sts(kube)
    found = reconciler.sync(sts, write=False)
    assert found.podgroup is None and found.pending
    assert kube.calls == [] and events.seen == []


def test_discovery_is_by_reference_not_by_name(kube, reconciler):
    sts = add_sts(kube)
    reconciler.sync(sts)
    # Rename-proof: objects named anything are found through controllerRef / workloadRef.
    workload = compile_workload(sts, resolve(GANG), BUILTIN)
    other = FakeKube()
    workload["metadata"]["name"] = "whatever"
    w = other.add(WORKLOADS, workload)
    template = w["spec"]["podGroupTemplates"][0]
    other.add(PODGROUPS, {"metadata": {"name": "any-name"}, "spec": {
        "workloadRef": {"workloadName": "whatever", "templateName": template["name"]}, **{
            k: v for k, v in template.items() if k != "name"}}})
    found = Reconciler(other, BUILTIN, Events()).sync(sts)
    assert found.podgroup["metadata"]["name"] == "any-name"
    assert len(other.objects("workloads")) == 1


def test_crash_between_workload_and_podgroup_creates_only_the_podgroup(kube, reconciler):
    sts = add_sts(kube)
    kube.fail_create = {"podgroups"}
    with pytest.raises(CreationFailed):
        reconciler.sync(sts)
    kube.fail_create = set()
    reconciler.sync(sts)
    assert len(kube.objects("workloads")) == 1 and len(kube.objects("podgroups")) == 1


def test_creation_failure_counts_and_emits_an_event(kube, events):
    errors = []
    reconciler = Reconciler(kube, BUILTIN, events, on_creation_error=lambda: errors.append(1))
    kube.fail_create = {"workloads"}
    with pytest.raises(CreationFailed):
        reconciler.sync(add_sts(kube))
    assert errors == [1] and events.reasons() == [names.EVENT_WORKLOAD_CREATION_FAILED]
    assert kube.objects("podgroups") == []


def test_no_creation_once_the_statefulset_has_pods(kube, reconciler):
    sts = add_sts(kube)
    kube.add(PODS, sts_pod(sts, 0, nodeName="n1"))
    found = reconciler.sync(sts)
    assert found.podgroup is None and found.has_pods and not found.pending
    assert kube.objects("workloads") == []


def test_existing_objects_are_used_once_pods_exist(kube, reconciler):
    sts = add_sts(kube)
    first = reconciler.sync(sts).podgroup
    kube.add(PODS, sts_pod(sts, 0))
    assert reconciler.sync(sts).podgroup["metadata"]["uid"] == first["metadata"]["uid"]


@pytest.mark.parametrize("steps", [[5], [1], [0], [0, 3], [5, 2, 0, 4]])
def test_scaling_syncs_workload_then_podgroup_min_count_clamped(kube, reconciler, steps):
    sts = add_sts(kube, replicas=3)
    reconciler.sync(sts)
    uid = kube.objects("podgroups")[0]["metadata"]["uid"]
    for replicas in steps:
        kube.calls.clear()
        sts["spec"]["replicas"] = replicas
        reconciler.sync(sts)
        assert min_counts(kube) == (max(1, replicas), max(1, replicas))
        patched = [p for m, p in kube.calls if m == "PATCH"]
        assert patched == [] or patched[0].startswith(WORKLOADS)  # template first
    assert kube.objects("podgroups")[0]["metadata"]["uid"] == uid  # never recreated
    assert "minCount" not in sts["metadata"]["annotations"][names.ANNOTATION_SCHEDULING]


def test_interrupted_scale_converges_on_retry(kube, reconciler):
    sts = add_sts(kube, replicas=3)
    reconciler.sync(sts)
    sts["spec"]["replicas"] = 6
    real_patch = kube.patch

    def fail_podgroups(path, body, content_type=""):
        if "/podgroups/" in path:
            raise __import__("cluster.kube", fromlist=["KubeError"]).KubeError("PATCH", path, 500, "{}")
        return real_patch(path, body, content_type)
    kube.patch = fail_podgroups
    with pytest.raises(CreationFailed):
        reconciler.sync(sts)
    assert min_counts(kube) == (6, 3)
    kube.patch = real_patch
    reconciler.sync(sts)
    assert min_counts(kube) == (6, 6)


def test_two_matching_workloads_are_ambiguous(kube, events, reconciler):
    sts = add_sts(kube, replicas=4)
    for name in ("a", "b"):
        w = compile_workload(sts, resolve(GANG), BUILTIN)
        w["metadata"]["name"] = name
        kube.add(WORKLOADS, w)
    kube.calls.clear()
    assert reconciler.sync(sts).podgroup is None
    assert kube.calls == [] and events.reasons() == [names.EVENT_WORKLOAD_AMBIGUOUS]


def test_two_matching_podgroups_are_ambiguous(kube, events, reconciler):
    sts = add_sts(kube)
    group = reconciler.sync(sts).podgroup
    copy_ = {"metadata": {"name": "second"}, "spec": dict(group["spec"])}
    kube.add(PODGROUPS, copy_)
    assert reconciler.sync(sts).podgroup is None
    assert events.reasons()[-1] == names.EVENT_WORKLOAD_AMBIGUOUS


def test_workload_with_two_templates_is_ignored(kube, events, reconciler):
    sts = add_sts(kube)
    w = compile_workload(sts, resolve(GANG), BUILTIN)
    w["spec"]["podGroupTemplates"].append({"name": "extra", "schedulingPolicy": {"basic": {}}})
    kube.add(WORKLOADS, w)
    assert reconciler.sync(sts).podgroup is None
    assert events.reasons() == [names.EVENT_WORKLOAD_IGNORED] and kube.objects("podgroups") == []


def test_user_workload_is_used_as_is_and_only_our_podgroup_is_synced(kube, reconciler):
    sts = add_sts(kube, replicas=3)
    user = {"metadata": {"name": "mine"}, "spec": {
        "controllerRef": {"apiGroup": "apps", "kind": "StatefulSet", "name": "db"},
        "podGroupTemplates": [{"name": "t", "schedulingPolicy": {"gang": {"minCount": 2}}}]}}
    kube.add(WORKLOADS, user)
    group = reconciler.sync(sts).podgroup
    assert [r["kind"] for r in group["metadata"]["ownerReferences"]] == ["StatefulSet"]
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    sts["spec"]["replicas"] = 9
    kube.calls.clear()
    reconciler.sync(sts)
    assert not any("/workloads/" in p for _, p in kube.calls)  # never mutated
    assert min_counts(kube) == (2, 2)
    (stored,) = kube.objects("workloads")
    assert "ownerReferences" not in stored["metadata"]


def test_user_podgroup_is_never_mutated(kube, reconciler):
    sts = add_sts(kube, replicas=3)
    reconciler.sync(sts)
    (group,) = kube.objects("podgroups")
    group["metadata"]["annotations"] = {}  # now it looks user-made
    sts["spec"]["replicas"] = 5
    reconciler.sync(sts)
    assert min_counts(kube) == (5, 3)


def test_stale_objects_of_a_predecessor_are_not_adopted(kube, reconciler):
    old = add_sts(kube)
    reconciler.sync(old)
    successor = statefulset(scheduling=GANG)
    successor["metadata"]["uid"] = "uid-new"
    kube.store["apis/apps/v1/statefulsets"][("ns", "db")] = successor  # deleted and created again
    found = reconciler.sync(successor)
    assert found.podgroup["metadata"]["ownerReferences"][0]["uid"] == "uid-new"
    assert len(kube.objects("workloads")) == 2


def test_invalid_configuration_admitted_while_the_webhook_was_down_gets_an_event(kube, events, reconciler):
    sts = add_sts(kube, policy="OrderedReady")
    assert reconciler.sync(sts).podgroup is None
    assert events.reasons() == [names.EVENT_WORKLOAD_CREATION_FAILED] and kube.objects("workloads") == []


# -- composition ---------------------------------------------------------------------------------------

PARENT = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "lws", "uid": "lws-uid",
          "controller": True}


def parent_workload(kube, templates=("workers",)):
    return kube.add(WORKLOADS, {"metadata": {"name": "lws-w"}, "spec": {
        "controllerRef": {"apiGroup": "leaderworkerset.x-k8s.io", "kind": "LeaderWorkerSet", "name": "lws"},
        "podGroupTemplates": [{"name": t, "schedulingPolicy": {"gang": {"minCount": 4}}} for t in templates]}})


def test_delegation_creates_only_a_podgroup_from_the_parent_template(kube, reconciler):
    parent_workload(kube, ("leader", "workers"))
    sts = add_sts(kube, owner=PARENT, annotations={names.ANNOTATION_GROUP_TEMPLATE_NAME: "workers",
                                                   names.ANNOTATION_PARENT_COMPOSITE_ALT: "lws-0"})
    group = reconciler.sync(sts).podgroup
    assert len(kube.objects("workloads")) == 1
    assert group["spec"]["workloadRef"] == {"workloadName": "lws-w", "templateName": "workers"}
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert group["spec"]["parentCompositePodGroupName"] == "lws-0"
    assert [r["kind"] for r in group["metadata"]["ownerReferences"]] == ["StatefulSet"]


def test_delegation_reads_the_upstream_composite_spelling_first(kube, reconciler):
    parent_workload(kube)
    sts = add_sts(kube, owner=PARENT, annotations={names.ANNOTATION_GROUP_TEMPLATE_NAME: "workers",
                                                   names.ANNOTATION_PARENT_COMPOSITE: "first",
                                                   names.ANNOTATION_PARENT_COMPOSITE_ALT: "second"})
    assert reconciler.sync(sts).podgroup["spec"]["parentCompositePodGroupName"] == "first"


def test_sibling_statefulsets_of_one_parent_template_get_their_own_podgroups(kube, reconciler):
    parent_workload(kube)
    ann = {names.ANNOTATION_GROUP_TEMPLATE_NAME: "workers"}
    a = reconciler.sync(add_sts(kube, name="a", owner=PARENT, annotations=ann)).podgroup
    b = reconciler.sync(add_sts(kube, name="b", owner=PARENT, annotations=ann)).podgroup
    assert a["metadata"]["uid"] != b["metadata"]["uid"] and len(kube.objects("podgroups")) == 2


def test_parent_owner_without_the_annotation_manages_its_own_objects(kube, events, reconciler):
    parent_workload(kube)
    reconciler.sync(add_sts(kube, owner=PARENT))
    assert len(kube.objects("workloads")) == 2 and events.reasons()[0] == names.EVENT_WORKLOAD_CREATED


def test_annotation_without_a_parent_controller_is_not_delegation(kube, events, reconciler):
    sts = add_sts(kube, annotations={names.ANNOTATION_GROUP_TEMPLATE_NAME: "workers"})
    assert reconciler.sync(sts).podgroup is not None
    assert events.reasons()[0] == names.EVENT_DELEGATION_IGNORED
    assert names.EVENT_WORKLOAD_CREATED in events.reasons()


@pytest.mark.parametrize("templates", [(), ("leader",)])
def test_unresolved_parent_template_falls_back_with_an_event(kube, events, reconciler, templates):
    if templates:
        parent_workload(kube, templates)
    sts = add_sts(kube, owner=PARENT, annotations={names.ANNOTATION_GROUP_TEMPLATE_NAME: "workers"})
    assert reconciler.sync(sts).podgroup is None
    assert events.reasons() == [names.EVENT_WORKLOAD_IGNORED] and kube.objects("podgroups") == []


# -- pods: gate and finalizer ----------------------------------------------------------------------------

def stamped_pod(kube, sts, group, ordinal, flavor=BUILTIN):
    pod = apply_json_patch(sts_pod(sts, ordinal), pod_patch(sts_pod(sts, ordinal), group, flavor))
    return kube.add(PODS, pod)


def test_release_lifts_only_the_sync_gate_of_this_group(kube, reconciler):
    sts = add_sts(kube)
    group = reconciler.sync(sts).podgroup
    pod = sts_pod(sts, 0, schedulingGates=[{"name": "keep-me"}])
    kube.add(PODS, apply_json_patch(pod, pod_patch(pod, group, BUILTIN)))
    stamped_pod(kube, sts, group, 1)
    assert reconciler.release_pods(sts, group) == 2
    gates = {p["metadata"]["name"]: p["spec"]["schedulingGates"] for p in kube.list_pages(PODS)[0]}
    assert gates == {"db-0": [{"name": "keep-me"}], "db-1": []}
    assert reconciler.release_pods(sts, group) == 0


def test_crd_finalizer_is_removed_only_when_no_live_pod_references_the_group(kube):
    reconciler = Reconciler(kube, CRD, Events())
    sts = add_sts(kube)
    group = reconciler.sync(sts).podgroup
    assert group["metadata"]["finalizers"] == [names.FINALIZER_PODGROUP_PROTECTION]
    pod = stamped_pod(kube, sts, group, 0, CRD)
    assert not has_sync_gate({"spec": {}}) and has_sync_gate(pod)
    assert not reconciler.release_finalizer(group)  # not being deleted
    group["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not reconciler.release_finalizer(group)  # a running pod still references it
    kube.store["api/v1/pods"][("ns", "db-0")]["status"] = {"phase": "Succeeded"}
    assert reconciler.release_finalizer(group)
    (stored,) = kube.objects("podgroups", names.CRD_GROUP)
    assert stored["metadata"]["finalizers"] == []


def test_deleted_podgroup_of_a_deleted_statefulset_takes_its_pods_along(kube, reconciler):
    sts = add_sts(kube)
    group = reconciler.sync(sts).podgroup
    stamped_pod(kube, sts, group, 0)
    other = kube.add(STS, statefulset(name="other", scheduling=GANG))
    kube.add(PODS, sts_pod(other, 0))  # not a member: untouched
    group["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert reconciler.finish_cascade(group) == 0  # the StatefulSet still exists: its pods stay
    del kube.store["apis/apps/v1/statefulsets"][("ns", "db")]
    assert reconciler.finish_cascade(group) == 1
    assert [p["metadata"]["name"] for p in kube.list_pages(PODS)[0]] == ["other-0"]


def test_finish_cascade_leaves_podgroups_phalanx_did_not_create(kube, reconciler):
    sts = add_sts(kube)
    group = reconciler.sync(sts).podgroup
    stamped_pod(kube, sts, group, 0)
    del kube.store["apis/apps/v1/statefulsets"][("ns", "db")]
    group["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", annotations={})
    assert reconciler.finish_cascade(group) == 0


# -- the work queue ----------------------------------------------------------------------------------

def test_queue_deduplicates_and_serialises_a_key():
    q = WorkQueue()
    q.add("a"), q.add("a"), q.add("b")
    first = q.get()
    q.add(first)  # arrives while in progress: comes back after done
    second = q.get()
    assert {first, second} == {"a", "b"}
    q.done(second)
    q.done(first)
    assert q.get() == first
    q.close()
    assert q.get() is None


def test_queue_backoff_doubles_and_resets():
    q = WorkQueue(base_delay=0.001, max_delay=0.004)
    q.add("k")
    delays = []
    for _ in range(4):
        assert q.get() == "k"
        delays.append(q.retry("k"))
    assert delays == [0.001, 0.002, 0.004, 0.004]
    assert q.get() == "k"
    q.done("k")
    q.add("k")
    assert q.get() == "k" and q.retry("k") == 0.001


# -- leader election -----------------------------------------------------------------------------------

def test_only_one_of_two_replicas_leads_and_the_other_takes_over_after_release(kube):
    a = LeaderElector(kube, "kube-system", "lease", "a", lease_duration=60)
    b = LeaderElector(kube, "kube-system", "lease", "b", lease_duration=60)
    assert a._try_acquire_or_renew() is True
    assert b._try_acquire_or_renew() is False
    assert a._try_acquire_or_renew() is True  # renew
    a._leading.set()
    a._release()
    assert b._try_acquire_or_renew() is True
    (lease,) = kube.store["apis/coordination.k8s.io/v1/leases"].values()
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1


def test_an_expired_lease_is_taken_over(kube, monkeypatch):
    a = LeaderElector(kube, "kube-system", "lease", "a", lease_duration=1)
    b = LeaderElector(kube, "kube-system", "lease", "b", lease_duration=1)
    assert a._try_acquire_or_renew()
    assert not b._try_acquire_or_renew()
    now = __import__("time").monotonic()
    monkeypatch.setattr("controller.leader.time.monotonic", lambda: now + 5)
    assert b._try_acquire_or_renew()


def test_concurrent_writers_conflict_on_resource_version(kube):
    a = LeaderElector(kube, "kube-system", "lease", "a", lease_duration=1)
    assert a._try_acquire_or_renew()
    stale = kube.get_or_none("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/lease")
    assert a._try_acquire_or_renew()  # bumps resourceVersion
    with pytest.raises(Exception, match="409"):
        kube.request("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/lease", stale)
