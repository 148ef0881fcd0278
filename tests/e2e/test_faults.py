"""phalanx when the real API server goes away and comes back: it keeps answering from its cache,
/readyz turns false once the watches are stale, and after the restart it recovers (re-list or
watch resume) and sees objects created while it was cut off. And the quick fault run: phalanx
serve, kube-scheduler, kube-apiserver and the controller leader killed at moments read from the
API, the at-rest invariants checked after each (the driver: harness/faults.py), in extender mode
and in plugin mode (phalanx-scheduler killed as the scheduler; serve and phalanx-scheduler killed
while a gang is planned and while it is half bound). And, in plugin mode, ``phalanx serve`` down:
plain pods still schedule, gang members wait whole, and the gang binds once serve is back."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from harness import (
    ControlPlane,
    assert_none_bound,
    create,
    create_node,
    locate,
    pod,
    podgroup,
    wait_all_bound,
    wait_for,
)
from harness.faults import FaultConfig, Rig, fault_control_plane, run_faults

from cluster.apiserver import ApiServerBackend
from cluster.cache import ClusterCache
from cluster.kube import Kube


@pytest.fixture
def lonely_plane():
    workdir = Path(tempfile.mkdtemp(prefix="phalanx-e2e-faults-"))
    plane = ControlPlane(workdir, locate()).start()
    try:
        yield plane
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_api_server_down_then_back(lonely_plane):
    rest = lonely_plane.rest
    create_node(rest, "before", gpu=1)
    cache = ClusterCache()
    backend = ApiServerBackend(Kube(str(lonely_plane.admin_kubeconfig), timeout=5), cache, stale_after=3.0)
    backend.start()
    try:
        assert backend.wait_synced(60)
        wait_for(lambda: "before" in cache.nodes, timeout=30, message="node cached")
        apiserver = next(c for c in lonely_plane.components if c.name == "kube-apiserver")
        argv = apiserver.argv
        apiserver.stop()
        wait_for(lambda: not backend.ready()[0], timeout=30, message="readiness false while the API server is down")
        assert "before" in cache.nodes  # still serving from the cache
        lonely_plane.components.remove(apiserver)
        restarted = lonely_plane._spawn("kube-apiserver", argv)
        restarted.wait_ready(lambda: rest.text("/readyz") == "ok", timeout=90)
        create_node(rest, "after", gpu=1)
        wait_for(lambda: "after" in cache.nodes, timeout=60, message="recovered and saw the new node")
        wait_for(lambda: backend.ready()[0], timeout=60, message="ready again")
    finally:
        backend.stop()


@pytest.fixture
def fault_plane():
    with fault_control_plane("phalanx-e2e-faults-") as plane:
        yield plane


def assert_no_violations(plane, cfg, rows, log):
    bad = [(r["i"], r["kind"], r["phase"], r["violations"]) for r in rows if r["violations"]]
    plane.keep_logs = plane.keep_logs or bool(bad)
    assert not bad, f"seed {cfg.seed}, {cfg.mode} mode: " + "\n".join(log) + f"\nlogs: {plane.workdir}/logs"


def test_kills_leave_no_partial_gang(fault_plane):
    """The quick fault run (the full one is ``phalanx bench faults``): one kill of each kind, then a
    few drawn, each followed by rest and the invariants (tests/e2e/harness/faults.py)."""
    log: list[str] = []
    cfg = FaultConfig(seed=7, faults=7, sizes={4: 0.5, 16: 0.4, 64: 0.1},
                      sequence=("serve", "scheduler", "apiserver", "controller", "serve", "serve", "scheduler"),
                      log=log.append)
    summary, rows = run_faults(fault_plane, cfg)
    assert len(rows) == 7 and summary["faults"] == 7
    assert_no_violations(fault_plane, cfg, rows, log)


STREAM_ENDED = "phalanx: reservations stream ended; reconnecting"  # plugin/pkg/phalanx/stream.go, at -v=2


def test_plugin_mode_kills_leave_no_partial_gang_and_half_bound_gangs_finish_whole(fault_plane):
    """The quick fault run in plugin mode: ``phalanx serve`` and phalanx-scheduler each SIGKILLed
    while a gang is half bound and while it is planned (members at the Permit barrier), then the
    API server mid-barrier (the controller leader's crash stays in the extender run: nothing of
    it differs by mode). At rest after each: the invariants (no partial gang, nothing bound off
    the placement record, ...); a gang caught with members bound has finished whole (from its
    record, after a serve restart); the plugin's reservations stream was seen ending (its log),
    and the later shots' gangs were planned and bound through the restarted serve."""
    log: list[str] = []
    cfg = FaultConfig(seed=11, faults=5, mode="plugin", sizes={4: 0.2, 16: 0.5, 64: 0.3},
                      sequence=("serve", "serve", "scheduler", "scheduler", "apiserver"),
                      phases=("binding", "planned", "binding", "planned", "binding"), log=log.append)
    summary, rows = run_faults(fault_plane, cfg)
    assert len(rows) == 5 and summary["faults"] == 5
    assert_no_violations(fault_plane, cfg, rows, log)
    assert summary["serve_starts"] == 3  # started once, restarted after each of its two kills
    half_bound = [r for r in rows if r["kind"] in ("serve", "scheduler") and 0 < r["bound_at_kill"] < r["min_count"]]
    unfinished = [r for r in half_bound if r["victim_bound_at_rest"] < r["min_count"]]
    assert not unfinished, "half-bound gangs not finished at rest:\n" + "\n".join(log)
    assert any(r["victim_bound_at_rest"] >= r["min_count"] for r in rows[1:]), "nothing placed after a restart"
    scheduler_log = next(c.log for c in fault_plane.components if c.name.startswith("phalanx-scheduler-"))
    assert STREAM_ENDED in scheduler_log.read_text(errors="replace")
    print("\n" + "\n".join(log))


def test_plugin_mode_serve_down_plain_pods_schedule_and_gang_members_wait_whole(fault_plane):
    """phalanx-scheduler while ``phalanx serve`` is down: a plain pod schedules as under stock
    kube-scheduler, a gang's members wait (none bound, though the gang has room);
    serve back on the same port, the gang binds whole without any other change in the cluster (the
    plugin's stream reconnected and retried the waiting members)."""
    rest = fault_plane.rest
    rig = Rig(fault_plane, "phalanx-serve-down", barrier_timeout=8.0, mode="plugin")
    ns = "serve-down"
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for i in range(3):
        create_node(rest, f"down-{i}", cpu=2)
    try:
        rig.start_serve()
        rig.start_scheduler()
        # while serve is up, a gang binds whole (the plugin is connected)
        create(rest, podgroup("before", min_count=2), ns)
        for i in range(2):
            create(rest, pod(f"before-{i}", "before", {"cpu": "1"}, scheduler_name=rig.scheduler_name), ns)
        wait_all_bound(rest, ns, count=2, timeout=60, podgroup="before")

        rig.kill_serve()
        create(rest, pod("plain", None, {"cpu": "1"}, scheduler_name=rig.scheduler_name), ns)
        create(rest, podgroup("during", min_count=3), ns)
        for i in range(3):  # 3 CPUs free after the plain pod: room for the gang
            create(rest, pod(f"during-{i}", "during", {"cpu": "1"}, scheduler_name=rig.scheduler_name), ns)
        wait_for(lambda: rest.get(f"/api/v1/namespaces/{ns}/pods/plain")["spec"].get("nodeName"), 60,
                 "the plain pod bound while phalanx serve is down")
        assert_none_bound(rest, ns, seconds=8, podgroup="during")  # past the breaker's cooldown

        rig.start_serve()
        placed = wait_all_bound(rest, ns, count=3, timeout=90, podgroup="during")
        assert len(placed) == 3
        assert STREAM_ENDED in rig.scheduler.component.log.read_text(errors="replace")
    except BaseException:
        fault_plane.keep_logs = True
        raise
    finally:
        rig.stop()


@pytest.mark.parametrize("mode", ["extender", "plugin"])
def test_node_loss_under_running_all_gangs_evicts_them_whole_and_they_come_back_whole(fault_plane, mode):
    """The quick node-loss run (harness/node_faults.py): a running ``disruptionMode: all`` gang loses
    a node, once deleted and once taken NotReady by KWOK; each time the gang must go whole and,
    re-created by the test (as its owner controller would), bind whole again within the bound,
    with the fault run's at-rest invariants after each."""
    log: list[str] = []
    cfg = FaultConfig(seed=3, faults=2, mode=mode, sequence=("node-deleted", "node-notready"), log=log.append)
    summary, rows = run_faults(fault_plane, cfg)
    assert [r["kind"] for r in rows] == ["node-deleted", "node-notready"]
    assert_no_violations(fault_plane, cfg, rows, log)
    assert all(r["bound_at_kill"] == r["size"] and r["evicted_s"] is not None and r["replaced_s"] is not None
               for r in rows), "\n".join(log)
