"""The few writes phalanx makes, as one interface with two backends (real API server, simulation).

Reads go through :class:`cluster.cache.ClusterCache`; writes go through a :class:`ClusterWriter`.
Code above ``cluster/`` holds one of each and cannot tell which cluster is behind them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from .karpenter import NodeClaimAsk, NodePoolRecord
from .provisioning import ProvisioningAsk


@dataclass(frozen=True)
class Expected:
    """What a guarded annotation write expects the object to hold when it lands: whether it has
    any annotation at all, and the value of each annotation the write changes (None: absent). The
    guard is on those values alone, not on the object's version, so a write of another field
    meanwhile (kube-scheduler's status condition) does not refuse it."""

    annotated: bool
    values: Mapping[str, str | None] = field(default_factory=dict)


class WriteError(RuntimeError):
    """A write the cluster refused (conflict, not found, forbidden, PDB-blocked eviction...)."""

    def __init__(self, message: str, status: int = 0, reason: str = ""):
        super().__init__(message)
        self.status, self.reason = status, reason


class ClusterWriter(Protocol):
    flavor: str  # "builtin" (scheduling.k8s.io) or "crd" (scheduling.phalanx.dev)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Create the pods/binding. Raises WriteError."""

    def evict(self, namespace: str, name: str, uid: str, message: str, respect_pdb: bool) -> None:
        """Evict (policy/v1, honouring PDBs) or delete the pod, marking it DisruptionTarget."""

    def patch_podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any],
                              resource_version: str = "") -> str:
        """Merge-patch the PodGroup's status subresource; with ``resource_version``, only if the
        PodGroup is still at that version (else WriteError 409, nothing written). Returns the
        version the write made ("" when the cluster did not say)."""

    def annotate_podgroup(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                          resource_version: str = "", expect: Expected | None = None) -> str:
        """Patch PodGroup annotations (None removes one), conditional on ``resource_version`` as
        :meth:`patch_podgroup_status`, or with ``expect`` only if the annotations still read as
        expected (else WriteError 409, nothing written); returns the version it made."""

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge-patch pod annotations (None removes one)."""

    def event(self, regarding: Mapping[str, str], reason: str, note: str, type_: str = "Normal") -> None:
        """Record an events.k8s.io/v1 Event about ``regarding`` (kind, namespace, name, uid)."""

    def create_provisioning_request(self, ask: ProvisioningAsk) -> None:
        """Create the PodTemplates and then the ProvisioningRequest of ``ask``; one that exists
        already (an earlier attempt, a restart) is kept as it is. Raises WriteError."""

    def delete_provisioning_request(self, namespace: str, name: str, templates: tuple[str, ...]) -> None:
        """Delete the ProvisioningRequest and its PodTemplates; ones already gone are no error."""

    def create_nodeclaim(self, ask: NodeClaimAsk, pool: NodePoolRecord) -> None:
        """Create the NodeClaim of ``ask`` from ``pool``'s template; one that exists already is kept."""

    def delete_nodeclaim(self, name: str) -> None:
        """Delete a NodeClaim (Karpenter drains and removes its node); one already gone is no error."""

    def release_nodeclaim(self, name: str, node: str) -> None:
        """Remove ``karpenter.sh/do-not-disrupt`` from the NodeClaim and from its node (when named)."""
