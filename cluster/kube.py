"""phalanx's one client to a real API server: raw JSON over the official client's transport.

The official ``kubernetes`` package supplies configuration (kubeconfig or in-cluster), auth and
the HTTP pool; objects are never deserialized into its models (that is ~60x slower and ~25x
bigger than plain dicts at 100k pods). Every caller — the watch cache, the workload-cycle service,
the controller — goes through :class:`Kube`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterator, NamedTuple

import kubernetes
import orjson

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeError(RuntimeError):
    """A non-2xx answer from the API server, with its status code and Status reason."""

    def __init__(self, method: str, path: str, status: int, body: str):
        self.method, self.path, self.status = method, path, status
        try:
            self.status_obj = json.loads(body) if body else {}
        except ValueError:
            self.status_obj = {}
        message = self.status_obj.get("message") or (body or "")[:300]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")

    @property
    def reason(self) -> str:
        return str(self.status_obj.get("reason", ""))


def loads(data: bytes | str) -> Any:
    """JSON from the API server: orjson (2.3× the standard library's speed on a watched pod, the
    watch's and the cache's hottest decode), and the standard library for what orjson refuses
    (NaN, a lone surrogate), so no valid document is refused. An integer past 64 bits becomes a
    float, as the API server itself stores it (sigs.k8s.io/json, PreserveInts: int64, else float64)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def api_path(group_version: str, resource: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
    """``v1`` + ``pods`` -> ``/api/v1/pods``; ``scheduling.k8s.io/v1beta1`` -> ``/apis/...``."""
    root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    parts = [root]
    if namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(resource)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _query(params: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in (params or {}).items() if v is not None]


#: how often a request checks whether the kubeconfig's token (exec plugin, in-cluster token file)
#: needs reloading; the official client checks before every request, which costs more CPU than
#: the request itself (it copies the whole configuration back, host and proxies included)
TOKEN_CHECK_SECONDS = 1.0

#: client-go's rule for a throttled or failing API server (k8s.io/client-go/rest, v0.37:
#: ``Request.maxRetries`` defaults to 10 in ``NewRequest``; ``withRetry.IsNextRetry`` retries while
#: ``checkWait`` finds a 429 or 5xx answer carrying an integer ``Retry-After`` header, and
#: ``withRetry.Before`` sleeps that many seconds first). An answer without the header is not
#: retried here: the caller decides (a PDB-blocked eviction is a 429 without one).
MAX_RETRIES = 10
#: the most one request waits in all for Retry-After (s). client-go bounds the waits by the
#: request's context instead; phalanx's writes have none, and ten waits a throttled API server
#: names in whole seconds (up to its own choosing) could hold a placement record, and the gang's
#: barrier with it, far past the barrier timeout. A wait that would pass it is not waited: the
#: error goes to the caller (the dispatcher retries on its own backoff).
MAX_RETRY_WAIT_SECONDS = 30.0


def retry_after(status: int, headers: Mapping[str, str] | None) -> int | None:
    """Seconds the API server asked to wait before trying again, or None when it did not ask
    (client-go's ``checkWait``: only 429 and 5xx answers, only an integer ``Retry-After``)."""
    if status != 429 and status < 500:
        return None
    value = (headers or {}).get("Retry-After")
    try:
        return max(0, int(str(value).strip())) if value is not None else None
    except ValueError:
        return None


def _throttle_token_check(config: Any, every: float) -> None:
    """Run ``config``'s token check at most once per ``every`` seconds (the first request runs it).
    The client's loader installs its hook anew each time it runs, so the throttle puts itself back."""
    state: dict[str, Any] = {"hook": config.refresh_api_key_hook, "last": float("-inf")}

    def throttled(configuration: Any) -> None:
        now = time.monotonic()
        if now - state["last"] < every:
            return
        state["last"] = now
        state["hook"](configuration)
        if configuration.refresh_api_key_hook is not throttled:
            state["hook"] = configuration.refresh_api_key_hook
            configuration.refresh_api_key_hook = throttled

    config.refresh_api_key_hook = throttled


class _Failed(NamedTuple):
    error: KubeError
    headers: Mapping[str, str] | None


class Kube:
    def __init__(self, kubeconfig: str | None = None, context: str | None = None, timeout: float = 30.0,
                 qps_pool: int = 32):
        config = kubernetes.client.Configuration()
        try:
            if kubeconfig:
                kubernetes.config.load_kube_config(config_file=kubeconfig, context=context,
                                                   client_configuration=config)
            else:
                try:
                    kubernetes.config.load_incluster_config(client_configuration=config)
                except kubernetes.config.ConfigException:
                    kubernetes.config.load_kube_config(context=context, client_configuration=config)
        except kubernetes.config.ConfigException as err:  # a missing or broken kubeconfig: one line, no traceback
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "no in-cluster configuration and no kubeconfig"
            raise ValueError(f"{where}: {err}") from None
        config.connection_pool_maxsize = qps_pool
        if getattr(config, "refresh_api_key_hook", None) is not None:
            _throttle_token_check(config, TOKEN_CHECK_SECONDS)
        self.config = config
        self.api = kubernetes.client.ApiClient(config)
        self.timeout = timeout
        self.max_retries = MAX_RETRIES
        self.max_retry_wait = MAX_RETRY_WAIT_SECONDS
        self.sleep: Callable[[float], None] = time.sleep  # the Retry-After wait (tests inject one)
        self.throttled = 0  # answers retried after their Retry-After (429 or 5xx)

    # -- plain requests ----------------------------------------------------------------------
    def _send(self, method: str, path: str, body: Any, query: list[tuple[str, Any]], content_type: str,
              timeout: Any) -> kubernetes.client.rest.RESTResponse:
        """One request through the official client's pool and auth; the raw response, unread. A 429
        or 5xx answer carrying ``Retry-After`` is retried after that many seconds, up to
        ``max_retries`` times, as client-go does (see :data:`MAX_RETRIES`), and while the waits add
        up to at most ``max_retry_wait`` seconds (:data:`MAX_RETRY_WAIT_SECONDS`)."""
        attempt, waited = 0, 0.0
        while True:
            status, resp, err = self._send_once(method, path, body, query, content_type, timeout)
            if resp is not None:
                return resp
            assert err is not None
            wait = retry_after(status, err.headers)
            if wait is None or attempt >= self.max_retries or waited + wait > self.max_retry_wait:
                raise err.error
            attempt += 1
            waited += wait
            self.throttled += 1
            self.sleep(wait)

    def _send_once(self, method: str, path: str, body: Any, query: list[tuple[str, Any]], content_type: str,
                   timeout: Any) -> tuple[int, kubernetes.client.rest.RESTResponse | None, _Failed | None]:
        """One attempt: (status, the 2xx response, None) or (status, None, the failure)."""
        _, url, headers, payload, _ = self.api.param_serialize(
            method=method, resource_path=path, query_params=query,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body, auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(method, url, header_params=headers, body=payload, _request_timeout=timeout)
        except kubernetes.client.ApiException as err:
            status = err.status or 0
            return status, None, _Failed(KubeError(method, path, status, err.body or str(err)), err.headers)
        except Exception as err:  # noqa: BLE001 - transport errors (refused, TLS, timeout)
            return 0, None, _Failed(KubeError(method, path, 0, f"transport error: {err}"), None)
        if not 200 <= resp.status < 300:
            error = KubeError(method, path, resp.status, resp.read().decode(errors="replace"))
            return resp.status, None, _Failed(error, resp.headers)
        return resp.status, resp, None

    def request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
                content_type: str = "application/json", timeout: float | None = None) -> Any:
        data = self._send(method, path, body, _query(params), content_type, timeout or self.timeout).read()
        return loads(data) if data else None

    def text(self, path: str, **params: Any) -> str:
        """GET of an endpoint that answers plain text (``/readyz``, ``/metrics``)."""
        data: bytes = self._send("GET", path, None, _query(params), "application/json", self.timeout).read()
        return data.decode(errors="replace")

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def get_or_none(self, path: str, **params: Any) -> Any:
        try:
            return self.get(path, **params)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def create(self, path: str, body: Mapping[str, Any], **params: Any) -> Any:
        return self.request("POST", path, body, params=params)

    def replace(self, path: str, body: Mapping[str, Any], **params: Any) -> Any:
        return self.request("PUT", path, body, params=params)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH, **params: Any) -> Any:
        return self.request("PATCH", path, body, params=params, content_type=content_type)

    def delete(self, path: str, body: Any = None, missing_ok: bool = False, **params: Any) -> Any:
        """DELETE; with ``missing_ok`` an object already gone (404) is None instead of an error."""
        try:
            return self.request("DELETE", path, body, params=params)
        except KubeError as err:
            if missing_ok and err.status == 404:
                return None
            raise

    # -- list and watch ----------------------------------------------------------------------
    def list_items(self, path: str, **params: Any) -> list[dict[str, Any]]:
        """The items of a collection in one GET (no paging: for the small collections of tools
        and tests; the watch cache pages with :meth:`list_pages`)."""
        return self.get(path, **params).get("items") or []

    def list_pages(self, path: str, limit: int = 500, **params: Any) -> tuple[list[dict[str, Any]], str]:
        """All items of a collection, paginated; returns (items, resourceVersion of the list)."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page = self.get(path, limit=limit, **({"continue": token} if token else {}), **params)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 300) -> Iterator[dict[str, Any]]:
        """Watch events (``{"type": ..., "object": {...}}``) from ``resource_version``, with
        bookmarks. Ends when the server closes the stream; raises KubeError on HTTP errors (410
        Gone arrives as an ERROR event whose object is a Status with code 410)."""
        query = [("watch", "1"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(timeout_seconds))]
        resp = self._send("GET", path, None, query, "application/json", (self.timeout, timeout_seconds + 30)).response
        buffer = b""
        try:
            for chunk in resp.stream(amt=65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield loads(line)
        finally:
            resp.release_conn()

    # -- discovery ---------------------------------------------------------------------------
    def served_resources(self, group_version: str) -> set[str] | None:
        """Resource names served under a group/version, or None when it is not served."""
        root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        doc = self.get_or_none(root)
        if doc is None:
            return None
        return {r["name"] for r in doc.get("resources") or []}
