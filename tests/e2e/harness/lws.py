"""The real LeaderWorkerSet controller against the e2e control plane.

``hack/build-lws.sh`` builds the manager of ``sigs.k8s.io/lws`` at ``LWS_VERSION`` (hack/versions.env)
into ``${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/lws/<version>/``, with the module's CRDs and webhook
manifests beside it. ``LwsManager`` installs the CRDs, runs the manager as a process on loopback
(no leader election, its internal certificate management off: it serves a certificate from the
harness CA) and registers its own webhooks by URL, exactly as the module's kustomization does by
Service: the LeaderWorkerSet defaulting and validation, and the pod webhooks restricted to pods
labelled ``leaderworkerset.sigs.k8s.io/name`` (they add the group and worker index labels LWS relies
on). Configurations are named with kustomize's ``lws-`` prefix, so LWS's pod webhook runs before
phalanx's (mutating webhooks are called in the order of their configurations' names).
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
from .process import Component, free_ports
from .waits import wait_for

LWS_API = "/apis/leaderworkerset.x-k8s.io/v1"
NAME_PREFIX = "lws-"


class MissingLws(RuntimeError):
    """The LWS manager has not been built (run ``make e2e`` or hack/build-lws.sh)."""


def lws_dir() -> Path:
    version = read_versions()["LWS_VERSION"]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phalanx" / "lws" / version


def locate_lws() -> Path:
    directory = lws_dir()
    if not os.access(directory / "lws-manager", os.X_OK) or not (directory / "crds").is_dir():
        raise MissingLws(f"LWS manager not built: nothing in {directory}. Run `make e2e` or "
                         "`bash hack/build-lws.sh` first.")
    return directory


def webhook_configurations(directory: Path, url: str, ca_bundle: str) -> list[dict]:
    """The module's webhook configurations as its kustomization renders them (the two pod-webhook
    patches applied, the ``lws-`` name prefix), pointed at ``url`` instead of the Service."""
    docs = [d for d in yaml.safe_load_all((directory / "webhook" / "manifests.yaml").read_text()) if d]
    for doc in docs:
        patch_file = "mutating-patch.yaml" if doc["kind"] == "MutatingWebhookConfiguration" else "validating-patch.yaml"
        for op in yaml.safe_load((directory / "webhook" / patch_file).read_text()):
            if op["op"] != "replace" or not op["path"].startswith("/webhooks/"):
                raise ValueError(f"unexpected patch in {patch_file}: {op}")
            doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = copy.deepcopy(op["value"])
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"], "caBundle": ca_bundle}
    return docs


class LwsManager(WebhookManager):
    """One LWS manager process; ``start()`` installs the CRDs and webhooks, ``stop()`` removes the
    webhooks (the CRDs stay: deleting them would take every LeaderWorkerSet with them)."""

    def __init__(self, control_plane: Any):
        super().__init__(control_plane)
        self.directory = locate_lws()
        self.version = read_versions()["LWS_VERSION"]

    def start(self) -> "LwsManager":
        self._install_crds()
        workdir: Path = self.control_plane.workdir / "lws"
        certs = workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        tls = self.control_plane.pki.server("lws-webhook", ["IP:127.0.0.1", "DNS:localhost"])
        (certs / "tls.crt").write_bytes(tls.cert.read_bytes())
        (certs / "tls.key").write_bytes(tls.key.read_bytes())
        webhook_port, health_port = free_ports(2)
        config = {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        }
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        kubeconfig = self.control_plane.component_kubeconfig("lws-manager", "system:lws-manager")
        argv = [str(self.directory / "lws-manager"), f"--config={config_path}", f"--kubeconfig={kubeconfig}",
                "--zap-log-level=2"]
        self.component = Component("lws-manager", argv, self.control_plane.workdir / "logs" / "lws-manager.log",
                                   cwd=workdir)
        from .controlplane import _insecure_get  # the control plane's probe helper

        self.component.wait_ready(lambda: _insecure_get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200, 60)
        ca_bundle = base64.b64encode(self.control_plane.pki.ca_cert.read_bytes()).decode()
        self.register(webhook_configurations(self.directory, f"https://127.0.0.1:{webhook_port}", ca_bundle))
        wait_for(self._defaulting_active, 30, "the LWS webhooks are called by the API server")
        return self

    def _install_crds(self) -> None:
        for path in sorted((self.directory / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            if self.rest.get_or_none(f"{CRD_API}/{crd['metadata']['name']}") is None:
                self.rest.create(CRD_API, crd)
        wait_established(self.rest, [yaml.safe_load(p.read_text())["metadata"]["name"]
                                     for p in sorted((self.directory / "crds").glob("*.yaml"))],
                         LWS_API, "leaderworkersets")

    def _defaulting_active(self) -> bool:
        """True once a dry-run LeaderWorkerSet comes back defaulted by LWS's mutating webhook."""
        probe = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                 "metadata": {"name": f"probe-{int(time.monotonic() * 1000)}"},
                 "spec": {"leaderWorkerTemplate": {"size": 1, "workerTemplate": {
                     "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}}
        try:
            created = self.rest.create(f"{LWS_API}/namespaces/default/leaderworkersets", probe, dryRun="All")
        except KubeError:
            return False
        return bool((created.get("spec") or {}).get("networkConfig"))


def leaderworkerset(name: str, size: int, replicas: int = 1, resources: dict | None = None,
                    scheduling: dict | str | None = None, scheduler_name: str | None = None,
                    leader_resources: dict | None = None, annotations: dict | None = None,
                    priority_class_name: str | None = None, restart_policy: str | None = None,
                    **spec: Any) -> dict:
    """A LeaderWorkerSet of ``replicas`` groups of ``size`` pause pods (the harness's pod spec);
    ``scheduling`` (the guide's ``spec.scheduling`` block) goes into phalanx's annotation;
    ``restart_policy`` is LWS's (``None`` keeps a group when one of its pods goes)."""
    import json

    from cluster.names import ANNOTATION_SCHEDULING

    from .objects import pod_spec

    def template(requests: dict | None) -> dict:
        return {"spec": {**pod_spec(requests, scheduler_name=scheduler_name, priority_class_name=priority_class_name),
                         "terminationGracePeriodSeconds": 0}}

    meta: dict[str, Any] = {"name": name, "annotations": dict(annotations or {})}
    if scheduling is not None:
        meta["annotations"][ANNOTATION_SCHEDULING] = scheduling if isinstance(scheduling, str) else json.dumps(scheduling)
    lwt: dict[str, Any] = {"size": size, "workerTemplate": template(resources)}
    if restart_policy:
        lwt["restartPolicy"] = restart_policy
    if leader_resources is not None:
        lwt["leaderTemplate"] = template(leader_resources)
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": meta,
            "spec": {"replicas": replicas, "leaderWorkerTemplate": lwt, **spec}}
