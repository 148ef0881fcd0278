"""``kubectl phalanx``: the kubectl plugin (the executable ``kubectl-phalanx``).

It reads the user's kubeconfig, finds phalanx serve's pod, and reaches serve's HTTP JSON API (the
dashboard's ``/api/v1/...`` and what-if's ``/phalanx/api/whatif``) through a ``pods/portforward``
stream of the API server, sending the user's own bearer token: no port of the cluster is opened.

Why a port-forward and not the API server's service proxy: the API server's authentication filter
deletes the ``Authorization`` header of every request it has authenticated
(``k8s.io/apiserver/pkg/endpoints/filters/authentication.go``, ``req.Header.Del("Authorization")``),
so a call through ``/api/v1/namespaces/NS/services/NAME:PORT/proxy/`` reaches serve without the
user's token, and serve answers 401; and serve's HTTP port listens on the pod's loopback in the
shipped installs, where only a port-forward (the kubelet dials inside the pod's network namespace)
reaches it.

- :mod:`.kubeconfig` — the kubeconfig, its context, namespace and bearer token;
- :mod:`.transport` — the port-forward and HTTP/1.1 over it (one place, replaceable in tests);
- :mod:`.output` — kubectl's output conventions (tables with upper-case headers, ``-o json|yaml|wide``);
- :mod:`.main` — the commands (``top``, ``plans``, ``explain``, ``whatif``) and their flags.
"""
