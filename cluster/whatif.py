"""What-if drafts: the PodGroups and member pods a manifest *would* create, read as the cache reads
live ones — nothing here is stored, watched or written.

A compiler (the controller's, :func:`controller.whatif.compile_objects`, handed to the entry points
by the command that composes ``phalanx serve``) turns a manifest's objects into :class:`Drafts`;
the workload cycle plans them (:mod:`cycle.whatif`). The entry points only know the
:data:`Compile` signature, so they never import the controller (docs/design.md, "What-if").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import yaml

from solver import InvalidInput, Pod, VolumeClaim

from . import names
from .convert import (
    ClaimInfo,
    ClaimRef,
    ClassInfo,
    CompositeRecord,
    PodGroupRecord,
    VolumeInfo,
    claim_from_json,
    pod_claims,
    pod_from_json,
    pod_group_name,
    podgroup_record,
)
from .fields import MalformedObject
from .kinds import owned_pod_json
from .volumes import default_class, resolve_claims


@dataclass(frozen=True)
class DraftClaim:
    """A PersistentVolumeClaim the manifest would make exist: a StatefulSet's claim template for one
    ordinal, or a pod's generic ephemeral volume. ``defaulted``: it names no class, so admission
    gives it the cluster's default one."""

    info: ClaimInfo
    defaulted: bool = False


@dataclass(frozen=True)
class DraftGroup:
    """A PodGroup as it would be created, with the pods that would join it. ``source`` names the
    object of the manifest it comes from (``StatefulSet ns/name``)."""

    record: PodGroupRecord
    members: tuple[Pod, ...]
    source: str
    claims: Mapping[str, tuple[ClaimRef, ...]] = field(default_factory=dict)  # member uid -> its claims
    new_claims: tuple[DraftClaim, ...] = ()  # the claims the manifest's objects would create

    @property
    def key(self) -> str:
        return self.record.key

    def members_with_volumes(self, claims: Mapping[str, ClaimInfo], volumes: Mapping[str, VolumeInfo],
                             classes: Mapping[str, ClassInfo]) -> tuple[Pod, ...]:
        """The members with their claims resolved as kube-scheduler will see them once applied: a
        claim that exists already is used as it is (the StatefulSet controller reuses a claim of its
        name); one the manifest would create is unbound, of its class (the default one when it
        names none), and waits for its pod — an Immediate claim is planned as if it did too: the PV
        controller binds it before scheduling, to a PV it picks, which what-if cannot know."""
        if not self.claims:
            return self.members
        default = default_class(classes)
        known = dict(claims)
        for draft in self.new_claims:
            if draft.info.name not in known:
                known[draft.info.name] = replace(draft.info, storage_class=default) if draft.defaulted else draft.info
        def as_planned(claim: VolumeClaim) -> VolumeClaim:
            drafted = claim.name not in claims and not claim.bound and not claim.missing
            return replace(claim, delayed=True) if drafted else claim

        out = []
        for pod in self.members:
            refs = self.claims.get(pod.uid)
            if refs:
                pod = replace(pod, volumes=tuple(map(as_planned, resolve_claims(refs, pod.uid, known, volumes,
                                                                                classes))))
            out.append(pod)
        return tuple(out)


@dataclass(frozen=True)
class ObjectErrors:
    """Why one object of a manifest was refused: field by field, as the admission webhooks say it."""

    source: str
    messages: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.source}: " + "; ".join(self.messages)


@dataclass(frozen=True)
class Drafts:
    """A manifest compiled: the groups to plan, or the objects refused (then nothing is planned)."""

    groups: tuple[DraftGroup, ...] = ()
    errors: tuple[ObjectErrors, ...] = ()
    #: the CompositePodGroups of the manifest: drafted groups naming one as their parent are
    #: answered together with it (``cycle.whatif``)
    composites: tuple[CompositeRecord, ...] = ()


#: objects of a manifest (raw JSON, as a user wrote them) and the namespace of those that name
#: none -> the drafts
Compile = Callable[[Sequence[Any], str], Drafts]


def draft_group(podgroup: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], source: str,
                claims: Sequence[DraftClaim] = ()) -> DraftGroup:
    """A PodGroup object and its pods as the cache would read them, with the claims the pods mount
    (``claims``: those their owner would create; each generic ephemeral volume's is added); raises
    InvalidInput naming the field the cache would refuse."""
    record = podgroup_record(podgroup)
    members = tuple(pod_from_json(p) for p in pods)
    strangers = [p.name for p in members if p.group != record.key]
    if strangers:
        raise InvalidInput(f"pods {', '.join(strangers)} do not name podgroup {record.key}")
    pairs = list(zip(members, pods, strict=True))
    refs = {member.uid: mounted for member, raw in pairs if (mounted := pod_claims(raw))}
    ephemeral = [claim for member, raw in pairs for claim in ephemeral_claims(raw, member.uid)]
    return DraftGroup(record, members, source, refs, tuple(claims) + tuple(ephemeral))


def drafted_claim(namespace: str, name: str, template: Any, where: str, owner_uid: str = "") -> DraftClaim:
    """The claim made from a claim template (``metadata`` and ``spec``), as its controller names it."""
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise MalformedObject(f"{where}.spec: Required value")
    raw_meta = template.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    raw_annotations = meta.get("annotations")
    annotations: Mapping[str, Any] = raw_annotations if isinstance(raw_annotations, Mapping) else {}
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations)},
                           "spec": template["spec"]}
    if owner_uid:  # a generic ephemeral volume's claim: controlled by its pod
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "uid": owner_uid, "controller": True}]
    defaulted = (template["spec"].get("storageClassName") is None
                 and names.ANNOTATION_BETA_STORAGE_CLASS not in annotations)
    return DraftClaim(claim_from_json(obj), defaulted)


def ephemeral_claims(pod: Mapping[str, Any], uid: str) -> list[DraftClaim]:
    """The claims the ephemeral volume controller creates for a pod's generic ephemeral volumes:
    ``<pod>-<volume>``, owned by the pod."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    out = []
    for i, volume in enumerate(spec.get("volumes") or ()):
        if isinstance(volume, Mapping) and isinstance(volume.get("ephemeral"), Mapping):
            out.append(drafted_claim(meta["namespace"], f"{meta['name']}-{volume.get('name')}",
                                     volume["ephemeral"].get("volumeClaimTemplate"),
                                     f"spec.volumes[{i}].ephemeral.volumeClaimTemplate", uid))
    return out


# -- reading a manifest ----------------------------------------------------------------------------

#: the most pods one object of a manifest may draft: a what-if of ``replicas: 1000000`` is refused
#: with the field named, not compiled pod by pod
MAX_DRAFTED_PODS = 20_000
#: the largest what-if request, its objects as JSON, at every door (HTTP body, gRPC message, the CLI
#: checks before it sends): far above any real manifest, far below what would stall serve
MAX_MANIFEST_BYTES = 16 * 2**20
MSG_DUPLICATE = "metadata.name: Duplicate value: the manifest gives this object twice"


def _drafted(count: int, field_path: str) -> None:
    if count > MAX_DRAFTED_PODS:
        raise MalformedObject(f"{field_path}: Too many: {count}: what-if drafts at most {MAX_DRAFTED_PODS} pods "
                              "per object")


@dataclass(frozen=True)
class ManifestObject:
    """One object of a manifest: its API group, kind, name and namespace (the request's when it
    names none), and a copy of it in that namespace with a what-if UID
    (``whatif-<namespace>-<name>``: the real one is given by the API server)."""

    group: str
    kind: str
    name: str
    namespace: str
    source: str  # "Kind namespace/name", how answers and errors name it
    raw: dict[str, Any] = field(compare=False, repr=False)


def read_manifest(objects: Sequence[Any], namespace: str) -> tuple[list[ManifestObject], list[ObjectErrors]]:
    """The objects of a manifest, and those without the basics of the schema (an object with an
    ``apiVersion``, a ``kind`` and a ``metadata.name``), refused field by field."""
    read: list[ManifestObject] = []
    refused: list[ObjectErrors] = []
    seen: set[tuple[str, str, str, str]] = set()
    for index, raw in enumerate(objects):
        source = _source(raw, index, namespace)
        if not isinstance(raw, Mapping):
            refused.append(ObjectErrors(source, ("Invalid value: must be an object",)))
            continue
        missing = [f for f in ("apiVersion", "kind") if not isinstance(raw.get(f), str) or not raw.get(f)]
        meta = raw.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta.get("name"):
            missing.append("metadata.name")
        elif meta.get("namespace") is not None and not isinstance(meta.get("namespace"), str):
            missing.append("metadata.namespace")
        if missing:
            refused.append(ObjectErrors(source, tuple(f"{f}: Required value" for f in missing)))
            continue
        obj = copy.deepcopy(dict(raw))
        obj["metadata"].setdefault("namespace", namespace)
        ns, name = obj["metadata"]["namespace"] or namespace, obj["metadata"]["name"]
        obj["metadata"]["namespace"] = ns
        obj["metadata"].setdefault("uid", f"whatif-{ns}-{name}")
        group = str(obj["apiVersion"]).rpartition("/")[0]
        if (group, obj["kind"], ns, name) in seen:
            refused.append(ObjectErrors(source, (MSG_DUPLICATE,)))
            continue
        seen.add((group, obj["kind"], ns, name))
        read.append(ManifestObject(group, obj["kind"], name, ns, source, obj))
    return read, refused


def manifest_too_large(size: int) -> str:
    """The refusal of a what-if request of ``size`` bytes (JSON) above MAX_MANIFEST_BYTES, at any door."""
    return (f"phalanx: the manifest is {size / 2**20:.1f} MiB as JSON; what-if takes at most "
            f"{MAX_MANIFEST_BYTES // 2**20} MiB at once (plan its parts separately)")


# libyaml's safe loader when PyYAML was built with it (ten times faster on a large manifest)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def manifest_objects(text: str) -> list[Any]:
    """The documents of a YAML (or JSON) text, ``kind: List`` items unpacked, empty ones left out;
    raises yaml.YAMLError for text that is not YAML."""
    objects: list[Any] = []
    for document in yaml.load_all(text, Loader=_SAFE_LOADER):
        items = document.get("items") if isinstance(document, dict) and document.get("kind") == "List" else None
        if isinstance(items, list):
            objects += items
        elif document is not None:
            objects.append(document)
    return objects


def _source(raw: Any, index: int, namespace: str) -> str:
    """``Kind namespace/name`` of an object, or its place in the manifest when it has none."""
    if isinstance(raw, Mapping) and isinstance(raw.get("metadata"), Mapping):
        name = raw["metadata"].get("name")
        if isinstance(name, str) and name:
            ns = raw["metadata"].get("namespace")
            return f"{raw.get('kind') or 'object'} {ns if isinstance(ns, str) and ns else namespace}/{name}"
    return f"object {index + 1} of the manifest"


def member_of(pod: Mapping[str, Any]) -> str:
    """``namespace/group`` of the PodGroup a pod of the manifest names ("" none); raises
    InvalidInput for a name that is not a PodGroup name."""
    group = pod_group_name(pod)
    return f"{pod['metadata']['namespace']}/{group}" if group else ""


def _owner(obj: ManifestObject) -> dict[str, Any]:
    return {"apiVersion": obj.raw["apiVersion"], "kind": obj.kind, "name": obj.name,
            "uid": obj.raw["metadata"]["uid"]}


def _template(obj: ManifestObject, *path: str) -> Mapping[str, Any]:
    """The pod template at ``spec.<path>`` (MalformedObject naming it when it is not an object)."""
    value: Any = obj.raw.get("spec")
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping):
        raise MalformedObject(f"{obj.source}: spec.{'.'.join(path)}: Required value")
    return value


def job_pods(job: ManifestObject) -> list[dict[str, Any]]:
    """The pods the Job controller runs at once: ``parallelism`` (default 1), at most
    ``completions``, named ``<job>-<index>``."""
    raw_spec = job.raw.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    counts = [spec.get(f) for f in ("parallelism", "completions")]
    if any(c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 0) for c in counts):
        raise MalformedObject(f"{job.source}: spec.parallelism and spec.completions must be non-negative integers")
    parallelism = 1 if counts[0] is None else counts[0]
    running = parallelism if counts[1] is None else min(parallelism, counts[1])
    template = _template(job, "template")
    _drafted(running, "spec.parallelism")
    return [owned_pod_json(template, f"{job.name}-{i}", job.namespace, _owner(job)) for i in range(running)]


def _claim_templates(sts: ManifestObject) -> list[tuple[str, Mapping[str, Any]]]:
    """``spec.volumeClaimTemplates`` as (name, template), each named."""
    raw = sts.raw.get("spec", {}).get("volumeClaimTemplates") or []
    if not isinstance(raw, list):
        raise MalformedObject(f"{sts.source}: spec.volumeClaimTemplates: Invalid value: must be a list")
    out = []
    for i, template in enumerate(raw):
        meta = template.get("metadata") if isinstance(template, Mapping) else None
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise MalformedObject(f"{sts.source}: spec.volumeClaimTemplates[{i}].metadata.name: Required value")
        out.append((meta["name"], template))
    return out


def statefulset_pods(sts: ManifestObject, replicas: int) -> list[dict[str, Any]]:
    """The pods the StatefulSet controller creates: ``<name>-<ordinal>`` from its template, each
    claim template mounted as the volume of its name (claim ``<template>-<name>-<ordinal>``, in
    place of a template volume of that name)."""
    template = _template(sts, "template")
    _drafted(replicas, "spec.replicas")
    claim_names = [name for name, _ in _claim_templates(sts)]
    pods = []
    for i in range(replicas):
        pod = owned_pod_json(template, f"{sts.name}-{i}", sts.namespace, _owner(sts))
        if claim_names:
            kept = [v for v in pod["spec"].get("volumes") or () if not isinstance(v, Mapping)
                    or v.get("name") not in claim_names]
            pod["spec"]["volumes"] = kept + [{"name": c, "persistentVolumeClaim": {"claimName": f"{c}-{sts.name}-{i}"}}
                                             for c in claim_names]
        pods.append(pod)
    return pods


def statefulset_claims(sts: ManifestObject, replicas: int) -> list[DraftClaim]:
    """The claims the StatefulSet controller creates before each pod: ``<template>-<name>-<ordinal>``."""
    templates = list(enumerate(_claim_templates(sts)))
    return [drafted_claim(sts.namespace, f"{name}-{sts.name}-{i}", template,
                          f"{sts.source}: spec.volumeClaimTemplates[{t}]")
            for i in range(replicas) for t, (name, template) in templates]


def leaderworkerset_pods(lws: ManifestObject, replicas: int, size: int,
                         incarnations: Sequence[str]) -> list[dict[str, Any]]:
    """The pods LWS creates: per replica ``i`` the leader ``<lws>-<i>`` (leader template, else the
    worker template) and workers ``<lws>-<i>-<j>``, labelled and annotated as LWS does, each with
    the incarnation label ``incarnations[i]`` (phalanx's pod webhook gives it)."""
    _drafted(replicas * size, "spec.replicas")
    worker = _template(lws, "leaderWorkerTemplate", "workerTemplate")
    lwt = _template(lws, "leaderWorkerTemplate")
    leader = _template(lws, "leaderWorkerTemplate", "leaderTemplate") if lwt.get("leaderTemplate") else worker
    pods = []
    for i in range(replicas):
        leader_name = f"{lws.name}-{i}"
        for j in range(size):
            owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": leader_name if j else lws.name,
                     "uid": f"{lws.raw['metadata']['uid']}-{i}"}
            pod = owned_pod_json(leader if j == 0 else worker, f"{leader_name}-{j}" if j else leader_name,
                                 lws.namespace, owner)
            pod["metadata"].setdefault("labels", {}).update({
                names.LABEL_LWS_NAME: lws.name, names.LABEL_LWS_GROUP_INDEX: str(i),
                names.LABEL_LWS_WORKER_INDEX: str(j), names.LABEL_LWS_INCARNATION: incarnations[i]})
            annotations = pod["metadata"].setdefault("annotations", {})
            annotations[names.ANNOTATION_LWS_SIZE] = str(size)
            if j:
                annotations[names.ANNOTATION_LWS_LEADER_NAME] = leader_name
            pods.append(pod)
    return pods
