"""Running phalanx's StatefulSet controller against the e2e control plane, in-process.

``PhalanxController`` starts the webhook server on 127.0.0.1 with a certificate from the harness CA,
registers the shipped webhook manifests (``scheduler-config/controller/webhooks.yaml``) by URL
instead of by Service, and starts/stops controller replicas (threads with short Lease timings), so a
test can kill the leader between two writes and start a successor.
"""

from __future__ import annotations

import base64
import copy
import uuid
from pathlib import Path
from typing import Any

import yaml
from harness import wait_for

from cluster.kube import Kube, KubeError
from controller import Controller, PodMutator, WebhookServer, discover_flavor

ROOT = Path(__file__).resolve().parents[2]
WEBHOOKS = ROOT / "scheduler-config" / "controller" / "webhooks.yaml"
LEASE_NAMESPACE = "default"


class PhalanxController:
    def __init__(self, control_plane: Any):
        self.rest: Kube = control_plane.rest
        self.kube = Kube(str(control_plane.admin_kubeconfig))
        self.flavor = discover_flavor(self.kube)
        self.controller: Controller | None = None
        tls = control_plane.pki.server("phalanx-webhook", ["IP:127.0.0.1", "DNS:localhost"])
        self.ca_bundle = base64.b64encode(control_plane.pki.ca_cert.read_bytes()).decode()
        probe = Controller(self.kube, "webhook-reader", LEASE_NAMESPACE, flavor=self.flavor)
        self.mutator = PodMutator(self.kube, probe.reconciler, self.flavor, kick=self._kick, wait=3.0)
        self.server = WebhookServer("127.0.0.1:0", str(tls.cert), str(tls.key), self.mutator.review,
                                    probe.registry).start()
        self.configs: list[tuple[str, str]] = []

    def _kick(self, namespace: str, name: str, delay: float) -> None:
        if self.controller is not None:
            self.controller.kick(namespace, name, delay)

    # -- controller replicas ----------------------------------------------------------------------
    def start(self, kube: Any = None) -> Controller:
        """A new replica (its own identity); it leads once the Lease is free or expired."""
        self.controller = Controller(kube or self.kube, f"e2e-{uuid.uuid4().hex[:6]}", LEASE_NAMESPACE,
                                     resync_period=5.0, lease_duration=2.0, renew_deadline=1.5,
                                     retry_period=0.3, flavor=self.flavor).start()
        wait_for(self.controller.elector.is_leader, 30, "the new controller replica leads")
        return self.controller

    def stop(self, release_lease: bool = True) -> None:
        if self.controller is not None:
            self.controller.stop(release_lease=release_lease)
            self.controller = None

    # -- webhooks -----------------------------------------------------------------------------------
    def register(self) -> None:
        """Create the shipped webhook configurations, pointed at this process by URL."""
        for doc in yaml.safe_load_all(WEBHOOKS.read_text()):
            doc = copy.deepcopy(doc)
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.server.port}{path}",
                                        "caBundle": self.ca_bundle}
            plural = doc["kind"].lower() + "s"
            collection = f"/apis/admissionregistration.k8s.io/v1/{plural}"
            self.rest.delete(f"{collection}/{doc['metadata']['name']}", missing_ok=True)
            self.rest.create(collection, doc)
            self.configs.append((collection, doc["metadata"]["name"]))
        wait_for(self._validation_active, 30, "the phalanx webhooks are called by the API server")

    def _validation_active(self) -> bool:
        """True once a dry-run of an invalid StatefulSet is rejected by phalanx."""
        sts = {"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": "probe", "annotations": {"scheduling.phalanx.dev/scheduling": '{"x": 1}'}},
               "spec": {"selector": {"matchLabels": {"a": "b"}}, "serviceName": "probe",
                        "template": {"metadata": {"labels": {"a": "b"}},
                                     "spec": {"containers": [{"name": "c", "image": "pause"}]}}}}
        try:
            self.rest.create("/apis/apps/v1/namespaces/default/statefulsets", sts, dryRun="All")
        except KubeError as err:
            return "unknown field" in str(err)
        return False

    def close(self) -> None:
        self.stop()
        for collection, name in self.configs:
            self.rest.delete(f"{collection}/{name}", missing_ok=True)
        self.server.stop()
