"""A tiny raw-JSON REST client for the e2e API server: urllib + the admin client certificate.

No Kubernetes client library on purpose: tests speak the wire format (plain dicts), which is also
what phalanx's ``cluster/`` adapter speaks.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        self.method, self.path, self.status, self.body = method, path, status, body
        try:
            self.status_obj = json.loads(body)
        except ValueError:
            self.status_obj = {}
        reason = self.status_obj.get("message") or body[:500]
        super().__init__(f"{method} {path}: HTTP {status}: {reason}")

    @property
    def reason(self) -> str:
        return self.status_obj.get("reason", "")


class Rest:
    """GET/POST/PUT/PATCH/DELETE JSON against one API server.

    Paths are API paths (``/api/v1/namespaces/x/pods``); ``params`` become the query string.
    """

    def __init__(self, server: str, ca_cert: Path, client_cert: Path, client_key: Path,
                 timeout: float = 30.0):
        self.server = server.rstrip("/")
        self.timeout = timeout
        ctx = ssl.create_default_context(cafile=str(ca_cert))
        ctx.load_cert_chain(str(client_cert), str(client_key))
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))

    def request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", raw: bool = False) -> Any:
        url = self.server + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as err:
            raise ApiError(method, path, err.code, err.read().decode(errors="replace")) from None
        if raw:
            return payload.decode(errors="replace")
        return json.loads(payload) if payload else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def get_or_none(self, path: str, **params: Any) -> Any:
        try:
            return self.get(path, **params)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def list(self, path: str, **params: Any) -> list[dict]:
        return self.get(path, **params).get("items") or []

    def post(self, path: str, body: Any, **params: Any) -> Any:
        return self.request("POST", path, body, params=params)

    def put(self, path: str, body: Any, **params: Any) -> Any:
        return self.request("PUT", path, body, params=params)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH, **params: Any) -> Any:
        return self.request("PATCH", path, body, params=params, content_type=content_type)

    def delete(self, path: str, body: Any = None, missing_ok: bool = True, **params: Any) -> Any:
        try:
            return self.request("DELETE", path, body, params=params)
        except ApiError as err:
            if missing_ok and err.status == 404:
                return None
            raise
