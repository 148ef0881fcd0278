"""Every manifest `kubectl apply -k scheduler-config/` (and scheduler-config/crds/) would create is
accepted by the real API server (server-side dry run: validated, admitted, not persisted)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cluster.kube import api_path

ROOT = Path(__file__).resolve().parents[2] / "scheduler-config"


def kustomized(directory: Path) -> list[dict]:
    """The objects a kustomization lists (resources: files and directories), in order."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects = []
    for entry in kust.get("resources", []):
        target = directory / entry
        if target.is_dir():
            objects += kustomized(target)
        else:
            objects += [d for d in yaml.safe_load_all(target.read_text()) if d]
    return objects


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "PriorityClass"}


def collection(obj: dict) -> str:
    namespace = None if obj["kind"] in CLUSTER_SCOPED else obj["metadata"].get("namespace", "default")
    return api_path(obj["apiVersion"], obj["kind"].lower() + "s", namespace)


def test_kustomization_and_crds_are_accepted_by_the_api_server(rest):
    objects = kustomized(ROOT) + kustomized(ROOT / "crds")
    kinds = sorted({o["kind"] for o in objects})
    assert {"Deployment", "ClusterRole", "MutatingWebhookConfiguration", "CustomResourceDefinition"} <= set(kinds)
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    for ns in namespaces:  # dry-run creation of namespaced objects needs their namespace to exist
        if rest.get_or_none(f"/api/v1/namespaces/{ns['metadata']['name']}") is None:
            rest.post(collection(ns), ns, dryRun="All")
            rest.post(collection(ns), ns)
    for obj in objects:
        if obj["kind"] != "Namespace":
            rest.post(collection(obj), obj, dryRun="All")
