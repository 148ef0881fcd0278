"""The real Kueue manager against the e2e control plane.

``hack/build-kueue.sh`` builds the manager of ``sigs.k8s.io/kueue`` at ``KUEUE_VERSION``
(hack/versions.env) into ``${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/kueue/<version>/``, with the
module's CRDs, their conversion-webhook patches and its webhook manifests beside it. ``KueueManager``
installs the CRDs (conversion by URL, as the module's kustomization does by Service), registers the
webhooks of the enabled integrations and of Kueue's own kinds by URL, named with kustomize's
``kueue-`` prefix and with the namespace selectors its kustomization adds (``kube-system`` and
``kueue-system`` left alone; webhooks of integrations not enabled are left out: the manager serves no
handler for them), and runs the manager as a process on loopback (no leader election; the on-demand
visibility API, MultiKueue and Kueue's own topology-aware scheduling off) with the integrations
``batch/job``, ``pod``, ``statefulset`` and ``leaderworkerset.x-k8s.io/leaderworkerset``.

Certificates: with its internal certificate management off, Kueue v0.17.0 reads its metrics
certificate from a fixed path under /etc, so it is left on, as Kueue ships it; its rotator keeps the
Secret it finds when that Secret holds a CA and a serving certificate valid for the webhook
Service's name for more than its 90-day look-ahead. The harness makes such a pair (a CA of its own,
a serving certificate whose names also include 127.0.0.1, where the API server calls it) and writes
the Secret before the manager starts (and its files where the Secret would be mounted); the rotator then
injects that CA into the webhook configurations and CRDs, as it does in a cluster.
"""

from __future__ import annotations

import base64
import copy
import os
import time
from pathlib import Path
from typing import Any

import yaml

from cluster.kube import KubeError

from .binaries import read_versions
from .managers import CRD_API, WebhookManager, wait_established
from .pki import _openssl
from .process import Component, free_ports
from .waits import wait_for

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
NAME_PREFIX = "kueue-"
NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
FRAMEWORKS = ("batch/job", "pod", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset")
#: the resources whose webhooks are registered: the enabled integrations' and Kueue's own kinds
RESOURCES = {"jobs", "pods", "statefulsets", "leaderworkersets", "clusterqueues", "localqueues", "cohorts",
             "resourceflavors", "workloads", "workloadpriorityclasses", "admissionchecks", "topologies"}
#: the webhooks the module's kustomization gives a namespace selector
SELECTED = {"mpod.kb.io", "mdeployment.kb.io", "mstatefulset.kb.io", "vpod.kb.io", "vdeployment.kb.io",
            "vstatefulset.kb.io"}
FEATURE_GATES = "VisibilityOnDemand=false,MultiKueue=false,TopologyAwareScheduling=false"
SERVICE = "kueue-webhook-service"  # the Service the rotator names its certificate for
SECRET = "kueue-webhook-server-cert"
DAYS = "400"  # beyond the rotator's 90-day look-ahead, so it keeps the certificate


class MissingKueue(RuntimeError):
    """The Kueue manager has not been built (run ``make e2e`` or hack/build-kueue.sh)."""


def kueue_dir() -> Path:
    version = read_versions()["KUEUE_VERSION"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phalanx" / "kueue" / version


def locate_kueue() -> Path:
    directory = kueue_dir()
    if not os.access(directory / "kueue-manager", os.X_OK) or not (directory / "crds").is_dir():
        raise MissingKueue(f"Kueue manager not built: nothing in {directory}. Run `make e2e` or "
                           "`bash hack/build-kueue.sh` first.")
    return directory


def _not_system() -> dict:
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": ["kube-system", NAMESPACE]}]}


def webhook_configurations(directory: Path, url: str, ca_bundle: str) -> list[dict]:
    """The module's webhook configurations as its kustomization renders them (the ``kueue-`` name
    prefix, the namespace selectors), the enabled integrations' webhooks only, pointed at ``url``."""
    docs = [d for d in yaml.safe_load_all((directory / "webhook" / "manifests.yaml").read_text()) if d]
    for doc in docs:
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        kept = []
        for hook in doc["webhooks"]:
            resources = {r for rule in hook.get("rules") or [] for r in rule.get("resources") or []}
            if not resources & RESOURCES:
                continue
            if hook["name"] in SELECTED:
                hook["namespaceSelector"] = _not_system()
            hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"], "caBundle": ca_bundle}
            kept.append(hook)
        doc["webhooks"] = kept
    return docs


def crds(directory: Path, url: str, ca_bundle: str) -> list[dict]:
    """The module's CRDs, each with the conversion webhook its kustomization patches in (by URL)."""
    listed = yaml.safe_load((directory / "crd-patches" / "kustomization.yaml").read_text())
    applied = {p["path"].split("/", 1)[1] for p in listed.get("patches") or []}
    converted = {yaml.safe_load((directory / "crd-patches" / name).read_text())["metadata"]["name"]
                 for name in applied if (directory / "crd-patches" / name).is_file()}
    out = []
    for path in sorted((directory / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"{url}/convert", "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"]}}
        out.append(crd)
    return out


def certificates(directory: Path) -> dict[str, bytes]:
    """A CA named as Kueue's rotator names its own (``kueue-ca``) and a serving certificate for the
    webhook Service's name and 127.0.0.1: the Secret's ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "tls.crt").exists():
        # RSA keys in PKCS#1, the form the rotator parses
        _openssl("genrsa", "-traditional", "-out", "ca.key", "2048", cwd=directory)
        _openssl("genrsa", "-traditional", "-out", "tls.key", "2048", cwd=directory)
        _openssl("req", "-x509", "-key", "ca.key", "-out", "ca.crt", "-days", DAYS, "-subj", "/O=kueue/CN=kueue-ca",
                 "-addext", "subjectAltName=DNS:kueue-ca", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=directory)
        (directory / "tls.ext").write_text(
            f"basicConstraints=CA:FALSE\nsubjectAltName=DNS:{SERVICE}.{NAMESPACE}.svc,IP:127.0.0.1\n"
            "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n")
        _openssl("req", "-new", "-key", "tls.key", "-out", "tls.csr", "-subj", f"/CN={SERVICE}.{NAMESPACE}.svc",
                 cwd=directory)
        _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", DAYS, "-sha256", "-extfile", "tls.ext", "-out", "tls.crt", cwd=directory)
    return {name: (directory / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}


class KueueManager(WebhookManager):
    """One Kueue manager process; ``start()`` installs the CRDs and webhooks, ``stop()`` removes the
    webhooks (the CRDs stay: deleting them would take every queue and Kueue Workload with them)."""

    def __init__(self, control_plane: Any):
        super().__init__(control_plane)
        self.directory = locate_kueue()
        self.version = read_versions()["KUEUE_VERSION"]

    def start(self) -> "KueueManager":
        """Start it; on any failure its webhooks are removed again (they would refuse every pod)."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "KueueManager":
        workdir: Path = self.control_plane.workdir / "kueue"
        certs = workdir / "certs"  # where a pod would have the Secret mounted: written as the kubelet would
        certs.mkdir(parents=True, exist_ok=True)
        pair = certificates(workdir / "pki")
        for name in ("ca.crt", "tls.crt", "tls.key"):
            (certs / name).write_bytes(pair[name])
        webhook_port, health_port = free_ports(2)
        url = f"https://127.0.0.1:{webhook_port}"
        ca_bundle = base64.b64encode(pair["ca.crt"]).decode()
        if self.rest.get_or_none(f"/api/v1/namespaces/{NAMESPACE}") is None:
            self.rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": NAMESPACE}})
        secrets = f"/api/v1/namespaces/{NAMESPACE}/secrets"
        self.rest.delete(f"{secrets}/{SECRET}", missing_ok=True)
        self.rest.create(secrets, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
                                   "data": {k: base64.b64encode(v).decode() for k, v in pair.items()}})
        self._install_crds(crds(self.directory, url, ca_bundle))
        # registered before the manager starts: its rotator injects its CA into them and waits for them
        self.register(webhook_configurations(self.directory, url, ca_bundle))
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NAMESPACE,
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "manageJobsWithoutQueueName": False,
            "managedJobsNamespaceSelector": _not_system(),
            "integrations": {"frameworks": list(FRAMEWORKS)},
        }
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        kubeconfig = self.control_plane.component_kubeconfig("kueue-manager", "system:kueue-manager")
        argv = [str(self.directory / "kueue-manager"), f"--config={config_path}", f"--kubeconfig={kubeconfig}",
                f"--feature-gates={FEATURE_GATES}", "--zap-log-level=2"]
        self.component = Component("kueue-manager", argv, self.control_plane.workdir / "logs" / "kueue-manager.log",
                                   cwd=workdir)
        from .controlplane import _insecure_get  # the control plane's probe helper

        self.component.wait_ready(lambda: _insecure_get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200, 90)
        wait_for(self._defaulting_active, 30, "the Kueue webhooks are called by the API server")
        return self

    def _install_crds(self, wanted: list[dict]) -> None:
        for crd in wanted:
            existing = self.rest.get_or_none(f"{CRD_API}/{crd['metadata']['name']}")
            if existing is None:
                self.rest.create(CRD_API, crd)
            else:  # a manager started before (another module): its conversion URL is stale
                self.rest.patch(f"{CRD_API}/{crd['metadata']['name']}", {"spec": {"conversion": crd["spec"].get(
                    "conversion", {"strategy": "None"})}})
        wait_established(self.rest, [crd["metadata"]["name"] for crd in wanted], KUEUE_API, "clusterqueues")

    def _defaulting_active(self) -> bool:
        """True once a dry-run ClusterQueue comes back defaulted by Kueue's mutating webhook."""
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                 "metadata": {"name": f"probe-{int(time.monotonic() * 1000)}"}, "spec": {}}
        try:
            created = self.rest.create(f"{KUEUE_API}/clusterqueues", probe, dryRun="All")
        except KubeError:
            return False
        return bool((created.get("spec") or {}).get("queueingStrategy"))


# -- the objects a Kueue user writes ---------------------------------------------------------------
def resource_flavor(name: str, node_labels: dict[str, str] | None = None) -> dict:
    spec: dict[str, Any] = {"nodeLabels": dict(node_labels)} if node_labels else {}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": spec}


def cluster_queue(name: str, flavor: str, cpu: int | str, cohort: str = "", borrowing_limit: str | None = None,
                  preemption: dict | None = None) -> dict:
    quota: dict[str, Any] = {"name": "cpu", "nominalQuota": str(cpu)}
    if borrowing_limit is not None:
        quota["borrowingLimit"] = borrowing_limit
    spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [
        {"coveredResources": ["cpu"], "flavors": [{"name": flavor, "resources": [quota]}]}]}
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = copy.deepcopy(preemption)
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(name: str, cluster_queue_name: str) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": name},
            "spec": {"clusterQueue": cluster_queue_name}}


def workload_priority_class(name: str, value: int) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": name},
            "value": value}
