"""Solver worker processes (cycle/workers.py): a solve runs in another process and comes back the
same as in serve's; a worker that dies is started again and the solve sent once more; the verbs
meanwhile run with the interpreter free."""

from __future__ import annotations

import os
import pickle
import time

import pytest

from cycle.workers import SolverWorkers
from solver import InvalidInput, Snapshot, SolverError, first_plan, place

from .solver_builders import cluster, gang, pods


def _full(racks: int, per_rack: int, taken: int) -> Snapshot:
    """``racks`` x ``per_rack`` 4-GPU nodes, the first ``taken`` running a low-priority 4-GPU pod."""
    nodes = cluster(racks=racks, per_rack=per_rack, gpus=4)
    bound = [p for i, n in enumerate(nodes[:taken]) for p in pods(f"low{i}", 1, gpus=4, node=n.name)]
    return Snapshot(nodes, bound=bound)


def _die_once(marker: str, value: int) -> int:
    """Kills its worker the first time it runs (the marker file says whether it ran)."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return value


def _always_die() -> None:
    os._exit(3)


def _pid() -> int:
    return os.getpid()


def _refuse() -> None:
    raise InvalidInput("podgroup ns/g: bad input")


def _cpu(seconds: float) -> float:
    """Pure Python for ``seconds``, holding the interpreter it runs in; returns the CPU it took."""
    end, started = time.perf_counter() + seconds, time.process_time()
    while time.perf_counter() < end:
        pass
    return time.process_time() - started


@pytest.fixture
def workers():
    w = SolverWorkers()
    yield w
    w.close()


def test_a_solve_runs_in_another_process_and_answers_as_in_this_one(workers):
    snapshot = _full(2, 4, 3)
    group = gang("g", 4, gpus=4, key="topology.kubernetes.io/rack")
    here = place(snapshot, group)
    there = workers.run(place, snapshot, group)
    assert here.assignments and there.assignments == here.assignments and there.domain == here.domain
    assert workers.pids() and workers.pids()[0] != os.getpid() and workers.run(_pid) == workers.pids()[0]


def test_a_snapshot_travels_without_its_derived_caches():
    snapshot = _full(2, 4, 3)
    place(snapshot, gang("g", 4, gpus=4))  # fills the caches
    assert snapshot.node_cache and snapshot.usage_cache
    copy = pickle.loads(pickle.dumps(snapshot))
    assert copy.node_cache == {} and copy.usage_cache == {}
    assert (copy.used == snapshot.used).all() and copy.nodes == snapshot.nodes and copy.bound == snapshot.bound
    assert snapshot.node_cache  # the original keeps its own


def test_the_solvers_errors_come_back_as_they_are(workers):
    with pytest.raises(InvalidInput, match="bad input"):
        workers.run(_refuse)


def test_a_worker_that_dies_is_started_again_and_the_solve_sent_once_more(workers, tmp_path):
    first = workers.run(_pid)
    assert workers.run(_die_once, str(tmp_path / "ran"), 7) == 7
    assert workers.restarts == 1 and workers.run(_pid) != first


def test_a_solve_that_kills_every_worker_is_an_error_not_a_hang(workers):
    with pytest.raises(SolverError, match="died 2 times"):
        workers.run(_always_die)
    assert workers.run(_pid) > 0  # and the next solve gets a fresh worker


def test_the_interpreter_is_free_while_a_worker_solves(workers):
    """The solve's CPU is the worker's, not this process's: a thread that waits on it costs this
    interpreter nothing while the other threads run (CPU counted per process, not timed)."""
    workers.run(_pid)  # started and warm
    before = time.process_time()
    worker_cpu = workers.run(_cpu, 1.0)
    here = time.process_time() - before
    assert worker_cpu > 0.1 and here < 0.2 * worker_cpu, (here, worker_cpu)
    before = time.process_time()
    same = _cpu(1.0)  # the same solve in this interpreter: its CPU is all here
    assert time.process_time() - before >= 0.9 * same


def test_a_preemption_search_over_victim_prefixes_is_one_call(workers):
    from solver import PreemptionContext
    snapshot = _full(1, 2, 2)
    group = gang("hi", 2, gpus=4, priority=100)
    plan = workers.run(first_plan, snapshot, group, [PreemptionContext()])
    assert plan is not None and len(plan.victims) == 2
    assert workers.run(first_plan, snapshot, group, []) is None


def _bound_uids(snapshot: Snapshot) -> list[str]:
    return [p.uid for p in snapshot.bound]


def test_a_worker_is_sent_only_what_changed_and_solves_on_the_same_snapshot(workers, monkeypatch):
    """The worker keeps the node list and the bound pods it was sent: the next solve carries the
    pods that changed, never the nodes again, and sees exactly the snapshot serve has."""
    from cycle.workers import _Sent
    sends = []
    real = _Sent.ship
    monkeypatch.setattr(_Sent, "ship", lambda self, snap: sends.append(real(self, snap)) or sends[-1])
    nodes = cluster(racks=2, per_rack=4, gpus=4)
    low = [p for i, n in enumerate(nodes[:3]) for p in pods(f"low{i}", 1, gpus=4, node=n.name)]
    base = Snapshot(nodes)  # the cache's way: one node list, usage and bound pods swapped in
    first = base.with_used(Snapshot(nodes, bound=low).used, low)
    assert workers.run(_bound_uids, first) == [p.uid for p in low]
    assert sends[-1].nodes == first.nodes and len(sends[-1].added) == 3
    late = list(pods("late", 1, gpus=4, node=nodes[5].name))
    second = base.with_used(Snapshot(nodes, bound=low[1:] + late).used, low[1:] + late)
    group = gang("g", 3, gpus=4, key="topology.kubernetes.io/rack")  # only rack r1 has 3 free nodes
    there = workers.run(place, second, group)
    assert sends[-1].nodes is None and [p.uid for p in sends[-1].added] == ["late-0"]
    assert low[0].uid not in sends[-1].order and low[0].uid not in workers._replica.pods
    here = place(second, group)
    assert there.assignments and there.assignments == here.assignments and there.domain == here.domain
    assert workers.run(_bound_uids, second) == _bound_uids(second)
    assert sends[-1].added == () and sends[-1].order is None and workers.resent == 0


def test_a_worker_without_the_replica_a_send_builds_on_gets_the_whole_snapshot(workers):
    snapshot = _full(2, 4, 3)
    assert workers.run(_bound_uids, snapshot) == _bound_uids(snapshot)
    workers._replica.ship(snapshot)  # a send the worker never got: its replica is behind
    assert workers.run(_bound_uids, snapshot) == _bound_uids(snapshot) and workers.resent == 1


def test_a_worker_killed_between_solves_is_sent_the_whole_snapshot(workers):
    import signal
    snapshot = _full(2, 4, 3)
    group = gang("g", 4, gpus=4, key="topology.kubernetes.io/rack")
    first = workers.run(place, snapshot, group)
    os.kill(workers.pids()[0], signal.SIGKILL)
    again = workers.run(place, snapshot, group)
    assert again.assignments == first.assignments and workers.restarts == 1


ORPHAN_SCRIPT = """
import os, sys, time
from cycle.workers import SolverWorkers
workers = SolverWorkers()  # no main-module guard: the worker never imports this script
print(workers.run(os.getpid), flush=True)
time.sleep(120)
"""


def test_a_worker_whose_serve_was_killed_exits(tmp_path):
    """serve killed (SIGKILL: no shutdown runs) leaves no worker behind to live beside the next."""
    import signal
    import subprocess
    import sys
    script = tmp_path / "serve_like.py"
    script.write_text(ORPHAN_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    worker = int(parent.stdout.readline())
    os.kill(worker, 0)  # alive
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while _alive(worker):
        assert time.monotonic() < deadline, "the worker outlived its serve"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped by init) is gone
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pods_the_cluster_deleted_are_not_held_for_the_worker_after_a_prune(workers):
    """serve's record of what the worker holds keeps the pods of the last solve; the requeue
    thread's full prune drops those the cache no longer has (a drained cluster holds none), and
    the next solve still sees exactly its snapshot."""
    nodes = cluster(racks=2, per_rack=4, gpus=4)
    low = [p for i, n in enumerate(nodes[:3]) for p in pods(f"low{i}", 1, gpus=4, node=n.name)]
    base = Snapshot(nodes)
    first = base.with_used(Snapshot(nodes, bound=low).used, low)
    assert workers.run(_bound_uids, first) == [p.uid for p in low]
    workers.prune({low[2].uid})  # the cache lost the first two
    assert set(workers._replica.pods) == {low[2].uid} and workers._replica.bound is None
    workers.prune(set())
    assert workers._replica.pods == {}
    second = base.with_used(Snapshot(nodes, bound=low[2:]).used, low[2:])
    assert workers.run(_bound_uids, second) == [low[2].uid] and workers.resent == 0
    assert workers.run(_bound_uids, first) == [p.uid for p in low]  # and back: all sent again


def test_warm_starts_the_worker_before_its_first_solve():
    workers = SolverWorkers()
    try:
        assert workers.pids() == []
        workers.warm()
        deadline = time.monotonic() + 10
        while not workers.pids():
            assert time.monotonic() < deadline, "the worker was not started"
            time.sleep(0.01)
        started = workers.pids()[0]
        assert workers.run(_pid) == started and workers.restarts == 0  # the first solve used it
    finally:
        workers.close()
