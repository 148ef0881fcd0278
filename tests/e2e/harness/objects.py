"""Builders for the objects the e2e tests create (plain dicts, upstream wire shapes) and the
REST paths they live at.

Workload and PodGroup follow ``scheduling.k8s.io/v1beta1`` as served by Kubernetes 1.37; pods join a
group with ``spec.schedulingGroup.podGroupName``. StatefulSets carry KEP-6277's scheduling block in
the ``scheduling.phalanx.dev/scheduling`` annotation (no released StatefulSet has the field).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

SCHEDULING_API = "scheduling.k8s.io/v1beta1"
STATEFULSET_SCHEDULING_ANNOTATION = "scheduling.phalanx.dev/scheduling"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"

_PLURALS = {
    ("v1", "Pod"): "pods", ("v1", "Node"): "nodes", ("v1", "Namespace"): "namespaces",
    ("apps/v1", "StatefulSet"): "statefulsets", ("batch/v1", "Job"): "jobs",
    ("scheduling.k8s.io/v1", "PriorityClass"): "priorityclasses",
    (SCHEDULING_API, "Workload"): "workloads", (SCHEDULING_API, "PodGroup"): "podgroups",
    ("scheduling.k8s.io/v1alpha3", "CompositePodGroup"): "compositepodgroups",
    ("scheduling.phalanx.dev/v1beta1", "PodGroup"): "podgroups",
    ("scheduling.phalanx.dev/v1beta1", "Workload"): "workloads",
    ("scheduling.phalanx.dev/v1alpha3", "CompositePodGroup"): "compositepodgroups",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
}
_CLUSTER_SCOPED = {"Node", "Namespace", "PriorityClass"}


def path(api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """REST path of a collection (name None) or an object."""
    plural = _PLURALS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if kind not in _CLUSTER_SCOPED:
        if not namespace:
            raise ValueError(f"{kind} is namespaced: give a namespace")
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


def path_of(obj: Mapping[str, Any], namespace: str | None = None) -> str:
    meta = obj["metadata"]
    return path(obj["apiVersion"], obj["kind"], meta.get("namespace") or namespace, meta["name"])


# --- scheduling.k8s.io/v1beta1 ---------------------------------------------------------------

def _scheduling_fields(min_count: int | None, topology_key: str | None, disruption_mode: str | None,
                       priority_class_name: str | None, priority: int | None) -> dict:
    """The fields a PodGroupTemplate and a PodGroup spec share. min_count None means Basic."""
    fields: dict[str, Any] = {
        "schedulingPolicy": {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}},
    }
    if topology_key:
        fields["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    if disruption_mode:
        fields["disruptionMode"] = {disruption_mode: {}}
    if priority_class_name:
        fields["priorityClassName"] = priority_class_name
    if priority is not None:
        fields["priority"] = priority
    return fields


def podgroup_template(name: str, min_count: int | None = None, topology_key: str | None = None,
                      disruption_mode: str | None = None, priority_class_name: str | None = None,
                      priority: int | None = None) -> dict:
    return {"name": name, **_scheduling_fields(min_count, topology_key, disruption_mode,
                                               priority_class_name, priority)}


def workload(name: str, templates: list[dict], controller_ref: Mapping[str, str] | None = None,
             namespace: str | None = None) -> dict:
    spec: dict[str, Any] = {"podGroupTemplates": templates}
    if controller_ref:
        spec["controllerRef"] = dict(controller_ref)
    return {"apiVersion": SCHEDULING_API, "kind": "Workload",
            "metadata": _meta(name, namespace), "spec": spec}


def podgroup(name: str, min_count: int | None = None, workload_name: str | None = None,
             template_name: str | None = None, topology_key: str | None = None,
             disruption_mode: str | None = None, priority_class_name: str | None = None,
             priority: int | None = None, namespace: str | None = None) -> dict:
    spec = _scheduling_fields(min_count, topology_key, disruption_mode, priority_class_name, priority)
    if workload_name:
        spec["workloadRef"] = {"workloadName": workload_name, "templateName": template_name or ""}
    return {"apiVersion": SCHEDULING_API, "kind": "PodGroup",
            "metadata": _meta(name, namespace), "spec": spec}


# --- core / apps -------------------------------------------------------------------------------

def _meta(name: str, namespace: str | None, labels: Mapping[str, str] | None = None,
          annotations: Mapping[str, str] | None = None) -> dict:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def pod_spec(requests: Mapping[str, str | int] | None = None, podgroup_name: str | None = None,
             scheduler_name: str | None = None, priority_class_name: str | None = None,
             node_selector: Mapping[str, str] | None = None,
             tolerations: list[dict] | None = None) -> dict:
    resources = {"requests": {k: str(v) for k, v in (requests or {"cpu": "1"}).items()}}
    if any(k not in ("cpu", "memory", "ephemeral-storage") for k in resources["requests"]):
        resources["limits"] = {k: v for k, v in resources["requests"].items()
                               if k not in ("cpu", "memory", "ephemeral-storage")}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": resources}],
        "terminationGracePeriodSeconds": 1,
    }
    if podgroup_name:
        spec["schedulingGroup"] = {"podGroupName": podgroup_name}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def pod(name: str, podgroup_name: str | None = None, requests: Mapping[str, str | int] | None = None,
        labels: Mapping[str, str] | None = None, namespace: str | None = None, **spec_kwargs: Any) -> dict:
    """A pause pod; with ``podgroup_name`` it joins that PodGroup (spec.schedulingGroup)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(name, namespace, labels),
            "spec": pod_spec(requests, podgroup_name, **spec_kwargs)}


def statefulset(name: str, replicas: int, pod_management_policy: str = "Parallel",
                requests: Mapping[str, str | int] | None = None,
                scheduling: Mapping[str, Any] | None = None, namespace: str | None = None,
                labels: Mapping[str, str] | None = None, **spec_kwargs: Any) -> dict:
    """A StatefulSet of pause pods. ``scheduling`` is KEP-6277's ``spec.scheduling`` block, e.g.
    ``{"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": [{"key": RACK}]}}``,
    carried in the ``scheduling.phalanx.dev/scheduling`` annotation."""
    selector = {"app": name}
    annotations = {STATEFULSET_SCHEDULING_ANNOTATION: json.dumps(scheduling)} if scheduling else None
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(name, namespace, labels, annotations),
        "spec": {
            "replicas": replicas, "serviceName": name, "podManagementPolicy": pod_management_policy,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": {**selector, **(labels or {})}},
                         "spec": pod_spec(requests, **spec_kwargs)},
        },
    }


def job(name: str, parallelism: int, podgroup_name: str | None = None,
        requests: Mapping[str, str | int] | None = None, namespace: str | None = None, **spec_kwargs: Any) -> dict:
    """An Indexed Job of ``parallelism`` pause pods (as many completions), its pod template naming
    ``podgroup_name`` (spec.schedulingGroup: the Job controller copies it into every pod)."""
    spec = {**pod_spec(requests, podgroup_name, **spec_kwargs), "restartPolicy": "Never"}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace),
        "spec": {"parallelism": parallelism, "completions": parallelism, "completionMode": "Indexed",
                 "backoffLimit": 0, "template": {"spec": spec}},
    }


def priority_class(name: str, value: int, preemption_policy: str | None = None) -> dict:
    obj: dict[str, Any] = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                           "metadata": {"name": name}, "value": value}
    if preemption_policy:
        obj["preemptionPolicy"] = preemption_policy
    return obj


def create(rest: Any, obj: Mapping[str, Any], namespace: str | None = None) -> dict:
    """POST ``obj`` to its collection (namespace from the object or the argument)."""
    ns = obj["metadata"].get("namespace") or namespace
    return rest.create(path(obj["apiVersion"], obj["kind"], ns), obj)
