"""The HTTP stack every phalanx endpoint is served on: Flask applications on cheroot.

``phalanx serve`` (the extender) and ``phalanx controller`` (the admission webhooks, health and
metrics) speak HTTP through this one package, so TLS, client certificates, the thread pool, the
body limit, the 400-not-500 answer to a bad body, request logging and request metrics are written
once. It knows nothing of Kubernetes or of the services above it.
"""

from .app import (
    BadBody,
    BodyTooLarge,
    Gate,
    RequestMetrics,
    add_health_routes,
    bearer_token,
    json_endpoint,
    json_reply,
    new_app,
    read_json,
    require_token,
    text,
)
from .server import Listener, split_addr, wsgi_server

__all__ = [
    "BadBody", "BodyTooLarge", "Gate", "RequestMetrics", "add_health_routes", "bearer_token", "json_endpoint",
    "json_reply", "new_app", "read_json", "require_token", "text", "Listener", "split_addr", "wsgi_server",
]
