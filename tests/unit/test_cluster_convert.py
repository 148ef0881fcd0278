"""Kubernetes JSON to solver records: quantities, requests, constraints, groups, bad objects."""

import pytest

from cluster import names
from cluster.convert import node_from_json, pod_from_json, podgroup_from_json
from cluster.quantity import parse_quantity
from solver import DisruptionMode, InvalidInput, Policy, TaintEffect


@pytest.mark.parametrize(
    "text, resource, expected",
    [("500m", "cpu", 500), ("2", "cpu", 2000), ("0.1", "cpu", 100), ("1.5Gi", "memory", 1610612736),
     ("1e3", "memory", 1000), ("128974848", "memory", 128974848), ("129M", "memory", 129000000),
     ("1m", "memory", 1), ("8", "nvidia.com/gpu", 8), (4, "cpu", 4000), ("1n", "cpu", 1)],
)
def test_quantities(text, resource, expected):
    assert parse_quantity(text, resource) == expected


@pytest.mark.parametrize("text", ["12x", "", "Gi", "-1", "1.2.3", None, True, "1 Gi"])
def test_bad_quantities_are_rejected_with_the_text(text):
    with pytest.raises(InvalidInput):
        parse_quantity(text, "memory")


NODE = {
    "metadata": {"name": "n1", "labels": {names.LABEL_RACK: "r1"}},
    "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}], "unschedulable": True},
    "status": {"allocatable": {"cpu": "63500m", "memory": "250Gi", "nvidia.com/gpu": "8", "pods": "110"}},
}


def test_node():
    node = node_from_json(NODE)
    assert node.allocatable == {"cpu": 63500, "memory": 250 * 2**30, "nvidia.com/gpu": 8, "pods": 110}
    assert node.labels[names.LABEL_RACK] == "r1"
    assert node.taints[0].effect is TaintEffect.NO_SCHEDULE and node.unschedulable


@pytest.mark.parametrize(
    "obj, message",
    [({}, "metadata.name is missing"),
     ({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "lots"}}}, "unparsable quantity"),
     ({"metadata": {"name": "n"}, "spec": {"taints": [{"key": "k", "effect": "Sometimes"}]}}, "malformed taint")],
)
def test_bad_nodes(obj, message):
    with pytest.raises(InvalidInput, match=message):
        node_from_json(obj)


POD = {
    "metadata": {"name": "db-0", "namespace": "prod", "uid": "u-1"},
    "spec": {
        "schedulingGroup": {"podGroupName": "db-pg"},
        "priority": 100,
        "nodeSelector": {"pool": "a"},
        "containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                       {"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        "initContainers": [{"resources": {"requests": {"cpu": "3"}}},
                           {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}],
        "overhead": {"cpu": "100m"},
        "tolerations": [{"operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]}]}}},
    },
}


def test_pod():
    pod = pod_from_json(POD)
    assert pod.group == "prod/db-pg" and pod.uid == "u-1" and pod.key == "prod/db-0"
    # init 3000 vs running 1000 + sidecar 500; plus overhead 100
    assert pod.spec.requests == {"cpu": 3100, "memory": 2**30, "nvidia.com/gpu": 2}
    assert pod.spec.priority == 100 and pod.spec.node_selector == {"pool": "a"}
    assert pod.spec.affinity.matches({"gen": "4"}) and not pod.spec.affinity.matches({"gen": "3"})


def test_pod_group_label_in_the_crd_flavor():
    pod = pod_from_json({"metadata": {"name": "p", "labels": {names.LABEL_POD_GROUP: "g"}}, "spec": {}})
    assert pod.group == "default/g"


def test_bad_pod_priority():
    with pytest.raises(InvalidInput, match="spec.priority"):
        pod_from_json({"metadata": {"name": "p"}, "spec": {"priority": "high"}})


def test_podgroup_v1beta1():
    obj = {
        "metadata": {"name": "pg", "namespace": "ml", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "annotations": {names.ANNOTATION_PREFERRED_TOPOLOGY: "topology.kubernetes.io/rack, example/block"}},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 8}},
                 "schedulingConstraints": {"topology": [{"key": names.LABEL_ZONE}]},
                 "disruptionMode": {"all": {}}, "priority": 1000},
    }
    group = podgroup_from_json(obj)
    assert group.policy is Policy.GANG and group.min_count == 8 and group.topology_key == names.LABEL_ZONE
    assert group.preferred_keys == (names.LABEL_RACK, "example/block")
    assert group.disruption_mode is DisruptionMode.ALL and group.priority == 1000 and group.created > 0


def test_podgroup_basic_defaults():
    group = podgroup_from_json({"metadata": {"name": "pg"}, "spec": {"schedulingPolicy": {"basic": {}}}})
    assert group.policy is Policy.BASIC and group.min_count == 1 and group.topology_key == ""


@pytest.mark.parametrize(
    "spec, message",
    [({"schedulingPolicy": {"gang": {"minCount": 0}}}, "minCount"),
     ({"schedulingPolicy": {"gang": {}, "basic": {}}}, "both basic and gang"),
     ({"schedulingConstraints": {"topology": [{"key": "a"}, {"key": "b"}]}}, "at most one topology")],
)
def test_bad_podgroups(spec, message):
    with pytest.raises(InvalidInput, match=message):
        podgroup_from_json({"metadata": {"name": "pg"}, "spec": spec})
