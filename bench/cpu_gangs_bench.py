"""Solve time of gangs of 8 one-CPU pods on a cluster of 16-CPU nodes in racks of 20 (the shape of
the real-control-plane throughput test), each solve following the bindings of the one before, with
the domain pruning bound of :meth:`solver.problem.Problem.objective_lower_bound` side by side with
the looser bound alone (the ranking bound, which was also the pruning bound before).

Every step binds the previous gang (inserted among the bound pods, as a watch cache lists them: a
new bound-pod tuple, so the solver's bound-pod caches start over), adds a few plain 100m pods, and
solves the next gang (every fourth with required hostname anti-affinity among its members) on two
fresh snapshot copies, once per bound, in alternating order. Both answers must be equal.

  python -m bench.cpu_gangs_bench [--nodes 2000] [--steps 40]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Mapping
from unittest import mock

import numpy as np

from cluster.names import LABEL_HOSTNAME, LABEL_RACK
from solver import LabelSelector, Node, Pod, PodAffinityTerm, PodGroup, PodSpec, Policy, Snapshot, place
from solver.objective import Objective
from solver.problem import DomainBound, Problem

RACK_SIZE = 20
NODE = {"cpu": 16_000, "memory": 64 * 2**30, "pods": 110}


def cluster(nodes: int) -> list[Node]:
    return [Node(f"tp-{i:04d}", NODE, {LABEL_HOSTNAME: f"tp-{i:04d}", LABEL_RACK: f"tp-rack-{i // RACK_SIZE:03d}"})
            for i in range(nodes)]


def gang(name: str, anti: bool) -> PodGroup:
    spec = PodSpec({"cpu": 1000})
    if anti:
        term = PodAffinityTerm(LABEL_HOSTNAME, LabelSelector((("gang", name),)), frozenset({"default"}))
        spec = PodSpec({"cpu": 1000}, pod_anti_affinity=(term,))
    members = tuple(Pod(f"{name}-{i}", f"{name}-{i}", spec, group=f"default/{name}", labels={"gang": name, "run": "r"})
                    for i in range(8))
    return PodGroup("default", name, members, Policy.GANG, 8, LABEL_RACK)


def _loose(self: Problem, bound: DomainBound, placed: int, tight: bool = True) -> Objective:
    return LOOSE(self, bound, placed, tight=False)


LOOSE = Problem.objective_lower_bound


def _timed(snap: Snapshot, group: PodGroup, loose: bool) -> tuple[float, Mapping[str, str]]:
    with mock.patch.object(Problem, "objective_lower_bound", _loose) if loose else contextlib.nullcontext():
        started = time.perf_counter()
        result = place(snap, group)
        return (time.perf_counter() - started) * 1000.0, result.assignments


def run(nodes: int, steps: int, seed: int = 0) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    base = Snapshot(cluster(nodes))
    bound: list[Pod] = []
    times: dict[str, list[float]] = {"tight": [], "loose": []}
    for step in range(steps):
        used = Snapshot(base.nodes, bound).used  # the usage a watch cache keeps incrementally
        group = gang(f"g{step}", step % 4 == 3)
        answers = {}
        for kind in (("tight", "loose") if step % 2 else ("loose", "tight")):
            snap = base.with_used(used, tuple(bound))  # a fresh bound-pod tuple: caches start over
            ms, answers[kind] = _timed(snap, group, kind == "loose")
            times[kind].append(ms)
        if answers["tight"] != answers["loose"]:
            raise AssertionError(f"step {step}: the bounds gave different placements")
        for uid, node in answers["tight"].items():
            m = next(p for p in group.members if p.uid == uid)
            bound.insert(int(rng.integers(len(bound) + 1)),
                         Pod(m.uid, m.name, m.spec, node=node, group=m.group, labels=m.labels))
        for k in range(3):
            name = f"plain-{step}-{k}"
            bound.insert(int(rng.integers(len(bound) + 1)),
                         Pod(name, name, PodSpec({"cpu": 100}), node=f"tp-{int(rng.integers(nodes)):04d}",
                             labels={"run": "r"}))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    times = run(args.nodes, args.steps)
    loose, tight = statistics.median(times["loose"]), statistics.median(times["tight"])
    print(f"{args.nodes} nodes, {args.steps} gangs of 8 one after another, solver.place median ms: "
          f"looser bound {loose:.1f} (max {max(times['loose']):.1f}), tighter bound {tight:.1f} "
          f"(max {max(times['tight']):.1f}), {loose / tight:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
