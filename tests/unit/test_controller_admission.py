"""KEP-6277's admission rules (validating webhook) and the pod stamping (mutating webhook)."""

import base64
import json

import pytest

from cluster import names
from controller import BUILTIN, CRD, PodMutator, Reconciler, review_statefulset, validate_statefulset
from controller.config import MSG_DISRUPTION_ALL_BASIC, MSG_GANG_ORDERED_READY, MSG_MIN_COUNT, MSG_PARTITION
from tests.unit.controller_fakes import Events, FakeKube, statefulset, sts_pod

GANG = {"schedulingPolicy": {"gang": {}}}


def errors_of(sts, old=None):
    return validate_statefulset(sts, old)[0]


# -- validating: StatefulSets ------------------------------------------------------------------------

def test_kep_messages_verbatim():
    assert MSG_GANG_ORDERED_READY == (
        "spec.scheduling.schedulingPolicy.gang: Forbidden: gang scheduling requires podManagementPolicy: "
        "Parallel; OrderedReady creates pods sequentially, which can never satisfy a gang")
    assert MSG_PARTITION == ("spec.updateStrategy.rollingUpdate.partition: Forbidden: partitioned rollouts are "
                             "not supported for StatefulSets with spec.scheduling set")


@pytest.mark.parametrize("policy", ["OrderedReady", None])
def test_gang_with_ordered_ready_or_unset_policy_is_rejected(policy):
    assert errors_of(statefulset(scheduling=GANG, policy=policy)) == [MSG_GANG_ORDERED_READY]


def test_gang_with_parallel_is_accepted():
    assert errors_of(statefulset(scheduling=GANG)) == []


@pytest.mark.parametrize("scheduling", [
    {}, {"schedulingPolicy": {"basic": {}}},
    {"schedulingPolicy": {"basic": {}}, "schedulingConstraints": {"topology": [{"key": names.LABEL_RACK}]},
     "resourceClaims": [{"name": "c", "resourceClaimName": "shared"}]},
])
def test_ordered_ready_with_basic_is_accepted(scheduling):
    assert errors_of(statefulset(scheduling=scheduling, policy="OrderedReady")) == []


def test_user_set_min_count_is_rejected():
    assert errors_of(statefulset(scheduling={"schedulingPolicy": {"gang": {"minCount": 2}}})) == [MSG_MIN_COUNT]


@pytest.mark.parametrize("old_partition", [None, 0])
def test_partition_with_scheduling_is_rejected_on_create_and_update(old_partition):
    assert errors_of(statefulset(scheduling=GANG, partition=2)) == [MSG_PARTITION]
    old = statefulset(scheduling=GANG, partition=old_partition)
    assert errors_of(statefulset(scheduling=GANG, partition=1), old) == [MSG_PARTITION]
    assert errors_of(statefulset(scheduling=GANG, partition=0), old) == []


def test_partition_without_scheduling_is_fine():
    assert errors_of(statefulset(scheduling=None, partition=3)) == []


def test_disruption_all_with_basic_is_rejected():
    for scheduling in ({"disruptionMode": {"all": {}}},
                       {"schedulingPolicy": {"basic": {}}, "disruptionMode": {"all": {}}}):
        assert errors_of(statefulset(scheduling=scheduling)) == [MSG_DISRUPTION_ALL_BASIC]
    assert errors_of(statefulset(scheduling={**GANG, "disruptionMode": {"all": {}}})) == []
    assert errors_of(statefulset(scheduling={"disruptionMode": {"single": {}}})) == []


def test_policy_and_mode_are_one_of():
    both = errors_of(statefulset(scheduling={"schedulingPolicy": {"basic": {}, "gang": {}}}))
    assert both == ["spec.scheduling.schedulingPolicy: Invalid value: exactly one of basic or gang must be set"]
    modes = errors_of(statefulset(scheduling={"disruptionMode": {"single": {}, "all": {}}}))
    assert "spec.scheduling.disruptionMode: Invalid value: exactly one of single or all must be set" in modes


def test_at_most_four_claims():
    claims = [{"name": f"c{i}", "resourceClaimName": f"r{i}"} for i in range(5)]
    assert errors_of(statefulset(scheduling={"resourceClaims": claims})) == [
        "spec.scheduling.resourceClaims: Too many: 5: must have at most 4 items"]
    assert errors_of(statefulset(scheduling={"resourceClaims": claims[:4]})) == []


@pytest.mark.parametrize("claim", [{"name": "c"},
                                   {"name": "c", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}])
def test_each_claim_has_exactly_one_source(claim):
    assert errors_of(statefulset(scheduling={"resourceClaims": [claim]})) == [
        "spec.scheduling.resourceClaims[0]: Invalid value: exactly one of resourceClaimName or "
        "resourceClaimTemplateName must be set"]


def test_claims_with_one_source_each_are_accepted():
    claims = [{"name": "a", "resourceClaimName": "x"}, {"name": "b", "resourceClaimTemplateName": "y"}]
    assert errors_of(statefulset(scheduling={"resourceClaims": claims})) == []


def test_at_most_one_topology_key():
    topology = {"topology": [{"key": "a"}, {"key": "b"}]}
    assert errors_of(statefulset(scheduling={"schedulingConstraints": topology})) == [
        "spec.scheduling.schedulingConstraints.topology: Too many: 2: must have at most 1 items"]


@pytest.mark.parametrize("old,new", [
    (None, {}),  # add after create
    ({}, None),  # unset
    ({"schedulingPolicy": {"basic": {}}}, GANG),  # basic -> gang
    (GANG, {"schedulingPolicy": {"basic": {}}}),  # gang -> basic
    ({"resourceClaims": [{"name": "a", "resourceClaimName": "x"}]},
     {"resourceClaims": [{"name": "a", "resourceClaimName": "y"}]}),  # claims edit
    ({}, {"schedulingConstraints": {"topology": [{"key": "zone"}]}}),
])
def test_any_change_of_the_scheduling_configuration_is_rejected(old, new):
    errors = errors_of(statefulset(scheduling=new), statefulset(scheduling=old))
    assert len(errors) == 1 and errors[0].startswith("spec.scheduling: Invalid value: ")
    assert errors[0].endswith(": field is immutable")


def test_unchanged_configuration_and_other_updates_pass():
    old = statefulset(scheduling=GANG, replicas=3)
    new = statefulset(scheduling=GANG, replicas=7)
    new["metadata"]["annotations"][names.ANNOTATION_SCHEDULING] = json.dumps(GANG, indent=2)  # same JSON
    assert errors_of(new, old) == []


def test_missing_template_claims_warn_but_do_not_reject():
    claim = {"name": "shared", "resourceClaimTemplateName": "accel"}
    errors, warnings = validate_statefulset(statefulset(scheduling={**GANG, "resourceClaims": [claim]}))
    assert errors == [] and len(warnings) == 1 and "resourceClaims[0]" in warnings[0]
    matching = statefulset(scheduling={**GANG, "resourceClaims": [claim]}, template_claims=[dict(claim)])
    assert validate_statefulset(matching) == ([], [])
    other_source = statefulset(scheduling={**GANG, "resourceClaims": [claim]},
                               template_claims=[{"name": "shared", "resourceClaimName": "accel"}])
    assert len(validate_statefulset(other_source)[1]) == 1


def test_review_denies_with_the_message_and_allows_with_warnings():
    request = {"uid": "u1", "operation": "CREATE", "object": statefulset(scheduling=GANG, policy="OrderedReady")}
    answer = review_statefulset({"request": request})["response"]
    assert answer == {"uid": "u1", "allowed": False,
                      "status": {"code": 403, "message": MSG_GANG_ORDERED_READY, "reason": "Forbidden"}}
    claim = {"name": "s", "resourceClaimName": "x"}
    request["object"] = statefulset(scheduling={"resourceClaims": [claim]})
    answer = review_statefulset({"request": request})["response"]
    assert answer["allowed"] is True and answer["warnings"]


def test_review_of_a_bad_annotation_is_denied():
    request = {"uid": "u", "operation": "CREATE",
               "object": statefulset(annotations={names.ANNOTATION_SCHEDULING: "[1]"})}
    answer = review_statefulset({"request": request})["response"]
    assert not answer["allowed"] and "must be a JSON object" in answer["status"]["message"]


# -- mutating: pods ----------------------------------------------------------------------------------

def _cluster(flavor=BUILTIN, scheduling=GANG):
    kube = FakeKube()
    sts = kube.add("/apis/apps/v1/namespaces/ns/statefulsets", statefulset(scheduling=scheduling))
    reconciler = Reconciler(kube, flavor, Events())
    return kube, sts, reconciler


def _patch(answer):
    return json.loads(base64.b64decode(answer["patch"]))


def _admit(mutator, pod):
    return mutator.review({"request": {"uid": "p", "operation": "CREATE", "namespace": "ns", "object": pod}})["response"]


def test_pod_of_a_gang_statefulset_is_stamped_owned_and_gated():
    kube, sts, reconciler = _cluster()
    group = reconciler.sync(sts).podgroup
    kicked = []
    mutator = PodMutator(kube, reconciler, BUILTIN, kick=lambda ns, name, delay: kicked.append(name))
    answer = _admit(mutator, sts_pod(sts, 0))
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"
    assert _patch(answer) == [
        {"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": group["metadata"]["name"]}},
        {"op": "add", "path": "/metadata/ownerReferences/-",
         "value": {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                   "name": group["metadata"]["name"], "uid": group["metadata"]["uid"]}},
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": names.GATE_PODGROUP_SYNC}]},
    ]
    assert kicked == ["db"]


def test_crd_flavor_stamps_the_label_and_appends_to_existing_gates():
    kube, sts, reconciler = _cluster(CRD)
    group = reconciler.sync(sts).podgroup
    pod = sts_pod(sts, 1, schedulingGates=[{"name": "other"}])
    patch = _patch(_admit(PodMutator(kube, reconciler, CRD), pod))
    assert patch[0] == {"op": "add", "path": "/metadata/labels/scheduling.phalanx.dev~1pod-group",
                        "value": group["metadata"]["name"]}
    assert patch[1]["value"]["apiVersion"] == "scheduling.phalanx.dev/v1beta1"
    assert patch[2] == {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": names.GATE_PODGROUP_SYNC}}


def test_pods_of_statefulsets_without_scheduling_and_other_pods_pass_untouched():
    kube, sts, reconciler = _cluster(scheduling=None)
    mutator = PodMutator(kube, reconciler, BUILTIN)
    plain = _admit(mutator, sts_pod(sts, 0))
    assert plain == {"uid": "p", "allowed": True}
    bare = {"metadata": {"name": "x"}, "spec": {}}
    assert _admit(mutator, bare) == {"uid": "p", "allowed": True}


def test_pod_of_a_predecessor_with_another_uid_is_untouched():
    kube, sts, reconciler = _cluster()
    reconciler.sync(sts)
    pod = sts_pod(sts, 0)
    pod["metadata"]["ownerReferences"][0]["uid"] = "old-uid"
    assert "patch" not in _admit(PodMutator(kube, reconciler, BUILTIN), pod)


def test_pod_is_held_when_the_podgroup_does_not_appear():
    kube, sts, reconciler = _cluster()
    mutator = PodMutator(kube, reconciler, BUILTIN, wait=0.05, poll=0.01)
    answer = _admit(mutator, sts_pod(sts, 0))
    assert not answer["allowed"]
    assert "is held until its PodGroup exists" in answer["status"]["message"]


def test_pod_waits_for_the_leader_to_create_the_podgroup():
    kube, sts, reconciler = _cluster()
    mutator = PodMutator(kube, reconciler, BUILTIN, kick=lambda ns, name, delay: reconciler.sync(sts))
    answer = _admit(mutator, sts_pod(sts, 0))
    assert answer["allowed"] and "patch" in answer


def test_pod_of_a_statefulset_that_had_pods_before_phalanx_is_admitted_with_a_warning():
    kube, sts, reconciler = _cluster()
    kube.add("/api/v1/namespaces/ns/pods", sts_pod(sts, 0, nodeName="n1"))  # running before phalanx
    answer = _admit(PodMutator(kube, reconciler, BUILTIN), sts_pod(sts, 1))
    assert answer["allowed"] and "patch" not in answer and answer["warnings"]


def test_unbound_unstamped_siblings_do_not_count_as_pods_the_new_pod_waits_for_the_podgroup():
    """After a webhook outage: an unbound sibling admitted unstamped does not stop the group from
    being created, so the next pod is stamped instead of joining the outage's pods."""
    kube, sts, reconciler = _cluster()
    kube.add("/api/v1/namespaces/ns/pods", sts_pod(sts, 0))  # unstamped, Pending
    mutator = PodMutator(kube, reconciler, BUILTIN, kick=lambda ns, name, delay: reconciler.sync(sts))
    answer = _admit(mutator, sts_pod(sts, 1))
    assert answer["allowed"] and "patch" in answer
