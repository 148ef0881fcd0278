"""A corpus of real workload shapes (``harness/corpus.py``: ZooKeeper, etcd, Kafka, CockroachDB,
Cassandra, Redis cluster, training workers, GPU inference, local PVs) through the whole product
path, side by side with upstream's in-tree gang scheduling, on one control plane.

- **phalanx**: the StatefulSet carries ``scheduling.phalanx.dev/scheduling`` (gang) → phalanx's
  controller and webhooks (as ``test_controller.py`` runs them) make the Workload and PodGroup and
  stamp and release the pods → kube-scheduler with phalanx places them, in each mode
  (``scheduler_mode``: kube-scheduler with phalanx as extender and binder, then phalanx-scheduler
  with the framework plugin); the in-tree side runs once.
- **in-tree**: the same StatefulSet without the annotation, its pod template naming a Workload and
  PodGroup the user created (no released StatefulSet controller makes them), placed by a
  kube-scheduler with ``GenericWorkload`` and ``TopologyAwareWorkloadScheduling``.

The real StatefulSet controller makes the pods and claims, the real PV controller binds them, the
KWOK runs bound pods. Each case runs on its own fresh nodes and namespace; the in-tree runs
come first (so ``-x`` still leaves every in-tree row), then phalanx's. Per case: the gang is bound
whole or not at all (at rest), every hard constraint holds on the result, phalanx binds whatever
in-tree binds, and phalanx's soft-constraint result (distinct nodes, ScheduleAnyway skew) is at
least in-tree's. A table row per case and phalanx mode is printed and written to ``corpus.md`` in the module's tmp
dir. Times are measurements (StatefulSet created → all pods bound), never asserted.

Run alone:  .venv/bin/python -m pytest tests/e2e/test_corpus.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from harness import create, node, path, pods, wait_for
from harness.corpus import (
    CASES,
    Case,
    Result,
    hard_violations,
    in_tree_group,
    persistent_volume,
    soft_metrics,
    storage_class,
)

from cluster.kube import KubeError

from .conftest import PHALANX_SCHEDULER_MODES, scratch_namespace, start_in_tree, start_phalanx_scheduler

IN_TREE, PHALANX = "in-tree", "phalanx"
SCHEDULER = {IN_TREE: "corpus-in-tree", PHALANX: "corpus-phalanx"}
PREFIX = {IN_TREE: "it", PHALANX: "px"}
BIND_TIMEOUT = 60.0   # per case: StatefulSet created -> all replicas bound
SETTLE = 10.0         # a partly bound gang must finish or fall back to 0 within this, to be "at rest"
API = "scheduling.k8s.io/v1beta1"
IDS = [c.name for c in CASES]


@dataclass
class Outcome:
    case: Case
    side: str
    bound: int = 0
    seconds: float | None = None
    metrics: dict = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    note: str = ""
    why: str = ""             # when not bound: the PodGroup condition and the pods' PodScheduled messages
    plans: int | None = None  # phalanx: plans serve made for the PodGroup (1 = right the first time)
    events: list[str] = field(default_factory=list)  # phalanx's other events on it (timeouts, failures)
    mode: str = ""            # phalanx: the scheduler mode (extender, plugin)

    def cells(self) -> str:
        """bound | distinct nodes (and ScheduleAnyway skew) | time, as table cells."""
        extra = f", zone skew {self.metrics['soft_skew']}" if self.metrics.get("soft_skew") is not None else ""
        nodes = f"{self.metrics.get('distinct_nodes')}{extra}" if self.bound else "-"
        took = f"{self.seconds:.1f} s" if self.seconds is not None else (self.note or "-")
        return f"{self.bound}/{self.case.replicas} | {nodes} | {took}"


@pytest.fixture(scope="module")
def in_tree(start_scheduler):
    """kube-scheduler with in-tree gang scheduling (its own scheduler name), for the whole module."""
    return start_in_tree(start_scheduler, SCHEDULER[IN_TREE], "corpus-in-tree")


@pytest.fixture(scope="module")
def schedulers(in_tree, scheduler_mode, phalanx, control_plane):
    """Side by side: in-tree gang scheduling, and phalanx in ``scheduler_mode`` (its scheduler
    stopped before the other mode's starts: both serve the one scheduler name)."""
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, phalanx, scheduler_name=SCHEDULER[PHALANX],
                                        name=f"corpus-phalanx-{scheduler_mode}")
    yield {PHALANX: scheduler, IN_TREE: in_tree}
    scheduler.stop()


@pytest.fixture(scope="module")
def controller(registered_controller):
    return registered_controller


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Outcomes by (case, side) (side: in-tree, or phalanx's mode); the markdown table is printed
    and written at the module's end."""
    outcomes: dict[tuple[str, str], Outcome] = {}
    yield outcomes
    header = ("| case | in-tree bound | in-tree distinct nodes | in-tree time | phalanx mode | phalanx bound | "
              "phalanx distinct nodes | phalanx time | phalanx plans |\n|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for c in CASES:
        theirs = outcomes.get((c.name, IN_TREE))
        for mode in PHALANX_SCHEDULER_MODES:
            ours = outcomes.get((c.name, mode))
            if ours or (theirs and mode == PHALANX_SCHEDULER_MODES[0]):
                rows.append(f"| {c.title} | {theirs.cells() if theirs else 'not run | - | -'} | {mode} | "
                            f"{ours.cells() if ours else 'not run | - | -'} | "
                            f"{ours.plans if ours and ours.plans is not None else '-'} |")
    text = header + "\n".join(rows) + "\n"
    out = tmp_path_factory.mktemp("corpus") / "corpus.md"
    out.write_text(text)
    print(f"\ncorpus: phalanx vs in-tree gang scheduling (written to {out}):\n{text}")


# --- running one case --------------------------------------------------------------------------

def read_result(rest, namespace: str, case: Case, node_names: list[str]) -> Result:
    items = [p for p in pods(rest, namespace, label_selector=f"app={case.name}")
             if not p["metadata"].get("deletionTimestamp")]
    nodes = {n: rest.get(f"/api/v1/nodes/{n}") for n in node_names}
    claims = {c["metadata"]["name"]: c for c in rest.list_items(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims")}
    volumes = {v["metadata"]["name"]: v for v in rest.list_items("/api/v1/persistentvolumes")
               if v["spec"].get("storageClassName", "").startswith(namespace)}
    return Result(items, nodes, claims, volumes)


def bound_count(rest, namespace: str, case: Case) -> int:
    return sum(1 for p in pods(rest, namespace, label_selector=f"app={case.name}")
               if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))


def at_rest_bound(rest, namespace: str, case: Case) -> int:
    """The bound count once it is not a partial gang any more (or after SETTLE seconds)."""
    deadline = time.monotonic() + SETTLE
    while True:
        count = bound_count(rest, namespace, case)
        if count in (0, case.replicas) or time.monotonic() >= deadline:
            return count
        time.sleep(0.5)


def the_group(rest, namespace: str) -> dict | None:
    groups = rest.list_items(f"/apis/{API}/namespaces/{namespace}/podgroups")
    return groups[0] if len(groups) == 1 else None


def initially_scheduled(rest, namespace: str) -> bool:
    group = the_group(rest, namespace) or {}
    return any(c["type"] == "PodGroupInitiallyScheduled" and c["status"] == "True"
               for c in group.get("status", {}).get("conditions") or [])


def group_events(rest, namespace: str) -> list[dict]:
    """phalanx's events on the namespace's PodGroup, oldest first."""
    items = [e for e in rest.list_items(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
             if e.get("reportingController") == "phalanx.dev/scheduler"
             and (e.get("regarding") or {}).get("kind") == "PodGroup"]
    return sorted(items, key=lambda e: e.get("eventTime") or "")


def pod_scheduling_events(rest, namespace: str) -> list[str]:
    """kube-scheduler's FailedScheduling events on the pods, oldest first, one line per pod and message."""
    items = [e for e in rest.list_items(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
             if (e.get("regarding") or {}).get("kind") == "Pod" and e.get("reason") == "FailedScheduling"]
    seen: dict[str, None] = {}
    for e in sorted(items, key=lambda e: e.get("eventTime") or e["metadata"].get("creationTimestamp") or ""):
        seen[f"pod {e['regarding']['name']}: {e.get('note', '')[:240]}"] = None
    return list(seen)


def explain(rest, namespace: str, case: Case) -> str:
    """Why the pods wait: PodGroup condition and the pods' last scheduling messages."""
    parts = []
    for group in rest.list_items(f"/apis/{API}/namespaces/{namespace}/podgroups"):
        for cond in group.get("status", {}).get("conditions") or []:
            parts.append(f"PodGroup {group['metadata']['name']} {cond['type']}={cond['status']} "
                         f"{cond.get('reason', '')}: {cond.get('message', '')[:300]}")
    for p in pods(rest, namespace, label_selector=f"app={case.name}")[:2]:
        for cond in p.get("status", {}).get("conditions") or []:
            if cond["type"] == "PodScheduled" and cond["status"] != "True":
                parts.append(f"pod {p['metadata']['name']}: {cond.get('reason')}: {cond.get('message', '')[:300]}")
    return "; ".join(parts)


def cleanup(rest, namespace: str, case: Case, cluster_paths: list[str]) -> None:
    """StatefulSet and pods gone before the next case (the fixtures then drop namespace and nodes)."""
    rest.delete(path("apps/v1", "StatefulSet", namespace, case.name), {"propagationPolicy": "Background"}, missing_ok=True)
    rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": 0})
    try:
        wait_for(lambda: not pods(rest, namespace), 30, f"pods of {namespace} gone", interval=0.3)
    except TimeoutError:
        pass  # leftovers sit on this case's own nodes, which are deleted next
    for item in cluster_paths:
        rest.delete(item, missing_ok=True)


def provision(rest, namespace: str, nodes, case: Case, side: str) -> tuple[list[str], str | None, list[str]]:
    """The case's nodes, StorageClass and PVs (and, in-tree, the user's Workload and PodGroup).
    Returns the node names, the StorageClass name and the cluster-scoped paths to delete."""
    prefix = PREFIX[side]
    names = case.node_names(prefix)
    for name, (_, kwargs) in zip(names, case.nodes, strict=False):
        nodes.add(name, **kwargs)
    sc_name, cluster_paths = None, []
    if case.storage:
        sc_name = f"{namespace}-{case.storage.binding.lower()}"
        rest.create("/apis/storage.k8s.io/v1/storageclasses", storage_class(sc_name, case.storage.binding))
        cluster_paths.append(f"/apis/storage.k8s.io/v1/storageclasses/{sc_name}")
        for pv in case.persistent_volumes(prefix, sc_name, f"{prefix}-{case.short}-{namespace[-5:]}"):
            rest.create("/api/v1/persistentvolumes", pv)
            cluster_paths.append(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
    if side == IN_TREE:
        for obj in in_tree_group(case, namespace):
            create(rest, obj, namespace)
    return names, sc_name, cluster_paths


def membership_violations(rest, namespace: str, case: Case, result: Result) -> list[str]:
    """One gang PodGroup of minCount = replicas (phalanx's controller made it, or the user did), and
    every pod in it (stamped by phalanx's webhook, or copied from the template by the StatefulSet
    controller)."""
    pg = the_group(rest, namespace)
    if pg is None or pg["spec"]["schedulingPolicy"] != {"gang": {"minCount": case.replicas}}:
        return [f"no single gang PodGroup of {case.replicas}: {pg}"]
    unstamped = [p["metadata"]["name"] for p in result.pods
                 if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") != pg["metadata"]["name"]]
    return [f"pods not in the PodGroup: {unstamped}"] if unstamped else []


@pytest.fixture(scope="module")
def plans_made(phalanx) -> Counter:
    """Plans phalanx serve made, by namespace (its listeners' ``planned``: no event is written per plan)."""
    made: Counter = Counter()

    def count(kind: str, data) -> None:
        if kind == "planned":
            made[data["group"].split("/", 1)[0]] += 1

    phalanx.cycle.subscribe(count)
    return made


def run_case(rest, namespace: str, nodes, case: Case, side: str, plans_made: Counter | None = None) -> Outcome:
    """Create the case as a user would, wait (bounded) for its pods to be bound, read back the result."""
    outcome = Outcome(case, side)
    plans_before = plans_made[namespace] if plans_made is not None else 0
    cluster_paths: list[str] = []
    try:
        names, sc_name, cluster_paths = provision(rest, namespace, nodes, case, side)
        sts = case.statefulset(namespace, SCHEDULER[side], sc_name, case.name if side == IN_TREE else None)
        started = time.monotonic()
        create(rest, sts, namespace)
        try:
            wait_for(lambda: bound_count(rest, namespace, case) == case.replicas, BIND_TIMEOUT,
                     f"{side}: {case.name} all {case.replicas} bound", interval=0.2)
            outcome.seconds = time.monotonic() - started
            outcome.bound = case.replicas
        except TimeoutError:
            outcome.bound = at_rest_bound(rest, namespace, case)
            outcome.note = f"not bound within {BIND_TIMEOUT:.0f} s"
            outcome.why = explain(rest, namespace, case)
        result = read_result(rest, namespace, case, names)
        outcome.metrics = soft_metrics(result, case)
        outcome.violations = membership_violations(rest, namespace, case, result) + hard_violations(result)
        if outcome.bound:
            try:
                wait_for(lambda: initially_scheduled(rest, namespace), 10, "PodGroupInitiallyScheduled=True")
            except TimeoutError as err:
                outcome.violations.append(f"PodGroup condition: {err}")
        if side == PHALANX:
            events = group_events(rest, namespace)
            outcome.plans = plans_made[namespace] - plans_before if plans_made is not None else None
            outcome.events = [f"{e['reason']}: {e.get('note', '')[:200]}" for e in events]
            if outcome.events:  # something went wrong on the way: what kube-scheduler said to the pods
                outcome.events += pod_scheduling_events(rest, namespace)
        return outcome
    finally:
        try:
            cleanup(rest, namespace, case, cluster_paths)
        except KubeError:
            pass


def record(table, outcome: Outcome) -> None:
    table[(outcome.case.name, outcome.mode or outcome.side)] = outcome
    plans = f" | plans {outcome.plans}" if outcome.plans is not None else ""
    side = f"{outcome.side} ({outcome.mode})" if outcome.mode else outcome.side
    print(f"\n  {side:18} {outcome.case.name:14} {outcome.cells()}{plans}", flush=True)
    for line in outcome.events:
        print(f"    {line}", flush=True)


def check_common(outcome: Outcome) -> None:
    case = outcome.case
    assert outcome.bound in (0, case.replicas), (
        f"{outcome.side}: {case.name} partly bound at rest: {outcome.bound} of minCount {case.replicas}")
    assert not outcome.violations, f"{outcome.side}: {case.name}: " + "; ".join(outcome.violations)


# --- the tests: every in-tree row first, then phalanx's --------------------------------------

@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_in_tree(case, rest, namespace, nodes, in_tree, table):
    outcome = run_case(rest, namespace, nodes, case, IN_TREE)
    record(table, outcome)
    check_common(outcome)
    assert outcome.bound == case.replicas, f"in-tree did not place {case.name}: {outcome.why}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_phalanx(case, rest, namespace, nodes, schedulers, scheduler_mode, controller, table, plans_made):
    if (case.name, IN_TREE) not in table:  # run alone (-k): measure in-tree first, in its own namespace
        with scratch_namespace(rest, f"{namespace[:50]}-it") as other:
            record(table, run_case(rest, other, nodes, case, IN_TREE))
        for name in list(nodes.names):
            nodes.delete(name)
    outcome = run_case(rest, namespace, nodes, case, PHALANX, plans_made)
    outcome.mode = scheduler_mode
    record(table, outcome)
    check_common(outcome)
    theirs = table[(case.name, IN_TREE)]
    if not theirs.bound:
        return  # in-tree placed nothing: only the checks above apply
    assert outcome.bound == case.replicas, (
        f"phalanx did not place {case.name}, in-tree did: {outcome.why}; events: {outcome.events}")
    if case.soft_anti_affinity:
        assert outcome.metrics["distinct_nodes"] >= theirs.metrics["distinct_nodes"], (
            f"soft anti-affinity: phalanx used {outcome.metrics['distinct_nodes']} nodes, "
            f"in-tree {theirs.metrics['distinct_nodes']}")
    if case.soft_spread_key:
        assert outcome.metrics["soft_skew"] <= theirs.metrics["soft_skew"], (
            f"ScheduleAnyway spread over {case.soft_spread_key}: phalanx skew {outcome.metrics['soft_skew']}, "
            f"in-tree {theirs.metrics['soft_skew']}")


def scaled_up(rest, namespace: str, nodes, case: Case, side: str, replicas: int) -> int:
    """Create ``case``, wait until it is bound, scale it to ``replicas``, wait again; the distinct
    nodes its pods then use."""
    names, sc_name, cluster_paths = provision(rest, namespace, nodes, case, side)
    try:
        create(rest, case.statefulset(namespace, SCHEDULER[side], sc_name, case.name if side == IN_TREE else None),
               namespace)
        wait_for(lambda: bound_count(rest, namespace, case) == case.replicas, BIND_TIMEOUT,
                 f"{side}: {case.name} all {case.replicas} bound", interval=0.2)
        rest.patch(path("apps/v1", "StatefulSet", namespace, case.name), {"spec": {"replicas": replicas}})
        wait_for(lambda: bound_count(rest, namespace, case) == replicas, BIND_TIMEOUT,
                 f"{side}: {case.name} all {replicas} bound after scale-up", interval=0.2)
        result = read_result(rest, namespace, case, names)
        assert not hard_violations(result), hard_violations(result)
        return len({p["spec"]["nodeName"] for p in result.pods})
    finally:
        cleanup(rest, namespace, case, cluster_paths)


def test_soft_anti_affinity_holds_after_scale_up(rest, namespace, nodes, schedulers, controller):
    """The reported case: a gang StatefulSet with soft anti-affinity, scaled up through phalanx's
    controller (minCount synced, the new pod gated then released) keeps its replicas on distinct
    nodes while room exists — at least as spread as in-tree on the same objects."""
    case = by_name("etcd")
    replicas = len(case.nodes)
    with scratch_namespace(rest, f"{namespace[:50]}-it") as other:
        theirs = scaled_up(rest, other, nodes, case, IN_TREE, replicas)
    for name in list(nodes.names):
        nodes.delete(name)
    ours = scaled_up(rest, namespace, nodes, case, PHALANX, replicas)
    print(f"\n  scale-up {case.name} 3 -> {replicas}: distinct nodes in-tree {theirs}, phalanx {ours}")
    assert ours == replicas, f"phalanx: {replicas} replicas with soft anti-affinity on {ours} of {replicas} nodes"
    assert ours >= theirs


# --- the checks themselves, on made-up placements (no control plane) --------------------------

def made_up(case: Case, placement: list[int], pv_nodes: list[int] | None = None) -> Result:
    """``case``'s pods placed on its node number ``placement[i]``; with ``pv_nodes``, pod i's claim
    is bound to a local PV on node ``pv_nodes[i]``."""
    names = case.node_names("t")
    nodes = {n: node(n, **kwargs) for n, (_, kwargs) in zip(names, case.nodes, strict=False)}
    for n in nodes.values():
        n["spec"].setdefault("taints", [])
    template = case.statefulset("ns", "s", "sc", None)["spec"]["template"]
    pods_, claims, volumes = [], {}, {}
    for i, where in enumerate(placement):
        pod = {"metadata": {"name": f"{case.name}-{i}", "labels": dict(template["metadata"]["labels"])},
               "spec": {**json.loads(json.dumps(template["spec"])), "nodeName": names[where]}}
        if pv_nodes is not None:
            pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-{i}"}}]
            claims[f"data-{i}"] = {"metadata": {"name": f"data-{i}", "uid": f"u{i}"},
                                   "spec": {"volumeName": f"pv{i}"}, "status": {"phase": "Bound"}}
            volumes[f"pv{i}"] = persistent_volume(f"pv{i}", "sc", "1Gi", names[pv_nodes[i]])
            volumes[f"pv{i}"]["spec"]["claimRef"] = {"uid": f"u{i}"}
        pods_.append(pod)
    return Result(pods_, nodes, claims, volumes)


def by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


@pytest.mark.parametrize("name,placement,pv_nodes,expected", [
    ("zookeeper", [0, 1, 2], None, None),
    ("zookeeper", [0, 0, 1], None, "required anti-affinity"),
    ("trainer", [3, 4, 5, 6], None, None),
    ("trainer", [3, 3, 4, 5], None, "hostPort used twice"),
    ("trainer", [0, 4, 5, 6], None, "required pod affinity"),
    ("cockroachdb", [0, 1, 3, 4, 5], None, None),
    ("cockroachdb", [0, 1, 2, 3, 4], None, "skew 3 > maxSkew 1"),
    ("inference", [0, 0, 1, 2], None, None),
    ("inference", [0, 1, 2, 3], None, "outside its required node affinity"),
    ("inference", [0, 0, 0, 1], None, "nvidia.com/gpu requested 6 > allocatable 4"),
    ("local-volumes", [1, 2, 5, 6], [1, 2, 5, 6], None),
    ("local-volumes", [1, 2, 5, 7], [1, 2, 5, 6], "its PV pv3 is on another node"),
])
def test_the_checks_catch_broken_placements(name, placement, pv_nodes, expected):
    found = hard_violations(made_up(by_name(name), placement, pv_nodes))
    if expected is None:
        assert found == []
    else:
        assert any(expected in v for v in found), found


def test_soft_metrics_count_nodes_and_skew():
    kafka = by_name("kafka")
    assert soft_metrics(made_up(kafka, [0, 3, 5]), kafka) == {"distinct_nodes": 3, "soft_skew": 0}
    assert soft_metrics(made_up(kafka, [0, 0, 1]), kafka) == {"distinct_nodes": 2, "soft_skew": 3}
