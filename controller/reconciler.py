"""One StatefulSet's Workload and PodGroup, kept right against the API (KEP-6277 Controller Workflow).

Objects are found by reference, never by name: the Workload by ``spec.controllerRef`` (apps,
StatefulSet, name) in the StatefulSet's namespace, the PodGroup by ``spec.workloadRef``. Every
decision reads the API server directly (no cache), so a create always follows a fresh "not there".

Life cycle of the two objects, per StatefulSet:

    no pods yet, nothing found  -> create Workload, then PodGroup (events WorkloadCreated,
                                   PodGroupCreated; failures: WorkloadCreationFailed + metric)
    Workload found, no PodGroup -> create only the PodGroup (a crash between the two creates)
    pods exist                  -> create nothing; discover and sync minCount on objects phalanx
                                   created: Workload template first, then PodGroup
    two Workloads/PodGroups     -> ambiguous: nothing created or mutated, an event
    Workload with != 1 template -> ignored, an event
    not created by phalanx      -> used as-is: never mutated, owned or deleted
    StatefulSet deleted         -> the garbage collector follows ownerReferences; phalanx deletes
                                   the pods of its deleted PodGroup (see ``finish_cascade``)
    shared claims from templates, -> one ResourceClaim per PodGroup and entry, owned by the PodGroup,
    cluster without KEP-5729         created before the pods are released (see ``ensure_claims``)
    pods admitted unstamped       -> unbound ones do not count as "pods exist"; they are deleted for
    (webhook down, Ignore)           re-admission through the webhook; bound ones are reported and
                                     kept (see ``repair_unstamped``)
    StatefulSet gone or deleting  -> nothing is created: the StatefulSet is read live before a create

Composition: a StatefulSet with a parent *controller* ownerReference and the
``scheduling.k8s.io/group-template-name`` annotation gets only a PodGroup, instantiated from the
named template of the parent's Workload (found by its controllerRef to the parent); minCount then
comes from that template, which phalanx never changes. The annotation without a parent controller
is not delegation: the StatefulSet-managed path runs, with an event.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NoReturn, Protocol, Sequence

from cluster import kinds, names
from cluster.kinds import selector_query as label_selector
from cluster.kube import JSON_PATCH, KubeError, api_path

from . import objects
from .config import ConfigError, Owner, raw_scheduling, resolve, validate_statefulset
from .objects import Flavor

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")
MAX_REMEMBERED = 10_000  # created-object UIDs kept until their watch event arrives


__all__ = ["label_selector", "Reconciler", "Resolution", "CreationFailed", "StatefulSetGone", "Repair"]


class Recorder(Protocol):
    def event(self, obj: Any, kind: str, reason: str, message: str) -> None: ...


@dataclass
class Resolution:
    """What discovery found for one StatefulSet. ``podgroup`` (the PodGroup as the API returned it)
    None means pods cannot be stamped; ``why`` says why (empty: no scheduling configuration at all)."""

    podgroup: Mapping[str, Any] | None
    why: str = ""
    has_pods: bool = False
    pending: bool = False  # the leader is expected to create what is missing
    pods: list[kinds.Pod] = field(default_factory=list)  # the StatefulSet's pods as listed during the sync
    claims: tuple[objects.SharedClaim, ...] = ()  # the PodGroup's claims phalanx provides (see ensure_claims)


class CreationFailed(RuntimeError):
    """Creating or syncing the Workload/PodGroup failed; the caller retries with backoff."""


class StatefulSetGone(RuntimeError):
    """The StatefulSet was deleted (or is being deleted, or was replaced) under a sync: nothing is
    created for it."""


@dataclass
class Repair:
    """What ``repair_unstamped`` did: ``deleted`` unbound unstamped pods (names), ``bound`` unstamped
    pods left in place and reported, ``deferred`` unbound ones not deleted this time (backoff)."""

    deleted: list[str] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)
    deferred: int = 0


MAX_LISTED_PODS = 20  # pod names spelled out in an event or the unstamped-bound annotation


def _listed(pod_names: list[str]) -> str:
    shown = ", ".join(pod_names[:MAX_LISTED_PODS])
    more = len(pod_names) - MAX_LISTED_PODS
    return shown + (f" and {more} more" if more > 0 else "")


def owned_pods(pods: list[kinds.Pod], sts: kinds.StatefulSet) -> list[kinds.Pod]:
    return [p for p in pods if p.meta.controller_uid == sts.meta.uid]


def unstamped(pod: kinds.Pod | Mapping[str, Any], flavor: Flavor) -> bool:
    """A live pod that names no PodGroup (admitted while the pod webhook was unavailable)."""
    pod = kinds.pod(pod)
    return not pod.group and pod.phase not in TERMINAL_PHASES


def repairable(pod: kinds.Pod | Mapping[str, Any], flavor: Flavor) -> bool:
    """Unstamped and bound to no node: deleting it loses nothing, and the StatefulSet controller
    recreates it through the webhook. Such pods do not count as "the StatefulSet has pods"."""
    return unstamped(pod, flavor) and not kinds.pod(pod).node_name


def _stale(meta: kinds.Meta, owner: Owner) -> bool:
    """A managed object whose controller is another owner of this name (UIDs differ): it belongs to
    a deleted predecessor and waits for the garbage collector."""
    ctrl = meta.controller
    return meta.managed and ctrl is not None and ctrl.uid != owner.meta.uid


class Reconciler:
    def __init__(self, kube: Any, flavor: Flavor, recorder: Recorder,
                 on_creation_error: Callable[[], None] = lambda: None):
        self.kube, self.flavor, self.recorder = kube, flavor, recorder
        self.on_creation_error = on_creation_error
        self._created: dict[str, str] = {}  # UID -> resource of Workloads/PodGroups created here, oldest first
        self._created_lock = threading.Lock()

    # -- reads -----------------------------------------------------------------------------------
    def _list(self, resource_path: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.list_pages(resource_path)[0]
        return items

    def _workloads(self, namespace: str) -> list[kinds.Workload]:
        return [kinds.workload(w) for w in self._list(self.flavor.path("workloads", namespace))]

    def _podgroups(self, namespace: str) -> list[kinds.PodGroup]:
        return [kinds.podgroup(g) for g in self._list(self.flavor.path("podgroups", namespace))]

    def pods_of(self, sts: kinds.StatefulSet | Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The StatefulSet's pods as the API returned them (see ``_pods``)."""
        return [p.raw for p in self._pods(kinds.statefulset(sts))]

    def _pods(self, sts: kinds.StatefulSet) -> list[kinds.Pod]:
        """The StatefulSet's pods: those matching its selector (filtered by the API server, so a
        busy namespace is not listed whole on every sync) that it controls."""
        path = api_path("v1", "pods", sts.meta.namespace)
        selector = label_selector(sts.selector)
        found = self.kube.list_pages(path, labelSelector=selector)[0] if selector else self._list(path)
        return owned_pods([kinds.pod(p) for p in found], sts)

    def _holding(self, pods: list[kinds.Pod]) -> bool:
        """Pods that forbid creating the Workload/PodGroup now (KEP-6277: none once pods exist):
        every pod but those admitted unstamped and still unbound, which ``repair_unstamped``
        replaces."""
        # the rule's one home (docs/design.md: KEP-6277/create-before-pods)
        return any(not repairable(p, self.flavor) for p in pods)

    def created_here(self, uid: str | None) -> bool:
        """True once for an object this reconciler created: its watch ADDED event needs no sync."""
        with self._created_lock:
            return self._created.pop(uid, None) is not None if uid else False

    def forget_created(self, uid: str | None) -> None:
        """The object is gone (its DELETED event): no ADDED event will come for it."""
        with self._created_lock:
            self._created.pop(uid or "", None)

    def prune_created(self, resource: str, listed_uids: set[str]) -> None:
        """After a re-list of ``resource``: objects created here that the list lacks are gone."""
        with self._created_lock:
            for uid in [u for u, r in self._created.items() if r == resource and u not in listed_uids]:
                del self._created[uid]

    def created_count(self) -> int:
        with self._created_lock:
            return len(self._created)

    # -- the workflow ----------------------------------------------------------------------------
    def sync(self, sts: kinds.StatefulSet | Mapping[str, Any], write: bool = True) -> Resolution:
        """Discover (and with ``write``, create and sync) the StatefulSet's objects.

        ``write=False`` is the webhook's read-only view: it never changes the cluster, so only the
        leader writes. Raises CreationFailed when a write failed (retry with backoff).
        """
        # the rule's one home (docs/design.md: KEP-6277/annotation-without-parent)
        sts = kinds.statefulset(sts)
        try:
            raw = raw_scheduling(sts)
        except ConfigError as err:
            return self._invalid(sts, [str(err)], write)
        if raw is None:
            return Resolution(None)
        errors, _ = validate_statefulset(sts)
        if errors:
            return self._invalid(sts, errors, write)
        pods = self._pods(sts)
        template_name = sts.meta.annotations.get(names.ANNOTATION_GROUP_TEMPLATE_NAME)
        parent = sts.meta.controller
        if template_name and parent:
            found = self._delegated(sts, parent, template_name, pods, write)
        else:
            if template_name and write:
                self.recorder.event(sts, "Warning", names.EVENT_DELEGATION_IGNORED,
                                    f"annotation {names.ANNOTATION_GROUP_TEMPLATE_NAME} without a parent controller "
                                    "ownerReference is not delegation; the StatefulSet manages its own Workload")
            found = self._managed(sts, raw, pods, write)
        found.pods = pods
        if found.podgroup is not None:
            group = kinds.podgroup(found.podgroup)
            found.claims = objects.shared_claims(group, resolve(raw).resource_claims, self.flavor)
            if write and found.claims:
                self.ensure_claims(sts, group, found.claims)
        return found

    def _invalid(self, owner: Owner, errors: list[str], write: bool) -> Resolution:
        why = "invalid scheduling configuration: " + "; ".join(errors)
        if write:
            self._creation_failed(owner, why)
        return Resolution(None, why)

    def _creation_failed(self, owner: Owner, why: str) -> None:
        """KEP-6277: a Workload or PodGroup that could not be made is a WorkloadCreationFailed
        event on the owner and one more statefulset_workload_creation_errors_total."""
        self.on_creation_error()
        self.recorder.event(owner, "Warning", names.EVENT_WORKLOAD_CREATION_FAILED, why)

    def _managed(self, sts: kinds.StatefulSet, raw: Mapping[str, Any], pods: list[kinds.Pod],
                 write: bool) -> Resolution:
        # these rules' one home (docs/design.md: KEP-6277/workload-by-controller-ref, KEP-6277/one-template)
        ref = kinds.ControllerRef("apps", "StatefulSet", sts.meta.name)
        found = [w for w in self._workloads(sts.meta.namespace)
                 if w.controller_ref == ref and not _stale(w.meta, sts)]
        if len(found) > 1:
            return self._ambiguous(sts, "Workloads", [w.meta for w in found], write)
        if not found:
            if self._holding(pods):
                return Resolution(None, "no Workload, and the StatefulSet already has pods", True)
            if not write:
                return Resolution(None, "the Workload is not created yet", pending=True)
            workload = kinds.workload(self._create(sts, "workloads", objects.compile_workload(
                sts, resolve(raw), self.flavor), names.EVENT_WORKLOAD_CREATED))
            body = objects.compile_podgroup(sts, workload, workload.templates[0], self.flavor, True)
            return Resolution(self._create(sts, "podgroups", body, names.EVENT_PODGROUP_CREATED))
        workload = found[0]
        if len(workload.templates) != 1:
            if write:
                self.recorder.event(sts, "Warning", names.EVENT_WORKLOAD_IGNORED,
                                    f"Workload {workload.meta.name} has {len(workload.templates)} podGroupTemplates; "
                                    "a StatefulSet needs exactly 1")
            return Resolution(None, "the Workload does not have exactly one template", bool(pods))
        owns_workload = workload.meta.managed
        if owns_workload and write:
            workload = kinds.workload(self._sync_min_count(workload.raw, workload.meta, "/spec/podGroupTemplates/0",
                                                           workload.templates[0].fields, objects.min_count(sts),
                                                           "workloads"))
        return self._podgroup(sts, workload, workload.templates[0], pods, owns_workload, False, None, write)

    def _delegated(self, sts: kinds.StatefulSet, parent: kinds.OwnerRef, template_name: str,
                   pods: list[kinds.Pod], write: bool) -> Resolution:
        # the rule's one home (docs/design.md: KEP-6277/delegation)
        ref = kinds.ControllerRef(parent.group, parent.kind, parent.name)
        found = [w for w in self._workloads(sts.meta.namespace) if w.controller_ref == ref]
        templates = [(w, t) for w in found for t in w.templates if t.name == template_name]
        if len(found) != 1 or len(templates) != 1:
            why = (f"parent {parent.kind}/{parent.name}: {len(found)} Workload(s) and "
                   f"{len(templates)} template(s) named {template_name!r}; creating nothing")
            if write:
                self.recorder.event(sts, "Warning", names.EVENT_WORKLOAD_IGNORED, why)
            return Resolution(None, why, bool(pods))
        composite = (sts.meta.annotations.get(names.ANNOTATION_PARENT_COMPOSITE)
                     or sts.meta.annotations.get(names.ANNOTATION_PARENT_COMPOSITE_ALT))
        return self._podgroup(sts, found[0], templates[0][1], pods, False, True, composite, write)

    def _podgroup(self, sts: kinds.StatefulSet, workload: kinds.Workload, template: kinds.GroupTemplate,
                  pods: list[kinds.Pod], owns_workload: bool, delegated: bool, composite: str | None,
                  write: bool) -> Resolution:
        # the rule's one home (docs/design.md: KEP-6277/podgroup-by-template-ref)
        found = [g for g in self._podgroups(sts.meta.namespace)
                 if (g.workload_name, g.template_name) == (workload.meta.name, template.name)
                 and not _stale(g.meta, sts)]
        if delegated:
            # A parent's template may serve several StatefulSets: ours is the one we control.
            found = [g for g in found if g.meta.controller_uid == sts.meta.uid]
        if len(found) > 1:
            return self._ambiguous(sts, "PodGroups", [g.meta for g in found], write)
        if not found:
            if self._holding(pods):
                return Resolution(None, "no PodGroup, and the StatefulSet already has pods", True)
            if not write:
                return Resolution(None, "the PodGroup is not created yet", pending=True)
            body = objects.compile_podgroup(sts, workload, template, self.flavor, owns_workload, composite)
            return Resolution(self._create(sts, "podgroups", body, names.EVENT_PODGROUP_CREATED), has_pods=bool(pods))
        group = found[0]
        podgroup = group.raw
        target = template.fields.min_count
        if write and group.meta.managed and target is not None:
            podgroup = self._sync_min_count(group.raw, group.meta, "/spec", group.fields, target, "podgroups")
        return Resolution(podgroup, has_pods=bool(pods))

    # -- writes ----------------------------------------------------------------------------------
    def _ambiguous(self, owner: Owner, what: str, found: list[kinds.Meta], write: bool) -> Resolution:
        # the rule's one home (docs/design.md: KEP-6277/ambiguous)
        listed = ", ".join(sorted(m.name for m in found))
        why = f"{len(found)} {what} match this StatefulSet ({listed}); creating and changing nothing"
        if write:
            self.recorder.event(owner, "Warning", names.EVENT_WORKLOAD_AMBIGUOUS, why)
        return Resolution(None, why)

    def _alive(self, owner: Owner) -> bool:
        """The StatefulSet, read live, is this one (same UID) and not being deleted."""
        live = self.kube.get_or_none(api_path("apps/v1", "statefulsets", owner.meta.namespace, owner.meta.name))
        return live is not None and _same_and_alive(kinds.meta_of(live, "StatefulSet"), owner.meta.uid)

    def _create(self, owner: Owner, resource: str, body: Mapping[str, Any], reason: str) -> Mapping[str, Any]:
        """Create ``body`` (what this module compiled, so its kind and name are known) for ``owner``."""
        # the rule's one home (docs/design.md: KEP-6277/events)
        ns = owner.meta.namespace
        kind, name = _kind_and_name(resource, body)
        if not self._alive(owner):  # a deleted StatefulSet (stale cache, queued key) gets nothing new
            raise StatefulSetGone(f"StatefulSet {ns}/{owner.meta.name} is gone or being deleted")
        try:
            created: Mapping[str, Any] = self.kube.create(self.flavor.path(resource, ns), body)
        except KubeError as err:
            self._creation_failed(owner, f"creating {kind} {name}: {err}")
            raise CreationFailed(str(err)) from err
        meta = kinds.meta_of(created, kind)
        self.recorder.event(owner, "Normal", reason, f"Created {kind} {meta.name}")
        with self._created_lock:
            self._created[meta.uid] = resource
            while len(self._created) > MAX_REMEMBERED:  # an ADDED event that never came
                del self._created[next(iter(self._created))]
        return created

    def ensure_claims(self, sts: kinds.StatefulSet, podgroup: kinds.PodGroup,
                      shared: tuple[objects.SharedClaim, ...]) -> None:
        """Create the PodGroup's shared ResourceClaims that do not exist yet (KEP-6277 story 4 where
        the cluster lacks KEP-5729's PodGroup-level claims; see ``objects.shared_claims``).

        One claim per PodGroup and template entry, from the ResourceClaimTemplate in the PodGroup's
        namespace, owned by the PodGroup (so it goes when the StatefulSet goes). Runs before the
        pods are released: a missing template, a name taken by a claim the PodGroup does not own, or
        a failed create raises CreationFailed and the pods stay behind the podgroup-sync gate.

        The claim is reserved pod by pod (``status.reservedFor``, at most 256 entries), so a group
        sharing it is limited to 256 pods, unlike a KEP-5729 PodGroup-level reservation.
        """
        # the rule's one home (docs/design.md: KEP-6277/claims-without-kep-5729)
        meta = podgroup.meta
        if meta.deleting:
            return
        for claim in shared:
            path = api_path(names.RESOURCE_API_VERSION, "resourceclaims", meta.namespace, claim.claim)
            existing = self.kube.get_or_none(path)
            if existing is None:
                existing = self._create_claim(sts, podgroup, claim)
            if kinds.meta_of(existing, "ResourceClaim").controller_uid != meta.uid:
                self._claim_failed(sts, f"ResourceClaim {claim.claim} exists and is not owned by PodGroup "
                                        f"{meta.name}; pods stay gated")

    def _create_claim(self, sts: kinds.StatefulSet, podgroup: kinds.PodGroup,
                      claim: objects.SharedClaim) -> Mapping[str, Any]:
        ns = podgroup.meta.namespace
        template = self.kube.get_or_none(api_path(names.RESOURCE_API_VERSION, "resourceclaimtemplates", ns,
                                                  claim.template))
        if template is None:
            self._claim_failed(sts, f"shared claim {claim.name}: ResourceClaimTemplate {ns}/{claim.template} "
                                    "not found; pods stay gated")
        body = objects.compile_claim(podgroup, claim, kinds.claim_template(template), self.flavor)
        try:
            created: Mapping[str, Any] = self.kube.create(api_path(names.RESOURCE_API_VERSION, "resourceclaims", ns),
                                                          body)
        except KubeError as err:
            if err.status == 409:  # created meanwhile: whose it is decides
                found: Mapping[str, Any] | None = self.kube.get_or_none(
                    api_path(names.RESOURCE_API_VERSION, "resourceclaims", ns, claim.claim))
                if found is not None:
                    return found
            self._claim_failed(sts, f"creating ResourceClaim {claim.claim}: {err}")
        self.recorder.event(sts, "Normal", names.EVENT_RESOURCECLAIM_CREATED,
                            f"Created ResourceClaim {kinds.meta_of(created, 'ResourceClaim').name} for PodGroup "
                            f"{podgroup.meta.name} from ResourceClaimTemplate {claim.template}")
        return created

    def _claim_failed(self, sts: kinds.StatefulSet, why: str) -> NoReturn:
        self.recorder.event(sts, "Warning", names.EVENT_RESOURCECLAIM_FAILED, why)
        raise CreationFailed(why)

    def _sync_min_count(self, obj: Mapping[str, Any], meta: kinds.Meta, at: str, fields: kinds.GroupFields,
                        target: int, resource: str) -> Mapping[str, Any]:
        """``obj`` (of ``resource``) with gang minCount at ``at`` patched to ``target``."""
        # the rule's one home (docs/design.md: KEP-6277/min-count-sync)
        patch = objects.min_count_patch(at, fields, target)
        if patch is None:
            return obj
        try:
            patched: Mapping[str, Any] = self.kube.patch(self.flavor.path(resource, meta.namespace, meta.name), patch,
                                                         JSON_PATCH)
            return patched
        except KubeError as err:
            raise CreationFailed(f"syncing minCount of {_KINDS[resource]} {meta.name}: {err}") from err

    def release_pods(self, owner: Owner | Mapping[str, Any], podgroup: kinds.PodGroup | Mapping[str, Any],
                     pods: Sequence[kinds.Pod | Mapping[str, Any]] | None = None) -> int:
        """Lift the sync gate from the owner's pods in ``podgroup`` (minCount is in sync); ``pods``:
        the owner's pods when just listed (raw JSON or ``kinds.Pod``)."""
        released = 0
        group = kinds.podgroup(podgroup).meta.name
        owner = kinds.workload_owner(owner)
        if pods is None:
            if not isinstance(owner, kinds.StatefulSet):
                raise TypeError("release_pods: a LeaderWorkerSet's pods must be given")
            pods = self._pods(owner)
        for pod in map(kinds.pod, pods):
            if objects.has_sync_gate(pod) and pod.group == group:
                try:
                    self.kube.patch(api_path("v1", "pods", pod.meta.namespace, pod.meta.name),
                                    objects.ungate_patch(pod), JSON_PATCH)
                    released += 1
                except KubeError as err:
                    if err.status not in (404, 409, 422):
                        raise
        return released

    def repair_unstamped(self, sts: kinds.StatefulSet | Mapping[str, Any], found: Resolution,
                         delete: bool = True) -> Repair:
        """Mend the gang after a pod-webhook outage (``failurePolicy: Ignore`` admitted the
        StatefulSet's pods without their PodGroup reference and gate).

        Unbound unstamped pods (no ``spec.nodeName``) are deleted, with preconditions on their UID
        and resourceVersion (a pod bound meanwhile changed version and is kept), so the StatefulSet
        controller recreates them through the webhook, stamped and gated: only once the PodGroup
        exists, and not with ``delete`` False (the caller's backoff while the webhook stays down).
        Bound unstamped pods are never deleted: a Warning event on the StatefulSet names them and
        says what to do, and the PodGroup phalanx manages carries their names in the
        ``unstamped-bound-pods`` annotation until none is left. ``found`` is this sync's result.
        """
        sts = kinds.statefulset(sts)
        group = None if found.podgroup is None else kinds.podgroup(found.podgroup)
        if group is None and not found.has_pods:
            return Repair()
        loose = [p for p in map(kinds.pod, found.pods) if unstamped(p, self.flavor)]
        bound = sorted(p.meta.name for p in loose if p.node_name)
        result = Repair(bound=bound)
        ns, name = sts.meta.namespace, sts.meta.name
        if group is not None and not group.meta.deleting:
            self._recreate_unbound(sts, group, loose, delete, result)
            self._mark_unstamped_bound(group, bound)
        if bound:
            if group is not None:
                where = f"PodGroup {group.meta.name} waits for them"
                todo = (f"delete them when convenient (kubectl delete pod -n {ns} "
                        f"{' '.join(bound[:MAX_LISTED_PODS])}) and the StatefulSet controller recreates them in "
                        "the gang")
            else:  # KEP-6277 creates nothing once pods run; freed room would go to unstamped siblings
                where = "so phalanx creates no Workload or PodGroup for the StatefulSet"
                todo = (f"scale it to 0 and back when convenient (kubectl scale statefulset -n {ns} {name} "
                        f"--replicas=0, then --replicas={objects.replicas(sts)}) and every pod joins the gang")
            self.recorder.event(sts, "Warning", names.EVENT_UNSTAMPED_PODS_BOUND,
                                f"pods {_listed(bound)} were admitted without a PodGroup (the pod webhook was "
                                f"unavailable) and are bound to nodes, {where}; phalanx never deletes running "
                                f"pods: {todo}")
        return result

    def _recreate_unbound(self, sts: kinds.StatefulSet, group: kinds.PodGroup, loose: list[kinds.Pod],
                          delete: bool, result: Repair) -> None:
        """Delete the unbound ``loose`` pods (``delete`` False: count them as deferred)."""
        for pod in loose:
            if pod.node_name or pod.meta.deleting:
                continue
            if not delete:
                result.deferred += 1
                continue
            try:
                self.kube.delete(api_path("v1", "pods", sts.meta.namespace, pod.meta.name), {"preconditions": {
                    "uid": pod.meta.uid, "resourceVersion": pod.meta.resource_version or None}})
                result.deleted.append(pod.meta.name)
            except KubeError as err:
                if err.status not in (404, 409):  # gone, or changed (e.g. bound) since listed
                    raise
        if result.deleted:
            self.recorder.event(sts, "Normal", names.EVENT_UNSTAMPED_PODS_RECREATED,
                                f"Deleted unbound pods {_listed(result.deleted)}: admitted without PodGroup "
                                f"{group.meta.name} (the pod webhook was unavailable); the "
                                "StatefulSet controller recreates them in the group")

    def _mark_unstamped_bound(self, group: kinds.PodGroup, bound: list[str]) -> None:
        """Keep the managed PodGroup's unstamped-bound-pods annotation equal to ``bound``."""
        gmeta = group.meta
        if not gmeta.managed:
            return  # a user's or parent's PodGroup is never mutated
        current = gmeta.annotations.get(names.ANNOTATION_UNSTAMPED_BOUND)
        wanted = _listed(bound) if bound else None
        if current == wanted:
            return
        at = kinds.json_pointer("metadata", "annotations", names.ANNOTATION_UNSTAMPED_BOUND)
        if wanted is None:
            patch = [{"op": "test", "path": at, "value": current}, {"op": "remove", "path": at}]
        else:
            patch = [{"op": "add", "path": at, "value": wanted}]
        try:
            self.kube.patch(self.flavor.path("podgroups", gmeta.namespace, gmeta.name), patch, JSON_PATCH)
        except KubeError as err:
            if err.status not in (404, 409, 422):  # gone or changed: the next sync sets it
                raise

    def _live_members(self, podgroup: kinds.PodGroup) -> list[kinds.Pod]:
        meta = podgroup.meta
        return [p for p in map(kinds.pod, self._list(api_path("v1", "pods", meta.namespace)))
                if p.group == meta.name and p.phase not in TERMINAL_PHASES]

    def finish_cascade(self, podgroup: kinds.PodGroup | Mapping[str, Any]) -> int:
        """Delete the pods of a deleted PodGroup phalanx created whose StatefulSet is gone.

        The garbage collector keeps a dependent while any owner still exists, and the
        podgroup-protection finalizer keeps the PodGroup while a pod references it: after the
        StatefulSet is deleted, its pods (owners: StatefulSet, PodGroup) and its PodGroup would
        wait for each other forever. phalanx does the step the collector cannot.
        """
        group = kinds.podgroup(podgroup)
        meta = group.meta
        if not meta.deleting or not meta.managed:
            return 0
        deleted = 0
        for pod in self._live_members(group):
            owner = pod.meta.controller
            if pod.meta.deleting or (owner and self._owner_alive(pod, owner)):
                continue
            path = api_path("v1", "pods", meta.namespace, pod.meta.name)
            try:
                self.kube.delete(path, {"preconditions": {"uid": pod.meta.uid}})
                deleted += 1
            except KubeError as err:
                if err.status not in (404, 409):
                    raise
        return deleted

    def _owner_alive(self, pod: kinds.Pod, owner: kinds.OwnerRef) -> bool:
        if owner.kind != "StatefulSet":
            return True  # not ours to judge
        sts = self.kube.get_or_none(api_path("apps/v1", "statefulsets", pod.meta.namespace, owner.name))
        return sts is not None and _same_and_alive(kinds.meta_of(sts, "StatefulSet"), owner.uid)

    def release_finalizer(self, podgroup: kinds.PodGroup | Mapping[str, Any]) -> bool:
        """CRD flavor: drop podgroup-protection from a deleted PodGroup once no non-terminal pod
        references it (upstream, kube-controller-manager does this for the built-in API)."""
        # the rule's one home (docs/design.md: KEP-6277/finalizer-removed)
        group = kinds.podgroup(podgroup)
        meta = group.meta
        finalizers = list(meta.finalizers)
        if not meta.deleting or names.FINALIZER_PODGROUP_PROTECTION not in finalizers:
            return False
        if self._live_members(group):
            return False
        kept = [f for f in finalizers if f != names.FINALIZER_PODGROUP_PROTECTION]
        patch = [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                 {"op": "replace", "path": "/metadata/finalizers", "value": kept}]
        self.kube.patch(self.flavor.path("podgroups", meta.namespace, meta.name), patch, JSON_PATCH)
        return True


_KINDS = {"workloads": "Workload", "podgroups": "PodGroup"}


def _kind_and_name(resource: str, body: Mapping[str, Any]) -> tuple[str, str]:
    return _KINDS[resource], kinds.meta_of(body, _KINDS[resource]).name


def _same_and_alive(live: kinds.Meta, uid: str) -> bool:
    """The object read live is the one with ``uid`` and is not being deleted."""
    return live.uid == uid and not live.deleting
