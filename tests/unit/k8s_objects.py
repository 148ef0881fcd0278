"""Raw Kubernetes objects for service and extender tests (the simulated cluster stores these)."""

from cluster import names


def podgroup(name, min_count=None, key=None, namespace="default", mode=None, priority=None):
    spec = {"schedulingPolicy": {"gang": {"minCount": min_count}} if min_count else {"basic": {}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    if mode:
        spec["disruptionMode"] = {mode: {}}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


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
