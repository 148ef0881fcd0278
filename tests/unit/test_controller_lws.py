"""LeaderWorkerSet support in phalanx's controller: the guide's admission rules, the objects per
level, and the pod stamping and gate lifting, on the in-memory API (controller_fakes)."""

from __future__ import annotations

import base64
import json

import pytest

from cluster import names
from controller import lws, lws_config
from controller.lws_admission import LwsMutator, review_leaderworkerset
from controller.objects import BUILTIN, CRD
from tests.unit.controller_fakes import Events, FakeKube, apply_json_patch

NS = "ns"
PODS = f"/api/v1/namespaces/{NS}/pods"


def make_lws(name="llm", size=3, replicas=2, scheduling=None, annotations=None, **spec):
    ann = dict(annotations or {})
    if scheduling is not None:
        ann[names.ANNOTATION_SCHEDULING] = json.dumps(scheduling)
    worker = {"spec": {"containers": [{"name": "c", "image": "pause"}]}}
    body = {"apiVersion": names.LWS_API_VERSION, "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "annotations": ann},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size, "workerTemplate": worker}, **spec}}
    return body


# -- admission rules --------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "level", "templates"), [
    ({}, "replica", ["replica"]),
    ({"replica": {}}, "replica", ["replica"]),
    ({"replica": {"schedulingConstraints": {"topology": [{"key": names.LABEL_RACK}]}}}, "replica", ["replica"]),
    ({"schedulingPolicy": {"gang": {}}}, "whole", ["leaderworkerset"]),
    ({"disruptionMode": {"all": {}}}, "whole", ["leaderworkerset"]),
    ({"replica": {"leader": {}, "worker": {}}}, "role", ["leader", "worker"]),
    ({"replica": {"worker": {"schedulingPolicy": {"gang": {}}}}}, "role", ["leader", "worker"]),
])
def test_the_guides_shapes_select_one_level_each_defaulting_to_gang(raw, level, templates):
    assert lws_config.validate_lws(make_lws(scheduling=raw)) == []
    sched = lws_config.resolve_lws(raw)
    assert sched.level == level and [t for t, _ in sched.units] == templates
    assert all(c.gang for _, c in sched.units)


def test_role_level_keeps_a_basic_leader():
    sched = lws_config.resolve_lws({"replica": {"leader": {"schedulingPolicy": {"basic": {}}}, "worker": {}}})
    assert not sched.unit("leader").gang and sched.unit("worker").gang


@pytest.mark.parametrize(("lws_kwargs", "message"), [
    ({"scheduling": {"replica": {}, "schedulingPolicy": {"gang": {}}}}, lws_config.MSG_LEVELS),
    ({"scheduling": {"replica": {"leader": {}, "schedulingPolicy": {"gang": {}}}}}, lws_config.MSG_ROLE_MIXED),
    ({"scheduling": {"resourceClaims": []}}, lws_config.MSG_CLAIMS_LEVEL),
    ({"scheduling": {"replica": {"schedulingPolicy": {"gang": {"minCount": 2}}}}},
     lws_config.MSG_LWS_MIN_COUNT.format(path="spec.scheduling.replica")),
    ({"scheduling": {}, "startupPolicy": "LeaderReady"}, lws_config.MSG_LEADER_READY),
    ({"scheduling": {}, "annotations": {names.ANNOTATION_LWS_EXCLUSIVE_TOPOLOGY: names.LABEL_RACK}},
     lws_config.MSG_EXCLUSIVE),
    ({"scheduling": {"bogus": 1}}, "unknown field(s) bogus"),
    ({"scheduling": {"replica": {"disruptionMode": {"all": {}}, "schedulingPolicy": {"basic": {}}}}},
     "spec.scheduling.replica.disruptionMode.all: Forbidden"),
])
def test_invalid_configurations_are_rejected_with_the_field_at_fault(lws_kwargs, message):
    errors = lws_config.validate_lws(make_lws(**lws_kwargs))
    assert any(message in e for e in errors), errors


def test_leader_ready_is_allowed_when_nothing_is_a_gang():
    obj = make_lws(scheduling={"replica": {"schedulingPolicy": {"basic": {}}}}, startupPolicy="LeaderReady")
    assert lws_config.validate_lws(obj) == []


def test_templates_priority_classes_and_scheduling_group():
    obj = make_lws(scheduling={})
    lwt = obj["spec"]["leaderWorkerTemplate"]
    lwt["leaderTemplate"] = {"spec": {"containers": [], "priorityClassName": "high"}}
    assert any("must use the same priorityClassName" in e for e in lws_config.validate_lws(obj))
    lwt["workerTemplate"]["spec"]["priorityClassName"] = "high"
    assert lws_config.validate_lws(obj) == []
    old = make_lws(scheduling={})
    assert any("cannot change after creation" in e for e in lws_config.validate_lws(obj, old))
    lwt["workerTemplate"]["spec"]["schedulingGroup"] = {"podGroupName": "mine"}
    assert any("workerTemplate.spec.schedulingGroup: Forbidden" in e for e in lws_config.validate_lws(obj))


def test_scheduling_cannot_be_added_removed_or_changed():
    plain, replica, whole = make_lws(), make_lws(scheduling={}), make_lws(scheduling={"schedulingPolicy": {"gang": {}}})
    assert lws_config.validate_lws(replica, plain) == [lws_config.MSG_ADDED]
    assert lws_config.validate_lws(plain, replica) == [lws_config.MSG_ADDED]
    assert "field is immutable" in lws_config.validate_lws(whole, replica)[0]
    scaled = make_lws(scheduling={}, replicas=5, size=4)
    assert lws_config.validate_lws(scaled, replica) == []  # replicas and size stay free


def test_the_validating_webhook_answers_with_the_messages():
    request = {"uid": "u1", "operation": "CREATE", "object": make_lws(scheduling={}, startupPolicy="LeaderReady")}
    answer = review_leaderworkerset({"request": request})["response"]
    assert answer["allowed"] is False and lws_config.MSG_LEADER_READY in answer["status"]["message"]
    request["object"] = make_lws(scheduling={})
    assert review_leaderworkerset({"request": request})["response"]["allowed"] is True


# -- names ------------------------------------------------------------------------------------------

def test_podgroup_names_are_label_values_with_incarnation_index_role_and_revision():
    obj = make_lws(name="x" * 80)
    name = lws.replica_podgroup_name(obj, "bcdfg", "12", "6687b786bc", "worker")
    assert len(name) <= 63 and name.endswith(".bcdfg-12-worker-6687b786bc") and name[0] == "x"
    short = lws.replica_podgroup_name(make_lws(), "bcdfg", "0", "rev1")
    assert short.startswith("llm-") and short.endswith(".bcdfg-0-rev1")
    assert lws.whole_podgroup_name(make_lws()) == lws.workload_name(make_lws())
    assert lws.replica_podgroup_name(make_lws(), "bcdfg", "0", "r") != lws.replica_podgroup_name(make_lws(), "cdfgh", "0", "r")


# -- the flow on the in-memory API ---------------------------------------------------------------------

class Cluster:
    """The fake API with one LWS, phalanx's reconciler and pod webhook, and a stand-in for what the
    LWS controller and its webhook do (leader pods, then worker pods, labelled as LWS labels them)."""

    def __init__(self, obj, flavor=BUILTIN):
        self.kube, self.events, self.flavor = FakeKube(), Events(), flavor
        self.lws = self.kube.add(lws.lws_path(NS), obj)
        self.reconciler = lws.LwsReconciler(self.kube, flavor, self.events)
        self.kicks: list[tuple[str, str]] = []
        self.mutator = LwsMutator(self.kube, flavor, kick=lambda ns, name, delay: self.kicks.append((ns, name)),
                                  wait=0.2, poll=0.01)

    def sync(self):
        """One reconcile, and the follow-up the controller queues after creating PodGroups."""
        _, again = self.reconciler.reconcile_lws(NS, self.lws["metadata"]["name"])
        if again:
            self.reconciler.reconcile_lws(NS, self.lws["metadata"]["name"])

    def admit(self, pod):
        answer = self.mutator.review({"uid": "u", "namespace": NS, "operation": "CREATE", "object": pod}, pod)
        response = answer["response"]
        if not response["allowed"]:
            return None, response["status"]["message"]
        if "patch" in response:
            pod = apply_json_patch(pod, json.loads(base64.b64decode(response["patch"])))
        return self.kube.add(PODS, pod), ""

    def pod(self, group, worker=0, revision="rev1", group_size=None):
        name = self.lws["metadata"]["name"]
        pod_name = f"{name}-{group}" + (f"-{worker}" if worker else "")
        labels = {names.LABEL_LWS_NAME: name, names.LABEL_LWS_GROUP_INDEX: str(group),
                  names.LABEL_LWS_WORKER_INDEX: str(worker), names.LABEL_LWS_REVISION: revision,
                  names.LABEL_STATEFULSET_POD_NAME: pod_name}
        annotations = {names.ANNOTATION_LWS_SIZE: str(group_size or lws.size(self.lws))}
        if worker:
            annotations[names.ANNOTATION_LWS_LEADER_NAME] = f"{name}-{group}"
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": NS, "labels": labels, "annotations": annotations},
                "spec": {"containers": [{"name": "c", "image": "pause"}]}}

    def replica(self, group, **kw):
        leader, _ = self.admit(self.pod(group, **kw))
        workers = [self.admit(self.pod(group, w, **kw))[0] for w in range(1, lws.size(self.lws))]
        return [leader, *workers]

    def podgroups(self):
        return {g["metadata"]["name"]: g for g in self.kube.objects("podgroups", self.flavor.group)}

    def live(self, name):
        return self.kube.get_or_none(f"{PODS}/{name}")


def gated(pod):
    return any(g["name"] == names.GATE_PODGROUP_SYNC for g in pod["spec"].get("schedulingGates") or [])


def test_replica_level_one_podgroup_per_replica_created_after_its_gated_leader():
    c = Cluster(make_lws(scheduling={}, size=3, replicas=2))
    c.sync()
    [workload] = c.kube.objects("workloads")
    assert workload["spec"]["controllerRef"] == {"apiGroup": names.LWS_API_GROUP, "kind": "LeaderWorkerSet",
                                                 "name": "llm"}
    assert workload["spec"]["podGroupTemplates"] == [{"name": "replica", "schedulingPolicy": {"gang": {"minCount": 3}}}]
    assert c.podgroups() == {}  # nothing before a leader exists
    pods = c.replica(0) + c.replica(1)
    assert all(gated(p) for p in pods) and len({p["metadata"]["labels"][names.LABEL_LWS_INCARNATION] for p in pods}) == 2
    assert ("lws:ns", "llm") in c.kicks
    c.sync()
    groups = c.podgroups()
    assert len(groups) == 2
    for p in pods:
        group = groups[p["spec"]["schedulingGroup"]["podGroupName"]]
        assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
        assert group["spec"]["workloadRef"] == {"workloadName": workload["metadata"]["name"], "templateName": "replica"}
        assert [o["kind"] for o in group["metadata"]["ownerReferences"]] == ["LeaderWorkerSet", "Workload"]
        assert group["metadata"]["annotations"][names.ANNOTATION_LWS_LEVEL] == "replica"
        assert not gated(c.live(p["metadata"]["name"]))  # released once the group exists
        assert not p["metadata"].get("ownerReferences")


def test_a_recreated_leader_gets_fresh_podgroups_and_its_predecessors_go():
    c = Cluster(make_lws(scheduling={}, size=2, replicas=1))
    c.sync()
    first = c.replica(0)
    c.sync()
    [old] = c.podgroups()
    for p in first:  # the leader is deleted; its worker StatefulSet goes with it
        c.kube.delete(f"{PODS}/{p['metadata']['name']}")
    again = c.replica(0)
    new = again[0]["spec"]["schedulingGroup"]["podGroupName"]
    assert new != old and again[1]["spec"]["schedulingGroup"]["podGroupName"] == new
    c.sync()
    assert list(c.podgroups()) == [new]


def test_a_rolled_out_replica_gets_podgroups_of_its_new_size():
    c = Cluster(make_lws(scheduling={}, size=2, replicas=2))
    c.sync()
    c.replica(0)
    c.replica(1)
    c.sync()
    c.lws = c.kube.patch(lws.lws_path(NS, "llm"), [{"op": "replace", "path": "/spec/leaderWorkerTemplate/size",
                                                     "value": 3}])
    for name in ("llm-1", "llm-1-1"):  # the rollout replaces replica 1 first
        c.kube.delete(f"{PODS}/{name}")
    c.replica(1, revision="rev2")
    c.sync()
    counts = sorted(g["spec"]["schedulingPolicy"]["gang"]["minCount"] for g in c.podgroups().values())
    assert counts == [2, 3]  # replica 0 keeps its previous size until replaced
    [workload] = c.kube.objects("workloads")
    assert workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": 3}}


def test_whole_level_one_podgroup_before_any_pod_and_the_rollout_min_count():
    c = Cluster(make_lws(scheduling={"schedulingPolicy": {"gang": {}},
                                     "schedulingConstraints": {"topology": [{"key": names.LABEL_RACK}]}},
                         size=2, replicas=2))
    pod, why = c.admit(c.pod(0))
    assert pod is None and "is held until its PodGroup" in why  # no PodGroup yet: rejected, retried
    c.sync()
    [group] = c.podgroups().values()
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": names.LABEL_RACK}]}
    pods = c.replica(0) + c.replica(1)
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {group["metadata"]["name"]}
    c.sync()
    assert not any(gated(c.live(p["metadata"]["name"])) for p in pods)
    c.lws = c.kube.patch(lws.lws_path(NS, "llm"), [{"op": "replace", "path": "/spec/leaderWorkerTemplate/size",
                                                     "value": 3}])
    c.sync()  # no replica replaced yet: both count with their previous size
    assert c.podgroups()[group["metadata"]["name"]]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 4
    for name in ("llm-1", "llm-1-1"):
        c.kube.delete(f"{PODS}/{name}")
    c.replica(1, revision="rev2")
    c.sync()
    assert c.podgroups()[group["metadata"]["name"]]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 5
    c.lws = c.kube.patch(lws.lws_path(NS, "llm"), [{"op": "replace", "path": "/spec/replicas", "value": 3}])
    c.sync()  # a new replica counts with the current size
    assert c.podgroups()[group["metadata"]["name"]]["spec"]["schedulingPolicy"]["gang"]["minCount"] == 8


def test_role_level_a_leader_and_a_worker_podgroup_per_replica():
    c = Cluster(make_lws(scheduling={"replica": {"leader": {"schedulingPolicy": {"basic": {}}}, "worker": {}}},
                         size=4, replicas=1), flavor=CRD)
    c.sync()
    pods = c.replica(0)
    c.sync()
    groups = c.podgroups()
    leader_group = pods[0]["metadata"]["labels"][names.LABEL_POD_GROUP]
    worker_group = pods[1]["metadata"]["labels"][names.LABEL_POD_GROUP]
    assert leader_group.endswith("-0-leader-rev1") and worker_group.endswith("-0-worker-rev1")
    assert {p["metadata"]["labels"][names.LABEL_POD_GROUP] for p in pods[1:]} == {worker_group}
    assert groups[leader_group]["spec"]["schedulingPolicy"] == {"basic": {}}
    assert groups[worker_group]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert groups[worker_group]["spec"]["workloadRef"]["templateName"] == "worker"


def test_pods_of_lws_without_the_annotation_or_of_other_owners_pass_unchanged():
    c = Cluster(make_lws())
    pod, _ = c.admit(c.pod(0))
    assert "schedulingGroup" not in pod["spec"] and names.LABEL_LWS_INCARNATION not in pod["metadata"]["labels"]
    c.sync()
    assert c.kube.objects("workloads") == [] and c.podgroups() == {}


def test_an_invalid_configuration_creates_nothing_and_says_why():
    c = Cluster(make_lws(scheduling={}, startupPolicy="LeaderReady"))
    c.sync()
    assert c.kube.objects("workloads") == []
    assert names.EVENT_WORKLOAD_CREATION_FAILED in c.events.reasons()
    pod, _ = c.admit(c.pod(0))
    assert "schedulingGroup" not in pod["spec"]


def test_podgroups_carry_the_lws_priority_class():
    obj = make_lws(scheduling={"schedulingPolicy": {"gang": {}}})
    obj["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["priorityClassName"] = "high"
    c = Cluster(obj)
    c.sync()
    [group] = c.podgroups().values()
    assert group["spec"]["priorityClassName"] == "high"


def test_a_gang_replica_is_released_together_once_its_pods_exist():
    c = Cluster(make_lws(scheduling={}, size=3, replicas=1))
    c.sync()
    leader, _ = c.admit(c.pod(0))
    c.sync()
    assert len(c.podgroups()) == 1 and gated(c.live("llm-0"))  # the group exists, its workers do not
    c.admit(c.pod(0, 1))
    c.admit(c.pod(0, 2))
    c.sync()
    assert not any(gated(c.live(n)) for n in ("llm-0", "llm-0-1", "llm-0-2"))


def test_dashboard_and_explain_show_the_lws_as_owner_with_its_level():
    from cluster.convert import podgroup_owner
    from extender.dashboard.views import _owner
    from phalanx_cli.explain import render
    from proto.phalanx.v1 import workload_cycle_pb2 as pb

    c = Cluster(make_lws(scheduling={"replica": {"leader": {}, "worker": {}}}, size=2, replicas=1))
    c.sync()
    c.replica(0)
    c.sync()
    owners = sorted(podgroup_owner(g) for g in c.podgroups().values())
    assert owners == [("LeaderWorkerSet", "llm", "role level, leader of group 0"),
                      ("LeaderWorkerSet", "llm", "role level, worker of group 0")]
    group = next(iter(c.podgroups().values()))
    assert _owner([], podgroup_owner(group))["kind"] == "LeaderWorkerSet"
    assert _owner([], podgroup_owner(group))["level"].startswith("role level")
    whole = Cluster(make_lws(name="w", scheduling={"schedulingPolicy": {"gang": {}}}))
    whole.sync()
    assert podgroup_owner(next(iter(whole.podgroups().values()))).level == "whole-LWS level"
    reply = pb.ExplainGroupReply(namespace=NS, name="g", state="waiting", owner_kind="LeaderWorkerSet",
                                 owner_name="llm", owner_level="replica level, group 1")
    assert "  owner: LeaderWorkerSet ns/llm (replica level, group 1)" in render(reply, None).splitlines()
    assert podgroup_owner({"metadata": "bad"}) == ("", "", "")


def test_the_controller_queues_leaderworkersets_and_forgets_deleted_ones():
    from controller import Controller

    c = Cluster(make_lws(scheduling={}, size=2, replicas=1))
    controller = Controller(c.kube, "me", flavor=BUILTIN)
    controller.lws.recorder = c.events  # the Controller's own recorder posts nothing here: no event is due
    controller._on_leaderworkerset("ADDED", c.lws)
    key = controller.queue.get()
    assert key == "lws:ns/llm" and controller.state_sizes()["known_lws"] == 1
    controller.reconcile(key)
    controller.queue.done(key)
    assert len(c.kube.objects("workloads")) == 1
    worker_sts = {"metadata": {"name": "llm-0", "namespace": NS, "labels": {names.LABEL_LWS_NAME: "llm"}}}
    controller._on_statefulset("MODIFIED", worker_sts)  # an LWS StatefulSet's change queues its LWS
    assert "lws:ns/llm" in controller.queue._due
    c.kube.delete(lws.lws_path(NS, "llm"))
    controller.reconcile("lws:ns/llm")  # gone: forgotten, nothing created
    assert controller.state_sizes()["known_lws"] == 0
    controller._on_leaderworkerset("ADDED", c.lws)
    controller._on_leaderworkerset("DELETED", c.lws)
    assert controller.state_sizes()["known_lws"] == 0


def test_pods_of_a_new_podgroup_are_released_by_the_next_reconcile():
    c = Cluster(make_lws(scheduling={}, size=2, replicas=1))
    c.reconciler.reconcile_lws(NS, "llm")
    c.replica(0)
    alive, again = c.reconciler.reconcile_lws(NS, "llm")
    assert alive and again and len(c.podgroups()) == 1 and gated(c.live("llm-0"))
    assert c.reconciler.reconcile_lws(NS, "llm") == (True, False)
    assert not gated(c.live("llm-0")) and not gated(c.live("llm-0-1"))


def test_the_provisioning_opt_in_of_the_lws_is_its_podgroups():
    c = Cluster(make_lws(scheduling={}, size=3, replicas=1,
                         annotations={names.ANNOTATION_PROVISIONING: names.PROVISIONING_ATOMIC}))
    c.sync()
    c.replica(0)
    c.sync()
    [group] = c.podgroups().values()
    assert group["metadata"]["annotations"][names.ANNOTATION_PROVISIONING] == names.PROVISIONING_ATOMIC


def test_a_worker_whose_leader_pod_is_gone_is_refused_not_admitted_outside_its_gang():
    """``LWS/worker-needs-leader``: a replica preempted whole takes its leader, and the leader's
    worker StatefulSet recreates its pods until the garbage collector removes it; such a worker has
    no incarnation to join, and admitted as it is it would be scheduled alone. It is refused (the
    StatefulSet controller retries); the new leader's workers join its new PodGroup."""
    c = Cluster(make_lws(scheduling={}, size=3, replicas=1))
    c.sync()
    first = c.replica(0)
    for p in first:
        c.kube.delete(f"{PODS}/{p['metadata']['name']}")
    stray, why = c.admit(c.pod(0, worker=1))
    assert stray is None and "leader pod llm-0 does not exist" in why and "retries" in why
    assert c.live("llm-0-1") is None
    again = c.replica(0)  # the new leader, then its workers
    group = again[0]["spec"]["schedulingGroup"]["podGroupName"]
    assert all(p is not None and p["spec"]["schedulingGroup"]["podGroupName"] == group for p in again)
    assert all(gated(p) for p in again)
