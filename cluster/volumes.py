"""The claims a pod mounts, resolved against the cluster's PVCs, PVs and StorageClasses.

The records come from :mod:`cluster.convert` (parsed once, when the watch event arrives); this
module only combines them into the solver's :class:`~solver.VolumeClaim` and
:class:`~solver.VolumeInventory`, the way kube-scheduler's VolumeBinding, VolumeRestrictions and
NodeVolumeLimits plugins see them. Nothing here decides where a pod goes.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from solver import PersistentVolume, VolumeClaim, VolumeInventory

from . import names
from .convert import ClaimInfo, ClaimRef, ClassInfo, VolumeInfo


def resolve_claim(ref: ClaimRef, pod_uid: str, claims: Mapping[str, ClaimInfo],
                  volumes: Mapping[str, VolumeInfo], classes: Mapping[str, ClassInfo]) -> VolumeClaim:
    """One claim of a pod:

    - missing (kube-scheduler: not found, or being deleted, or an ephemeral volume's claim that
      another owner created, or bound to a PV that does not exist): fits nowhere;
    - bound (``volumeName`` set): the PV's node affinity and CSI driver;
    - unbound: its class decides — WaitForFirstConsumer (``delayed``), dynamic provisioning
      within the class's allowed topologies, the provisioner as CSI driver; an unknown class or
      none at all binds immediately (the PV controller's job: fits nowhere until it did)."""
    claim = claims.get(ref.name)
    if claim is None or claim.terminating or (ref.ephemeral and claim.owner_uid != pod_uid):
        return VolumeClaim(ref.name, missing=True)
    if claim.volume_name:
        pv = volumes.get(claim.volume_name)
        if pv is None:
            return VolumeClaim(ref.name, missing=True)
        return VolumeClaim(ref.name, bound=True, node_affinity=pv.volume.node_affinity,
                           storage_class=claim.storage_class, request=claim.request,
                           access_modes=claim.access_modes, csi_driver=pv.volume.csi_driver)
    cls = classes.get(claim.storage_class) if claim.storage_class else None
    if cls is None:
        return VolumeClaim(ref.name, storage_class=claim.storage_class, request=claim.request,
                           access_modes=claim.access_modes)
    return VolumeClaim(ref.name, storage_class=claim.storage_class, request=claim.request,
                       access_modes=claim.access_modes, delayed=cls.delayed, dynamic=cls.dynamic,
                       allowed_topologies=cls.allowed_topologies,
                       csi_driver=cls.provisioner if cls.dynamic else "")


def resolve_claims(refs: Iterable[ClaimRef], pod_uid: str, claims: Mapping[str, ClaimInfo],
                   volumes: Mapping[str, VolumeInfo], classes: Mapping[str, ClassInfo]) -> tuple[VolumeClaim, ...]:
    """Every claim of a pod (``refs`` from :func:`cluster.convert.pod_claims`), resolved."""
    return tuple(resolve_claim(ref, pod_uid, claims, volumes, classes) for ref in refs)


def available_volumes(volumes: Iterable[VolumeInfo], claims: Mapping[str, ClaimInfo]) -> tuple[PersistentVolume, ...]:
    """Static PVs a WaitForFirstConsumer claim could still get: phase Available, and either no
    claimRef or one to a claim that exists and is not bound yet (pre-bound). Sorted by name."""
    def usable(info: VolumeInfo) -> bool:
        if info.phase != names.PV_PHASE_AVAILABLE:
            return False
        ref = info.volume.claim_ref
        return not ref or (ref in claims and not claims[ref].volume_name)

    return tuple(sorted((v.volume for v in volumes if usable(v)), key=lambda pv: pv.name))


def volume_inventory(volumes: Iterable[VolumeInfo], claims: Mapping[str, ClaimInfo],
                     attach_limits: Mapping[str, Mapping[str, int]]) -> VolumeInventory:
    """The snapshot's volume facts: available static PVs and per node the CSI attach limits."""
    return VolumeInventory(available_volumes(volumes, claims),
                           {node: dict(limits) for node, limits in attach_limits.items() if limits})


def default_class(classes: Mapping[str, ClassInfo]) -> str:
    """The class the DefaultStorageClass admission plugin gives a claim that names none: the newest
    class marked default (by name among equals), "" when none is."""
    marked = sorted((c for c in classes.values() if c.default), key=lambda c: c.name)
    return max(marked, key=lambda c: c.created).name if marked else ""
