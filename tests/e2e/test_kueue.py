"""phalanx behind Kueue: Kueue's quotas decide *when* a gang may start, phalanx *where* it lands
whole (docs/kueue.md).

The real Kueue manager (``sigs.k8s.io/kueue`` at ``KUEUE_VERSION``, hack/build-kueue.sh) runs with its
webhooks on the e2e control plane (harness/kueue.py; its topology-aware scheduling off), beside
phalanx in each integration mode. Each test writes what a Kueue user writes — a ResourceFlavor, a
ClusterQueue with a CPU quota, a LocalQueue — and submits its workloads to the LocalQueue with the
``kueue.x-k8s.io/queue-name`` label:

- a gang **Job** (``spec.scheduling``, the Job controller's ``WorkloadWithJob``): the second of two
  Jobs that together exceed the quota stays suspended by Kueue (no pod exists), and once the first
  ends Kueue admits it and phalanx places its pods whole in one rack;
- a gang **StatefulSet** (phalanx's scheduling annotation; Kueue's ``statefulset`` integration gates
  its pods): held gated while over quota — phalanx plans none of them — then placed whole;
- **quota preemption**: a high-priority Job (Kueue's WorkloadPriorityClass) evicts a running
  low-priority gang Job as one Kueue Workload: the low Job is suspended and every one of its pods
  goes, none is left bound, and the high Job lands whole;
- a **cohort**: a ClusterQueue borrows its neighbour's unused quota for a gang, and the neighbour
  reclaims it for its own gang: the borrower's gang goes whole, the reclaimer's lands whole.

There is no in-tree side: what these tests check is how Kueue and phalanx meet, not a placement
kube-scheduler would make differently (its gang scheduling is measured beside phalanx elsewhere).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from harness import RACK, create, finish_pod, job, placement, pods, statefulset, wait_for
from harness.kueue import (
    KUEUE_API,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    KueueManager,
    cluster_queue,
    local_queue,
    resource_flavor,
    workload_priority_class,
)

from cluster.kube import Kube

from .conftest import NodePool, start_phalanx_scheduler

SCHEDULER = "kueue-phalanx"
GANG_IN_A_RACK = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}
CPU1 = {"cpu": "1"}
TIMEOUT = 90.0


@pytest.fixture(scope="module")
def kueue(control_plane) -> Iterator[KueueManager]:
    manager = KueueManager(control_plane).start()
    yield manager
    manager.stop()


@pytest.fixture(scope="module")
def ours(control_plane, scheduler_mode, phalanx, kueue) -> Iterator[Any]:
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, phalanx, scheduler_name=SCHEDULER,
                                        name=f"kueue-phalanx-{scheduler_mode}")
    yield scheduler
    scheduler.stop()


class Queues:
    """A test's Kueue objects (cluster-scoped ones named after its namespace), deleted at the end."""

    def __init__(self, rest: Kube, namespace: str):
        self.rest, self.namespace = rest, namespace
        self.prefix = namespace[-40:]
        self.made: list[str] = []

    def name(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    def add(self, obj: dict) -> dict:
        kind = obj["kind"].lower() + ("es" if obj["kind"].endswith("s") else "s")
        if obj["kind"] in ("ResourceFlavor", "ClusterQueue", "WorkloadPriorityClass"):
            created = self.rest.create(f"{KUEUE_API}/{kind}", obj)
            self.made.append(f"{KUEUE_API}/{kind}/{obj['metadata']['name']}")
        else:
            created = self.rest.create(f"{KUEUE_API}/namespaces/{self.namespace}/{kind}", obj)
        return created

    def queue(self, cpu: int, cohort: str = "", preemption: dict | None = None, queue: str = "lq",
              borrowing_limit: str | None = None) -> str:
        """A flavor (once), a ClusterQueue of ``cpu`` CPUs and the LocalQueue ``queue`` on it; the
        ClusterQueue's name."""
        flavor = self.name("flavor")
        if not any(m.endswith(f"/{flavor}") for m in self.made):
            self.add(resource_flavor(flavor))
        cq = self.name(f"cq-{queue}")
        self.add(cluster_queue(cq, flavor, cpu, cohort=cohort, preemption=preemption,
                               borrowing_limit=borrowing_limit))
        self.add(local_queue(queue, cq))
        wait_for(lambda: self._active(cq), 30, f"ClusterQueue {cq} active")
        return cq

    def _active(self, cq: str) -> bool:
        conditions = (self.rest.get(f"{KUEUE_API}/clusterqueues/{cq}").get("status") or {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

    def workloads(self) -> list[dict]:
        return self.rest.list_items(f"{KUEUE_API}/namespaces/{self.namespace}/workloads")

    def close(self) -> None:
        self.rest.delete(f"/api/v1/namespaces/{self.namespace}", missing_ok=True)
        for path in reversed(self.made):
            self.rest.delete(path, missing_ok=True)


@pytest.fixture
def queues(rest: Kube, namespace: str) -> Iterator[Queues]:
    made = Queues(rest, namespace)
    yield made
    made.close()


def racks(nodes: NodePool, namespace: str, per_rack: int = 4) -> str:
    """Racks a and b of ``per_rack`` one-CPU nodes, labelled with this test's pool."""
    pool = namespace[-40:]
    for rack in ("a", "b"):
        for i in range(per_rack):
            nodes.add(f"{pool}-{rack}{i}", cpu="1", rack=f"{pool}-{rack}", labels={"phalanx.dev/e2e-pool": pool})
    return pool


def gang_job(rest: Kube, namespace: str, name: str, size: int, pool: str, queue: str = "lq",
             priority: str = "") -> None:
    """An Indexed gang Job of ``size`` one-CPU pods in one rack, submitted to LocalQueue ``queue``."""
    obj = job(name, size, requests=CPU1, scheduler_name=SCHEDULER, node_selector={"phalanx.dev/e2e-pool": pool})
    obj["metadata"]["labels"] = {QUEUE_LABEL: queue, **({PRIORITY_LABEL: priority} if priority else {})}
    obj["spec"]["scheduling"] = GANG_IN_A_RACK
    create(rest, obj, namespace)


def job_pods(rest: Kube, namespace: str, name: str) -> list[dict]:
    return [p for p in pods(rest, namespace, label_selector=f"batch.kubernetes.io/job-name={name}")
            if not p["metadata"].get("deletionTimestamp")]


def wait_whole(rest: Kube, namespace: str, name: str, size: int, what: str) -> dict[str, str]:
    """Wait until ``size`` pods of Job ``name`` are bound; pod -> node. Asserts one rack."""
    def probe() -> dict[str, str] | None:
        bound = placement(job_pods(rest, namespace, name))
        return bound if len(bound) == size else None
    bound = wait_for(probe, TIMEOUT, what)
    assert len(rack_names(bound)) == 1, f"{what}: split across racks {bound}"
    return bound


def rack_names(bound: dict[str, str]) -> list[str]:
    return sorted({f"rack {node.rsplit('-', 1)[1][0]}" for node in bound.values()})


def suspended(rest: Kube, namespace: str, name: str) -> bool:
    return bool(rest.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")["spec"].get("suspend"))


def kueue_workload(queues: Queues, job_name: str) -> dict | None:
    return next((w for w in queues.workloads()
                 if any(o.get("name") == job_name for o in w["metadata"].get("ownerReferences") or [])), None)


def admitted(workload: dict | None) -> bool:
    conditions = ((workload or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)


def test_a_gang_job_over_quota_waits_suspended_then_lands_whole(rest, namespace, nodes, queues, ours, scheduler_mode):
    pool = racks(nodes, namespace)
    queues.queue(cpu=4)
    gang_job(rest, namespace, "first", 4, pool)
    first = wait_whole(rest, namespace, "first", 4, "the first Job admitted by Kueue and placed by phalanx")
    gang_job(rest, namespace, "second", 4, pool)
    # over quota: Kueue keeps it suspended, so the Job controller makes no pod (the nodes have room)
    wait_for(lambda: kueue_workload(queues, "second") is not None, 30, "Kueue's Workload for the second Job")
    assert suspended(rest, namespace, "second") and not admitted(kueue_workload(queues, "second"))
    assert job_pods(rest, namespace, "second") == []
    for pod in first:
        finish_pod(rest, namespace, pod)
    second = wait_whole(rest, namespace, "second", 4, "the second Job admitted once the first ended, placed whole")
    assert admitted(kueue_workload(queues, "second")) and not suspended(rest, namespace, "second")
    print(f"\n  {scheduler_mode}: first Job in {rack_names(first)}, the second, held until then, in {rack_names(second)}")


def test_a_gang_statefulset_waits_gated_while_over_quota_then_lands_whole(rest, namespace, nodes, queues, ours,
                                                                           registered_controller, scheduler_mode):
    pool = racks(nodes, namespace)
    queues.queue(cpu=4)

    def sts(name: str) -> dict:
        obj = statefulset(name, 4, requests=CPU1, scheduling=GANG_IN_A_RACK, scheduler_name=SCHEDULER,
                          node_selector={"phalanx.dev/e2e-pool": pool})
        obj["metadata"].setdefault("labels", {})[QUEUE_LABEL] = "lq"
        return obj

    def members(name: str) -> list[dict]:
        return [p for p in pods(rest, namespace) if p["metadata"]["name"].startswith(f"{name}-")
                and not p["metadata"].get("deletionTimestamp")]

    create(rest, sts("db"), namespace)
    wait_for(lambda: len(placement(members("db"))) == 4 or None, TIMEOUT, "the first StatefulSet placed whole")
    create(rest, sts("cache"), namespace)
    wait_for(lambda: len(members("cache")) == 4 or None, TIMEOUT, "the second StatefulSet's pods created")
    held = members("cache")
    assert all(p["spec"].get("schedulingGates") for p in held), "Kueue gates the pods over quota"
    assert placement(held) == {}
    rest.delete(f"/apis/apps/v1/namespaces/{namespace}/statefulsets/db")
    bound = wait_for(lambda: placement(members("cache")) if len(placement(members("cache"))) == 4 else None,
                     TIMEOUT, "the second StatefulSet admitted once the first went, placed whole")
    assert len(rack_names(bound)) == 1, bound
    print(f"\n  {scheduler_mode}: the gated StatefulSet bound in {rack_names(bound)}")


def test_kueue_preempts_a_running_gang_job_whole(rest, namespace, nodes, queues, ours, scheduler_mode):
    pool = racks(nodes, namespace)
    low, high = queues.name("low"), queues.name("high")
    queues.add(workload_priority_class(low, 10))
    queues.add(workload_priority_class(high, 1000))
    queues.queue(cpu=4, preemption={"withinClusterQueue": "LowerPriority"})
    gang_job(rest, namespace, "low", 4, pool, priority=low)
    wait_whole(rest, namespace, "low", 4, "the low-priority gang placed")
    gang_job(rest, namespace, "high", 4, pool, priority=high)
    wait_for(lambda: suspended(rest, namespace, "low") or None, TIMEOUT, "Kueue suspends the low Job (evicted)")
    high_bound = wait_whole(rest, namespace, "high", 4, "the high-priority gang placed whole")
    wait_for(lambda: job_pods(rest, namespace, "low") == [] or None, TIMEOUT, "every pod of the low Job gone")
    assert not admitted(kueue_workload(queues, "low"))
    print(f"\n  {scheduler_mode}: low evicted whole, high in {rack_names(high_bound)}")


def test_a_cohort_borrows_for_a_gang_and_reclaims_it_whole(rest, namespace, nodes, queues, ours, scheduler_mode):
    pool = racks(nodes, namespace, per_rack=6)  # a rack holds the borrower's 6
    cohort = queues.name("cohort")
    queues.queue(cpu=4, cohort=cohort, queue="lq-a")
    queues.queue(cpu=4, cohort=cohort, queue="lq-b", preemption={"reclaimWithinCohort": "Any"})
    gang_job(rest, namespace, "borrower", 6, pool, queue="lq-a")  # 6 of its ClusterQueue's 4: borrows 2
    wait_for(lambda: len(placement(job_pods(rest, namespace, "borrower"))) == 6 or None, TIMEOUT,
             "the borrowing gang placed whole")
    gang_job(rest, namespace, "owner", 4, pool, queue="lq-b")  # its own quota, lent out: reclaimed
    wait_for(lambda: suspended(rest, namespace, "borrower") or None, TIMEOUT, "Kueue suspends the borrower")
    owner = wait_whole(rest, namespace, "owner", 4, "the reclaiming gang placed whole")
    wait_for(lambda: job_pods(rest, namespace, "borrower") == [] or None, TIMEOUT, "every pod of the borrower gone")
    assert not admitted(kueue_workload(queues, "borrower"))
    print(f"\n  {scheduler_mode}: borrower reclaimed whole, owner in {rack_names(owner)}")
