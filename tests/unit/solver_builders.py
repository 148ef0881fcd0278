"""Small builders for solver tests: nodes in racks and zones, gangs of identical pods."""

from solver import Node, Pod, PodGroup, PodSpec, Policy

RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"


def gpu_node(name, rack="r0", zone="z0", gpus=8, cpu=64000, **kw):
    labels = {RACK: rack, ZONE: zone, "kubernetes.io/hostname": name} | kw.pop("labels", {})
    return Node(name, {"cpu": cpu, "memory": 256 * 2**30, "nvidia.com/gpu": gpus, "pods": 110}, labels, **kw)


def cluster(racks=2, per_rack=4, zones=1, gpus=8):
    return [
        gpu_node(f"n-{r}-{i}", rack=f"r{r}", zone=f"z{r % zones}", gpus=gpus)
        for r in range(racks)
        for i in range(per_rack)
    ]


def pods(name, n, gpus=1, cpu=1000, start=0, namespace="default", node="", **spec):
    return tuple(
        Pod(
            uid=f"{name}-{i}",
            name=f"{name}-{i}",
            namespace=namespace,
            group=f"{namespace}/{name}",
            node=node,
            spec=PodSpec({"cpu": cpu, "nvidia.com/gpu": gpus} if gpus else {"cpu": cpu}, **spec),
        )
        for i in range(start, start + n)
    )


def gang(name, n, gpus=1, key="", min_count=None, members=None, **kw):
    members = members if members is not None else pods(name, n, gpus)
    return PodGroup("default", name, members, Policy.GANG, min_count or n, key, **kw)
