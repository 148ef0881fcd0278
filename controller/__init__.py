"""The StatefulSet controller (KEP-6277) and its admission webhooks.

Public surface: ``run`` (the ``phalanx controller`` process); ``Controller`` (watches, queue,
workers, leader election) with its ``Reconciler``; ``PodMutator`` and ``review_statefulset``
(admission); ``WebhookServer``; the pure core: ``raw_scheduling``, ``resolve``,
``validate_statefulset``, ``compile_workload``, ``compile_podgroup``, ``pod_patch``, ``BUILTIN``/``CRD``.
"""

from .admission import PodMutator, review_statefulset
from .config import SchedulingConfig, raw_scheduling, resolve, validate_statefulset
from .objects import BUILTIN, CRD, Flavor, compile_podgroup, compile_workload, pod_patch
from .reconciler import Reconciler, Resolution
from .runtime import Controller, discover_flavor
from .service import run
from .webhook import WebhookServer

__all__ = [
    "PodMutator", "review_statefulset", "SchedulingConfig", "raw_scheduling", "resolve", "validate_statefulset",
    "BUILTIN", "CRD", "Flavor", "compile_podgroup", "compile_workload", "pod_patch", "Reconciler", "Resolution",
    "Controller", "discover_flavor", "run", "WebhookServer",
]
