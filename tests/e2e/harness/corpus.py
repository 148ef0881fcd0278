"""A corpus of workload shapes as public Helm charts write them, for the side-by-side e2e run of
phalanx and upstream's in-tree gang scheduling (``tests/e2e/test_corpus.py``).

Each ``Case`` is one StatefulSet with its chart's usual constraints (pod anti-affinity, topology
spread, host ports, node affinity to a pool, extended resources, claim templates), the nodes it is
placed on, and the storage it needs. The same case is built twice:

- **phalanx**: the StatefulSet carries ``scheduling.phalanx.dev/scheduling`` (gang); phalanx's
  controller and webhooks make the Workload and PodGroup and stamp the pods;
- **in-tree**: no released StatefulSet controller makes a Workload or PodGroup, so the user
  creates them (``in_tree_group``) and the pod template names the PodGroup
  (``spec.schedulingGroup.podGroupName``); everything else is the same object.

``hard_violations`` checks every hard constraint on the bound result from API objects alone;
``soft_metrics`` measures the soft ones (distinct nodes, skew of ScheduleAnyway spread).
All charts' pods use ``podManagementPolicy: Parallel`` (KEP-6277: a gang needs it).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .nodes import GPU, RACK, ZONE
from .objects import podgroup, podgroup_template, statefulset, workload

HOSTNAME = "kubernetes.io/hostname"
NODE_POOL = "cloud.google.com/gke-nodepool"
GANG = {"schedulingPolicy": {"gang": {}}}
NO_PROVISIONER = "kubernetes.io/no-provisioner"


# --- constraint builders (as the charts render them) ------------------------------------------

def _selector(app: str) -> dict:
    return {"matchLabels": {"app": app}}


def anti_affinity(app: str, required: bool, key: str = HOSTNAME, weight: int = 1) -> dict:
    """Bitnami's ``podAntiAffinityPreset``: hard = required, soft = preferred with ``weight``."""
    term = {"labelSelector": _selector(app), "topologyKey": key}
    if required:
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": weight, "podAffinityTerm": term}]}}


def pod_affinity_required(app: str, key: str) -> dict:
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": _selector(app), "topologyKey": key}]}}


def node_affinity_required(key: str, values: list[str]) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]}}}


def spread(app: str, key: str, max_skew: int, when: str) -> dict:
    return {"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when, "labelSelector": _selector(app)}


# --- storage -----------------------------------------------------------------------------------

def storage_class(name: str, binding_mode: str) -> dict:
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": NO_PROVISIONER, "volumeBindingMode": binding_mode, "reclaimPolicy": "Retain"}


def persistent_volume(name: str, storage_class_name: str, size: str, node: str | None) -> dict:
    """A static PV: ``local`` with node affinity to ``node``, or (node None) an NFS export any
    node can mount."""
    spec: dict[str, Any] = {
        "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": storage_class_name,
    }
    if node is None:
        spec["nfs"] = {"server": "10.0.0.2", "path": f"/exports/{name}"}
    else:
        spec["local"] = {"path": f"/mnt/disks/{name}"}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}]}}
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


# --- cases -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Storage:
    """The claim template's storage: ``binding`` Immediate (NFS PVs, one per replica) or
    WaitForFirstConsumer (local PVs on the nodes ``pv_nodes`` by index)."""
    binding: str
    size: str
    pv_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str            # the StatefulSet's name, also the pytest id
    title: str           # the table's row label
    short: str           # node name prefix
    replicas: int
    requests: Mapping[str, str | int]
    nodes: tuple[tuple[str, Mapping[str, Any]], ...]  # (name suffix, create_node kwargs)
    pod: Callable[[str], Mapping[str, Any]] = lambda app: {}  # extra pod spec fields
    host_port: int | None = None
    storage: Storage | None = None
    soft_anti_affinity: bool = False          # compare distinct nodes with in-tree
    soft_spread_key: str | None = None        # compare ScheduleAnyway skew over this key with in-tree

    def node_names(self, prefix: str) -> list[str]:
        return [f"{prefix}-{self.short}-{suffix}" for suffix, _ in self.nodes]

    def statefulset(self, namespace: str, scheduler_name: str, storage_class_name: str | None,
                    podgroup_name: str | None) -> dict:
        """The chart's StatefulSet. ``podgroup_name`` None: phalanx's annotation (the product
        path); else the template names that PodGroup (the in-tree path)."""
        sts = statefulset(self.name, self.replicas, requests=self.requests, namespace=namespace,
                          scheduling=GANG if podgroup_name is None else None, scheduler_name=scheduler_name)
        spec = sts["spec"]["template"]["spec"]
        spec.update(json.loads(json.dumps(self.pod(self.name))))
        container = spec["containers"][0]
        if self.host_port:
            container["ports"] = [{"name": "rendezvous", "containerPort": self.host_port,
                                   "hostPort": self.host_port, "protocol": "TCP"}]
        if podgroup_name is not None:
            spec["schedulingGroup"] = {"podGroupName": podgroup_name}
        if self.storage:
            container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
            sts["spec"]["volumeClaimTemplates"] = [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class_name,
                         "resources": {"requests": {"storage": self.storage.size}}}}]
        return sts

    def persistent_volumes(self, prefix: str, storage_class_name: str, pv_prefix: str) -> list[dict]:
        """The static PVs (named ``<pv_prefix>-pv<i>``) for nodes named with ``prefix``."""
        if not self.storage:
            return []
        if self.storage.binding == "Immediate":
            return [persistent_volume(f"{pv_prefix}-pv{i}", storage_class_name, self.storage.size, None)
                    for i in range(self.replicas)]
        names = self.node_names(prefix)
        return [persistent_volume(f"{pv_prefix}-pv{i}", storage_class_name, self.storage.size, names[i])
                for i in self.storage.pv_nodes]


def in_tree_group(case: Case, namespace: str) -> list[dict]:
    """What the user creates for in-tree gang scheduling: a Workload and its gang PodGroup
    (minCount = replicas), as phalanx's controller would."""
    return [
        workload(case.name, [podgroup_template(case.name, min_count=case.replicas)],
                 controller_ref={"apiGroup": "apps", "kind": "StatefulSet", "name": case.name},
                 namespace=namespace),
        podgroup(case.name, min_count=case.replicas, workload_name=case.name, template_name=case.name,
                 namespace=namespace),
    ]


def _n(count: int, prefix: str, **kwargs: Any) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    return tuple((f"{prefix}{i}", kwargs) for i in range(count))


GPU_TAINT = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
GPU_TOLERATION = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]

CASES: tuple[Case, ...] = (
    # bitnami/zookeeper with podAntiAffinityPreset=hard; persistence on (NFS-like storage)
    Case("zookeeper", "ZooKeeper (3, required anti-affinity, PVCs)", "zk", 3, {"cpu": "1", "memory": "2Gi"},
         _n(4, "n", cpu="8", zone="z1"), pod=lambda app: {"affinity": anti_affinity(app, required=True)},
         storage=Storage("Immediate", "8Gi")),
    # bitnami/etcd: podAntiAffinityPreset soft (weight 1)
    Case("etcd", "etcd (3, soft anti-affinity)", "etcd", 3, {"cpu": "1", "memory": "1Gi"},
         _n(4, "n", cpu="8", zone="z1"), pod=lambda app: {"affinity": anti_affinity(app, required=False)},
         soft_anti_affinity=True),
    # bitnami/kafka: soft anti-affinity + zone spread ScheduleAnyway
    Case("kafka", "Kafka (3, soft anti-affinity, zone spread ScheduleAnyway)", "kafka", 3,
         {"cpu": "2", "memory": "4Gi"},
         _n(3, "a", cpu="8", zone="za") + _n(2, "b", cpu="8", zone="zb") + _n(1, "c", cpu="8", zone="zc"),
         pod=lambda app: {"affinity": anti_affinity(app, required=False),
                          "topologySpreadConstraints": [spread(app, ZONE, 1, "ScheduleAnyway")]},
         soft_anti_affinity=True, soft_spread_key=ZONE),
    # cockroachdb/cockroachdb: preferred anti-affinity weight 100 + zone spread DoNotSchedule
    Case("cockroachdb", "CockroachDB (5, preferred anti-affinity 100, zone spread DoNotSchedule)", "crdb", 5,
         {"cpu": "2", "memory": "8Gi"},
         _n(3, "a", cpu="8", zone="za") + _n(2, "b", cpu="8", zone="zb") + _n(1, "c", cpu="8", zone="zc"),
         pod=lambda app: {"affinity": anti_affinity(app, required=False, weight=100),
                          "topologySpreadConstraints": [spread(app, ZONE, 1, "DoNotSchedule")]},
         soft_anti_affinity=True),
    # bitnami/cassandra with podAntiAffinityPreset=hard
    Case("cassandra", "Cassandra (3, required anti-affinity)", "cass", 3, {"cpu": "2", "memory": "4Gi"},
         _n(2, "big", cpu="16", memory="64Gi", zone="z1") + _n(3, "small", cpu="4", memory="16Gi", zone="z1"),
         pod=lambda app: {"affinity": anti_affinity(app, required=True)}),
    # bitnami/redis-cluster: 6 nodes (3 primaries + 3 replicas), soft anti-affinity
    Case("redis-cluster", "Redis cluster (6, soft anti-affinity)", "redis", 6, {"cpu": "1", "memory": "1Gi"},
         _n(4, "n", cpu="8", zone="z1"), pod=lambda app: {"affinity": anti_affinity(app, required=False)},
         soft_anti_affinity=True),
    # training workers (WorkloadWithJob is off in this control plane: a StatefulSet of workers):
    # a rendezvous hostPort, all workers in one rack by required pod affinity on the rack label
    Case("trainer", "Training workers (4, hostPort, required pod affinity on rack)", "train", 4,
         {"cpu": "2", "memory": "8Gi"},
         _n(3, "ra", cpu="4", memory="16Gi", zone="z1", rack="ra")
         + _n(4, "rb", cpu="16", memory="64Gi", zone="z1", rack="rb"),
         pod=lambda app: {"affinity": pod_affinity_required(app, RACK)}, host_port=29500),
    # GPU inference: 2 GPUs per shard, required node affinity to the inference pool, GPU taint
    Case("inference", "GPU inference (4 x 2 GPUs, required node affinity to a pool)", "gpu", 4,
         {"cpu": "4", "memory": "16Gi", GPU: 2},
         _n(3, "inf", cpu="32", memory="128Gi", gpu=4, zone="z1", labels={NODE_POOL: "inference"}, taints=GPU_TAINT)
         + _n(2, "trn", cpu="32", memory="128Gi", gpu=8, zone="z1", labels={NODE_POOL: "training"},
              taints=GPU_TAINT)
         + _n(2, "cpu", cpu="32", memory="128Gi", zone="z1", labels={NODE_POOL: "default"}),
         pod=lambda app: {"affinity": node_affinity_required(NODE_POOL, ["inference"]),
                          "tolerations": GPU_TOLERATION}),
    # e.g. MinIO distributed on local disks: WaitForFirstConsumer claims, static local PVs on 4 of 8 nodes
    Case("local-volumes", "Local PVs (4, WaitForFirstConsumer, PVs on 4 of 8 nodes)", "lv", 4,
         {"cpu": "1", "memory": "2Gi"}, _n(8, "n", cpu="4", zone="z1"),
         storage=Storage("WaitForFirstConsumer", "10Gi", pv_nodes=(1, 2, 5, 6))),
)


# --- checks on the bound result ----------------------------------------------------------------

def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _node_term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    return _selector_matches({"matchExpressions": term.get("matchExpressions") or []}, labels)


def _node_affinity_ok(node_selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    terms = (node_selector or {}).get("nodeSelectorTerms") or []
    return not terms or any(_node_term_matches(t, labels) for t in terms)


def _quantity(text: str | int) -> float:
    text = str(text)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


@dataclass
class Result:
    """The bound state of one case, read back from the API server."""
    pods: list[dict]
    nodes: dict[str, dict]                     # node name -> Node
    claims: dict[str, dict] = field(default_factory=dict)   # PVC name -> PVC
    volumes: dict[str, dict] = field(default_factory=dict)  # PV name -> PV

    def bound(self) -> list[dict]:
        return [p for p in self.pods if p["spec"].get("nodeName")]

    def labels(self, pod: dict) -> Mapping[str, str]:
        return self.nodes.get(pod["spec"]["nodeName"], {}).get("metadata", {}).get("labels") or {}


def hard_violations(result: Result) -> list[str]:
    """Every hard constraint of the bound pods, checked from the objects: required (anti-)affinity,
    DoNotSchedule spread, host ports, node affinity, nodeSelector and taints, capacity, and each
    claim bound (by the PV controller) to a PV whose node affinity the pod's node meets."""
    out: list[str] = []
    bound = result.bound()
    by_node: dict[str, list[dict]] = defaultdict(list)
    for p in bound:
        if p["spec"]["nodeName"] not in result.nodes:
            out.append(f"{p['metadata']['name']}: bound to unknown node {p['spec']['nodeName']}")
            continue
        by_node[p["spec"]["nodeName"]].append(p)
        out += _pod_affinity_violations(result, p, bound)
        out += _node_choice_violations(result, p)
        out += _volume_violations(result, p)
    for constraint in _constraints(bound, "DoNotSchedule"):
        skew = spread_skew(result, constraint)
        if skew is not None and skew > constraint["maxSkew"]:
            out.append(f"spread over {constraint['topologyKey']}: skew {skew} > maxSkew {constraint['maxSkew']}")
    for node_name, members in by_node.items():
        out += _node_violations(node_name, result.nodes[node_name], members)
    return out


def _pod_labels(pod: dict) -> Mapping[str, str]:
    return pod["metadata"].get("labels") or {}


def _pod_affinity_violations(result: Result, pod: dict, bound: list[dict]) -> list[str]:
    out: list[str] = []
    name, labels = pod["metadata"]["name"], result.labels(pod)
    affinity = pod["spec"].get("affinity") or {}
    for term in (affinity.get("podAntiAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        key = term["topologyKey"]
        clash = [q["metadata"]["name"] for q in bound
                 if q is not pod and _selector_matches(term["labelSelector"], _pod_labels(q))
                 and key in labels and result.labels(q).get(key) == labels[key]]
        if clash:
            out.append(f"{name}: required anti-affinity on {key} broken by {clash} ({labels.get(key)})")
    for term in (affinity.get("podAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        key = term["topologyKey"]
        domains = {result.labels(q).get(key) for q in bound if _selector_matches(term["labelSelector"], _pod_labels(q))}
        if len(domains) > 1 or None in domains:
            out.append(f"{name}: required pod affinity on {key}: matching pods in {sorted(map(str, domains))}")
    return out


def _tolerated(taint: Mapping[str, Any], tolerations: list[dict]) -> bool:
    return any(t.get("key") in (None, "", taint["key"])
               and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
               and t.get("effect") in (None, "", taint.get("effect"))
               for t in tolerations)


def _node_choice_violations(result: Result, pod: dict) -> list[str]:
    out: list[str] = []
    name, node_name, spec = pod["metadata"]["name"], pod["spec"]["nodeName"], pod["spec"]
    labels = result.labels(pod)
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not _node_affinity_ok(required, labels):
        out.append(f"{name}: node {node_name} outside its required node affinity")
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        out.append(f"{name}: node {node_name} does not match its nodeSelector")
    for taint in result.nodes[node_name].get("spec", {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, spec.get("tolerations") or []):
            out.append(f"{name}: node {node_name} has untolerated taint {taint['key']}")
    return out


def _volume_violations(result: Result, pod: dict) -> list[str]:
    out: list[str] = []
    name, node_name = pod["metadata"]["name"], pod["spec"]["nodeName"]
    for volume in pod["spec"].get("volumes") or []:
        claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if not claim_name:
            continue
        claim = result.claims.get(claim_name) or {}
        pv = result.volumes.get(claim.get("spec", {}).get("volumeName") or "")
        phase = claim.get("status", {}).get("phase")
        if pv is None or phase != "Bound":
            out.append(f"{name}: claim {claim_name} not bound to a PV ({phase})")
            continue
        if (pv["spec"].get("claimRef") or {}).get("uid") != claim["metadata"]["uid"]:
            out.append(f"{name}: PV {pv['metadata']['name']} does not point back at claim {claim_name}")
        if not _node_affinity_ok((pv["spec"].get("nodeAffinity") or {}).get("required"), result.labels(pod)):
            out.append(f"{name}: on {node_name}, but its PV {pv['metadata']['name']} is on another node")
    return out


def _node_violations(node_name: str, node: dict, members: list[dict]) -> list[str]:
    """No hostPort twice on a node; requests within allocatable."""
    out: list[str] = []
    ports = Counter((port.get("hostIP") or "0.0.0.0", port.get("protocol") or "TCP", port["hostPort"])
                    for p in members for c in p["spec"]["containers"] for port in c.get("ports") or []
                    if port.get("hostPort"))
    doubled = [port for port, n in ports.items() if n > 1]
    if doubled:
        out.append(f"node {node_name}: hostPort used twice: {doubled}")
    allocatable = node.get("status", {}).get("allocatable") or {}
    used: Counter = Counter()
    for p in members:
        for c in p["spec"]["containers"]:
            for resource, value in ((c.get("resources") or {}).get("requests") or {}).items():
                used[resource] += _quantity(value)
    for resource, value in used.items():
        if value > _quantity(allocatable.get(resource, 0)) + 1e-9:
            out.append(f"node {node_name}: {resource} requested {value:g} > allocatable {allocatable.get(resource)}")
    return out


def _constraints(pods: list[dict], when: str) -> list[dict]:
    seen: dict[str, dict] = {}
    for p in pods:
        for c in p["spec"].get("topologySpreadConstraints") or []:
            if c.get("whenUnsatisfiable", "DoNotSchedule") == when:
                seen[json.dumps(c, sort_keys=True)] = c
    return list(seen.values())


def spread_skew(result: Result, constraint: Mapping[str, Any]) -> int | None:
    """max - min count of matching bound pods over the domains of the constraint's key (every
    domain of the case's nodes counts, empty ones included). None when nothing is bound."""
    key = constraint["topologyKey"]
    counts = {n["metadata"]["labels"][key]: 0 for n in result.nodes.values()
              if key in n["metadata"].get("labels", {})}
    bound = [p for p in result.bound() if _selector_matches(constraint["labelSelector"], _pod_labels(p))]
    if not bound or not counts:
        return None
    for p in bound:
        value = result.labels(p).get(key)
        if value in counts:
            counts[value] += 1
    return max(counts.values()) - min(counts.values())


def soft_metrics(result: Result, case: Case) -> dict[str, int | None]:
    """Distinct nodes of the bound pods, and the skew of the case's ScheduleAnyway spread."""
    metrics: dict[str, int | None] = {"distinct_nodes": len({p["spec"]["nodeName"] for p in result.bound()})}
    if case.soft_spread_key:
        constraint = next(c for c in _constraints(result.pods, "ScheduleAnyway")
                          if c["topologyKey"] == case.soft_spread_key)
        metrics["soft_skew"] = spread_skew(result, constraint)
    return metrics


__all__ = ["CASES", "Case", "Result", "Storage", "hard_violations", "in_tree_group", "persistent_volume",
           "soft_metrics", "spread_skew", "storage_class"]
