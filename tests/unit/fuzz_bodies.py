"""Hypothesis strategies for kube-scheduler-shaped extender requests, then corrupted.

A body is built the way kube-scheduler sends it — ``ExtenderArgs`` (filter, prioritize),
``ExtenderPreemptionArgs`` (preempt), ``ExtenderBindingArgs`` (bind) — around realistic Pods
(containers with resources and ports, initContainers and sidecars, overhead, tolerations, node
and pod (anti-)affinity, topologySpreadConstraints, volumes, schedulingGroup, labels) and Nodes.
Then a few nested values are corrupted: a wrong type, a missing key, a huge number, unicode, a
list where an object goes or an object where a list goes. Built from pools of valid fragments
(cheap to draw), so tens of thousands of cases stay within the fuzz tests' time budget.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from cluster import names

GROUP = "g"  # the PodGroup the fuzz cluster holds (members g-0, g-1)
NODES = ("n0", "n1", "n2")

LABELS = st.sampled_from(({}, {"app": "db"}, {"app": "web", "tier": "a"}, {"team": "", names.LABEL_ZONE: "z0"},
                         {names.LABEL_HOSTNAME: "n0", "app": "db", "tier": "b"}))
TOPOLOGY_KEYS = (names.LABEL_HOSTNAME, names.LABEL_ZONE, names.LABEL_RACK, "example.com/none")

# every corruption replaces a value with one of these (or wraps, unwraps, deletes it)
BAD_VALUES = (
    None, True, False, 0, -1, 1.5, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 + 1, 10**30, 1e300, -1e300,
    "", "x", "-1", "1e400", "9" * 40, "99999999999999999999Ei", "NaN", "Infinity", "0x10", "1/2",
    "ｃｐｕ", "１２", "😀" * 4, "\u202e1Gi", "\x00", "a\nb", "\ud7ff\ue000", "Ω" * 64,
    [], {}, [{}], [None], {"": None}, {"😀": [1, {"x": "y"}]}, [[[]]], {"metadata": {"name": 7}},
)
CORRUPTIONS = ("replace", "delete", "wrap-in-list", "unwrap", "unicode-key")


def _variants(*options: Any) -> list:
    """Every combination of ``options`` (each a list of (key, value) choices, value None = absent)
    as dicts: the valid fragments a pod is assembled from."""
    out: list[dict] = [{}]
    for choices in options:
        out = [{**d, **({k: v} if v is not None else {})} for d in out for k, v in choices]
    return out


def _cycle(pool: list, n: int, step: int = 7) -> list:
    """``n`` members of ``pool`` spread over it (a deterministic thinning of a big product)."""
    return [pool[(i * step) % len(pool)] for i in range(min(n, len(pool)))]


AMOUNTS = [{}, {"cpu": "100m"}, {"cpu": "2.5", "memory": "1Gi"}, {"nvidia.com/gpu": "4", "cpu": "1"},
           {"memory": "128Mi", "ephemeral-storage": "1e3"}, {"hugepages-2Mi": "1.5Ki", "example.com/foo": "0"},
           {"cpu": "500000n", "memory": "4G", "nvidia.com/gpu": "1"}]
PORTS = [[], [{"containerPort": 80}], [{"containerPort": 8080, "hostPort": 8080, "protocol": "TCP"}],
         [{"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"},
          {"containerPort": 65535, "hostPort": 65535, "protocol": "SCTP", "hostIP": "0.0.0.0"}]]
CONTAINERS = _cycle(_variants(
    [("name", "main"), ("name", "side")], [("image", "registry.example/app:1")],
    [("resources", None)] + [("resources", {"requests": a}) for a in AMOUNTS]
    + [("resources", {"requests": a, "limits": b}) for a, b in zip(AMOUNTS[:-1], AMOUNTS[1:], strict=True)]
    + [("resources", {"requests": AMOUNTS[3], "claims": [{"name": "gpu"}]})],
    [("ports", p) for p in PORTS] + [("ports", None)],
), 60)
INIT_CONTAINERS = [dict(c, name="init") for c in CONTAINERS[:8]] + [
    dict(c, name="sidecar", restartPolicy="Always") for c in CONTAINERS[8:14]]  # restartPolicy: a sidecar

SELECTORS = [{}, {"matchLabels": {"app": "db"}}, {"matchLabels": {"app": "web", "tier": "a"}},
             {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
             {"matchExpressions": [{"key": "app", "operator": "Exists"},
                                   {"key": "team", "operator": "NotIn", "values": ["x"]}]},
             {"matchLabels": {"app": "db"}, "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
             {"matchExpressions": [{"key": "app", "operator": "Bogus", "values": []}]}]
NODE_TERMS = [
    {"matchExpressions": [{"key": names.LABEL_ZONE, "operator": "In", "values": ["z0"]}]},
    {"matchExpressions": [{"key": names.LABEL_RACK, "operator": "NotIn", "values": ["r1"]},
                          {"key": "gpu-count", "operator": "Gt", "values": ["3"]}]},
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0", "n1"]}]},
    {"matchExpressions": [{"key": "gpu-count", "operator": "Lt", "values": ["10"]}],
     "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]},
    {"matchExpressions": [{"key": names.LABEL_ZONE, "operator": "Exists"}]}, {},
]
POD_TERMS = _cycle(_variants(
    [("topologyKey", k) for k in TOPOLOGY_KEYS],
    [("labelSelector", sel) for sel in SELECTORS] + [("labelSelector", None)],
    [("namespaces", None), ("namespaces", ["default"]), ("namespaces", ["default", "other"])],
    [("namespaceSelector", None), ("namespaceSelector", {}), ("namespaceSelector", SELECTORS[1])],
    [("matchLabelKeys", None), ("matchLabelKeys", ["app"]), ("mismatchLabelKeys", ["tier"])],
), 40, 11)
POD_RULES = [
    {"requiredDuringSchedulingIgnoredDuringExecution": [POD_TERMS[i]]} for i in range(0, 12, 2)] + [
    {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1 + 7 * i, "podAffinityTerm": POD_TERMS[i]}]}
    for i in range(1, 12, 3)] + [
    {"requiredDuringSchedulingIgnoredDuringExecution": POD_TERMS[20:22],
     "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": POD_TERMS[30]}]}, {}]
NODE_AFFINITIES = [
    {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [NODE_TERMS[i]]}} for i in range(5)] + [
    {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": NODE_TERMS[1:3]},
     "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 30, "preference": NODE_TERMS[0]},
                                                         {"weight": 70, "preference": NODE_TERMS[3]}]}, {}]
SPREADS = _cycle(_variants(
    [("maxSkew", 1), ("maxSkew", 3)], [("topologyKey", k) for k in TOPOLOGY_KEYS],
    [("whenUnsatisfiable", "DoNotSchedule"), ("whenUnsatisfiable", "ScheduleAnyway")],
    [("labelSelector", sel) for sel in SELECTORS[:4]] + [("labelSelector", None)],
    [("minDomains", None), ("minDomains", 2)],
    [("nodeAffinityPolicy", None), ("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore"),
     ("matchLabelKeys", ["app"])],
), 30, 13)


TOLERATIONS = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute", "tolerationSeconds": 300},
    {"operator": "Exists"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
VOLUMES = (
    {"name": "data", "persistentVolumeClaim": {"claimName": "data-g-0"}},
    {"name": "ro", "persistentVolumeClaim": {"claimName": "shared", "readOnly": True}},
    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "local",
        "resources": {"requests": {"storage": "1Gi"}}}}}},
    {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
    {"name": "cfg", "configMap": {"name": "cfg"}},
    {"name": "host", "hostPath": {"path": "/var/data", "type": "Directory"}},
    {"name": "gpu", "csi": {"driver": "csi.example.com", "volumeAttributes": {"a": "b"}}},
)


def pods(uid: str) -> st.SearchStrategy[dict]:
    """A Pod as kube-scheduler sends it: ``uid`` (or another), mostly a member of :data:`GROUP`."""
    affinity = st.fixed_dictionaries({}, optional={
        "nodeAffinity": st.sampled_from(NODE_AFFINITIES), "podAffinity": st.sampled_from(POD_RULES),
        "podAntiAffinity": st.sampled_from(POD_RULES)})
    spec = st.fixed_dictionaries(
        {"containers": st.lists(st.sampled_from(CONTAINERS), min_size=1, max_size=3)},
        optional={
            "initContainers": st.lists(st.sampled_from(INIT_CONTAINERS), max_size=2),
            "overhead": st.sampled_from(AMOUNTS),
            "tolerations": st.lists(st.sampled_from(TOLERATIONS), max_size=3),
            "nodeSelector": st.sampled_from(({names.LABEL_ZONE: "z0"}, {names.LABEL_RACK: "r1"}, {})),
            "affinity": affinity,
            "topologySpreadConstraints": st.lists(st.sampled_from(SPREADS), max_size=2),
            "volumes": st.lists(st.sampled_from(VOLUMES), max_size=3),
            "schedulingGroup": st.sampled_from(({"podGroupName": GROUP}, {"podGroupName": "other"},
                                                {"podGroupName": ""})),
            "priority": st.sampled_from((0, 1000, -(2**31), 2**31 - 1)),
            "priorityClassName": st.sampled_from(("", "high", "system-node-critical")),
            "preemptionPolicy": st.sampled_from(("PreemptLowerPriority", "Never")),
            "nodeName": st.sampled_from(("", "n1")),
            "schedulingGates": st.just([{"name": names.GATE_PODGROUP_SYNC}]),
            "resourceClaims": st.just([{"name": "gpu", "resourceClaimName": "gpu-claim"}]),
        })
    meta = st.fixed_dictionaries(
        {"name": st.sampled_from(("g-0", "g-1", "loner", "x-very-long-name-" + "a" * 40)),
         "namespace": st.sampled_from(("default", "default", "other")),
         "uid": st.sampled_from((uid, uid, "u-other"))},
        optional={"labels": LABELS, "annotations": st.just({names.ANNOTATION_RETRY: "2026-01-01T00:00:00Z"}),
                  "ownerReferences": st.just([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": GROUP,
                                               "uid": "sts-uid", "controller": True}]),
                  "resourceVersion": st.just("12")})
    status = st.fixed_dictionaries({"phase": st.sampled_from(("Pending", "Running", "Failed"))})
    return st.fixed_dictionaries({"apiVersion": st.just("v1"), "kind": st.just("Pod"), "metadata": meta,
                                  "spec": spec}, optional={"status": status})


def nodes() -> st.SearchStrategy[dict]:
    allocatable = st.dictionaries(st.sampled_from(("cpu", "memory", "pods", "nvidia.com/gpu")),
                                  st.sampled_from(("4", "64", "110", "512Gi", "0")), min_size=1, max_size=4)
    taint = st.fixed_dictionaries({"key": st.sampled_from(("k", "nvidia.com/gpu")),
                                   "effect": st.sampled_from(("NoSchedule", "NoExecute", "PreferNoSchedule"))},
                                  optional={"value": st.just("v")})
    return st.fixed_dictionaries(
        {"apiVersion": st.just("v1"), "kind": st.just("Node"),
         "metadata": st.fixed_dictionaries({"name": st.sampled_from(NODES)}, optional={"labels": LABELS}),
         "status": st.fixed_dictionaries({"allocatable": allocatable})},
        optional={"spec": st.fixed_dictionaries({}, optional={"taints": st.lists(taint, max_size=2),
                                                              "unschedulable": st.booleans()})})


def extender_args(uid: str) -> st.SearchStrategy[dict]:
    """``ExtenderArgs``: with ``nodeCacheCapable`` NodeNames, else a NodeList (or, wrongly, both)."""
    names_only = st.fixed_dictionaries({"Pod": pods(uid), "Nodes": st.none(),
                                        "NodeNames": st.lists(st.sampled_from(NODES + ("gone",)), max_size=4)})
    node_list = st.fixed_dictionaries({"Pod": pods(uid), "NodeNames": st.none(), "Nodes": st.fixed_dictionaries(
        {"metadata": st.just({}), "items": st.lists(nodes(), max_size=3)})})
    return st.one_of(names_only, node_list)


def preemption_args(uid: str) -> st.SearchStrategy[dict]:
    """``ExtenderPreemptionArgs``: victims as full pods or (nodeCacheCapable) as UIDs."""
    meta_victims = st.dictionaries(st.sampled_from(NODES), st.fixed_dictionaries({
        "Pods": st.lists(st.fixed_dictionaries({"UID": st.sampled_from(("a", uid, "u-other"))}), max_size=3),
        "NumPDBViolations": st.integers(0, 3)}), max_size=3)
    victims = st.dictionaries(st.sampled_from(NODES), st.fixed_dictionaries({
        "Pods": st.lists(pods("victim"), max_size=1), "NumPDBViolations": st.integers(0, 3)}), max_size=2)
    return st.one_of(
        st.fixed_dictionaries({"Pod": pods(uid), "NodeNameToVictims": st.none(),
                               "NodeNameToMetaVictims": meta_victims}),
        st.fixed_dictionaries({"Pod": pods(uid), "NodeNameToVictims": victims,
                               "NodeNameToMetaVictims": st.none()}))


def binding_args(uid: str) -> st.SearchStrategy[dict]:
    """``ExtenderBindingArgs``: pods of the fuzz cluster (never bindable: gang members without a
    plan) or unknown ones."""
    return st.fixed_dictionaries({
        "PodName": st.sampled_from(("g-0", "g-1", "nope")), "PodNamespace": st.sampled_from(("default", "other")),
        "PodUID": st.sampled_from((uid, "u-other")), "Node": st.sampled_from(NODES + ("gone",))})


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, prefix + (i,))
    return found


def _corrupt(body: Any, path: tuple, how: str, bad: Any) -> Any:
    if not path:
        return bad if how == "replace" else [body] if how == "wrap-in-list" else body
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    last, value = path[-1], parent[path[-1]]
    if how == "delete":
        del parent[last]
    elif how == "wrap-in-list":
        parent[last] = [value]
    elif how == "unwrap":  # an object where a list goes, or a list's element in its place
        parent[last] = value[0] if isinstance(value, list) and value else {"0": value}
    elif how == "unicode-key" and isinstance(value, dict):
        value["ｋｅｙ😀\u0301"] = bad
    else:
        parent[last] = bad
    return body


@st.composite
def corrupted(draw, valid: st.SearchStrategy[dict], most: int = 3) -> Any:
    """A body from ``valid`` with up to ``most`` nested values corrupted (sometimes none)."""
    body = copy.deepcopy(draw(valid))
    for _ in range(draw(st.integers(0, most))):
        paths = _paths(body)
        path = paths[draw(st.integers(0, len(paths) - 1))]
        bad = copy.deepcopy(draw(st.sampled_from(BAD_VALUES)))  # the pool stays as it is
        body = _corrupt(body, path, draw(st.sampled_from(CORRUPTIONS)), bad)
    return body
