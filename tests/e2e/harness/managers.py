"""What the harness's runs of third-party controller managers (LWS, Kueue) share: a manager
process with webhooks registered by URL, removed again when it stops, and CRDs waited for."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from cluster.kube import Kube, KubeError

from .process import Component
from .waits import wait_for

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WEBHOOK_API = "/apis/admissionregistration.k8s.io/v1"


def established(crd: dict) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def served(rest: Kube, api: str, resource: str) -> bool:
    """Whether the API group version ``api`` (a path) lists ``resource``."""
    try:
        resources = rest.get(api).get("resources") or []
    except KubeError:
        return False
    return any(r.get("name") == resource for r in resources)


def wait_established(rest: Kube, names: Iterable[str], api: str, resource: str) -> None:
    for name in names:
        wait_for(lambda n=name: established(rest.get(f"{CRD_API}/{n}")), 30, f"CRD {name} established")
    wait_for(lambda: served(rest, api, resource), 30, f"{resource} served")


class WebhookManager:
    """A manager process (``component``) and the webhook configurations registered for it
    (``register``); ``stop()`` removes the configurations, then stops the process."""

    def __init__(self, control_plane: Any):
        self.control_plane = control_plane
        self.rest: Kube = control_plane.rest
        self.component: Component | None = None
        self.configs: list[tuple[str, str]] = []

    @property
    def log(self) -> Path | None:
        return self.component.log if self.component else None

    def register(self, docs: Iterable[dict]) -> None:
        """Create (or replace) each webhook configuration, remembered for :meth:`stop`."""
        for doc in docs:
            collection = f"{WEBHOOK_API}/{doc['kind'].lower()}s"
            self.rest.delete(f"{collection}/{doc['metadata']['name']}", missing_ok=True)
            self.rest.create(collection, doc)
            self.configs.append((collection, doc["metadata"]["name"]))

    def stop(self) -> None:
        for collection, name in self.configs:
            self.rest.delete(f"{collection}/{name}", missing_ok=True)
        self.configs.clear()
        if self.component is not None:
            self.component.stop()
            self.component = None
