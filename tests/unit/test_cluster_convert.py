"""Kubernetes JSON to solver records: quantities, requests, constraints, inter-pod terms, spread, host
ports, claims, storage objects, groups, the placement record, bad objects."""

import json

import pytest

from cluster import names
from cluster.convert import (
    RECORD_FORMAT,
    ClaimInfo,
    ClaimRef,
    GroupSpec,
    PlacementRecord,
    claim_from_json,
    csinode_limits,
    namespace_labels,
    node_from_json,
    placement_domain,
    placement_record,
    placement_text,
    pod_claims,
    pod_from_json,
    podgroup_from_json,
    podgroup_record,
    podgroup_spec,
    storage_class_from_json,
    volume_from_json,
)
from cluster.quantity import parse_quantity
from solver import DisruptionMode, HostPort, InvalidInput, Policy, Requirement, TaintEffect


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


@pytest.mark.parametrize("text,resource", [("9223372036854775808", "memory"), ("1e30", "nvidia.com/gpu"),
                                           ("9223372036854776", "cpu")])
def test_quantities_beyond_an_int64_are_rejected_not_overflowed(text, resource):
    with pytest.raises(InvalidInput, match="too large"):
        parse_quantity(text, resource)
    assert parse_quantity("9223372036854775807", "memory") == 2**63 - 1


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


# -- inter-pod terms, spread, host ports, claims -----------------------------------------------------
ZK_LABELS = {"app.kubernetes.io/name": "zookeeper", "app.kubernetes.io/instance": "zk",
             "app.kubernetes.io/component": "zookeeper", "statefulset.kubernetes.io/pod-name": "zk-0"}
ZK_SELECTOR = {"matchLabels": {k: v for k, v in ZK_LABELS.items() if k.startswith("app.")}}
# a ZooKeeper StatefulSet pod as the Bitnami chart writes it (podAntiAffinityPreset: hard)
ZK_POD = {
    "metadata": {"name": "zk-0", "namespace": "data", "uid": "zk-u0", "labels": ZK_LABELS},
    "spec": {
        "affinity": {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": ZK_SELECTOR, "topologyKey": "kubernetes.io/hostname"}]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "kafka"}},
                                                   "namespaces": ["streaming"],
                                                   "topologyKey": "topology.kubernetes.io/zone"}}]},
        },
        "containers": [{"name": "zookeeper", "image": "bitnami/zookeeper:3.9",
                        "ports": [{"name": "client", "containerPort": 2181},
                                  {"name": "follower", "containerPort": 2888},
                                  {"name": "election", "containerPort": 3888}],
                        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                        "volumeMounts": [{"name": "data", "mountPath": "/bitnami/zookeeper"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-zk-0"}},
                    {"name": "scripts", "configMap": {"name": "zk-scripts"}}],
    },
}


def test_zookeeper_anti_affinity_on_hostname():
    pod = pod_from_json(ZK_POD)
    assert pod.labels == ZK_LABELS
    (term,) = pod.spec.pod_anti_affinity
    assert term.topology_key == "kubernetes.io/hostname" and term.weight == 0
    assert term.namespaces == {"data"} and term.namespace_selector is None  # the pod's own namespace
    assert term.selects("data", ZK_LABELS, {}) and not term.selects("other", ZK_LABELS, {})
    (preferred,) = pod.spec.preferred_affinity
    assert preferred.weight == 50 and preferred.namespaces == {"streaming"}
    assert preferred.selects("streaming", {"app": "kafka"}, {})
    assert pod.spec.pod_affinity == () and pod.spec.preferred_anti_affinity == ()
    assert pod.spec.host_ports == ()  # containerPorts without hostPort take no host port
    assert pod_claims(ZK_POD) == (ClaimRef("data/data-zk-0"),)


def _term_pod(term, labels=None, kind="podAffinity"):
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels or {}},
            "spec": {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}}


def test_affinity_term_without_selector_matches_nothing_and_empty_namespace_selector_means_all():
    (term,) = pod_from_json(_term_pod({"topologyKey": "zone", "namespaceSelector": {}})).spec.pod_affinity
    assert term.selector is None and term.namespaces == frozenset()
    assert not term.selects("ns", {}, {})
    (term,) = pod_from_json(_term_pod({"topologyKey": "zone", "labelSelector": {},
                                       "namespaceSelector": {}})).spec.pod_affinity
    assert term.selects("anywhere", {"x": "y"}, {})


def test_affinity_namespace_selector_and_namespaces_are_a_union():
    raw = {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a"}}, "namespaces": ["one"],
           "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}}
    (term,) = pod_from_json(_term_pod(raw)).spec.pod_affinity
    assert term.namespaces == {"one"}
    labels = {"two": {"team": "ml"}, "three": {"team": "web"}}
    assert term.selects("one", {"app": "a"}, labels) and term.selects("two", {"app": "a"}, labels)
    assert not term.selects("three", {"app": "a"}, labels) and not term.selects("ns", {"app": "a"}, labels)


def test_match_and_mismatch_label_keys_merge_from_the_pods_labels():
    raw = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}},
           "matchLabelKeys": ["pod-template-hash", "absent"], "mismatchLabelKeys": ["tenant"]}
    pod = pod_from_json(_term_pod(raw, {"app": "web", "pod-template-hash": "abc", "tenant": "t1"}, "podAntiAffinity"))
    (term,) = pod.spec.pod_anti_affinity
    assert set(term.selector.match_expressions) == {Requirement("pod-template-hash", "In", ("abc",)),
                                                    Requirement("tenant", "NotIn", ("t1",))}
    assert term.selects("ns", {"app": "web", "pod-template-hash": "abc", "tenant": "t2"}, {})
    assert not term.selects("ns", {"app": "web", "pod-template-hash": "old", "tenant": "t2"}, {})
    assert not term.selects("ns", {"app": "web", "pod-template-hash": "abc", "tenant": "t1"}, {})


def test_label_keys_already_merged_by_the_api_server_are_not_repeated():
    merged = {"matchLabels": {"app": "web"},
              "matchExpressions": [{"key": "pod-template-hash", "operator": "In", "values": ["abc"]}]}
    raw = {"topologyKey": "zone", "labelSelector": merged, "matchLabelKeys": ["pod-template-hash"]}
    (term,) = pod_from_json(_term_pod(raw, {"app": "web", "pod-template-hash": "abc"})).spec.pod_affinity
    assert term.selector.match_expressions == (Requirement("pod-template-hash", "In", ("abc",)),)


WEB_POD = {  # a Deployment pod spread over zones (hard) and hosts (soft), as many charts write it
    "metadata": {"name": "web-7d9f-x2", "namespace": "shop", "labels": {"app": "web", "pod-template-hash": "7d9f"}},
    "spec": {
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app": "web"}}, "matchLabelKeys": ["pod-template-hash"]},
            {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": {"app": "web"}}, "minDomains": 3, "nodeAffinityPolicy": "Ignore",
             "nodeTaintsPolicy": "Honor"}],
        "containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}],
    },
}


def test_zone_spread_with_defaults_and_match_label_keys():
    zone, host = pod_from_json(WEB_POD).spec.spread
    assert (zone.max_skew, zone.topology_key, zone.hard) == (1, "topology.kubernetes.io/zone", True)
    assert (zone.min_domains, zone.node_affinity_policy, zone.node_taints_policy) == (1, "Honor", "Ignore")
    assert zone.selector.matches({"app": "web", "pod-template-hash": "7d9f"})
    assert not zone.selector.matches({"app": "web", "pod-template-hash": "old"})
    assert (host.hard, host.min_domains, host.node_affinity_policy, host.node_taints_policy) == (False, 3, "Ignore", "Honor")
    assert host.selector.matches({"app": "web", "pod-template-hash": "old"})


def test_spread_without_selector_counts_nothing():
    obj = {"metadata": {"name": "p"}, "spec": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "matchLabelKeys": ["a"]}]}}
    (spread,) = pod_from_json(obj).spec.spread
    assert spread.selector is None


def test_host_ports_of_containers_and_sidecars_with_defaults():
    spec = {"containers": [{"name": "a", "ports": [{"containerPort": 8080, "hostPort": 80},
                                                  {"containerPort": 53, "hostPort": 53, "protocol": "UDP",
                                                   "hostIP": "10.0.0.1"},
                                                  {"containerPort": 9090}]}],
            "initContainers": [{"name": "setup", "ports": [{"containerPort": 1, "hostPort": 1000}]},
                               {"name": "proxy", "restartPolicy": "Always",
                                "ports": [{"containerPort": 15001, "hostPort": 15001}]}]}
    ports = pod_from_json({"metadata": {"name": "p"}, "spec": spec}).spec.host_ports
    assert ports == (HostPort(80, "TCP", "0.0.0.0"), HostPort(53, "UDP", "10.0.0.1"), HostPort(15001))


def test_host_network_makes_every_container_port_a_host_port():
    spec = {"hostNetwork": True, "containers": [{"name": "a", "ports": [{"containerPort": 9100}]}]}
    assert pod_from_json({"metadata": {"name": "p"}, "spec": spec}).spec.host_ports == (HostPort(9100),)


def test_claims_of_persistent_and_generic_ephemeral_volumes():
    obj = {"metadata": {"name": "job-0", "namespace": "ml"},
           "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
                                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                                {"name": "tmp", "emptyDir": {}}]}}
    assert pod_claims(obj) == (ClaimRef("ml/shared"), ClaimRef("ml/job-0-scratch", ephemeral=True))


def _pod(spec, labels=None):
    return {"metadata": {"name": "bad", "namespace": "ns", "labels": labels or {}}, "spec": spec}


def _anti(term):
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


@pytest.mark.parametrize("obj, message", [
    (_pod({"affinity": "yes"}), r"pod ns/bad: spec.affinity must be an object"),
    (_pod({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"a": 1}}}}),
     r"podAffinity.requiredDuringSchedulingIgnoredDuringExecution must be a list"),
    (_pod(_anti({"labelSelector": {}})), r"\[0\].topologyKey must be a non-empty string"),
    (_pod(_anti({"topologyKey": "h", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]}})),
     r"labelSelector.matchExpressions\[0\].operator must be one of In, NotIn, Exists, DoesNotExist"),
    (_pod(_anti({"topologyKey": "h", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt",
                                                                              "values": ["1"]}]}})), "operator"),
    (_pod(_anti({"topologyKey": "h", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}})),
     "needs at least one value"),
    (_pod(_anti({"topologyKey": "h", "labelSelector": {"matchLabels": {"a": 1}}})), "matchLabels must map strings"),
    (_pod(_anti({"topologyKey": "h", "labelSelector": {}, "namespaces": "ns"})), r"namespaces must be a list"),
    (_pod({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 0, "podAffinityTerm": {"topologyKey": "h"}}]}}}), r"\[0\].weight must be 1-100"),
    (_pod({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": "high", "podAffinityTerm": {"topologyKey": "h"}}]}}}), r"weight must be an integer"),
    (_pod({"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]}),
     r"spec.topologySpreadConstraints\[0\]: .*maxSkew must be an integer >= 1"),
    (_pod({"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]}),
     r"topologySpreadConstraints\[0\].topologyKey must be a non-empty string"),
    (_pod({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "Sometimes"}]}),
     "whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway"),
    (_pod({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule",
                                          "nodeTaintsPolicy": "Maybe"}]}), "nodeTaintsPolicy must be Honor or Ignore"),
    (_pod({"topologySpreadConstraints": {"maxSkew": 1}}), "topologySpreadConstraints must be a list"),
    (_pod({"containers": [{"ports": [{"hostPort": 70000}]}]}), r"containers\[0\].ports\[0\].hostPort must be 1-65535"),
    (_pod({"containers": [{"ports": [{"hostPort": "80"}]}]}), r"hostPort must be an integer"),
    (_pod({"containers": [{"ports": [{"hostPort": 80, "protocol": "HTTP"}]}]}), "protocol must be TCP, UDP or SCTP"),
    (_pod({"containers": "nginx"}), "spec.containers must be a list"),
    (_pod({"containers": ["nginx"]}), r"spec.containers\[0\] must be an object"),
    (_pod({"tolerations": [{"operator": "Sometimes"}]}), r"spec.tolerations\[0\]: toleration operator"),
    (_pod({"nodeSelector": ["a"]}), "spec.nodeSelector must be an object"),
    (_pod({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near"}]}]}}}}), "operator must be one of"),
    (_pod({}, labels=["a"]), "metadata.labels must be an object"),
    (_pod("spec"), "spec must be an object"),
])
def test_malformed_pods_name_the_pod_and_the_field(obj, message):
    with pytest.raises(InvalidInput, match=message) as err:
        pod_from_json(obj)
    assert "bad" in str(err.value)


def test_malformed_volumes_name_the_field():
    with pytest.raises(InvalidInput, match=r"pod ns/bad: spec.volumes\[0\].persistentVolumeClaim.claimName"):
        pod_claims(_pod({"volumes": [{"name": "d", "persistentVolumeClaim": {}}]}))
    with pytest.raises(InvalidInput, match=r"spec.volumes must be a list"):
        pod_claims(_pod({"volumes": {"name": "d"}}))


# -- storage objects -----------------------------------------------------------------------------
def test_claim_volume_class_and_csinode():
    claim = claim_from_json({
        "metadata": {"name": "data-zk-0", "namespace": "data",
                     "ownerReferences": [{"kind": "Pod", "uid": "p1", "controller": True}]},
        "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOncePod"], "volumeName": "pv-1",
                 "resources": {"requests": {"storage": "8Gi"}}}})
    assert claim == ClaimInfo("data/data-zk-0", "fast", "pv-1", 8 * 2**30, frozenset({"ReadWriteOncePod"}), "p1")
    beta = claim_from_json({"metadata": {"name": "c", "annotations": {names.ANNOTATION_BETA_STORAGE_CLASS: "old"}},
                            "spec": {"storageClassName": "new"}})
    assert beta.storage_class == "old" and beta.name == "default/c" and beta.volume_name == ""
    pv = volume_from_json({
        "metadata": {"name": "local-1"},
        "spec": {"storageClassName": "local", "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
                 "claimRef": {"namespace": "data", "name": "data-zk-0"}, "csi": {"driver": "local.csi.k8s.io"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}},
        "status": {"phase": "Available"}})
    assert pv.phase == "Available" and pv.volume.claim_ref == "data/data-zk-0"
    assert pv.volume.capacity == 100 * 2**30 and pv.volume.csi_driver == "local.csi.k8s.io"
    assert pv.volume.node_affinity.matches({"kubernetes.io/hostname": "n1"})
    assert not pv.volume.node_affinity.matches({"kubernetes.io/hostname": "n2"})
    assert volume_from_json({"metadata": {"name": "nfs"}, "spec": {}}).volume.node_affinity is None
    wffc = storage_class_from_json({
        "metadata": {"name": "zonal"}, "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": names.LABEL_ZONE, "values": ["a", "b"]}]}]})
    assert wffc.delayed and wffc.dynamic and wffc.allowed_topologies.matches({names.LABEL_ZONE: "b"})
    static = storage_class_from_json({"metadata": {"name": "local"}, "provisioner": names.PROVISIONER_NONE})
    assert not static.delayed and not static.dynamic and static.allowed_topologies is None
    limits = csinode_limits({"metadata": {"name": "n1"}, "spec": {"drivers": [
        {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}},
        {"name": "nolimit.csi", "nodeID": "i-1"}]}})
    assert limits == {"ebs.csi.aws.com": 25}
    assert namespace_labels({"metadata": {"name": "ml", "labels": {"team": "ml"}}}) == {
        "team": "ml", names.LABEL_NAMESPACE_NAME: "ml"}


@pytest.mark.parametrize("convert, obj, message", [
    (claim_from_json, {"metadata": {"name": "c"}, "spec": {"accessModes": "ReadWriteOnce"}}, "spec.accessModes must be a list"),
    (claim_from_json, {"metadata": {"name": "c"}, "spec": {"resources": {"requests": {"storage": "lots"}}}},
     "unparsable quantity"),
    (volume_from_json, {"metadata": {"name": "v"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "Near"}]}]}}}}, "persistentvolume v: spec.nodeAffinity"),
    (storage_class_from_json, {"metadata": {"name": "s"}, "allowedTopologies": [{"matchLabelExpressions": [
        {"key": "zone"}]}]}, "needs at least one value"),
    (csinode_limits, {"metadata": {"name": "n"}, "spec": {"drivers": [{"name": "d", "allocatable": {"count": "9"}}]}},
     r"csinode n: spec.drivers\[0\].allocatable.count must be an integer"),
])
def test_malformed_storage_objects(convert, obj, message):
    with pytest.raises(InvalidInput, match=message):
        convert(obj)


# -- PodGroup spec and the placement record --------------------------------------------------------
def test_podgroup_spec():
    spec = podgroup_spec({"metadata": {"name": "pg"}, "spec": {
        "schedulingPolicy": {"gang": {"minCount": 4}}, "schedulingConstraints": {"topology": [{"key": "rack"}]},
        "disruptionMode": {"all": {}}, "priorityClassName": "high"}})
    assert spec == GroupSpec(Policy.GANG, 4, "rack", DisruptionMode.ALL, "high", None)
    assert podgroup_spec({"metadata": {"name": "pg"}}) == GroupSpec()
    with pytest.raises(InvalidInput, match="schedulingPolicy.gang.minCount must be an integer"):
        podgroup_spec({"metadata": {"name": "pg"}, "spec": {"schedulingPolicy": {"gang": {"minCount": "4"}}}})
    with pytest.raises(InvalidInput, match="spec.schedulingPolicy must be an object"):
        podgroup_spec({"metadata": {"name": "pg"}, "spec": {"schedulingPolicy": "gang"}})


def test_placement_record_round_trip_and_bad_records():
    text = placement_text("rack-1", {"db-0": "n1", "db-1": "n2"})
    assert placement_record(text) == PlacementRecord("rack-1", {"db-0": "n1", "db-1": "n2"})
    assert placement_domain(text) == "rack-1"
    assert placement_record("") is None and placement_domain("") == ""
    for raw in ("{not json", "[1]", '{"domain": "r"}', '{"pods": {"a": 1}}'):
        with pytest.raises(InvalidInput, match="placement record"):
            placement_record(raw)
    assert placement_domain('{"domain": "r"}') == "r"
    assert placement_domain("[1]") == ""


def test_the_record_carries_its_format_and_every_format_with_domain_and_pods_is_read():
    """Upgrades and rollbacks: a record written before the format was versioned, by this version
    and by a later one (which only adds fields) all read the same; a later record without pods is
    refused saying it is newer."""
    text = placement_text("r1", {"a": "n1"})
    assert json.loads(text)["format"] == RECORD_FORMAT == 1
    expected = PlacementRecord("r1", {"a": "n1"})
    before = '{"domain":"r1","pods":{"a":"n1"}}'  # what phalanx wrote before the format was versioned
    later = '{"format":2,"domain":"r1","pods":{"a":"n1"},"devices":{"a":["gpu-0"]}}'
    assert placement_record(before) == placement_record(text) == placement_record(later) == expected
    with pytest.raises(InvalidInput, match="format 3, written by a later phalanx"):
        placement_record('{"format":3,"placements":[]}')
    for bad in ('"1"', "0", "true", "1.5"):
        with pytest.raises(InvalidInput, match="format must be a positive integer"):
            placement_record('{"format":%s,"domain":"r1","pods":{}}' % bad)


def test_a_podgroups_record_is_its_placement_condition_else_the_annotation():
    def record(annotation=None, condition=None):
        obj = {"metadata": {"name": "pg", "annotations": {names.ANNOTATION_PLACEMENT: annotation} if annotation else {}},
               "status": {"conditions": [{"type": names.CONDITION_PLACEMENT, "status": condition[0],
                                          "reason": "R", "message": condition[1]}] if condition else []}}
        return podgroup_record(obj).placement
    new, old = placement_text("r1", {"a": "n1"}), placement_text("r0", {"a": "n0"})
    assert record(condition=("True", new)) == new
    assert record(annotation=old, condition=("True", new)) == new  # an earlier version's, superseded
    assert record(annotation=old) == old  # an earlier version's record is still read
    assert record(annotation=old, condition=("False", "")) == old  # on the annotation
    assert record(condition=("False", "abandoned")) == ""
    assert record() == ""


def test_placement_preference_annotation_defaults_to_pack_and_rejects_unknown_values():
    from cluster.convert import podgroup_from_json
    from solver import InvalidInput

    def group(annotations):
        return {"metadata": {"name": "db", "namespace": "x", "annotations": annotations},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}

    assert podgroup_from_json(group({})).default_preference == "pack"
    assert podgroup_from_json(group({"scheduling.phalanx.dev/placement-preference": "Spread"})).default_preference == "spread"
    with pytest.raises(InvalidInput, match="placement-preference must be one of pack, spread"):
        podgroup_from_json(group({"scheduling.phalanx.dev/placement-preference": "sideways"}))


def test_pods_with_equal_specs_share_one_spec_object_and_a_difference_keeps_its_own():
    import copy
    import gc

    from cluster import convert

    base = {"metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
            "spec": {"priority": 5, "tolerations": [{"key": "k", "operator": "Exists"}],
                     "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    other = copy.deepcopy(base)
    other["metadata"].update(name="b", uid="u2")
    first, second = convert.pod_from_json(base), convert.pod_from_json(other)
    assert first.spec is second.spec and first.uid != second.uid
    higher = copy.deepcopy(other)
    higher["spec"]["priority"] = 6  # not part of the shape, yet a different spec
    assert convert.pod_from_json(higher).spec is not first.spec
    assert convert.pod_from_json(higher).spec == convert.pod_from_json(higher).spec
    key = (first.spec.shape_key, first.spec.priority, first.spec.host_ports)
    del first, second
    gc.collect()
    assert key not in convert._SPECS  # held weakly: gone with its last pod
