"""phalanx when the real API server goes away and comes back: it keeps answering from its cache,
/readyz turns false once the watches are stale, and after the restart it recovers (re-list or
watch resume) and sees objects created while it was cut off. And the quick fault run: phalanx
serve, kube-scheduler, kube-apiserver and the controller leader killed at moments read from the
API, the at-rest invariants checked after each (the driver: harness/faults.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from harness import ControlPlane, create_node, locate, wait_for
from harness.faults import FaultConfig, fault_control_plane, run_faults

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
        restarted.wait_ready(lambda: rest.request("GET", "/readyz", raw=True) == "ok", timeout=90)
        create_node(rest, "after", gpu=1)
        wait_for(lambda: "after" in cache.nodes, timeout=60, message="recovered and saw the new node")
        wait_for(lambda: backend.ready()[0], timeout=60, message="ready again")
    finally:
        backend.stop()


@pytest.fixture
def fault_plane():
    with fault_control_plane("phalanx-e2e-faults-") as plane:
        yield plane


def test_kills_leave_no_partial_gang(fault_plane):
    """The quick fault run (the full one is ``phalanx bench faults``): one kill of each kind, then a
    few drawn, each followed by rest and the invariants (tests/e2e/harness/faults.py)."""
    log: list[str] = []
    cfg = FaultConfig(seed=7, faults=7, sizes={4: 0.5, 16: 0.4, 64: 0.1},
                      sequence=("serve", "scheduler", "apiserver", "controller", "serve", "serve", "scheduler"),
                      log=log.append)
    summary, rows = run_faults(fault_plane, cfg)
    assert len(rows) == 7 and summary["faults"] == 7
    bad = [(r["i"], r["kind"], r["phase"], r["violations"]) for r in rows if r["violations"]]
    fault_plane.keep_logs = fault_plane.keep_logs or bool(bad)
    assert not bad, "seed 7: " + "\n".join(log) + f"\nlogs: {fault_plane.workdir}/logs"
