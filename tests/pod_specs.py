"""Rules every pod phalanx ships must follow, checked on the manifests (unit tests) and on every
rendering of the Helm chart (e2e, where helm is built).

- no probe or lifecycle ``host`` unless the pod uses the host's network (the kubelet probes the pod
  IP; Pod Security "baseline" forbids a probe host);
- every container requests CPU and memory and has a memory limit;
- non-root (``runAsNonRoot``, no ``runAsUser: 0``), no privilege escalation, all capabilities
  dropped, not privileged, a read-only root filesystem (scratch space is an emptyDir);
- no hostPath volumes, hostPID or hostIPC.
"""

from __future__ import annotations

from typing import Any, Iterable

WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}
HANDLERS = ("livenessProbe", "readinessProbe", "startupProbe")


def pod_templates(objects: Iterable[dict]) -> list[tuple[str, dict]]:
    """(``Kind/name``, pod spec) of every workload and bare Pod among ``objects``."""
    found = []
    for obj in objects:
        kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
        if kind in WORKLOAD_KINDS:
            found.append((f"{kind}/{name}", obj["spec"]["template"]["spec"]))
        elif kind == "Pod":
            found.append((f"Pod/{name}", obj["spec"]))
    return found


def _hosts(container: dict) -> list[str]:
    where = []
    for probe in HANDLERS:
        for action in ("httpGet", "tcpSocket"):
            if ((container.get(probe) or {}).get(action) or {}).get("host"):
                where.append(f"{probe}.{action}.host")
    for hook in ("postStart", "preStop"):
        for action in ("httpGet", "tcpSocket"):
            if (((container.get("lifecycle") or {}).get(hook) or {}).get(action) or {}).get("host"):
                where.append(f"lifecycle.{hook}.{action}.host")
    return where


def pod_spec_problems(spec: dict) -> list[str]:
    """Every rule ``spec`` breaks, as ``container: what`` lines (empty: it follows them all)."""
    problems = []
    pod_security = spec.get("securityContext") or {}
    if spec.get("hostPID") or spec.get("hostIPC"):
        problems.append("pod: hostPID/hostIPC")
    problems += [f"pod: hostPath volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        name = container.get("name", "?")
        security = {**pod_security, **(container.get("securityContext") or {})}
        if not spec.get("hostNetwork"):
            problems += [f"{name}: {where} without hostNetwork" for where in _hosts(container)]
        resources = container.get("resources") or {}
        for key in ("cpu", "memory"):
            if key not in (resources.get("requests") or {}):
                problems.append(f"{name}: no {key} request")
        if "memory" not in (resources.get("limits") or {}):
            problems.append(f"{name}: no memory limit")
        if security.get("runAsNonRoot") is not True or security.get("runAsUser") == 0:
            problems.append(f"{name}: may run as root")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation not false")
        if security.get("privileged"):
            problems.append(f"{name}: privileged")
        if "ALL" not in ((security.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{name}: capabilities not dropped")
        if security.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: writable root filesystem")
    return problems


def shipped_problems(objects: Iterable[dict]) -> dict[str, list[str]]:
    """``Kind/name`` -> problems, for every pod template among ``objects`` that breaks a rule."""
    return {where: p for where, spec in pod_templates(objects) if (p := pod_spec_problems(spec))}


def containers_by_name(spec: dict) -> dict[str, Any]:
    return {c["name"]: c for c in spec.get("containers") or []}
