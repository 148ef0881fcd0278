"""cluster.kinds: the controller's typed view of API objects — a wrong field is a clear error naming it."""

import re
import threading

import pytest

from cluster import kinds, names
from controller import BUILTIN, Reconciler, validate_statefulset
from controller.runtime import Watcher
from tests.unit.controller_fakes import Events, FakeKube, statefulset, sts_pod

STS = "/apis/apps/v1/namespaces/ns/statefulsets"


def test_a_statefulset_is_read_once_into_a_record():
    sts = statefulset(replicas=4, partition=2, owner={"apiVersion": "apps/v1", "kind": "Parent", "name": "p",
                                                      "uid": "p-uid", "controller": True})
    sts["spec"]["template"]["spec"]["priorityClassName"] = "high"
    record = kinds.statefulset(sts)
    assert (record.meta.key, record.meta.uid, record.replicas, record.partition) == ("ns/db", "uid-db", 4, 2)
    assert record.pod_management_policy == "Parallel" and record.template.priority_class == "high"
    assert record.meta.controller == kinds.OwnerRef("apps/v1", "Parent", "p", "p-uid", True)
    assert record.meta.controller_uid == "p-uid" and record.meta.controller.group == "apps"
    assert kinds.statefulset(record) is record  # a record passes through: read once


def test_absent_fields_read_as_their_defaults_not_a_key_error():
    record = kinds.statefulset({})
    assert record.meta == kinds.Meta() and record.replicas is None and record.pod_management_policy == "OrderedReady"
    pod = kinds.pod({"metadata": {"name": "p"}})
    assert (pod.group, pod.gates, pod.node_name, pod.phase, pod.claims) == ("", (), "", "", ())


@pytest.mark.parametrize("read,obj,field", [
    (kinds.statefulset, {"metadata": {"name": "db", "namespace": "ns"}, "spec": {"replicas": "3"}},
     "StatefulSet ns/db: spec.replicas must be an integer"),
    (kinds.statefulset, {"metadata": []}, "StatefulSet: metadata must be an object"),
    (kinds.statefulset, {"metadata": {"name": "db", "labels": {"app": 1}}}, "metadata.labels must map strings"),
    (kinds.pod, {"metadata": {"name": "p", "ownerReferences": {}}}, "pod p: metadata.ownerReferences must be a list"),
    (kinds.pod, {"metadata": {"name": "p"}, "spec": {"schedulingGates": ["x"]}},
     "pod p: spec.schedulingGates[0] must be an object"),
    (kinds.workload, {"metadata": {"name": "w", "namespace": "ns"}, "spec": {"podGroupTemplates": [
        {"name": "t", "schedulingPolicy": {"gang": {"minCount": "2"}}}]}},
     "Workload ns/w: spec.podGroupTemplates[0].schedulingPolicy.gang.minCount must be an integer"),
    (kinds.podgroup, {"metadata": {"name": "g"}, "spec": {"workloadRef": "w"}}, "PodGroup g: spec.workloadRef"),
    (kinds.leaderworkerset, {"metadata": {"name": "l"}, "spec": {"leaderWorkerTemplate": {"size": "4"}}},
     "LeaderWorkerSet l: spec.leaderWorkerTemplate.size must be an integer"),
])
def test_a_malformed_field_is_a_value_error_naming_it(read, obj, field):
    with pytest.raises(kinds.MalformedObject, match=re.escape(field)) as caught:
        read(obj)
    assert isinstance(caught.value, ValueError)


def test_the_reconciler_reports_a_malformed_statefulset_clearly():
    kube = FakeKube()
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    sts["spec"]["replicas"] = "three"
    with pytest.raises(kinds.MalformedObject, match="spec.replicas"):
        Reconciler(kube, BUILTIN, Events()).sync(sts)
    with pytest.raises(kinds.MalformedObject, match="spec.replicas"):
        validate_statefulset(sts)


def test_writers_build_the_api_json():
    owner = kinds.meta_of(statefulset(), "StatefulSet")
    assert kinds.owner_ref_json(owner, "apps/v1", "StatefulSet", controller=False) == {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "uid-db", "blockOwnerDeletion": True}
    assert kinds.json_pointer("metadata", "labels", names.LABEL_POD_GROUP) == \
        "/metadata/labels/scheduling.phalanx.dev~1pod-group"
    assert kinds.group_fields_json(None) == {"schedulingPolicy": {"basic": {}}}
    fields = kinds.group_fields({"name": "t", "schedulingPolicy": {"gang": {"minCount": 2}}}, "template")
    spec = kinds.podgroup_spec_json(fields, "w", "t", min_count=5, priority_class="high")
    assert spec == {"schedulingPolicy": {"gang": {"minCount": 5}}, "priorityClassName": "high",
                    "workloadRef": {"workloadName": "w", "templateName": "t"}}
    assert fields.raw["schedulingPolicy"]["gang"]["minCount"] == 2  # a copy: the template is untouched


class _OneList:
    """A kube whose list holds a malformed StatefulSet before a good one, and whose watch ends it."""

    def __init__(self, halt):
        self.halt = halt

    def list_pages(self, path):
        bad = statefulset(name="bad")
        bad["metadata"]["labels"] = {"app": 7}
        return [bad, statefulset(name="good")], "1"

    def watch(self, path, rv, timeout_seconds):
        self.halt.set()
        return iter([])


def test_a_watch_skips_a_malformed_object_and_goes_on():
    halt, seen = threading.Event(), []
    watcher = Watcher(_OneList(halt), STS, lambda kind, obj: seen.append(kinds.meta_of(obj, "StatefulSet").name),
                      halt, on_list=lambda items: [kinds.meta_of(o, "StatefulSet") for o in items])
    watcher.run()
    assert seen == ["good"]


def test_pod_claims_and_gates_are_typed():
    pod = sts_pod(statefulset(), 0, schedulingGates=[{"name": names.GATE_PODGROUP_SYNC}],
                  resourceClaims=[{"name": "accel", "resourceClaimTemplateName": "gpu"}])
    record = kinds.pod(pod)
    assert record.gate_names == (names.GATE_PODGROUP_SYNC,)
    assert record.claims == (kinds.ClaimEntry("accel", "", "gpu"),)
