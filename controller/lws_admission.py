"""Admission for LeaderWorkerSets: validate the LWS, stamp its pods with their PodGroup.

Validating, LeaderWorkerSets (CREATE, UPDATE): the guide's rules (``controller.lws_config``).

Mutating, pods (CREATE), reached through phalanx's pod webhook (``admission.PodMutator``) for pods
labelled ``leaderworkerset.sigs.k8s.io/name`` whose LWS has a scheduling configuration:

- a leader gets a new group incarnation (label ``scheduling.phalanx.dev/lws-incarnation``, 5
  random characters), a worker its leader's (read from the leader pod its
  ``leaderworkerset.sigs.k8s.io/leader-name`` annotation names); a worker whose leader pod does
  not exist is refused — the worker StatefulSet of a leader just deleted (a replica preempted
  whole) recreates its pods until the garbage collector removes it, and admitted they would run
  outside any gang; the StatefulSet controller retries the create, and a new leader's workers come
  from its own StatefulSet;
- every pod gets its PodGroup reference (``spec.schedulingGroup.podGroupName`` built in, the
  ``scheduling.phalanx.dev/pod-group`` label in the CRD flavor, through ``objects.pod_patch``) and
  the ``podgroup-sync`` gate, which the controller lifts once the PodGroup exists with the right
  minCount;
- at the whole-LWS level the PodGroup exists before any pod: the webhook waits for it (bounded) and
  otherwise rejects the pod, so the StatefulSet controller retries and no pod runs outside the gang;
  at the replica and role levels the PodGroups are created after the leader is admitted (their
  names contain its incarnation), while it waits behind the gate.

The webhook never writes; it asks the leading controller replica to reconcile the LWS (``kick``).
Pods of LWSs without the annotation pass unchanged.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Callable, Mapping

from cluster import kinds, names
from cluster.kinds import admission_response as response
from cluster.kube import api_path

from . import lws, naming, objects
from .config import ConfigError, raw_scheduling
from .lws_config import LEVEL_WHOLE, resolve_lws, validate_lws

MSG_WHOLE_PENDING = "phalanx: pod of LeaderWorkerSet {ns}/{name} is held until its PodGroup {group} exists"
MSG_NO_LEADER = ("phalanx: worker of LeaderWorkerSet {ns}/{name} is refused while its leader pod {leader} does not "
                 "exist: its PodGroup is named by the leader's incarnation (the StatefulSet controller retries)")


def review_leaderworkerset(review: Mapping[str, Any]) -> dict[str, Any]:
    request = kinds.review_request(review)
    if request.operation not in ("CREATE", "UPDATE") or not request.object:
        return response(request, True)
    old = request.old_object if request.operation == "UPDATE" else None
    errors = validate_lws(request.object, old)
    return response(request, False, "; ".join(errors)) if errors else response(request, True)


def new_incarnation() -> str:
    return "".join(secrets.choice(naming.SAFE_ALPHABET) for _ in range(lws.INCARNATION_LENGTH))


def _label_op(key: str, value: str) -> dict[str, Any]:
    return {"op": "add", "path": kinds.json_pointer("metadata", "labels", key), "value": value}


class LwsMutator:
    """Stamps pods of opted-in LeaderWorkerSets. ``kick(namespace, name, delay)`` is the
    StatefulSet mutator's: it is called with ``lws:<namespace>`` so the queue key is the LWS's."""

    def __init__(self, kube: Any, flavor: objects.Flavor,
                 kick: Callable[[str, str, float], None] = lambda ns, name, delay: None,
                 wait: float = 6.0, poll: float = 0.05):
        self.kube, self.flavor, self.kick, self.wait, self.poll = kube, flavor, kick, wait, poll

    def _kick(self, ns: str, name: str, delay: float) -> None:
        self.kick(f"{lws.KEY_PREFIX}{ns}", name, delay)

    def review(self, request: kinds.AdmissionRequest | Mapping[str, Any],
               pod: kinds.Pod | Mapping[str, Any]) -> dict[str, Any]:
        """Admit ``pod``, the object of ``request`` (an AdmissionReview's request field)."""
        # these rules' one home (docs/design.md: LWS/incarnation, LWS/pod-names-podgroup)
        request, pod = kinds.admission_request(request), kinds.pod(pod)
        me = lws.member(pod)
        ns = request.namespace or pod.meta.namespace
        if me is None or pod.group:
            return response(request, True)
        raw_lws = self.kube.get_or_none(lws.lws_path(ns, me.lws))
        if raw_lws is None:
            return response(request, True)
        obj = kinds.leaderworkerset(raw_lws)
        try:
            raw = raw_scheduling(obj)
        except ConfigError as err:
            return response(request, True, warnings=[f"phalanx: pod not in a PodGroup: {err}"])
        if raw is None:
            return response(request, True)
        errors = validate_lws(obj)
        if errors:
            return response(request, True, warnings=[f"phalanx: pod not in a PodGroup: {'; '.join(errors)}"])
        sched = resolve_lws(raw)
        extra: list[dict[str, Any]] = []
        if sched.level == LEVEL_WHOLE:
            group = lws.whole_podgroup_name(obj)
            if not self._await_group(ns, me.lws, group, obj):
                return response(request, False, MSG_WHOLE_PENDING.format(ns=ns, name=me.lws, group=group))
        else:
            incarnation = me.incarnation
            if me.leader and not incarnation:
                incarnation = new_incarnation()
                extra.append(_label_op(names.LABEL_LWS_INCARNATION, incarnation))
            elif not me.leader:
                leader = self.kube.get_or_none(api_path("v1", "pods", ns, me.leader_name))
                if leader is None:  # the rule's one home (docs/design.md: LWS/worker-needs-leader)
                    return response(request, False, MSG_NO_LEADER.format(ns=ns, name=me.lws, leader=me.leader_name))
                leader_member = lws.member(kinds.pod(leader))
                if leader_member is None or not leader_member.incarnation:
                    return response(request, True, warnings=[
                        f"phalanx: pod not in a PodGroup: its leader {me.leader_name} is not in one"])
                incarnation = leader_member.incarnation
                extra.append(_label_op(names.LABEL_LWS_INCARNATION, incarnation))
            group = lws.podgroup_for(obj, sched, lws.Member(me.lws, me.leader, me.group_index, me.revision, me.size,
                                                            me.leader_name, incarnation)) or ""
        self._kick(ns, me.lws, 0.3)  # create the replica's PodGroups and lift the gate once the pod exists
        stamp = objects.pod_patch(pod, kinds.Meta(name=group), self.flavor, owned=False)
        return response(request, True, patch=extra + stamp)

    def _await_group(self, ns: str, name: str, group: str, obj: kinds.LeaderWorkerSet) -> bool:
        # the rule's one home (docs/design.md: LWS/whole-group-before-pods)
        deadline = time.monotonic() + self.wait
        delay = self.poll
        while True:
            found = self.kube.get_or_none(self.flavor.path("podgroups", ns, group))
            if found is not None and kinds.podgroup(found).meta.controller_uid == obj.meta.uid:
                return True
            if time.monotonic() >= deadline:
                return False
            self._kick(ns, name, 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
