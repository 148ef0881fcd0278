"""KWOK (Kubernetes WithOut Kubelet, ``sigs.k8s.io/kwok``) plays the e2e control plane's nodes.

``ControlPlane.start`` runs the pinned ``kwok`` controller (hack/build-kwok.sh; ``binaries.locate``) as one of its
components, managing only the nodes labelled ``E2E_NODE_LABEL`` (``nodes.py`` puts it on every node
it builds), with the stages below instead of KWOK's defaults:

- nodes: KWOK holds and renews each node's Lease (the node lifecycle controller's heartbeat);
  ``node-ready`` reports Ready when a node is not (on registration, and when ``NOT_READY_LABEL`` is
  taken off again); ``node-not-ready`` reports Ready=False for a node labelled ``NOT_READY_LABEL``;
- pods (bound to a managed node): ``pod-ready`` makes a pod Running and Ready, with a pod IP from
  KWOK's CIDR and the node's InternalIP as host IP, at once (OrderedReady StatefulSets progress at
  full speed); ``pod-delete`` finishes a graceful deletion at once (what a kubelet does when the
  containers are gone), except for pods labelled ``HOLD_DELETION_LABEL``; ``pod-succeeded`` and
  ``pod-failed`` end a running pod's containers with the exit code a test labels it with
  (``FINISH_LABEL``: 0 puts it in phase Succeeded, any other code in Failed), as a kubelet reports
  a finished pod (:func:`finish_pod`).

Pods run until then: a Job's pods finish only when a test finishes them. The stage format is KWOK's ``Stage`` API
(kwok.x-k8s.io/v1alpha1); the templates are Go templates over the object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .nodes import E2E_NODE_LABEL, FINISH_LABEL, HOLD_DELETION_LABEL, NOT_READY_LABEL

# Pod IPs: KWOK hands them out of this range and takes them back when a pod goes. Kept apart from
# the apiserver's service range (10.0.0.0/24) and from the nodes' InternalIPs (10.1.x.y).
POD_CIDR = "10.244.0.0/16"
# The Lease's duration; KWOK renews it every quarter of it. The node lifecycle controller's grace
# period (controlplane.py) must be comfortably longer than one renewal on a loaded machine.
NODE_LEASE_SECONDS = 20
_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
_LABEL = '.metadata.labels["{}"]'


def _conditions(ready: str, reason: str, message: str) -> str:
    """A status template: the node's four conditions, Ready = ``ready``, heartbeat now."""
    rows = [("Ready", ready, reason, message)] + [
        (kind, "False", f"KubeletHasNo{kind}", f"phalanx e2e node has no {kind}")
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    lines = ["{{ $now := Now }}", "conditions:"]
    for kind, status, why, text in rows:
        lines += [f"- type: {kind}", f'  status: "{status}"', f"  reason: {why}", f'  message: "{text}"',
                  "  lastHeartbeatTime: {{ $now | Quote }}", "  lastTransitionTime: {{ $now | Quote }}"]
    return "\n".join(lines + ["phase: Running", ""])


def _stage(name: str, kind: str, match: list[dict], next_: dict) -> dict:
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": {"resourceRef": {"apiGroup": "v1", "kind": kind},
                     "selector": {"matchExpressions": match}, "next": next_}}


_POD_RUNNING = """{{ $now := Now }}
conditions:
- {type: PodScheduled, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ range .spec.readinessGates }}
- {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state: {running: {startedAt: {{ $now | Quote }}}}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


_POD_FINISHED = """{{ $now := Now }}
conditions:
- {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state: {terminated: {exitCode: EXIT, reason: REASON, finishedAt: {{ $now | Quote }}}}
{{ end }}
phase: PHASE
"""


def _finished(phase: str) -> dict:
    """The stage that ends a pod labelled ``FINISH_LABEL`` with an exit code (0: Succeeded)."""
    code = '{{ index $.metadata.labels "' + FINISH_LABEL + '" }}'  # ($: the pod, inside the range)
    exit_code, reason, operator = ("0", "Completed", "In") if phase == "Succeeded" else (code, "Error", "NotIn")
    template = _POD_FINISHED.replace("EXIT", exit_code).replace("REASON", reason).replace("PHASE", phase)
    return _stage(f"pod-{phase.lower()}", "Pod", [
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
        {"key": ".status.phase", "operator": "In", "values": ["Running"]},
        {"key": _LABEL.format(FINISH_LABEL), "operator": "Exists"},
        {"key": _LABEL.format(FINISH_LABEL), "operator": operator, "values": ["0"]},
    ], {"statusTemplate": template})


def finish_pod(rest: Any, namespace: str, name: str, exit_code: int = 0) -> None:
    """Have KWOK end pod ``namespace/name``'s containers with ``exit_code`` (0: Succeeded, else
    Failed), as its kubelet would."""
    rest.patch(f"/api/v1/namespaces/{namespace}/pods/{name}",
               {"metadata": {"labels": {FINISH_LABEL: str(exit_code)}}})


def stages() -> list[dict]:
    """The Stage objects the harness runs KWOK with (see the module docstring)."""
    not_ready = _LABEL.format(NOT_READY_LABEL)
    return [
        _stage("node-ready", "Node", [
            {"key": _READY, "operator": "NotIn", "values": ["True"]},
            {"key": not_ready, "operator": "DoesNotExist"},
        ], {"statusTemplate": _conditions("True", "KubeletReady", "phalanx e2e node (KWOK)")}),
        _stage("node-not-ready", "Node", [
            {"key": _READY, "operator": "In", "values": ["True"]},
            {"key": not_ready, "operator": "Exists"},
        ], {"statusTemplate": _conditions("False", "NodeLost", "phalanx e2e: node taken NotReady")}),
        _stage("pod-ready", "Pod", [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
        ], {"statusTemplate": _POD_RUNNING}),
        _stage("pod-delete", "Pod", [
            {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
            {"key": _LABEL.format(HOLD_DELETION_LABEL), "operator": "DoesNotExist"},
        ], {"delete": True}),
        _finished("Succeeded"),
        _finished("Failed"),
    ]


def kwok_argv(binary: Path, kubeconfig: Path, stages_file: Path, server_port: int) -> list[str]:
    """The command line of the harness's kwok; writes the stages to ``stages_file``."""
    stages_file.write_text(yaml.safe_dump_all(stages(), sort_keys=False))
    return [
        str(binary), f"--kubeconfig={kubeconfig}", f"--config={stages_file}",
        f"--manage-nodes-with-label-selector={E2E_NODE_LABEL}=true",
        f"--cidr={POD_CIDR}", f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        f"--server-address=127.0.0.1:{server_port}",
    ]
