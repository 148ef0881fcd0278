"""The user's kubeconfig as kubectl reads it: ``--kubeconfig``, else ``KUBECONFIG`` (a list of
files joined by ``:``, merged), else ``~/.kube/config``; ``--context``, else the current context;
the context's namespace, else ``default``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

DEFAULT_KUBECONFIG = "~/.kube/config"
BEARER = "Bearer "


class KubeconfigError(Exception):
    """The kubeconfig cannot be read or names no usable context (the message says which)."""


@dataclass(frozen=True)
class KubeContext:
    api: client.ApiClient
    context: str
    namespace: str  # the context's namespace, or "default"
    token: str | None  # the user's bearer token (a token, or an exec/auth-provider plugin's); None: none


def kubeconfig_path(flag: str | None) -> str:
    """The file (or ``:``-joined files) kubectl would read."""
    return flag or os.environ.get("KUBECONFIG") or os.path.expanduser(DEFAULT_KUBECONFIG)


def load(kubeconfig: str | None = None, context: str | None = None) -> KubeContext:
    path = kubeconfig_path(kubeconfig)
    configuration = client.Configuration()
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
        if chosen is None:
            raise KubeconfigError(f"context {context!r} not found in {path}")
        config.load_kube_config(config_file=path, context=chosen["name"], client_configuration=configuration,
                                persist_config=False)
    except (ConfigException, OSError, TypeError, KeyError) as err:
        raise KubeconfigError(f"cannot use kubeconfig {path}: {err}") from None
    namespace = (chosen.get("context") or {}).get("namespace") or "default"
    # the client's auth settings refresh an exec plugin's token and name the header it goes in
    header = next((str(s.get("value") or "") for s in configuration.auth_settings().values()
                   if str(s.get("key", "")).lower() == "authorization"), "")
    token = header[len(BEARER):].strip() if header.startswith(BEARER) else None
    return KubeContext(client.ApiClient(configuration), chosen["name"], namespace, token or None)
