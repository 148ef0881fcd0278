"""The workloads of ``phalanx demo`` as raw Kubernetes objects (what a controller would create):
the KEP-6277 user stories, LeaderWorkerSet-shaped groups at each scheduling level, a gang that
cannot fit, a high-priority preemptor, and jobs of the acme-kalos trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.traces import Job
from cluster import names
from cluster.sim import SIM_DURATION

NS = "demo"
GPU = "nvidia.com/gpu"


@dataclass
class Workload:
    """One item of the demo: its objects, the PodGroups it makes, and how to say what it is."""

    section: str
    title: str
    groups: list[str]
    objects: list[dict] = field(default_factory=list)


def podgroup(name: str, min_count: int | None, key: str = "", mode: str = "", priority: int | None = None,
             namespace: str = NS, claims: list[dict] | None = None, preferred: str = "") -> dict:
    spec: dict = {"schedulingPolicy": {"gang": {"minCount": min_count}} if min_count else {"basic": {}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    if mode:
        spec["disruptionMode"] = {mode: {}}
    if priority is not None:
        spec["priority"] = priority
    if claims:
        spec["resourceClaims"] = claims
    meta: dict = {"name": name, "namespace": namespace}
    if preferred:
        meta["annotations"] = {names.ANNOTATION_PREFERRED_TOPOLOGY: preferred}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": meta, "spec": spec}


def pod_spec(group: str, requests: dict, priority: int = 0, node_selector: dict | None = None,
             claims: list[dict] | None = None) -> dict:
    spec: dict = {"schedulingGroup": {"podGroupName": group}, "priority": priority,
                  "containers": [{"name": "main", "image": "registry.example/app:1",
                                  "resources": {"requests": dict(requests)}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if claims:
        spec["resourceClaims"] = claims
    return spec


def pod(name: str, spec: dict, owner_kind: str, owner_name: str, namespace: str = NS, labels: dict | None = None,
        duration: float | None = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": labels or {},
                  "ownerReferences": [{"apiVersion": "v1", "kind": owner_kind, "name": owner_name,
                                       "uid": f"demo-owner-{namespace}-{owner_name}", "controller": True}]}
    if duration is not None:
        meta["annotations"] = {SIM_DURATION: str(duration)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def statefulset(name: str, replicas: int, spec: dict) -> dict:
    """A Parallel StatefulSet; the simulated cluster creates its pods (owned by it)."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "podManagementPolicy": "Parallel",
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def stories() -> list[Workload]:
    """The four KEP-6277 user stories, each a StatefulSet with its PodGroup."""
    db = {"cpu": "4", "memory": "16Gi"}
    gpu8 = {"cpu": "16", "memory": "64Gi", GPU: "8"}
    claim = [{"name": "shared", "resourceClaimName": "shared-accelerator"}]
    # a quorum database as its charts write it: one replica a node (required anti-affinity)
    one_a_node = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "cockroach"}}, "topologyKey": names.LABEL_HOSTNAME}]}}
    out = [
        Workload("KEP-6277 user stories", "story 1: quorum database, never 3 of 5, one replica a node (gang 5)",
                 [f"{NS}/cockroach"],
                 [podgroup("cockroach", 5, priority=100),
                  statefulset("cockroach", 5, {**pod_spec("cockroach", db, 100), "affinity": one_a_node})]),
        Workload("KEP-6277 user stories", "story 2: 8 inference shards, disruptionMode all, inside one rack",
                 [f"{NS}/shards"],
                 [podgroup("shards", 8, names.LABEL_RACK, "all", priority=10),
                  statefulset("shards", 8, pod_spec("shards", gpu8, 10))]),
        Workload("KEP-6277 user stories", "story 3: 8 trainers x 8 GPUs inside one rack", [f"{NS}/trainers"],
                 [podgroup("trainers", 8, names.LABEL_RACK, priority=200),
                  statefulset("trainers", 8, pod_spec("trainers", gpu8, 200))]),
        Workload("KEP-6277 user stories", "story 4: 4 servers sharing one ResourceClaim, inside one zone",
                 [f"{NS}/claim-servers"],
                 [podgroup("claim-servers", 4, names.LABEL_ZONE, priority=50, claims=claim,
                           preferred=names.LABEL_RACK),
                  statefulset("claim-servers", 4, pod_spec("claim-servers", {"cpu": "2", "memory": "8Gi"}, 50,
                                                           claims=claim))]),
    ]
    return out


def _lws_pods(lws: str, replica: int, size: int, leader_group: str, worker_group: str, worker: dict) -> list[dict]:
    labels = {"leaderworkerset.sigs.k8s.io/name": lws, "leaderworkerset.sigs.k8s.io/group-index": str(replica)}
    leader = pod(f"{lws}-{replica}", pod_spec(leader_group, {"cpu": "4", "memory": "16Gi"}, 80),
                 "LeaderWorkerSet", lws, labels=labels)
    workers = [pod(f"{lws}-{replica}-{i}", pod_spec(worker_group, worker, 80), "LeaderWorkerSet", lws, labels=labels)
               for i in range(1, size)]
    return [leader, *workers]


def leaderworkersets() -> list[Workload]:
    """LeaderWorkerSet-shaped groups at the three scheduling levels of the LWS guide."""
    replica_objects: list[dict] = []
    for r in range(2):
        replica_objects.append(podgroup(f"infer-{r}", 4, names.LABEL_RACK, priority=80))
        replica_objects += _lws_pods("infer", r, 4, f"infer-{r}", f"infer-{r}", {"cpu": "8", GPU: "4"})
    whole = [podgroup("serve", 8, names.LABEL_ZONE, priority=80, preferred=names.LABEL_RACK)]
    for r in range(2):
        whole += _lws_pods("serve", r, 4, "serve", "serve", {"cpu": "8", GPU: "2"})
    roles = [podgroup("roles-0-leader", None, priority=60),
             podgroup("roles-0-workers", 4, names.LABEL_RACK, priority=60)]
    roles += _lws_pods("roles", 0, 5, "roles-0-leader", "roles-0-workers", {"cpu": "16", GPU: "8"})
    return [
        Workload("LeaderWorkerSet", "replica level: one gang per replica (leader + 3 workers, one rack each)",
                 [f"{NS}/infer-0", f"{NS}/infer-1"], replica_objects),
        Workload("LeaderWorkerSet", "whole-LWS level: 2 replicas x 4 pods as one gang, one zone, rack preferred",
                 [f"{NS}/serve"], whole),
        Workload("LeaderWorkerSet", "role level: leader group (basic) and worker group (gang of 4, one rack)",
                 [f"{NS}/roles-0-leader", f"{NS}/roles-0-workers"], roles),
    ]


def composite() -> Workload:
    """Gangs of gangs: a CompositePodGroup (one zone, both children) over two rack gangs of 4
    trainers, planned, bound and explained as one unit."""
    spec = {"workloadRef": {"workloadName": "train", "templateName": "train"},
            "schedulingPolicy": {"gang": {"minGroupCount": 2}},
            "schedulingConstraints": {"topology": [{"key": names.LABEL_ZONE}]}}
    objects: list[dict] = [{"apiVersion": "scheduling.k8s.io/v1alpha3", "kind": "CompositePodGroup",
                            "metadata": {"name": "train", "namespace": NS}, "spec": spec}]
    for child in ("train-a", "train-b"):
        group = podgroup(child, 4, names.LABEL_RACK, priority=1000)
        group["spec"]["parentCompositePodGroupName"] = "train"
        objects.append(group)
        objects += [pod(f"{child}-{i}", pod_spec(child, {"cpu": "16", GPU: "8"}, 1000), "Job", child)
                    for i in range(4)]
    return Workload("CompositePodGroup", "train: 2 rack gangs of 4 x 8 GPUs, both in one zone, as one unit",
                    [f"{NS}/train-a", f"{NS}/train-b"], objects)


def job(name: str, pods: int, requests: dict, key: str, priority: int = 0, node_selector: dict | None = None,
        namespace: str = NS, duration: float | None = None, mode: str = "") -> list[dict]:
    """A Job-owned gang: its PodGroup and ``pods`` identical pods."""
    spec = pod_spec(name, requests, priority, node_selector)
    return [podgroup(name, pods, key, mode, priority, namespace=namespace)] + [
        pod(f"{name}-{i}", spec, "Job", name, namespace, {"job-name": name}, duration) for i in range(pods)]


def too_big() -> Workload:
    return Workload("Does not fit", "20 trainers x 8 GPUs inside one rack (a rack has 16 nodes x 8 GPUs)",
                    [f"{NS}/too-big"], job("too-big", 20, {"cpu": "16", GPU: "8"}, names.LABEL_RACK, priority=50))


def urgent(rack: str) -> Workload:
    return Workload("Preemption", f"urgent: 8 x 8 GPUs at priority 1000, pinned to rack {rack} (nodeSelector)",
                    [f"{NS}/urgent"], job("urgent", 8, {"cpu": "16", GPU: "8"}, names.LABEL_RACK, priority=1000,
                                          node_selector={names.LABEL_RACK: rack}))


def trace_job(job_: Job, name: str, duration: float, rack_nodes: int) -> list[dict]:
    """One acme-kalos gang: inside one rack when it fits a rack, else inside one zone."""
    key = names.LABEL_RACK if job_.pods <= rack_nodes else names.LABEL_ZONE
    requests = {"cpu": f"{job_.cpu}m", GPU: str(job_.gpus)}
    return job(name, job_.pods, requests, key, namespace="trace", duration=duration, mode="all")
