"""The health listener of ``phalanx serve`` (``--health-addr``): ``/healthz`` and ``/readyz`` only.

The extender listens on the pod's loopback, because its bind verb creates ``pods/binding`` with
phalanx's credentials; the kubelet probes from the node, i.e. the pod IP, and Pod Security
"baseline" forbids a probe ``host``. So the probes get a listener of their own that serves nothing
but these two answers, while the extender (bind, the dashboard, metrics) stays on loopback.

- ``/healthz``: 200 while the extender's HTTP server is serving, else 503 (a wedged or stopped
  extender fails liveness, not just a dead process).
- ``/readyz``: the same answer as the extender's ``/readyz`` (caches synced).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

Check = Callable[[], tuple[bool, str]]


def health_app(live: Check, ready: Check) -> Callable[..., Iterable[bytes]]:
    """A WSGI application answering GET /healthz from ``live`` and GET /readyz from ``ready``."""
    routes = {"/healthz": live, "/readyz": ready}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        check = routes.get(environ.get("PATH_INFO", ""))
        if check is None or environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, text = "404 Not Found", "not found: this listener serves /healthz and /readyz only"
        else:
            ok, text = check()
            status = "200 OK" if ok else "503 Service Unavailable"
        body = f"{text}\n".encode()
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    return app
