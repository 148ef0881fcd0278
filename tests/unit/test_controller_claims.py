"""Shared ResourceClaims (KEP-6277 story 4) where the cluster lacks KEP-5729's PodGroup-level claims:
one ResourceClaim per PodGroup and template entry, created and owned by phalanx, and the pod webhook's
exact-match rewrite of pod claim entries."""

import base64
import json
import re

import pytest

from cluster import names
from controller import BUILTIN, CRD, PodMutator, Reconciler
from controller.naming import MAX_NAME, claim_name
from controller.objects import SharedClaim, claim_patch, compile_claim, pod_patch, shared_claims
from controller.reconciler import CreationFailed
from tests.unit.controller_fakes import Events, FakeKube, apply_json_patch, statefulset, sts_pod

STS = "/apis/apps/v1/namespaces/ns/statefulsets"
PODS = "/api/v1/namespaces/ns/pods"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

ACCEL = {"name": "accel", "resourceClaimTemplateName": "shared-accelerator"}
BY_NAME = {"name": "scratch", "resourceClaimName": "hand-made"}
GANG_CLAIMS = {"schedulingPolicy": {"gang": {}}, "resourceClaims": [ACCEL, BY_NAME]}


class GateOffKube(FakeKube):
    """The built-in API with DRAWorkloadResourceClaims off: the server drops resourceClaims from
    Workload templates and PodGroups before storing them."""

    def create(self, path, body, record=True):
        body = json.loads(json.dumps(body))
        if path.endswith("/podgroups"):
            body["spec"].pop("resourceClaims", None)
        if path.endswith("/workloads"):
            for template in body["spec"]["podGroupTemplates"]:
                template.pop("resourceClaims", None)
        return super().create(path, body, record)


def template_object(name="shared-accelerator"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"metadata": {"labels": {"team": "ml"}, "annotations": {"note": "pooled"}},
                     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "accel"}}]}}}}


@pytest.fixture
def kube():
    kube = GateOffKube()
    kube.add(TEMPLATES, template_object())
    return kube


@pytest.fixture
def reconciler(kube):
    return Reconciler(kube, BUILTIN, Events())


def add_sts(kube, scheduling=GANG_CLAIMS, **kwargs):
    return kube.add(STS, statefulset(scheduling=scheduling, **kwargs))


def claims(kube):
    return kube.list_pages(CLAIMS)[0]


# -- which claims phalanx provides -------------------------------------------------------------------

def podgroup(name="db-pg", uid="uid-pg", stored=None):
    spec = {} if stored is None else {"resourceClaims": stored}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": spec}


def test_gate_off_builtin_uses_the_configured_template_entries_only():
    found = shared_claims(podgroup(), (ACCEL, BY_NAME), BUILTIN)
    assert found == (SharedClaim("accel", "shared-accelerator", "db-pg-accel"),)


def test_builtin_podgroup_that_kept_its_claims_is_left_to_kep_5729():
    assert shared_claims(podgroup(stored=[ACCEL]), (ACCEL,), BUILTIN) == ()


def test_crd_flavor_reads_the_podgroup_entries():
    other = {"name": "other", "resourceClaimTemplateName": "t2"}
    found = shared_claims(podgroup(stored=[other]), (ACCEL,), CRD)
    assert found == (SharedClaim("other", "t2", "db-pg-other"),)


def test_claims_named_by_resource_claim_name_are_not_created():
    assert shared_claims(podgroup(), (BY_NAME,), BUILTIN) == ()
    assert shared_claims(podgroup(), (), BUILTIN) == ()


# -- naming ------------------------------------------------------------------------------------------

def test_claim_name_is_podgroup_dash_entry_when_it_fits():
    assert claim_name("db-x-db-y", "accel", "uid") == "db-x-db-y-accel"


@pytest.mark.parametrize("group_len,entry_len", [(250, 10), (240, 63), (10, 63)])
def test_long_claim_names_are_cut_fairly_and_stay_unique(group_len, entry_len):
    group, entry = "g" * group_len, "e" * entry_len
    name = claim_name(group, entry, "uid-1")
    assert len(name) <= MAX_NAME and DNS_SUBDOMAIN.match(name)
    if group_len + entry_len + 1 > MAX_NAME:
        assert name != claim_name(group, entry, "uid-2")
        assert name != claim_name(group, entry + "x", "uid-1")
    assert name == claim_name(group, entry, "uid-1")


# -- the claim object --------------------------------------------------------------------------------

def test_claim_copies_the_template_and_is_owned_by_the_podgroup():
    group = podgroup()
    shared = SharedClaim("accel", "shared-accelerator", "db-pg-accel")
    claim = compile_claim(group, shared, template_object(), BUILTIN)
    assert claim["apiVersion"] == "resource.k8s.io/v1" and claim["kind"] == "ResourceClaim"
    assert claim["metadata"]["name"] == "db-pg-accel" and claim["metadata"]["namespace"] == "ns"
    assert claim["spec"] == template_object()["spec"]["spec"]
    assert claim["metadata"]["labels"] == {"team": "ml", names.LABEL_PODGROUP_CLAIM: "accel"}
    assert claim["metadata"]["annotations"] == {"note": "pooled", names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE}
    assert claim["metadata"]["ownerReferences"] == [{
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "name": "db-pg", "uid": "uid-pg",
        "controller": True, "blockOwnerDeletion": True}]


# -- the pod rewrite ---------------------------------------------------------------------------------

SHARED = (SharedClaim("accel", "shared-accelerator", "db-pg-accel"),)


def pod_with(*entries):
    return {"metadata": {"name": "db-0"}, "spec": {"resourceClaims": list(entries)}}


def test_exact_match_is_pointed_at_the_podgroup_claim():
    pod = pod_with({"name": "own", "resourceClaimTemplateName": "per-pod"}, dict(ACCEL))
    ops = claim_patch(pod, SHARED)
    assert ops == [{"op": "replace", "path": "/spec/resourceClaims/1",
                    "value": {"name": "accel", "resourceClaimName": "db-pg-accel"}}]
    assert apply_json_patch(pod, ops)["spec"]["resourceClaims"] == [
        {"name": "own", "resourceClaimTemplateName": "per-pod"}, {"name": "accel", "resourceClaimName": "db-pg-accel"}]


@pytest.mark.parametrize("entry", [
    {"name": "accelerator", "resourceClaimTemplateName": "shared-accelerator"},  # name differs
    {"name": "accel", "resourceClaimTemplateName": "other-template"},  # source differs
    {"name": "accel", "resourceClaimName": "shared-accelerator"},  # a claim, not the template
    {"name": "accel", "resourceClaimName": "db-pg-accel"},  # already pointed at it
])
def test_entries_that_do_not_match_exactly_stay_per_pod(entry):
    assert claim_patch(pod_with(entry), SHARED) == []


def test_pods_without_claims_or_without_shared_claims_get_no_claim_ops():
    assert claim_patch({"spec": {}}, SHARED) == []
    assert claim_patch(pod_with(dict(ACCEL)), ()) == []


# -- the reconciler ----------------------------------------------------------------------------------

def test_one_claim_per_podgroup_created_before_release_and_owned(kube, reconciler):
    sts = add_sts(kube)
    found = reconciler.sync(sts)
    group = found.podgroup
    assert "resourceClaims" not in group["spec"]  # the gate-off server dropped it
    (claim,) = claims(kube)
    assert claim["metadata"]["name"] == f"{group['metadata']['name']}-accel"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == group["metadata"]["uid"]
    assert found.claims == (SharedClaim("accel", "shared-accelerator", claim["metadata"]["name"]),)
    posts = [p for m, p in kube.calls if m == "POST"]
    assert posts[-1] == CLAIMS and posts.index(CLAIMS) > posts.index(
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups")
    assert names.EVENT_RESOURCECLAIM_CREATED in reconciler.recorder.reasons()


def test_second_sync_creates_nothing(kube, reconciler):
    sts = add_sts(kube)
    reconciler.sync(sts)
    kube.calls.clear()
    assert reconciler.sync(sts).claims
    assert kube.calls == [] and len(claims(kube)) == 1


def test_deleted_claim_is_recreated(kube, reconciler):
    sts = add_sts(kube)
    reconciler.sync(sts)
    kube.delete(f"{CLAIMS}/{claims(kube)[0]['metadata']['name']}")
    reconciler.sync(sts)
    assert len(claims(kube)) == 1


def test_two_statefulsets_get_one_claim_each(kube, reconciler):
    for name in ("a", "b"):
        reconciler.sync(add_sts(kube, name=name))
    owners = sorted(c["metadata"]["ownerReferences"][0]["name"] for c in claims(kube))
    assert len(owners) == 2 and owners[0] != owners[1]


def test_missing_template_fails_with_an_event_and_nothing_is_released(kube, reconciler):
    kube.delete(f"{TEMPLATES}/shared-accelerator")
    sts = add_sts(kube)
    with pytest.raises(CreationFailed, match="ResourceClaimTemplate ns/shared-accelerator not found"):
        reconciler.sync(sts)
    assert claims(kube) == []
    assert names.EVENT_RESOURCECLAIM_FAILED in reconciler.recorder.reasons()


def test_a_foreign_claim_under_the_name_is_not_adopted(kube, reconciler):
    sts = add_sts(kube)
    kube.fail_create.add("/resourceclaims")
    with pytest.raises(CreationFailed):
        reconciler.sync(sts)  # PodGroup created, the claim's create failed
    kube.fail_create.clear()
    group = reconciler.sync(sts, write=False).podgroup
    kube.add(CLAIMS, {"metadata": {"name": f"{group['metadata']['name']}-accel"}, "spec": {}})
    with pytest.raises(CreationFailed, match="is not owned by PodGroup"):
        reconciler.sync(sts)
    assert len(claims(kube)) == 1


def test_builtin_with_kep_5729_creates_no_claim():
    kube = FakeKube()  # the server keeps spec.resourceClaims: the ResourceClaim controller does the work
    kube.add(TEMPLATES, template_object())
    sts = kube.add(STS, statefulset(scheduling=GANG_CLAIMS))
    found = Reconciler(kube, BUILTIN, Events()).sync(sts)
    assert found.claims == () and claims(kube) == []


def test_crd_flavor_creates_the_claim_too():
    kube = FakeKube()
    kube.add(TEMPLATES, template_object())
    sts = kube.add(STS, statefulset(scheduling=GANG_CLAIMS))
    found = Reconciler(kube, CRD, Events()).sync(sts)
    (claim,) = claims(kube)
    assert claim["metadata"]["ownerReferences"][0]["apiVersion"] == "scheduling.phalanx.dev/v1beta1"
    assert found.claims[0].claim == claim["metadata"]["name"]


def test_statefulset_without_claims_costs_no_claim_calls(kube, reconciler):
    sts = add_sts(kube, scheduling={"schedulingPolicy": {"gang": {}}})
    assert reconciler.sync(sts).claims == ()
    assert all("resource.k8s.io" not in p for _, p in kube.calls)


# -- the webhook -------------------------------------------------------------------------------------

def _admit(mutator, pod):
    answer = mutator.review({"request": {"uid": "p", "operation": "CREATE", "namespace": "ns", "object": pod}})
    return answer["response"]


def _patched(answer, pod):
    return apply_json_patch(pod, json.loads(base64.b64decode(answer["patch"])))


def test_webhook_points_matching_entries_at_the_podgroup_claim(kube, reconciler):
    sts = add_sts(kube)
    found = reconciler.sync(sts)
    own = {"name": "own", "resourceClaimTemplateName": "shared-accelerator"}
    pod = sts_pod(sts, 0, resourceClaims=[dict(ACCEL), own, dict(BY_NAME)])
    answer = _admit(PodMutator(kube, reconciler, BUILTIN), pod)
    stamped = _patched(answer, pod)
    assert stamped["spec"]["resourceClaims"] == [
        {"name": "accel", "resourceClaimName": claims(kube)[0]["metadata"]["name"]}, own, BY_NAME]
    assert stamped["spec"]["schedulingGroup"] == {"podGroupName": found.podgroup["metadata"]["name"]}
    assert stamped == apply_json_patch(pod, pod_patch(pod, found.podgroup, BUILTIN, found.claims))


def test_webhook_leaves_claims_of_statefulsets_without_scheduling_alone(kube, reconciler):
    sts = add_sts(kube, scheduling=None)
    pod = sts_pod(sts, 0, resourceClaims=[dict(ACCEL)])
    assert _admit(PodMutator(kube, reconciler, BUILTIN), pod) == {"uid": "p", "allowed": True}
