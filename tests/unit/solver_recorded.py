"""Generated solver instances and the answers the CP-SAT paths give on them, for the recorded-answers
test (``test_solver_recorded.py``).

The instances come from a seeded :class:`random.Random`, so the same seed builds the same instance
on every machine. They are small (a test solves them all in seconds) but exercise every part of
the CP-SAT models: mixed shapes and packing patterns, preferred keys, required and preferred
(anti-)affinity on per-node and wider keys, hard and soft spread, host ports, ``all`` victim
groups, disruption budgets and overcommitted nodes.

``python -m tests.unit.solver_recorded`` rewrites the recorded answers; do that only when a change
to the solver is *meant* to change its answers, and say so in the commit.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from solver import (
    DO_NOT_SCHEDULE,
    SCHEDULE_ANYWAY,
    DisruptionBudget,
    DisruptionMode,
    HostPort,
    LabelSelector,
    Node,
    NodeAffinity,
    PersistentVolume,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSpec,
    Policy,
    PreemptionContext,
    Requirement,
    Snapshot,
    SolveOptions,
    SpreadConstraint,
    VictimInfo,
    VolumeClaim,
    VolumeInventory,
    place,
    plan_preemption,
)
from solver.cpsat import ModelTooLarge
from solver.exact import solve_domain
from solver.greedy import greedy_domain
from solver.problem import Problem

HOST = "kubernetes.io/hostname"
RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"
GPU = "nvidia.com/gpu"
LOCAL = "local"  # a WaitForFirstConsumer storage class served by local volumes
RWO = frozenset({"ReadWriteOnce"})
RECORDED = Path(__file__).parent / "data" / "solver_recorded.json"
PLACEMENT_SEEDS = range(60)
PREEMPTION_SEEDS = range(40)
#: every answer is computed under this budget, deterministic and small
OPTIONS = SolveOptions(path="exact", deterministic_time=0.5, time_limit=30.0)


# -- placement instances ----------------------------------------------------------------------------
def _nodes(rng: random.Random) -> list[Node]:
    out = []
    for i in range(rng.randint(3, 10)):
        rack = rng.randrange(4)
        labels = {HOST: f"n{i}", RACK: f"r{rack}", ZONE: f"z{rack % 2}"}
        allocatable = {"cpu": rng.choice([2000, 4000, 8000]), GPU: rng.choice([0, 2, 4, 8]), "pods": rng.randint(3, 12)}
        out.append(Node(f"n{i}", allocatable, labels))
    return out


def _term(rng: random.Random, app: str, weight: int = 0) -> PodAffinityTerm:
    return PodAffinityTerm(rng.choice([HOST, ZONE, RACK]), LabelSelector((("app", app),)),
                           frozenset({"default"}), weight=weight)


def _rules(rng: random.Random, app: str) -> dict[str, Any]:
    """Some of every rule family, each with a fair chance of being absent."""
    rules: dict[str, Any] = {}
    roll = rng.random
    if roll() < 0.3:
        rules["pod_anti_affinity"] = (_term(rng, app),)
    if roll() < 0.2:
        rules["pod_affinity"] = (PodAffinityTerm(rng.choice([HOST, ZONE, RACK]), LabelSelector((("app", app),)),
                                                 frozenset({"default"})),)
    if roll() < 0.25:
        rules["preferred_affinity"] = (_term(rng, rng.choice([app, "web"]), rng.randint(1, 100)),)
    if roll() < 0.25:
        rules["preferred_anti_affinity"] = (_term(rng, app, rng.randint(1, 100)),)
    if roll() < 0.35:
        rules["spread"] = (SpreadConstraint(rng.randint(1, 2), rng.choice([HOST, ZONE, RACK]),
                                            rng.choice([DO_NOT_SCHEDULE, SCHEDULE_ANYWAY]),
                                            LabelSelector((("app", app),))),)
    if roll() < 0.15:
        rules["host_ports"] = (HostPort(rng.choice([8080, 9090])),)
    return rules


def _bound(rng: random.Random, nodes: list[Node]) -> list[Pod]:
    out = []
    for k in range(rng.randint(0, 4)):
        node = rng.choice(nodes).name
        spec = PodSpec({"cpu": 500}, pod_anti_affinity=(_term(rng, "g"),) if rng.random() < 0.2 else ())
        out.append(Pod(f"b{k}", f"b{k}", spec, node=node, labels={"app": rng.choice(["g", "web"])}))
    return out


def _local_volumes(rng: random.Random, nodes: list[Node]) -> VolumeInventory:
    """A few local PersistentVolumes of a WaitForFirstConsumer class, each pinned to one node."""
    pvs = []
    for k in range(rng.randint(1, 2 * len(nodes))):
        on = NodeAffinity(((Requirement(HOST, "In", (rng.choice(nodes).name,)),),))
        pvs.append(PersistentVolume(f"pv{k}", LOCAL, 1, RWO, on))
    return VolumeInventory(tuple(pvs))


def placement_instance(seed: int) -> tuple[Snapshot, PodGroup]:
    rng = random.Random(seed)
    nodes = _nodes(rng)
    app = "g"
    members = []
    with_volumes = rng.random() < 0.2
    for s in range(rng.choice([1, 1, 2, 3])):
        spec = PodSpec({"cpu": rng.choice([250, 500, 1000]), GPU: rng.choice([0, 1, 2])}, **_rules(rng, app))
        claims = with_volumes and rng.random() < 0.7
        for k in range(rng.randint(1, 5)):
            volumes = (VolumeClaim(f"default/data-{len(members)}", storage_class=LOCAL, request=1, access_modes=RWO,
                                   delayed=True),) if claims else ()
            members.append(Pod(f"p{s}-{k}", f"g-{len(members)}", spec, group="default/g", labels={"app": app},
                               volumes=volumes))
    policy = rng.choice([Policy.GANG, Policy.GANG, Policy.BASIC])
    min_count = rng.randint(1, len(members)) if policy is Policy.GANG else 1
    key = rng.choice(["", ZONE, RACK])
    preferred = tuple(k for k in (ZONE, RACK) if k != key and rng.random() < 0.4)
    if key == RACK and ZONE in preferred:
        preferred = ()
    group = PodGroup("default", "g", tuple(members), policy, min_count, key, preferred,
                     default_preference=rng.choice(["pack", "pack", "spread"]))
    volumes = _local_volumes(rng, nodes) if with_volumes else None
    return Snapshot(nodes, _bound(rng, nodes), volumes=volumes), group


def placement_answer(seed: int) -> dict[str, Any]:
    """What :func:`solver.place` answers, and what the exact model says in each viable domain."""
    snapshot, group = placement_instance(seed)
    result = place(snapshot, group, OPTIONS)
    problem = Problem(snapshot, group)
    domains = []
    if problem.pending_total:
        for bound in problem.domain_bounds():
            if bound.placed_ub < max(problem.needed, 1):
                continue
            hint = greedy_domain(problem, bound.nodes)
            try:
                solution = solve_domain(problem, bound, hint, seed=OPTIONS.seed,
                                        deterministic_time=OPTIONS.deterministic_time, time_limit=OPTIONS.time_limit)
            except ModelTooLarge:
                domains.append({"domain": bound.domain, "too_large": True})
                continue
            domains.append({"domain": bound.domain} | ({"infeasible": True} if solution is None else {
                "picks": {str(s): sorted(p) for s, p in solution.picks.items()},
                "optimal": solution.optimal, "scalar": solution.scalar, "bound": solution.bound}))
    return {
        "assignments": dict(sorted(result.assignments.items())),
        "domain": result.domain,
        "objective": None if result.objective is None else result.objective.describe(),
        "optimal": result.optimal,
        "gap": result.gap,
        "stats": {k: v for k, v in sorted(result.stats.items()) if not k.endswith("_ms")},
        "domains": domains,
    }


# -- preemption instances ---------------------------------------------------------------------------
def preemption_instance(seed: int) -> tuple[Snapshot, PodGroup, PreemptionContext]:
    """A busy cluster of 8-GPU nodes and a priority-40 gang that needs some of it back."""
    rng = random.Random(1000 + seed)
    nodes = [Node(f"n{i}", {"cpu": 16000, GPU: 8, "pods": 20},
                  {HOST: f"n{i}", RACK: f"r{i % 3}", ZONE: f"z{i % 2}"}) for i in range(rng.randint(2, 6))]
    free = {n.name: 8 for n in nodes}
    running: list[Pod] = []
    victims: dict[str, VictimInfo] = {}

    def run(uid: str, gpus: int, priority: int, group: str = "") -> None:
        room = [name for name, left in free.items() if left >= gpus]
        if room:
            node = rng.choice(room)
            free[node] -= gpus
            running.append(Pod(uid, uid, PodSpec({"cpu": 1000, GPU: gpus}, priority=priority), node=node, group=group))

    for g in range(rng.randint(1, 5)):
        mode, priority = rng.choice([DisruptionMode.SINGLE, DisruptionMode.ALL]), rng.choice([0, 10, 20, 50])
        for k in range(rng.randint(1, 5)):
            run(f"v{g}-{k}", rng.choice([1, 2, 4]), priority, f"default/v{g}")
            victims[f"v{g}-{k}"] = VictimInfo(priority, f"default/v{g}", mode)
    for k in range(rng.randint(0, 8)):  # loose pods without a group
        run(f"s{k}", rng.choice([1, 2]), rng.choice([0, 5, 60]))
    if rng.random() < 0.3:  # an overcommitted node: more in use than it has
        running.append(Pod("big", "big", PodSpec({"cpu": 15000, GPU: 8}, priority=1), node=nodes[0].name))
    budgets = []
    if rng.random() < 0.5:
        chosen = frozenset(p.uid for p in running if rng.random() < 0.4)
        budgets.append(DisruptionBudget("pdb", chosen, rng.randint(0, 2)))
    size = rng.randint(1, 6)
    spec = PodSpec({"cpu": 1000, GPU: rng.choice([1, 2, 4])})
    members = tuple(Pod(f"q{i}", f"q-{i}", spec, group="default/q") for i in range(size))
    group = PodGroup("default", "q", members, Policy.GANG, rng.randint(1, size), rng.choice(["", RACK, ZONE]),
                     priority=40)
    return Snapshot(nodes, running), group, PreemptionContext(victims, tuple(budgets))


def preemption_answer(seed: int) -> dict[str, Any]:
    snapshot, group, context = preemption_instance(seed)
    options = SolveOptions(path="exact", seed=seed % 3, deterministic_time=0.1, time_limit=30.0)
    plan = plan_preemption(snapshot, group, context, options)
    return {
        "victims": list(plan.victims),
        "placement": dict(sorted(plan.placement.items())),
        "domain": plan.domain,
        "cost": None if plan.cost is None else plan.cost.describe(),
        "path": plan.path,
        "optimal": plan.optimal,
        "reason": plan.reason,
        "stats": {k: v for k, v in sorted(plan.stats.items()) if not k.endswith("_ms")},
    }


def answers() -> dict[str, dict[str, Any]]:
    return {
        "placement": {str(s): placement_answer(s) for s in PLACEMENT_SEEDS},
        "preemption": {str(s): preemption_answer(s) for s in PREEMPTION_SEEDS},
    }


if __name__ == "__main__":
    RECORDED.parent.mkdir(exist_ok=True)
    RECORDED.write_text(json.dumps(answers(), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"recorded {RECORDED.name}\n")
