"""The HTTP extender kube-scheduler calls (filter, prioritize, bind, preempt) and its health,
readiness and metrics endpoints."""

from .app import create_app

__all__ = ["create_app"]
