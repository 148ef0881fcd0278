"""pytest fixtures for phalanx's e2e tests against a real loopback control plane.

Session: ``control_plane`` (etcd + kube-apiserver + kube-controller-manager + KWOK),
``rest`` (admin REST client). Module: ``start_scheduler(config, feature_gates=...)`` starts a
kube-scheduler that is stopped when the module ends. Function: ``namespace`` (fresh, deleted
afterwards), ``nodes`` (a NodePool whose nodes are deleted afterwards).

Missing binaries fail the tests with the command that builds them; they are never skipped.
Logs and configs live in one work directory, printed at the start; it is kept when a test failed
(or PHALANX_E2E_KEEP=1) and removed otherwise.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (  # noqa: E402
    MODE_BINARY,
    PHALANX_MODES,
    ControlPlane,
    MissingBinaries,
    Scheduler,
    create_node,
    delete_node,
    locate,
    release_workdir,
    scheduler_config,
    wait_for,
)
from harness import phalanx_scheduler_config as harness_phalanx_config  # noqa: E402

from cluster.kube import Kube  # noqa: E402
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc  # noqa: E402

_WORKDIR: dict[str, Path] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "workdir" in _WORKDIR:
        report.sections.append(("phalanx e2e", f"control-plane logs and configs: {_WORKDIR['workdir']}/logs"))


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    try:
        binaries = locate()
    except MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)
    workdir = Path(tempfile.mkdtemp(prefix="phalanx-e2e-"))
    _WORKDIR["workdir"] = workdir
    sys.stderr.write(f"\nphalanx e2e: Kubernetes {binaries.k8s_version}, etcd {binaries.etcd_version}; "
                     f"work dir {workdir}\n")
    plane = ControlPlane(workdir, binaries)
    try:
        plane.start()
    except Exception as err:
        pytest.fail(f"control plane did not start (logs in {workdir}/logs): {err}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()
        release_workdir(workdir, bool(request.session.testsfailed))


CRDS = Path(__file__).resolve().parents[2] / "scheduler-config" / "crds"


@pytest.fixture(scope="session")
def crd_control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A second control plane as most clusters in the field are: ``GenericWorkload`` off, so
    ``scheduling.k8s.io`` Workloads and PodGroups are not served, and phalanx's CRDs applied from
    ``scheduler-config/crds/`` (its own KWOK)."""
    import yaml

    try:
        binaries = locate()
    except MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)
    workdir = Path(tempfile.mkdtemp(prefix="phalanx-e2e-crd-"))
    plane = ControlPlane(workdir, binaries, apiserver_feature_gates=None, runtime_config=None,
                         controller_manager_feature_gates=None)
    try:
        plane.start()
    except Exception as err:
        pytest.fail(f"CRD-flavor control plane did not start (logs in {workdir}/logs): {err}", pytrace=False)
    try:
        for crd in sorted(CRDS.glob("*.scheduling.phalanx.dev.yaml")):
            plane.rest.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load(crd.read_text()))
        wait_for(lambda: {"workloads", "podgroups"} <= {r["name"] for r in (plane.rest.get_or_none(
            "/apis/scheduling.phalanx.dev/v1beta1") or {}).get("resources", [])}, 60, "phalanx's CRDs served")
        wait_for(lambda: "compositepodgroups" in {r["name"] for r in (plane.rest.get_or_none(
            "/apis/scheduling.phalanx.dev/v1alpha3") or {}).get("resources", [])}, 60,
            "phalanx's CompositePodGroup CRD served")
        yield plane
    finally:
        plane.stop()
        release_workdir(workdir, bool(request.session.testsfailed), "phalanx e2e: CRD-flavor control plane")


@pytest.fixture(scope="session")
def rest(control_plane: ControlPlane) -> Kube:
    return control_plane.rest


@pytest.fixture(scope="module")
def start_scheduler(control_plane: ControlPlane) -> Iterator[Any]:
    """Factory: ``start_scheduler(config=None, feature_gates=None, extra_args=())`` -> Scheduler.

    ``config`` is a KubeSchedulerConfiguration path or dict (None: all defaults). Every scheduler
    started in a module is stopped at the module's end.
    """
    started: list[Scheduler] = []

    def start(config: Any = None, feature_gates: Any = None, extra_args: tuple[str, ...] = (),
              name: str | None = None) -> Scheduler:
        scheduler = control_plane.start_scheduler(config, feature_gates, extra_args, name)
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        scheduler.stop()


@pytest.fixture
def namespace(rest: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace; its pods are force-deleted and the namespace removed afterwards."""
    name = f"e2e-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:5]}"
    name = "".join(c for c in name if c.isalnum() or c == "-")
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    # Terminating first, so no controller can create pods in it any more; then drop the pods now.
    rest.delete(f"/api/v1/namespaces/{name}", missing_ok=True)
    rest.request("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": 0})


class NodePool:
    """Nodes created by one test (see harness.nodes.node for the keyword arguments)."""

    def __init__(self, rest: Kube):
        self.rest = rest
        self.names: list[str] = []

    def add(self, name: str, **kwargs: Any) -> dict:
        created = create_node(self.rest, name, **kwargs)
        self.names.append(name)
        return created

    def add_many(self, count: int, prefix: str = "node", **kwargs: Any) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        for n in names:
            self.add(n, **kwargs)
        return names

    def delete(self, name: str) -> None:
        delete_node(self.rest, name)
        self.names.remove(name)

    def cleanup(self) -> None:
        for n in list(self.names):
            self.delete(n)


@pytest.fixture
def nodes(rest: Kube) -> Iterator[NodePool]:
    pool = NodePool(rest)
    yield pool
    pool.cleanup()


T = TypeVar("T")
PHALANX_SCHEDULER_CONFIG = Path(__file__).resolve().parents[2] / "scheduler-config" / "kube-scheduler-config.yaml"
PHALANX_BARRIER_SECONDS = 8.0


@pytest.fixture(scope="module")
def phalanx(control_plane: ControlPlane) -> Iterator[Any]:
    """phalanx serving the extender in this process, watching the API server as admin."""
    from extender.server import ServeOptions, build

    service = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0", http_threads=256,
                                 barrier_timeout=PHALANX_BARRIER_SECONDS, plan_ttl=30.0),
                    kubeconfig=str(control_plane.admin_kubeconfig)).start()
    yield service
    service.stop()


@contextlib.contextmanager
def scratch_namespace(rest: Kube, name: str) -> Iterator[str]:
    """A namespace for the length of a block, deleted after."""
    rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        rest.delete(f"/api/v1/namespaces/{name}", missing_ok=True)


def settle(rest, cache, node_names: list[str]) -> None:
    """The case's nodes as phalanx will plan on them: in serve's cache, and no longer changing
    (KWOK and the node lifecycle controller may still touch a node just created)."""
    def still() -> bool:
        if not all(n in cache.nodes for n in node_names):
            return False
        first = [rest.get(f"/api/v1/nodes/{n}")["metadata"]["resourceVersion"] for n in node_names]
        time.sleep(1.0)
        return first == [rest.get(f"/api/v1/nodes/{n}")["metadata"]["resourceVersion"] for n in node_names]
    wait_for(still, 30, "the case's nodes in phalanx's cache and settled")


#: kube-scheduler's in-tree gang scheduling with topology: the anchor of every side-by-side case
IN_TREE_GATES = {"GenericWorkload": True, "TopologyAwareWorkloadScheduling": True}


def start_in_tree(start_scheduler: Callable[..., Scheduler], scheduler_name: str, name: str,
                  **gates: bool) -> Scheduler:
    """kube-scheduler with in-tree gang scheduling (``gates`` added), under its own scheduler name."""
    return start_scheduler(scheduler_config(scheduler_name), name=name, feature_gates=IN_TREE_GATES | gates)


@contextlib.contextmanager
def cycle_stub(service: Any) -> Iterator[pb_grpc.WorkloadCycleStub]:
    """A gRPC client of ``service``'s workload cycle (what-if and the other verbs)."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{service.grpc.port}") as channel:
        yield pb_grpc.WorkloadCycleStub(channel)


@pytest.fixture(scope="module")
def whatif_serve(control_plane: ControlPlane) -> Iterator[Any]:
    """phalanx serve as the command composes it, with the controller's compiler for what-if, for the
    whole module (the side-by-side modules' phalanx)."""
    with serve_with_whatif(control_plane) as service:
        yield service


@pytest.fixture(scope="module")
def whatif_stub(whatif_serve: Any) -> Iterator[pb_grpc.WorkloadCycleStub]:
    with cycle_stub(whatif_serve) as client:
        yield client


def in_tree_beside(rest: Kube, nodes: NodePool, namespace: str, run: Callable[[str], T]) -> T:
    """In-tree's side of a side-by-side case: ``run(other)`` in a namespace of its own
    (``<namespace>-it``), then its pods dropped at once and every node it made deleted, so the
    other side gets nodes of its own."""
    with scratch_namespace(rest, f"{namespace[:50]}-it") as other:
        try:
            return run(other)
        finally:
            rest.request("DELETE", f"/api/v1/namespaces/{other}/pods", params={"gracePeriodSeconds": 0})
            for name in list(nodes.names):
                nodes.delete(name)


@contextlib.contextmanager
def serve_with_whatif(control_plane: ControlPlane) -> Iterator[Any]:
    """phalanx serve as the command composes it: the ``phalanx`` fixture's, with the controller's
    compiler for what-if."""
    from controller.whatif import compile_objects
    from extender.server import ServeOptions, build

    options = ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0",
                           http_threads=256, barrier_timeout=PHALANX_BARRIER_SECONDS, plan_ttl=30.0,
                           compile_manifest=compile_objects)
    service = build(options, kubeconfig=str(control_plane.admin_kubeconfig)).start()
    try:
        yield service
    finally:
        service.stop()


PHALANX_SCHEDULER_MODES = PHALANX_MODES


@contextlib.contextmanager
def crd_flavor_phalanx(plane: ControlPlane, mode: str, name: str) -> Iterator[tuple[Any, NodePool, str]]:
    """phalanx serve and its kube-scheduler in ``mode`` on the CRD-flavor control plane, a node pool
    and a namespace (``<name>-<random>``) of their own: (serve, pool, namespace); all gone after."""
    from extender.server import ServeOptions, build

    rest = plane.rest
    serve = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0",
                               http_threads=64, barrier_timeout=PHALANX_BARRIER_SECONDS, plan_ttl=30.0),
                  kubeconfig=str(plane.admin_kubeconfig)).start()
    scheduler = start_phalanx_scheduler(plane, mode, serve, name=f"{name}-{mode}")
    pool = NodePool(rest)
    namespace = f"{name}-{uuid.uuid4().hex[:5]}"
    try:
        rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield serve, pool, namespace
    finally:
        rest.delete(f"/api/v1/namespaces/{namespace}", missing_ok=True)
        rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": 0})
        pool.cleanup()
        scheduler.stop()
        serve.stop()


def phalanx_scheduler_config(mode: str, phalanx: Any, scheduler_name: str | None = None) -> dict:
    """The shipped configuration of ``mode`` pointed at ``phalanx`` (harness.phalanx_scheduler_config)."""
    grpc = getattr(phalanx, "grpc", None)
    return harness_phalanx_config(mode, phalanx.port, grpc.port if grpc is not None else None,
                                  PHALANX_BARRIER_SECONDS, scheduler_name)


def start_phalanx_scheduler(control_plane: ControlPlane, mode: str, phalanx: Any, scheduler_name: str | None = None,
                            **kwargs: Any) -> Scheduler:
    """kube-scheduler with phalanx in ``mode``: extender (kube-scheduler + the HTTP extender) or
    plugin (phalanx-scheduler, the framework plugin talking gRPC). A missing phalanx-scheduler
    fails with the command that builds it."""
    binary = MODE_BINARY[mode]
    if not os.access(control_plane.binaries.path(binary), os.X_OK):
        pytest.fail(f"{binary} not built in {control_plane.binaries.directory}: run `bash hack/build-plugin.sh` "
                    "(or `make e2e`)", pytrace=False)
    return control_plane.start_scheduler(phalanx_scheduler_config(mode, phalanx, scheduler_name), binary=binary,
                                         **kwargs)


@pytest.fixture(scope="module", params=PHALANX_SCHEDULER_MODES)
def scheduler_mode(request: pytest.FixtureRequest) -> str:
    """extender, then plugin: a module whose fixtures depend on this runs its tests once per mode
    (grouped by mode)."""
    return request.param


@pytest.fixture(scope="module")
def phalanx_scheduler(scheduler_mode: str, phalanx: Any, control_plane: ControlPlane) -> Iterator[Scheduler]:
    """kube-scheduler with phalanx, once per mode: the shipped extender configuration, then
    phalanx-scheduler with the shipped plugin profile, both pointed at this module's phalanx
    (GenericWorkload stays off in the scheduler: phalanx owns the group logic). One mode's
    scheduler is stopped before the other's starts (both are the default scheduler)."""
    scheduler = start_phalanx_scheduler(control_plane, scheduler_mode, phalanx)
    yield scheduler
    scheduler.stop()


@pytest.fixture(scope="module")
def registered_controller(control_plane: ControlPlane) -> Iterator[Any]:
    """phalanx's controller for a module: started, its webhooks registered (removed after)."""
    from phalanx_controller import PhalanxController

    running = PhalanxController(control_plane)
    running.start()
    running.register()
    yield running
    running.close()
