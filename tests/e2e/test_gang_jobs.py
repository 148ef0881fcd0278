"""Gang Jobs that already ran, through the real Job controller (``WorkloadWithJob``), under phalanx
in each mode and under in-tree gang scheduling, side by side on one control plane.

Each Job carries ``spec.scheduling`` (a gang, minCount left to the Job controller: its
parallelism, one rack required); the Job controller makes its Workload and PodGroup and stamps its
pods; phalanx sees only what the controller makes. KWOK ends a pod's containers when the test says
so (``finish_pod``: exit code 0 → Succeeded, else Failed), as a kubelet would report it; a pod
*lost* is deleted, as an eviction or a node loss deletes it, and one that *crashes* exits 1. The
cases (docs/design.md: "A gang's history"):

- ``finished-then-crash`` — kubernetes/kubernetes#142330: index 0 finishes, index 1 crashes;
- ``finished-then-lost`` — the same, but index 1's pod is lost (deleted);
- ``tail`` — completions 6, parallelism 4: the Job starts later indexes as earlier ones finish;
  once no index is left to start, a running index crashes;
- ``failed-and-replaced`` — a pod crashes while the others run and the Job replaces it;
- ``success-policy`` — ``successPolicy`` (2 indexes succeeded) and ``podReplacementPolicy: Failed``:
  index 0 finishes, index 1 crashes and is replaced once Failed; the Job succeeds early;
- ``index-failed-for-good`` — ``backoffLimitPerIndex`` with a ``FailIndex`` rule for exit code 42:
  index 0 exits 42 and is never replaced; index 1 then crashes (exit 1: retried).

phalanx: every replacement binds, into the rack of the gang's running members, and every Job
reaches its end. In-tree gang scheduling no longer counts finished pods: where fewer than minCount
members still exist, the replacement stays Pending and the Job never ends
(kubernetes/kubernetes#142330). A crashed pod leaves its scheduler at once, and the Job controller
creates its replacement after its 10 s back-off, so in-tree strands every case where fewer than
minCount members run: the test asserts that, so a fix upstream shows here. A *lost* pod's
replacement is created at once, while the old pod is still terminating (the Job's finalizer holds
it; a kubelet's grace period would hold it longer), and in-tree counts the terminating pod: whether
it then binds depends on which it sees first, so that case is only recorded. A replacement still
Pending after STRAND seconds is "stranded".
The cases of one side run at once, each on its own pool of nodes (two racks of four one-CPU nodes,
its pods held to it by a nodeSelector) and in its own namespace. A table of outcomes is printed.

Run alone:  .venv/bin/python -m pytest tests/e2e/test_gang_jobs.py -q -p no:cacheprovider -s
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import pytest
from harness import RACK, create, finish_pod, job, placement, pods, wait_for

from cluster import names

from .conftest import PHALANX_SCHEDULER_MODES, NodePool, start_in_tree, start_phalanx_scheduler

IN_TREE = "in-tree"
SCHEDULER = {IN_TREE: "jobs-in-tree", "phalanx": "jobs-phalanx"}
INDEX = names.LABEL_JOB_COMPLETION_INDEX
JOB_NAME = "batch.kubernetes.io/job-name"
POOL = "phalanx.dev/e2e-pool"
GANG_IN_A_RACK = {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}
STRAND = 15.0  # in-tree: how long a replacement must stay Pending to be recorded as stranded
TIMEOUT = 90.0


@pytest.fixture(scope="module")
def in_tree(start_scheduler):
    """kube-scheduler with in-tree gang scheduling (its own scheduler name), for the whole module."""
    return start_in_tree(start_scheduler, SCHEDULER[IN_TREE], "jobs-in-tree")


@pytest.fixture(scope="module")
def phalanx_side(scheduler_mode, phalanx, control_plane):
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, phalanx, scheduler_name=SCHEDULER["phalanx"],
                                        name=f"jobs-phalanx-{scheduler_mode}")
    yield scheduler
    scheduler.stop()


@pytest.fixture(scope="module")
def table():
    """Outcomes by (case, side); printed at the module's end."""
    outcomes: dict[tuple[str, str], str] = {}
    yield outcomes
    sides = [IN_TREE, *PHALANX_SCHEDULER_MODES]
    rows = [f"| {case} | " + " | ".join(outcomes.get((case, s), "not run") for s in sides) + " |" for case in CASES]
    print("\ngang Jobs that already ran: outcome per scheduler\n| case | " + " | ".join(sides) + " |\n|---|"
          + "---|" * len(sides) + "\n" + "\n".join(rows))


# --- one run of a case: a namespace, a node pool and a Job ----------------------------------------

@dataclass
class Run:
    rest: object
    side: str  # in-tree, or phalanx's mode
    case: str
    nodes: NodePool
    namespace: str = ""
    pool: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def phalanx(self) -> bool:
        return self.side != IN_TREE

    def start(self, parallelism: int, completions: int | None = None, **spec: object) -> None:
        """The namespace, two racks of four one-CPU nodes, and the gang Job ``self.case``."""
        self.pool = f"{self.side[:2]}-{CASES.index(self.case)}-{uuid.uuid4().hex[:4]}"
        self.namespace = f"e2e-jobs-{self.pool}"
        self.rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": self.namespace}})
        for rack in ("a", "b"):
            for i in range(4):
                self.nodes.add(f"{self.pool}-{rack}-{i}", cpu="1", rack=f"{self.pool}-{rack}", labels={POOL: self.pool})
        scheduler = SCHEDULER["phalanx" if self.phalanx else IN_TREE]
        obj = job(self.case, parallelism, requests={"cpu": "1"}, scheduler_name=scheduler,
                  node_selector={POOL: self.pool})
        obj["spec"].update({"completions": completions or parallelism, "backoffLimit": 6,
                            "scheduling": GANG_IN_A_RACK, **spec})
        obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
        create(self.rest, obj, self.namespace)

    def close(self) -> None:
        if self.namespace:
            self.rest.delete(f"/api/v1/namespaces/{self.namespace}", missing_ok=True)
            self.rest.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods",
                              params={"gracePeriodSeconds": 0})

    # -- reading ---------------------------------------------------------------------------------
    def live(self) -> list[dict]:
        return [p for p in pods(self.rest, self.namespace, f"{JOB_NAME}={self.case}")
                if not p["metadata"].get("deletionTimestamp")]

    def running(self) -> dict[str, dict]:
        """index -> the live pod that is not finished."""
        return {p["metadata"]["labels"][INDEX]: p for p in self.live()
                if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")}

    def racks_of(self, where: dict[str, str]) -> set[str]:
        return {n.rsplit("-", 1)[0] for n in where.values()}

    def job_condition(self, type_: str) -> dict | None:
        obj = self.rest.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{self.case}")
        return next((c for c in obj.get("status", {}).get("conditions") or []
                     if c["type"] == type_ and c["status"] == "True"), None)

    # -- steps -----------------------------------------------------------------------------------
    def wait_running(self, indexes: set[str]) -> dict[str, str]:
        """Wait until exactly ``indexes`` run, all bound; pod name -> node."""
        def probe() -> dict[str, str] | None:
            now = self.running()
            where = placement(list(now.values()))
            return where if set(now) == indexes and len(where) == len(indexes) else None
        return wait_for(probe, TIMEOUT, f"{self.side} {self.case}: indexes {sorted(indexes)} running")

    def finish(self, index: str, exit_code: int = 0) -> str:
        """End the running pod of ``index`` with ``exit_code`` (0: Succeeded, else Failed); its name."""
        name = self.running()[index]["metadata"]["name"]
        finish_pod(self.rest, self.namespace, name, exit_code)
        phase = "Succeeded" if exit_code == 0 else "Failed"

        def ended() -> bool:  # that pod (a replacement may already run its index)
            obj = self.rest.get_or_none(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
            return obj is None or (obj.get("status") or {}).get("phase") == phase
        wait_for(ended, 60, f"{self.case}: index {index}'s pod {name} {phase} (exit code {exit_code})")
        return name

    def lose(self, index: str) -> str:
        """Delete the running pod of ``index`` (as an eviction or a lost node would); its name."""
        name = self.running()[index]["metadata"]["name"]
        self.rest.delete(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        return name

    def replacement(self, index: str, lost: str) -> str:
        """Wait for the Job's new pod for ``index``; its name. Notes whether the lost pod was still
        there (terminating, held by the Job's finalizer) when the replacement came."""
        found = wait_for(lambda: [p["metadata"]["name"] for p in self.live()
                                  if p["metadata"]["labels"][INDEX] == index and p["metadata"]["name"] != lost],
                         TIMEOUT, f"{self.case}: the Job made a replacement for index {index}")
        old = self.rest.get_or_none(f"/api/v1/namespaces/{self.namespace}/pods/{lost}")
        if old is not None and (old.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            self.notes.append("the lost pod still terminating when its replacement came")
        return found[0]

    def repaired(self, name: str, home: set[str]) -> bool:
        """phalanx: the replacement binds into the gang's rack. In-tree: recorded — bound, or still
        Pending after STRAND seconds ("stranded", the outcome kubernetes/kubernetes#142330 reports).
        True when it bound."""
        def where() -> dict[str, str]:
            return placement([p for p in self.live() if p["metadata"]["name"] == name])
        if not self.phalanx:
            try:
                found = wait_for(where, STRAND, "")
            except TimeoutError:
                self.notes.append("replacement stranded (kubernetes#142330)")
                return False
        else:
            found = wait_for(where, TIMEOUT, f"phalanx {self.side}: {self.case}'s replacement {name} bound")
        assert self.racks_of(found) == home, f"{name} bound to {found}, outside the gang's rack {home}"
        self.notes.append("replacement bound in the gang's rack")
        return True

    def finish_all(self) -> None:
        for index in sorted(self.running()):
            self.finish(index)

    def ends(self, type_: str = "Complete") -> None:
        wait_for(lambda: self.job_condition(type_), TIMEOUT, f"{self.side}: Job {self.case} {type_}")
        self.notes.append(f"Job {type_}")


# --- the cases ------------------------------------------------------------------------------------

def finished_then_crash(run: Run) -> None:
    run.start(4)
    home = run.racks_of(run.wait_running({"0", "1", "2", "3"}))
    run.finish("0")
    crashed = run.finish("1", exit_code=1)
    if run.repaired(run.replacement("1", crashed), home):
        run.finish_all()
        run.ends()


def finished_then_lost(run: Run) -> None:
    run.start(4)
    home = run.racks_of(run.wait_running({"0", "1", "2", "3"}))
    run.finish("0")
    lost = run.lose("1")
    if run.repaired(run.replacement("1", lost), home):
        run.finish_all()
        run.ends()


def tail(run: Run) -> None:
    run.start(4, completions=6)
    home = run.racks_of(run.wait_running({"0", "1", "2", "3"}))
    run.finish("0")
    run.wait_running({"1", "2", "3", "4"})  # index 4 joins: 3 running + 1 new (minCount met)
    run.finish("1")
    run.wait_running({"2", "3", "4", "5"})
    run.finish("2")  # no index left to start: 3, 4 and 5 run
    crashed = run.finish("3", exit_code=1)
    if run.repaired(run.replacement("3", crashed), home):
        run.finish_all()
        run.ends()


def failed_and_replaced(run: Run) -> None:
    """The replacement of a Failed pod whose siblings all run: minCount members run again, so both
    schedulers place it; the Failed pod is not counted twice."""
    run.start(4)
    home = run.racks_of(run.wait_running({"0", "1", "2", "3"}))
    crashed = run.finish("2", exit_code=1)
    if run.repaired(run.replacement("2", crashed), home):
        run.finish_all()
        run.ends()


def success_policy(run: Run) -> None:
    run.start(4, successPolicy={"rules": [{"succeededCount": 2}]}, podReplacementPolicy="Failed")
    home = run.racks_of(run.wait_running({"0", "1", "2", "3"}))
    run.finish("0")
    crashed = run.finish("1", exit_code=1)
    if run.repaired(run.replacement("1", crashed), home):
        run.finish("1")  # the second success: the Job succeeds and its other pods go
        run.ends()


def index_failed_for_good(run: Run) -> None:
    run.start(4, backoffLimitPerIndex=1, backoffLimit=None, podFailurePolicy={"rules": [
        {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}}]})
    home = run.racks_of(run.wait_running({"0", "1", "2", "3"}))
    run.finish("0", exit_code=42)  # FailIndex: index 0 is never replaced
    crashed = run.finish("1", exit_code=1)  # its first failure of one allowed: retried
    if run.repaired(run.replacement("1", crashed), home):
        run.finish_all()
        run.ends("Failed")  # with an index failed for good the Job fails once the rest finish


CASE_STEPS: dict[str, Callable[[Run], None]] = {
    "finished-then-crash": finished_then_crash,
    "finished-then-lost": finished_then_lost,
    "tail": tail,
    "failed-and-replaced": failed_and_replaced,
    "success-policy": success_policy,
    "index-failed-for-good": index_failed_for_good,
}
CASES = list(CASE_STEPS)


def run_side(rest, side: str, table: dict) -> None:
    """Every case on ``side`` at once; each failure named by its case."""
    pool = NodePool(rest)
    runs = [Run(rest, side, case, pool) for case in CASES]
    errors: list[str] = []

    def one(run: Run) -> None:
        try:
            CASE_STEPS[run.case](run)
        except Exception as err:  # noqa: BLE001 - collected and reported per case below
            errors.append(f"{side} {run.case}: {type(err).__name__}: {err}")
            run.notes.append(f"FAILED: {err}"[:120])
        finally:
            table[(run.case, side)] = "; ".join(run.notes)
    try:
        with ThreadPoolExecutor(len(runs)) as pool_:
            list(pool_.map(one, runs))
    finally:
        for run in runs:
            run.close()
        pool.cleanup()
    assert not errors, "\n".join(errors)


def test_in_tree_gang_scheduling_on_gang_jobs_that_already_ran(rest, in_tree, table):
    """The in-tree side, once: what upstream does with the same Jobs. A crash's replacement is
    stranded wherever fewer than minCount members run (kubernetes/kubernetes#142330) and bound
    where they do; a lost pod's is recorded only (see the module's docstring)."""
    run_side(rest, IN_TREE, table)
    stranded = {case for (case, side), text in table.items() if side == IN_TREE and "stranded" in text}
    assert stranded - {"finished-then-lost"} == {"finished-then-crash", "tail", "success-policy",
                                                 "index-failed-for-good"}


def test_phalanx_repairs_gang_jobs_that_already_ran_and_every_job_ends(rest, phalanx_side, scheduler_mode, table):
    run_side(rest, scheduler_mode, table)
