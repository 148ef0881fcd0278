"""Raw Kubernetes objects for service and extender tests (the simulated cluster stores these)."""

import json

from cluster import names
from phalanx_cli.demo_workloads import podgroup as demo_podgroup


def podgroup(name, min_count=None, key=None, namespace="default", mode=None, priority=None):
    """A PodGroup built the way the demo builds them (one builder for both)."""
    return demo_podgroup(name, min_count, key or "", mode or "", priority, namespace)


def pod(name, group=None, gpu=1, cpu="1", namespace="default", node=None, priority=None, labels=None):
    requests = {"cpu": cpu}
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}]}
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}}, "spec": spec}


def node(name, rack="r0", zone="z0", gpus=8, cpu="64"):
    alloc = {"cpu": cpu, "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {names.LABEL_RACK: rack, names.LABEL_ZONE: zone,
                                                  names.LABEL_HOSTNAME: name}},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


def placement_of(podgroup_obj):
    """The placement record on a PodGroup object as the API server holds it: its ``Placement``
    condition's message while True, else the annotation (too long for a condition, or written by
    an earlier version); None when there is none."""
    conditions = (podgroup_obj.get("status") or {}).get("conditions") or []
    condition = next((c for c in conditions if c["type"] == names.CONDITION_PLACEMENT), None)
    if condition is not None and condition["status"] == "True":
        return json.loads(condition["message"])
    raw = (podgroup_obj["metadata"].get("annotations") or {}).get(names.ANNOTATION_PLACEMENT)
    return json.loads(raw) if raw else None
