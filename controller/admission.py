"""Admission (``admission.k8s.io/v1`` AdmissionReview): validate StatefulSets, stamp their pods.

Validating, StatefulSets (CREATE, UPDATE): KEP-6277's rules from :mod:`controller.config`; shared
claims the pod template does not consume are a warning, not a rejection.

Mutating, pods (CREATE): a pod whose controller is a StatefulSet with a scheduling configuration
gets its PodGroup reference (``spec.schedulingGroup.podGroupName`` built in, the
``scheduling.phalanx.dev/pod-group`` label in the CRD flavor), an ownerReference to the PodGroup
(UID from the live object) and the ``podgroup-sync`` scheduling gate. Where phalanx provides the
PodGroup's shared ResourceClaims (no KEP-5729 in the cluster), each pod claim entry with the same
``name`` and the same ``resourceClaimTemplateName`` as a PodGroup entry becomes
``resourceClaimName: <the PodGroup's claim>``; other entries stay per-pod claims. The webhook never writes: it
asks the leader to reconcile and waits (bounded) for the PodGroup to appear. When the PodGroup
cannot be found in time and the StatefulSet has no pods yet, the pod is *rejected*: the StatefulSet
controller retries with backoff, so no pod of an opted-in StatefulSet runs outside its group.
Pods of StatefulSets without scheduling, and all other pods, pass unchanged. Pods of a
LeaderWorkerSet (its name label) go to ``controller.lws_admission``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from cluster import kinds
from cluster.kinds import admission_response as response
from cluster.kube import api_path

from . import lws, lws_admission, objects
from .config import validate_statefulset
from .objects import Flavor
from .reconciler import Reconciler

__all__ = ["response", "review_statefulset", "PodMutator", "MSG_GROUP_PENDING"]

MSG_GROUP_PENDING = "phalanx: pod of StatefulSet {ns}/{name} is held until its PodGroup exists: {why}"


def review_statefulset(review: Mapping[str, Any]) -> dict[str, Any]:
    request = kinds.review_request(review)
    if request.operation not in ("CREATE", "UPDATE") or not request.object:
        return response(request, True)
    old = request.old_object if request.operation == "UPDATE" else None
    errors, warnings = validate_statefulset(request.object, old)
    if errors:
        return response(request, False, "; ".join(errors))
    return response(request, True, warnings=warnings)


class PodMutator:
    """Stamps pods of opted-in StatefulSets. ``kick(namespace, name)`` asks the local controller
    (when it leads) to reconcile now; ``wait`` bounds how long one admission waits."""

    def __init__(self, kube: Any, reconciler: Reconciler, flavor: Flavor,
                 kick: Callable[[str, str, float], None] = lambda ns, name, delay: None,
                 wait: float = 6.0, poll: float = 0.05):
        self.kube, self.reconciler, self.flavor = kube, reconciler, flavor
        self.kick, self.wait, self.poll = kick, wait, poll
        self.lws = lws_admission.LwsMutator(kube, flavor, kick, wait, poll)

    def review(self, review: Mapping[str, Any]) -> dict[str, Any]:
        request = kinds.review_request(review)
        if request.operation != "CREATE" or request.dry_run:
            return response(request, True)
        pod = kinds.pod(request.object)
        owner = pod.meta.controller
        if not owner or owner.kind != "StatefulSet" or not owner.api_version.startswith("apps/"):
            return response(request, True)
        if lws.member(pod) is not None:
            return self.lws.review(request, pod)  # a LeaderWorkerSet's pod (controller.lws_admission)
        if pod.group:
            return response(request, True)  # already names a group: the user's choice stands
        ns = request.namespace or pod.meta.namespace
        raw_sts = self.kube.get_or_none(api_path("apps/v1", "statefulsets", ns, owner.name))
        sts = None if raw_sts is None else kinds.statefulset(raw_sts)
        if sts is None or sts.meta.uid != owner.uid:
            return response(request, True)  # a predecessor's pod: not ours to stamp
        deadline = time.monotonic() + self.wait
        delay = self.poll
        # the rule's one home (docs/design.md: KEP-6277/no-pod-outside-group)
        while True:
            found = self.reconciler.sync(sts, write=False)
            if found.podgroup is not None:
                self.kick(ns, owner.name, 0.3)  # lift the gate once the pod exists
                return response(request, True, patch=objects.pod_patch(pod, found.podgroup, self.flavor, found.claims))
            if not found.why:
                return response(request, True)  # no scheduling configuration
            if found.has_pods:
                return response(request, True, warnings=[f"phalanx: pod not in a PodGroup: {found.why}"])
            if not found.pending or time.monotonic() >= deadline:
                return response(request, False, MSG_GROUP_PENDING.format(ns=ns, name=owner.name, why=found.why))
            self.kick(ns, owner.name, 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
