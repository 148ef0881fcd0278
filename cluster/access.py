"""Who is calling, and may they: Kubernetes authentication and authorization for phalanx's own ports.

The dashboard, ``/metrics`` and the gRPC read calls (``phalanx explain``) accept a bearer token and
ask the API server about it, as kube-rbac-proxy does: a TokenReview says whose token it is, then a
SubjectAccessReview asks whether that user may ``verb`` a *non-resource URL*: the HTTP request's
path, or the gRPC method's full name, under :data:`PATH_PREFIX` (``/phalanx/metrics``,
``/phalanx/phalanx.v1.WorkloadCycle/ExplainGroup``). The prefix keeps phalanx's paths apart from the
API server's own: upstream's ``system:discovery`` grants ``/api/*`` (where the dashboard's JSON
lives) and ``system:public-info-viewer`` ``/healthz`` and ``/readyz`` to every authenticated user,
and a role granting phalanx's ``/metrics`` would grant the API server's too. An RBAC ClusterRole
with ``nonResourceURLs`` grants them (phalanx ships a read-only one, ``phalanx-viewer``), and
phalanx's own ServiceAccount needs ``system:auth-delegator`` to create the reviews.

Answers are cached for :data:`CACHE_SECONDS` (a dashboard polls every few seconds): a token by its
SHA-256, a decision by (user, groups, path, verb). A review that fails (API server down or refusing
phalanx) is not cached and denies the call, saying why.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

from .kube import Kube, KubeError

PATH_PREFIX = "/phalanx"  # before every path phalanx authorizes: none of the API server's own
CACHE_SECONDS = 10.0
CACHE_ENTRIES = 4096
AUTHENTICATION_API = "authentication.k8s.io/v1"
AUTHORIZATION_API = "authorization.k8s.io/v1"

V = TypeVar("V")


@dataclass(frozen=True)
class User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Access:
    """The answer for one call: ``authenticated`` False is a 401, ``allowed`` False a 403."""

    authenticated: bool
    allowed: bool
    reason: str
    user: str = ""


class _TtlCache(Generic[V]):
    def __init__(self, ttl: float, entries: int, clock: Callable[[], float]) -> None:
        self.ttl, self.entries, self.clock = ttl, entries, clock
        self._items: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None or hit[0] <= self.clock():
                return None
            return hit[1]

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._items[key] = (self.clock() + self.ttl, value)
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)


def _token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": AUTHENTICATION_API, "kind": "TokenReview", "spec": {"token": token}}


def _user_of(review: Any) -> User | None:
    status = review.get("status") if isinstance(review, dict) else None
    if not isinstance(status, dict) or not status.get("authenticated"):
        return None
    info = status.get("user") or {}
    extra = info.get("extra") or {}
    return User(name=str(info.get("username", "")), uid=str(info.get("uid", "")),
                groups=tuple(str(g) for g in info.get("groups") or ()),
                extra=tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in extra.items())))


def _access_review(user: User, path: str, verb: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups),
                            "nonResourceAttributes": {"path": path, "verb": verb}}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in user.extra}
    return {"apiVersion": AUTHORIZATION_API, "kind": "SubjectAccessReview", "spec": spec}


def _review_answer(review: Any) -> tuple[bool, str]:
    status = review.get("status") if isinstance(review, dict) else None
    if not isinstance(status, dict):
        return False, "the SubjectAccessReview came back without a status"
    return bool(status.get("allowed")) and not status.get("denied"), str(status.get("reason", ""))


class AccessReviewer:
    """TokenReview + SubjectAccessReview against the API server ``kube`` talks to, cached briefly."""

    def __init__(self, kube: Kube, ttl: float = CACHE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self._users: _TtlCache[tuple[User | None]] = _TtlCache(ttl, CACHE_ENTRIES, clock)  # (None,): refused
        self._decisions: _TtlCache[tuple[bool, str]] = _TtlCache(ttl, CACHE_ENTRIES, clock)

    def authenticate(self, token: str) -> User | None:
        """The token's user, None when the API server does not accept it. Raises KubeError when
        the review itself fails."""
        key = hashlib.sha256(token.encode()).digest()
        known = self._users.get(key)
        if known is None:
            known = (_user_of(self.kube.create(f"/apis/{AUTHENTICATION_API}/tokenreviews", _token_review(token))),)
            self._users.put(key, known)  # a refused token is remembered as refused, as briefly
        return known[0]

    def authorize(self, user: User, path: str, verb: str) -> tuple[bool, str]:
        key = (user, path, verb)
        decision = self._decisions.get(key)
        if decision is None:
            decision = _review_answer(self.kube.create(f"/apis/{AUTHORIZATION_API}/subjectaccessreviews",
                                                       _access_review(user, path, verb)))
            self._decisions.put(key, decision)
        return decision

    def check(self, token: str | None, path: str, verb: str) -> Access:
        """May the bearer of ``token`` ``verb`` phalanx's ``path`` (the non-resource URL
        :data:`PATH_PREFIX` + ``path``)?"""
        if not token:
            return Access(False, False, "no bearer token (Authorization: Bearer <token>)")
        try:
            user = self.authenticate(token)
            if user is None:
                return Access(False, False, "the API server does not accept this token")
            allowed, why = self.authorize(user, PATH_PREFIX + path, verb)
        except KubeError as err:
            return Access(False, False, f"cannot review the token with the API server: HTTP {err.status}")
        if not allowed:
            return Access(True, False, f"user {user.name!r} may not {verb} {PATH_PREFIX + path}"
                          + (f": {why}" if why else ""),
                          user.name)
        return Access(True, True, "ok", user.name)

    def answer(self, token: str | None, path: str, verb: str) -> tuple[int, str]:
        """:meth:`check` as the HTTP status it is answered with (200; 401: who are you?; 403: not
        you) and its reason: the gate of phalanx's HTTP and gRPC servers."""
        access = self.check(token, path, verb)
        return (200 if access.allowed else 403 if access.authenticated else 401), access.reason
