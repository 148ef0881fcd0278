"""The HTTP extender kube-scheduler calls (filter, prioritize, bind, preempt) and its health,
readiness and metrics endpoints; the separate health listener for probes."""

from .app import create_app
from .health import health_app

__all__ = ["create_app", "health_app"]
