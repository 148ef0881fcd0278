"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
KWOK, and kube-schedulers started on demand from a KubeSchedulerConfiguration.

Everything lives in one work directory (certificates, kubeconfigs, etcd data, one log per process);
every port is an ephemeral free port. There are no kubelets: tests create Node objects
(``nodes.py``) and KWOK (``kwok.py``) plays their kubelets: Leases, Ready, pods Running and Ready,
graceful deletions finished. The node lifecycle controller runs, so a node KWOK takes NotReady is
tainted and its pods evicted as in a real cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from cluster.kube import Kube

from .binaries import Binaries
from .kwok import kwok_argv
from .pki import Pki, make_pki
from .process import Component, free_port, free_ports

FeatureGates = Mapping[str, bool] | str | None

# GenericWorkload serves scheduling.k8s.io workloads/podgroups (beta, off by default in 1.37);
# beta API groups are also off by default, hence the runtime-config. WorkloadWithJob (alpha) keeps a
# Job's spec.scheduling and has the Job controller make its Workload and PodGroup; it also gives a
# new Job without spec.scheduling a Basic pair, unless its pod template names a group already (as
# every other Job of the suite does).
# CompositePodGroup (alpha, needs the two above) serves CompositePodGroups, only as v1alpha3, and
# keeps a PodGroup's spec.parentCompositePodGroupName.
APISERVER_FEATURE_GATES = {"GenericWorkload": True, "TopologyAwareWorkloadScheduling": True, "WorkloadWithJob": True,
                           "CompositePodGroup": True}
APISERVER_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true"
CONTROLLER_MANAGER_FEATURE_GATES = {"GenericWorkload": True, "WorkloadWithJob": True}
# All on-by-default controllers (statefulset, garbage collector, podgroup-protection-controller with
# GenericWorkload, node lifecycle and taint eviction, ...) except node IPAM, which has no pod CIDRs
# to hand out (KWOK assigns pod IPs).
CONTROLLERS = "*,-node-ipam-controller"
# The node lifecycle controller looks at every node each second; a node whose Lease KWOK has not
# renewed for the grace period (the upstream default) becomes Unknown. A node KWOK reports NotReady
# is tainted at the next look.
NODE_MONITOR_PERIOD = "1s"
NODE_MONITOR_GRACE_PERIOD = "50s"


def scheduler_config(scheduler_name: str = "default-scheduler", **fields: Any) -> dict:
    """A KubeSchedulerConfiguration with one profile; ``fields`` are merged in at the top level."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "percentageOfNodesToScore": 100,
        "profiles": [{"schedulerName": scheduler_name}],
        **fields,
    }


SCHEDULER_CONFIGS = Path(__file__).resolve().parents[3] / "scheduler-config"
PHALANX_MODES = ("extender", "plugin")
MODE_BINARY = {"extender": "kube-scheduler", "plugin": "phalanx-scheduler"}


def phalanx_scheduler_config(mode: str, http_port: int, grpc_port: int | None, barrier_seconds: float,
                             scheduler_name: str | None = None) -> dict:
    """The shipped KubeSchedulerConfiguration of ``mode`` pointed at a ``phalanx serve``: the
    extender's URL on ``http_port``, or the plugin's gRPC address on ``grpc_port`` (``permitTimeout``
    = the barrier timeout plus a margin). ``scheduler_name``: the one profile's name (else the
    default scheduler's)."""
    if mode == "extender":
        config = yaml.safe_load((SCHEDULER_CONFIGS / "kube-scheduler-config.yaml").read_text())
        config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{http_port}/scheduler"
        if scheduler_name:
            config["profiles"] = [{"schedulerName": scheduler_name}]
        return config
    config = yaml.safe_load((SCHEDULER_CONFIGS / "kube-scheduler-plugin-config.yaml").read_text())
    args = config["profiles"][0]["pluginConfig"][0]["args"]
    args["address"] = f"127.0.0.1:{grpc_port}"
    args["permitTimeout"] = f"{barrier_seconds + 2:.0f}s"
    if scheduler_name:
        config["profiles"][0]["schedulerName"] = scheduler_name
    return config


def gates_arg(gates: FeatureGates) -> str | None:
    if gates is None or isinstance(gates, str):
        return gates or None
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items())) or None


def release_workdir(workdir: Path, failed: bool, label: str = "phalanx e2e") -> None:
    """A finished run's work directory: kept (and said where) when tests failed or
    ``PHALANX_E2E_KEEP=1``, else removed."""
    if failed or os.environ.get("PHALANX_E2E_KEEP") == "1":
        sys.stderr.write(f"\n{label}: logs kept in {workdir}/logs\n")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def _insecure_get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:  # noqa: S310 (loopback)
        return resp.status, resp.read().decode(errors="replace")


@dataclass
class Scheduler:
    """A running kube-scheduler. ``metrics()`` returns its Prometheus text."""

    component: Component
    port: int
    config_path: Path

    @property
    def log(self) -> Path:
        return self.component.log

    def metrics(self) -> str:
        return _insecure_get(f"https://127.0.0.1:{self.port}/metrics", timeout=10)[1]

    def stop(self) -> None:
        self.component.stop()


class ControlPlane:
    def __init__(self, workdir: Path, binaries: Binaries,
                 apiserver_feature_gates: FeatureGates = APISERVER_FEATURE_GATES,
                 runtime_config: str | None = APISERVER_RUNTIME_CONFIG,
                 controller_manager_feature_gates: FeatureGates = CONTROLLER_MANAGER_FEATURE_GATES,
                 controllers: str = CONTROLLERS, controller_manager_args: tuple[str, ...] = ()):
        self.workdir, self.binaries = workdir, binaries
        self.controller_manager_args = controller_manager_args
        self.apiserver_feature_gates = apiserver_feature_gates
        self.runtime_config = runtime_config
        self.controller_manager_feature_gates = controller_manager_feature_gates
        self.controllers = controllers
        self.components: list[Component] = []
        self.pki: Pki | None = None
        self.server = ""
        self.rest: Kube | None = None
        self._schedulers = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> "ControlPlane":
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.pki = make_pki(self.workdir / "pki")
        try:
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            self._start_controller_manager()
            self._start_kwok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for component in reversed(self.components):
            component.stop()
        self.components.clear()

    def _spawn(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.workdir / "logs" / f"{name}.log", cwd=self.workdir)
        self.components.append(component)
        return component

    # --- etcd ----------------------------------------------------------------------------------

    def _start_etcd(self) -> str:
        client, peer = free_ports(2)
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._spawn("etcd", [
            str(self.binaries.path("etcd")),
            "--name=e2e", f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}", "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # throwaway data: durability buys nothing here
            "--log-level=warn",
        ])
        etcd.wait_ready(lambda: b'"health":"true"' in urllib.request.urlopen(
            f"{client_url}/health", timeout=2).read(), timeout=30)
        return client_url

    # --- kube-apiserver ------------------------------------------------------------------------

    def _start_apiserver(self, etcd_url: str) -> None:
        assert self.pki is not None
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        argv = [
            str(self.binaries.path("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--advertise-address=127.0.0.1",
            f"--tls-cert-file={self.pki.serving_cert}", f"--tls-private-key-file={self.pki.serving_key}",
            f"--client-ca-file={self.pki.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki.sa_pub}",
            f"--service-account-signing-key-file={self.pki.sa_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--profiling=false",
        ]
        if gates := gates_arg(self.apiserver_feature_gates):
            argv.append(f"--feature-gates={gates}")
        if self.runtime_config:
            argv.append(f"--runtime-config={self.runtime_config}")
        apiserver = self._spawn("kube-apiserver", argv)
        admin = self.pki.client("admin", "phalanx-e2e-admin", "system:masters")
        self.admin_kubeconfig = self.write_kubeconfig("admin", admin.cert, admin.key)
        self.rest = Kube(str(self.admin_kubeconfig))  # the admin's client certificate, the harness CA
        apiserver.wait_ready(lambda: self.rest.text("/readyz") == "ok", timeout=90)

    def write_kubeconfig(self, name: str, cert: Path, key: Path) -> Path:
        return self._kubeconfig(name, {"client-certificate": str(cert), "client-key": str(key)})

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        return self._kubeconfig(name, {"token": token})

    def _kubeconfig(self, name: str, user: dict[str, str]) -> Path:
        assert self.pki is not None
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.server, "certificate-authority": str(self.pki.ca_cert)}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": name}}],
        }
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(json.dumps(config, indent=2))
        return path

    def component_kubeconfig(self, name: str, user: str) -> Path:
        """A kubeconfig for a control-plane component, authenticated as ``user`` (system:masters)."""
        assert self.pki is not None
        cert = self.pki.client(name, user, "system:masters")
        return self.write_kubeconfig(name, cert.cert, cert.key)

    # --- kube-controller-manager ---------------------------------------------------------------

    def _start_controller_manager(self) -> None:
        assert self.pki is not None and self.rest is not None
        kubeconfig = self.component_kubeconfig("kube-controller-manager", "system:kube-controller-manager")
        port = free_port()
        argv = [
            str(self.binaries.path("kube-controller-manager")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'controller-manager-certs'}",
            "--leader-elect=false",
            f"--controllers={self.controllers}",
            f"--service-account-private-key-file={self.pki.sa_key}",
            f"--root-ca-file={self.pki.ca_cert}",
            f"--cluster-signing-cert-file={self.pki.ca_cert}",
            f"--cluster-signing-key-file={self.pki.ca_key}",
            "--use-service-account-credentials=false",
            "--kube-api-qps=200", "--kube-api-burst=400",
            f"--node-monitor-period={NODE_MONITOR_PERIOD}",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_PERIOD}",
        ]
        if gates := gates_arg(self.controller_manager_feature_gates):
            argv.append(f"--feature-gates={gates}")
        argv += self.controller_manager_args
        kcm = self._spawn("kube-controller-manager", argv)
        kcm.wait_ready(lambda: _insecure_get(f"https://127.0.0.1:{port}/healthz")[0] == 200, timeout=60)
        # Controllers are really running once the service-account controller made "default".
        kcm.wait_ready(lambda: self.rest.get_or_none(
            "/api/v1/namespaces/default/serviceaccounts/default") is not None, timeout=60)

    # --- KWOK ----------------------------------------------------------------------------------

    def _start_kwok(self) -> None:
        kubeconfig = self.component_kubeconfig("kwok", "system:kwok-controller")
        port = free_port()
        argv = kwok_argv(self.binaries.kwok, kubeconfig, self.workdir / "kwok-stages.yaml", port)
        kwok = self._spawn("kwok", argv)
        kwok.wait_ready(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200,
                        timeout=60)

    # --- kube-scheduler ------------------------------------------------------------------------

    def start_scheduler(self, config: Path | Mapping[str, Any] | None = None,
                        feature_gates: FeatureGates = None, extra_args: tuple[str, ...] = (),
                        name: str | None = None, kubeconfig: Path | None = None,
                        leader_elect: bool = False, binary: str = "kube-scheduler") -> Scheduler:
        """Start a kube-scheduler from a KubeSchedulerConfiguration (a file or a dict).

        The configuration's clientConnection.kubeconfig is pointed at this control plane (as
        ``system:kube-scheduler`` in ``system:masters``, or with ``kubeconfig``'s credentials, e.g. a
        ServiceAccount token, for its API calls and its delegated authentication alike) and leader
        election is turned off unless ``leader_elect``; everything else (profiles, plugins,
        extenders, the leader-election Lease) is used as given. ``binary`` is the executable in the
        binary directory: ``phalanx-scheduler`` for plugin mode (hack/build-plugin.sh builds it).
        """
        self._schedulers += 1
        name = name or f"kube-scheduler-{self._schedulers}"
        if config is None:
            cfg: dict[str, Any] = {"apiVersion": "kubescheduler.config.k8s.io/v1",
                                   "kind": "KubeSchedulerConfiguration"}
        elif isinstance(config, Mapping):
            cfg = json.loads(json.dumps(config))
        else:
            cfg = yaml.safe_load(Path(config).read_text())
        kubeconfig = kubeconfig or self.component_kubeconfig(name, "system:kube-scheduler")
        cfg.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
        if not leader_elect:
            cfg.setdefault("leaderElection", {})["leaderElect"] = False
        config_path = self.workdir / f"{name}.config.yaml"
        config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        port = free_port()
        argv = [
            str(self.binaries.path(binary)),
            f"--config={config_path}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.workdir / (name + '-certs')}",
            *extra_args,
        ]
        if gates := gates_arg(feature_gates):
            argv.append(f"--feature-gates={gates}")
        component = self._spawn(name, argv)
        component.wait_ready(lambda: _insecure_get(f"https://127.0.0.1:{port}/readyz")[0] == 200,
                             timeout=60)
        scheduler = Scheduler(component=component, port=port, config_path=config_path)
        return scheduler
