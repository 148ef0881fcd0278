"""``phalanx demo --solver-only``: the KEP-6277 user stories and LeaderWorkerSet-shaped groups,
placed by the solver alone on a generated 64-node, 8-rack GPU cluster (2 zones), with the reasons
for what does not fit.

The cluster is generated (synthetic racks and zones) and partly busy; the groups are placed in one
batch call, highest priority first, each charged before the next, exactly as the workload cycle
places a queue of groups.
"""

from __future__ import annotations

import time

from cluster.names import LABEL_HOSTNAME, LABEL_RACK, LABEL_ZONE
from solver import (
    DisruptionMode,
    Node,
    Pod,
    PodGroup,
    PodSpec,
    Policy,
    Snapshot,
    SolveOptions,
    assert_placement_valid,
    place_batch,
)

GPU = "nvidia.com/gpu"
GI = 2**30


def demo_cluster() -> tuple[list[Node], list[Pod]]:
    """8 racks x 8 nodes of 8 GPUs in 2 zones; racks 0 and 5 half busy with other work."""
    nodes, busy = [], []
    for rack in range(8):
        for i in range(8):
            name = f"gpu-r{rack}-n{i}"
            labels = {LABEL_HOSTNAME: name, LABEL_RACK: f"r{rack}", LABEL_ZONE: f"zone-{rack // 4}"}
            nodes.append(Node(name, {"cpu": 64_000, "memory": 512 * GI, GPU: 8, "pods": 110}, labels))
            if rack in (0, 5) and i % 2 == 0:
                busy.append(Pod(f"busy-{name}", f"busy-{name}", PodSpec({"cpu": 8000, GPU: 4}), node=name))
    return nodes, busy


def _pods(name: str, count: int, requests: dict, start: int = 0, prefix: str | None = None) -> tuple[Pod, ...]:
    prefix = prefix or name
    return tuple(
        Pod(f"{prefix}-{i}", f"{prefix}-{i}", PodSpec(requests), namespace="demo", group=f"demo/{name}")
        for i in range(start, start + count)
    )


def demo_groups() -> list[tuple[str, PodGroup]]:
    cpu_db = {"cpu": 4000, "memory": 16 * GI}
    out = [
        ("KEP-6277 story 1: quorum database, gang of 5",
         PodGroup("demo", "cockroach", _pods("cockroach", 5, cpu_db), Policy.GANG, 5, priority=100)),
        ("KEP-6277 story 2: 8 inference shards, disruptionMode all",
         PodGroup("demo", "shards", _pods("shards", 8, {"cpu": 8000, GPU: 2}), Policy.GANG, 8,
                  disruption_mode=DisruptionMode.ALL, priority=100)),
        ("KEP-6277 story 3: 8 trainers inside one rack",
         PodGroup("demo", "trainers", _pods("trainers", 8, {"cpu": 16000, GPU: 8}), Policy.GANG, 8,
                  LABEL_RACK, priority=200)),
        ("KEP-6277 story 4: 4 servers sharing one claim (claim allocated by DRA, see docs/limitations.md)",
         PodGroup("demo", "claim-servers", _pods("claim-servers", 4, {"cpu": 2000, "memory": 8 * GI}),
                  Policy.GANG, 4, LABEL_ZONE, (LABEL_RACK,), priority=50)),
    ]
    # LWS replica level: one gang per replica (leader + 3 workers), independent of each other
    for replica in range(2):
        name = f"lws-replica-{replica}"
        members = _pods(name, 1, {"cpu": 4000}, prefix=f"{name}-leader") + _pods(
            name, 3, {"cpu": 8000, GPU: 4}, prefix=f"{name}-worker")
        out.append((f"LWS replica level: replica {replica} (leader + 3 workers, rack)",
                    PodGroup("demo", name, members, Policy.GANG, 4, LABEL_RACK, priority=80)))
    # LWS whole-LWS level: 2 replicas x 4 pods as one gang, kept in one zone, compact by rack
    whole = _pods("lws-whole", 2, {"cpu": 4000}, prefix="lws-whole-leader") + _pods(
        "lws-whole", 6, {"cpu": 8000, GPU: 2}, prefix="lws-whole-worker")
    out.append(("LWS whole-LWS level: 8 pods all-or-nothing (zone, prefer one rack)",
                PodGroup("demo", "lws-whole", whole, Policy.GANG, 8, LABEL_ZONE, (LABEL_RACK,), priority=80)))
    # LWS role level: leaders basic, workers a gang
    out.append(("LWS role level: leader group (basic)",
                PodGroup("demo", "lws-role-leader", _pods("lws-role-leader", 1, {"cpu": 4000}), Policy.BASIC, 1,
                         priority=60)))
    out.append(("LWS role level: worker group (gang of 4, rack)",
                PodGroup("demo", "lws-role-worker", _pods("lws-role-worker", 4, {"cpu": 8000, GPU: 8}),
                         Policy.GANG, 4, LABEL_RACK, priority=60)))
    # does not fit: 9 x 8 GPUs in one rack of 8 nodes
    out.append(("Too big: 9 trainers x 8 GPUs inside one rack",
                PodGroup("demo", "too-big", _pods("too-big", 9, {"cpu": 16000, GPU: 8}), Policy.GANG, 9,
                         LABEL_RACK, priority=10)))
    return out


def run_solver_demo() -> int:
    nodes, busy = demo_cluster()
    snapshot = Snapshot(nodes, busy)
    titled = demo_groups()
    title = {g.key: t for t, g in titled}
    groups = {g.key: g for _, g in titled}
    print(f"phalanx demo — {len(nodes)} nodes, 8 racks x 8 nodes x 8 GPUs, 2 zones (generated); "
          f"{len(busy)} pods of other work already running\n")
    started = time.perf_counter()
    batch = place_batch(snapshot, [g for _, g in titled], SolveOptions(path="exact"))
    elapsed = (time.perf_counter() - started) * 1000
    current = snapshot
    for placement in batch.placements:
        group = groups[placement.group]
        print(f"• {title[placement.group]}")
        if placement.assignments:
            assert_placement_valid(current, group, placement.assignments)
            current = current.with_placement(placement.assignments, {p.uid: p for p in group.pending})
            racks = sorted({current.nodes[current.index[n]].labels[LABEL_RACK] for n in placement.assignments.values()})
            where = f"{group.topology_key.rsplit('/', 1)[-1]} {placement.domain}, " if group.topology_key else ""
            proof = "optimal (CP-SAT proved)" if placement.optimal else f"gap {placement.gap}"
            print(f"    placed {len(placement.assignments)}/{len(group.members)} pods on "
                  f"{len(set(placement.assignments.values()))} nodes — {where}racks {', '.join(racks)}; {proof}")
        else:
            print(f"    NOT placed: {placement.explanation.message()}")
    placed = sum(1 for p in batch.placements if p.assignments)
    print(f"\n{placed} of {len(batch.placements)} groups placed whole, none partially; "
          f"batch solved in {elapsed:.0f} ms")
    return 0
