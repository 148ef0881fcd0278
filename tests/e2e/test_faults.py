"""phalanx when the real API server goes away and comes back: it keeps answering from its cache,
/readyz turns false once the watches are stale, and after the restart it recovers (re-list or
watch resume) and sees objects created while it was cut off."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from harness import ControlPlane, create_node, locate, wait_for

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
