"""Synthetic GPU clusters for benchmarks: zones x racks x 8-GPU nodes with a random partial fill.

The fill mimics a busy training cluster: about 80% of the used GPUs belong to whole-node jobs
(nodes fully used), the rest are small jobs of 1-7 GPUs on randomly chosen other nodes, so free
capacity is partly fragmented the way a real cluster's is (a pure per-GPU coin flip would leave
almost no empty node even at 50% fill). CPU and memory are used in proportion to the GPUs. The fill
is charged as usage on the snapshot, exactly as bound pods would be. Racks and zones are synthetic
labels, and every result that uses them says so.
"""

from __future__ import annotations

import numpy as np

from cluster.names import LABEL_HOSTNAME, LABEL_RACK, LABEL_ZONE
from solver import Node, Pod, PodGroup, PodSpec, Policy, Snapshot

GPU = "nvidia.com/gpu"
NODE_ALLOCATABLE = {"cpu": 96_000, "memory": 1024 * 2**30, GPU: 8, "pods": 110}


def gpu_cluster(nodes: int, rack_size: int = 100, racks_per_zone: int = 10) -> list[Node]:
    out = []
    for i in range(nodes):
        rack = i // rack_size
        labels = {
            LABEL_HOSTNAME: f"node-{i:05d}",
            LABEL_RACK: f"rack-{rack:03d}",
            LABEL_ZONE: f"zone-{rack // racks_per_zone:02d}",
        }
        out.append(Node(f"node-{i:05d}", NODE_ALLOCATABLE, labels))
    return out


def filled_snapshot(nodes: list[Node], fill: float, seed: int) -> Snapshot:
    """A snapshot where about ``fill`` of every resource is in use, fragmented per node."""
    rng = np.random.default_rng(seed)
    n = len(nodes)
    target = int(round(fill * 8 * n))
    perm = rng.permutation(n)
    k = int(round(0.8 * target / 8))
    used_gpus = np.zeros(n, dtype=np.int64)
    used_gpus[perm[:k]] = 8
    rest = perm[k:]
    small = rng.integers(1, 8, size=len(rest))  # 1-7 GPUs of small jobs per partly used node
    budget = target - 8 * k
    cum = np.cumsum(small)
    if len(rest) and cum[-1] >= budget:
        take = int(np.searchsorted(cum, budget)) + 1
        used_gpus[rest[:take]] = small[:take]
    else:  # the small jobs cannot reach the target: fill more nodes whole
        used_gpus[rest] = small
        deficit = budget - int(small.sum())
        for i in rest:
            if deficit <= 0:
                break
            deficit -= 8 - used_gpus[i]
            used_gpus[i] = 8
    usage = {}
    for node, gpus in zip(nodes, used_gpus, strict=False):
        if gpus:
            usage[node.name] = {
                GPU: int(gpus),
                "cpu": int(gpus) * 12_000,
                "memory": int(gpus) * 128 * 2**30,
                "pods": int(gpus),
            }
    return Snapshot(nodes, reserved=usage)


def gpu_gang(name: str, size: int, gpus_per_pod: int, key: str = "", priority: int = 0,
             preferred: tuple[str, ...] = ()) -> PodGroup:
    spec = PodSpec({"cpu": 8_000 * gpus_per_pod, "memory": 64 * 2**30 * gpus_per_pod, GPU: gpus_per_pod})
    members = tuple(
        Pod(uid=f"{name}-{i}", name=f"{name}-{i}", namespace="bench", group=f"bench/{name}", spec=spec)
        for i in range(size)
    )
    return PodGroup("bench", name, members, Policy.GANG, size, key, preferred, priority=priority)


#: Constraint gangs of ``phalanx bench solver`` (see :func:`constraint_instance`).
CONSTRAINT_KINDS = ("hostname-anti", "zone-spread", "volume-topology")


def constraint_instance(kind: str, nodes: list[Node], fill: float, seed: int, name: str,
                        size: int) -> tuple[Snapshot, PodGroup]:
    """A filled snapshot and a 1-GPU gang carrying one kind of kube-scheduler rule:

    - ``hostname-anti``: required anti-affinity on the hostname against the gang's own label (one
      member per node), inside one rack (the required key);
    - ``zone-spread``: a ``DoNotSchedule`` zone spread, maxSkew 1, over the gang's own label, no
      required key (the whole cluster);
    - ``volume-topology``: every member its own WaitForFirstConsumer claim, local PVs (one per node)
      on a random 20% of the nodes, inside one rack.
    """
    from solver import (
        LabelSelector,
        NodeAffinity,
        PersistentVolume,
        PodAffinityTerm,
        Requirement,
        SpreadConstraint,
        VolumeClaim,
        VolumeInventory,
    )

    snap = filled_snapshot(nodes, fill, seed)
    labels = {"app": name}
    selector = LabelSelector((("app", name),))
    extra: dict = {}
    key = LABEL_RACK
    volumes = None
    if kind == "hostname-anti":
        extra["pod_anti_affinity"] = (PodAffinityTerm(LABEL_HOSTNAME, selector, frozenset({"bench"})),)
    elif kind == "zone-spread":
        extra["spread"] = (SpreadConstraint(1, LABEL_ZONE, selector=selector),)
        key = ""
    elif kind == "volume-topology":
        rng = np.random.default_rng(seed + 1000)
        hosts = rng.choice(len(nodes), size=max(1, len(nodes) // 5), replace=False)
        pvs = tuple(PersistentVolume(f"pv-{i}", "local", 100 * 2**30, frozenset({"ReadWriteOnce"}),
                                     NodeAffinity(((Requirement(LABEL_HOSTNAME, "In", (nodes[i].name,)),),)))
                    for i in sorted(int(h) for h in hosts))
        snap = snap.with_context(volumes=VolumeInventory(pvs))
        volumes = lambda i: (VolumeClaim(f"bench/{name}-data-{i}", storage_class="local", request=2**30,  # noqa: E731
                                         access_modes=frozenset({"ReadWriteOnce"}), delayed=True),)
    else:
        raise ValueError(f"unknown constraint kind {kind!r}")
    spec = PodSpec({"cpu": 8_000, "memory": 64 * 2**30, GPU: 1}, **extra)
    members = tuple(
        Pod(uid=f"{name}-{i}", name=f"{name}-{i}", namespace="bench", group=f"bench/{name}", spec=spec,
            labels=labels, volumes=volumes(i) if volumes else ())
        for i in range(size)
    )
    return snap, PodGroup("bench", name, members, Policy.GANG, size, key)
