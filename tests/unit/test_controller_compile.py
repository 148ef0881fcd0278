"""Compiling a StatefulSet's scheduling configuration: reading it, names, objects, ownerReferences."""

import json
import re

import pytest

from cluster import names
from controller import BUILTIN, CRD, compile_podgroup, compile_workload, raw_scheduling, resolve
from controller.config import ConfigError, SchedulingConfig
from controller.naming import (
    MAX_LABEL,
    MAX_NAME,
    SAFE_ALPHABET,
    fair_join,
    fnv32a,
    podgroup_name,
    template_name,
    workload_name,
)
from controller.objects import min_count, min_count_patch, template_fields
from tests.unit.controller_fakes import statefulset

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _compiled(sts, flavor=BUILTIN):
    workload = compile_workload(sts, resolve(raw_scheduling(sts)), flavor)
    workload["metadata"]["uid"] = "uid-workload"
    template = workload["spec"]["podGroupTemplates"][0]
    return workload, compile_podgroup(sts, workload, template, flavor, owns_workload=True)


# -- reading the configuration -----------------------------------------------------------------------

def test_no_scheduling_means_no_objects():
    assert raw_scheduling(statefulset(scheduling=None)) is None


def test_empty_scheduling_resolves_to_basic_with_nothing_else():
    config = resolve(raw_scheduling(statefulset(scheduling={})))
    assert config == SchedulingConfig(gang=False)
    assert template_fields(config, statefulset()) == {"schedulingPolicy": {"basic": {}}}


def test_the_pod_templates_priority_class_is_the_groups():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    sts["spec"]["template"]["spec"]["priorityClassName"] = "serving-high"
    fields = template_fields(resolve(raw_scheduling(sts)), sts)
    assert fields == {"schedulingPolicy": {"gang": {"minCount": 3}}, "priorityClassName": "serving-high"}
    workload = compile_workload(sts, resolve(raw_scheduling(sts)), BUILTIN)
    assert workload["spec"]["podGroupTemplates"][0]["priorityClassName"] == "serving-high"


def test_field_is_read_before_the_annotation():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}}, as_field=True)
    sts["metadata"]["annotations"][names.ANNOTATION_SCHEDULING] = "{}"
    assert resolve(raw_scheduling(sts)).gang


def test_annotation_that_is_not_json_is_an_error():
    sts = statefulset(annotations={names.ANNOTATION_SCHEDULING: "{gang"})
    with pytest.raises(ConfigError, match="not JSON"):
        raw_scheduling(sts)


@pytest.mark.parametrize("policy", [{"gang": {}}, {"basic": {}}])
def test_topology_and_disruption_mode_pass_through_unchanged(policy):
    mode = {"all": {}} if "gang" in policy else {"single": {}}
    sts = statefulset(scheduling={"schedulingPolicy": policy, "disruptionMode": mode,
                                  "schedulingConstraints": {"topology": [{"key": names.LABEL_RACK}]}})
    _, podgroup = _compiled(sts)
    assert podgroup["spec"]["schedulingConstraints"] == {"topology": [{"key": names.LABEL_RACK}]}
    assert podgroup["spec"]["disruptionMode"] == mode


def test_resource_claims_pass_through_to_template_and_podgroup():
    claims = [{"name": "shared", "resourceClaimTemplateName": "accel"}]
    workload, podgroup = _compiled(statefulset(scheduling={"schedulingPolicy": {"gang": {}}, "resourceClaims": claims}))
    assert workload["spec"]["podGroupTemplates"][0]["resourceClaims"] == claims
    assert podgroup["spec"]["resourceClaims"] == claims


def test_resource_claims_omitted_when_empty():
    workload, podgroup = _compiled(statefulset(scheduling={"resourceClaims": []}))
    assert "resourceClaims" not in workload["spec"]["podGroupTemplates"][0]
    assert "resourceClaims" not in podgroup["spec"]


# -- minCount ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas,expected", [(5, 5), (1, 1), (0, 1), (None, 1)])
def test_gang_min_count_is_replicas_clamped_to_one(replicas, expected):
    sts = statefulset(replicas=replicas, scheduling={"schedulingPolicy": {"gang": {}}})
    assert min_count(sts) == expected
    workload, podgroup = _compiled(sts)
    assert workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": expected}}
    assert podgroup["spec"]["schedulingPolicy"] == {"gang": {"minCount": expected}}


def test_derived_min_count_is_never_written_back_to_the_statefulset():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    before = json.dumps(sts, sort_keys=True)
    _compiled(sts)
    assert json.dumps(sts, sort_keys=True) == before
    assert json.loads(sts["metadata"]["annotations"][names.ANNOTATION_SCHEDULING])["schedulingPolicy"]["gang"] == {}


def test_min_count_patch_only_for_gang_and_only_when_changed():
    gang = {"schedulingPolicy": {"gang": {"minCount": 3}}}
    assert min_count_patch("/spec", gang, 3) is None
    assert min_count_patch("/spec", {"schedulingPolicy": {"basic": {}}}, 5) is None
    assert min_count_patch("/spec", gang, 5) == [
        {"op": "test", "path": "/spec/schedulingPolicy/gang/minCount", "value": 3},
        {"op": "replace", "path": "/spec/schedulingPolicy/gang/minCount", "value": 5}]


# -- names -------------------------------------------------------------------------------------------

def test_fnv32a_known_values():
    assert fnv32a(b"") == 0x811C9DC5
    assert fnv32a(b"a") == 0xE40C292C
    assert fnv32a(b"foobar") == 0xBF9CF968


def test_names_use_the_safe_alphabet_and_are_stable():
    name = workload_name("db", "uid-1")
    assert name == workload_name("db", "uid-1") != workload_name("db", "uid-2")
    prefix, suffix = name.split("-", 1)
    assert prefix == "db" and set(suffix) <= set(SAFE_ALPHABET)
    # a StatefulSet's own Workload is not repeated in its PodGroup's name; another's is kept
    assert re.fullmatch(f"db-[{SAFE_ALPHABET}]+", podgroup_name(name, "db", "w-uid"))
    assert podgroup_name("train-x1", "workers", "w-uid").startswith("train-x1-workers-")
    assert podgroup_name(name, "db", "w-uid", "sts-1") != podgroup_name(name, "db", "w-uid", "sts-2")


LABEL_VALUE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


@pytest.mark.parametrize("sts_len,template_len", [(253, 63), (200, 10), (10, 250), (126, 126), (63, 63), (52, 52)])
def test_long_names_are_truncated_fairly_podgroups_to_a_label_value(sts_len, template_len):
    workload = workload_name("a" * (sts_len - 1) + "b", "uid")
    pg = podgroup_name(workload, "c" * template_len, "uid2")
    assert len(workload) <= MAX_NAME and DNS_SUBDOMAIN.match(workload), workload
    # in the CRD flavor pods carry the PodGroup's name as a label value
    assert len(pg) <= MAX_LABEL and DNS_SUBDOMAIN.match(pg) and LABEL_VALUE.match(pg), pg
    wpart, tpart, _ = pg.rsplit("-", 2)
    room = MAX_LABEL - 2 - len(pg.rsplit("-", 1)[1])
    # neither part is cut below half the room while the other keeps more than its share
    assert min(len(wpart), len(tpart)) >= min(room // 2, len(workload), template_len) - 1


@pytest.mark.parametrize("length", [1, 30, 52, 63])
def test_a_statefulsets_own_podgroup_name_is_a_label_value(length):
    sts = ("s" * length)[:-1] + "z"
    workload = workload_name(sts, "uid")
    pg = podgroup_name(workload, template_name(sts), "w-uid", "uid")
    assert len(pg) <= MAX_LABEL and LABEL_VALUE.match(pg), pg
    assert pg.startswith(sts[: min(length, 40)]) and pg.count(sts[:min(length, 40)]) == 1


def test_truncated_parts_never_end_in_a_dash_or_dot():
    for cut in range(100, 140):
        name = fair_join(["a" * cut + ".b" * 60, "c-" * 100 + "c"], "hash")
        assert not re.search(r"[-.][-.]", name) and DNS_SUBDOMAIN.match(name), name


def test_template_name_is_a_dns_label():
    assert template_name("web.v2") == "web-v2"
    assert len(template_name("x" * 100)) == 63


# -- objects and ownerReferences ---------------------------------------------------------------------

def test_workload_shape_owner_and_managed_by():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    workload, _ = _compiled(sts)
    assert workload["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert workload["spec"]["controllerRef"] == {"apiGroup": "apps", "kind": "StatefulSet", "name": "db"}
    assert workload["metadata"]["annotations"] == {names.ANNOTATION_MANAGED_BY: names.MANAGED_BY_VALUE}
    assert workload["metadata"]["ownerReferences"] == [{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "uid-db",
        "controller": True, "blockOwnerDeletion": True}]
    assert workload["spec"]["podGroupTemplates"][0]["name"] == "db"


def test_podgroup_owners_workload_ref_and_finalizer():
    _, podgroup = _compiled(statefulset(scheduling={"schedulingPolicy": {"gang": {}}}))
    sts_ref, workload_ref = podgroup["metadata"]["ownerReferences"]
    assert sts_ref["controller"] is True and sts_ref["uid"] == "uid-db"
    assert workload_ref["kind"] == "Workload" and workload_ref["uid"] == "uid-workload"
    assert "controller" not in workload_ref
    assert podgroup["metadata"]["finalizers"] == [names.FINALIZER_PODGROUP_PROTECTION]
    assert podgroup["spec"]["workloadRef"] == {"workloadName": podgroup["spec"]["workloadRef"]["workloadName"],
                                               "templateName": "db"}


def test_podgroup_of_a_parent_workload_has_no_workload_owner():
    sts = statefulset(scheduling={})
    parent = {"metadata": {"name": "lws-w", "uid": "p-uid", "namespace": "ns"}}
    template = {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}
    podgroup = compile_podgroup(sts, parent, template, BUILTIN, owns_workload=False, parent_composite="lws-0")
    assert [r["kind"] for r in podgroup["metadata"]["ownerReferences"]] == ["StatefulSet"]
    assert podgroup["spec"]["parentCompositePodGroupName"] == "lws-0"
    assert podgroup["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}


def test_crd_flavor_uses_the_phalanx_group_with_the_same_schema():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    builtin_w, builtin_pg = _compiled(sts, BUILTIN)
    crd_w, crd_pg = _compiled(sts, CRD)
    assert crd_w["apiVersion"] == "scheduling.phalanx.dev/v1beta1"
    assert crd_w["spec"] == builtin_w["spec"] and crd_pg["spec"] == builtin_pg["spec"]
    assert crd_pg["metadata"]["ownerReferences"][1]["apiVersion"] == "scheduling.phalanx.dev/v1beta1"


def test_the_provisioning_opt_in_of_the_statefulset_is_its_podgroups():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    _, podgroup = _compiled(sts)
    assert names.ANNOTATION_PROVISIONING not in podgroup["metadata"]["annotations"]
    sts["metadata"]["annotations"][names.ANNOTATION_PROVISIONING] = names.PROVISIONING_ATOMIC
    sts["metadata"]["annotations"]["unrelated.example.com/x"] = "y"
    _, podgroup = _compiled(sts)
    annotations = podgroup["metadata"]["annotations"]
    assert annotations[names.ANNOTATION_PROVISIONING] == names.PROVISIONING_ATOMIC
    assert "unrelated.example.com/x" not in annotations


def test_the_placement_hints_of_the_statefulset_are_its_podgroups():
    sts = statefulset(scheduling={"schedulingPolicy": {"gang": {}}})
    hints = {names.ANNOTATION_PREFERRED_TOPOLOGY: "topology.kubernetes.io/rack,topology.kubernetes.io/zone",
             names.ANNOTATION_PLACEMENT_PREFERENCE: "spread", names.ANNOTATION_EXPECTED_DURATION: "2h"}
    sts["metadata"]["annotations"].update(hints)
    _, podgroup = _compiled(sts)
    assert {k: podgroup["metadata"]["annotations"].get(k) for k in hints} == hints
