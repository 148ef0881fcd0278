"""phalanx e2e harness: a real Kubernetes control plane on loopback, built from the Go modules.

Public surface (the conftest wires these into pytest fixtures):
- ``ControlPlane`` (etcd + kube-apiserver + kube-controller-manager; ``start_scheduler``),
  ``Scheduler`` handle, ``scheduler_config``, ``phalanx_scheduler_config`` (extender or plugin
  mode), ``locate`` / ``MissingBinaries`` for the pinned binaries;
- ``ControlPlane.rest``: the project's REST client (``cluster.kube.Kube``) with the admin's client
  certificate;
- nodes played by KWOK (``kwok.py``, started by ``ControlPlane.start``): ``node``, ``create_node``,
  ``delete_node``, ``set_not_ready``, ``deletions_held``, ``finish_pod``;
- object builders: ``workload``, ``podgroup_template``, ``podgroup``, ``pod``, ``statefulset``, ``job``,
  ``priority_class``, ``create``, ``path``;
- bounded waits: ``wait_for``, ``wait_all_bound``, ``assert_none_bound``, ``podgroup_conditions``,
  ``wait_gone``.
"""

from .binaries import Binaries, MissingBinaries, locate, read_versions
from .controlplane import (
    MODE_BINARY,
    PHALANX_MODES,
    ControlPlane,
    Scheduler,
    phalanx_scheduler_config,
    release_workdir,
    scheduler_config,
)
from .kwok import finish_pod
from .nodes import GPU, RACK, ZONE, create_node, delete_node, deletions_held, node, set_not_ready
from .objects import (
                      SCHEDULING_API,
                      STATEFULSET_SCHEDULING_ANNOTATION,
                      create,
                      job,
                      path,
                      path_of,
                      pod,
                      podgroup,
                      podgroup_template,
                      priority_class,
                      statefulset,
                      workload,
)
from .waits import assert_none_bound, bound, placement, podgroup_conditions, pods, wait_all_bound, wait_for, wait_gone

__all__ = [
    "Binaries", "MissingBinaries", "locate", "read_versions", "ControlPlane", "Scheduler",
    "scheduler_config", "phalanx_scheduler_config", "PHALANX_MODES", "MODE_BINARY",
    "release_workdir",
    "GPU", "RACK", "ZONE", "create_node", "delete_node", "deletions_held", "finish_pod", "node", "set_not_ready",
    "SCHEDULING_API", "STATEFULSET_SCHEDULING_ANNOTATION", "create", "job", "path", "path_of", "pod",
    "podgroup", "podgroup_template", "priority_class", "statefulset", "workload",
    "assert_none_bound", "bound", "placement", "podgroup_conditions", "pods", "wait_all_bound", "wait_for", "wait_gone",
]
