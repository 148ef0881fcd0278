"""``kubectl phalanx COMMAND``: ``top``, ``plans``, ``explain`` and ``whatif``, read from a running
phalanx serve through the API server (see :mod:`phalanx_cli.kubectl`).

Each command is a function of its arguments and a :class:`~.transport.Transport` to serve, so the
commands are tested against serve's real HTTP API in memory, and the port-forward on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TextIO

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..composite_text import composite_line
from . import output
from .kubeconfig import KubeconfigError, KubeContext, load
from .transport import (
    DEFAULT_NAMESPACE,
    DEFAULT_PORT,
    DEFAULT_SELECTOR,
    DEFAULT_TIMEOUT,
    PortForwardTransport,
    Reply,
    ServeLocation,
    ServeUnreachable,
    Transport,
    find_pod,
)

PROG = "kubectl phalanx"
WHATIF_PATH = "/phalanx/api/whatif"  # serve's what-if endpoint: {"objects": [...]} -> {"groups": [...]}
POD_KINDS = ("pod", "pods", "po")
GROUP_KINDS = ("podgroup", "podgroups", "pg")


class CommandError(Exception):
    """What the user is told on standard error, exit status 1."""


@dataclass
class Call:
    """One command's arguments, its namespace, serve, and the API server (for ``explain pod/X``)."""

    args: argparse.Namespace
    namespace: str | None  # None: every namespace (-A)
    serve: Transport
    api: client.ApiClient | None
    out: TextIO

    def get(self, path: str, what: str) -> Any:
        return self.answer(self.serve.request("GET", path), what)

    def answer(self, reply: Reply, what: str) -> Any:
        if reply.status == 200:
            return reply.json()
        raise CommandError(refusal(reply, what))

    def show(self, value: Any, render: Callable[[Any, bool], str]) -> None:
        fmt = self.args.output
        print(output.document(value, fmt) if fmt in ("json", "yaml") else render(value, fmt == "wide"), file=self.out)


def refusal(reply: Reply, what: str) -> str:
    """serve's non-200 answer, said for a kubectl user."""
    said = reply.text()
    try:
        said = str(json.loads(said).get("error", said))
    except (ValueError, AttributeError):
        pass
    hint = {401: " (serve wants a bearer token the API server accepts: your kubeconfig user has none? "
                 "give --token-file)",
            403: " (bind your user to the ClusterRole phalanx-viewer)"}.get(reply.status, "")
    return f"{what}: HTTP {reply.status}: {said}{hint}"


# -- top -----------------------------------------------------------------------------------------
STATE_ORDER = ("binding", "planned", "preempting", "unschedulable", "pending", "waiting for members", "scheduled",
               "finished")


def _in_namespace(rows: list[dict], namespace: str | None) -> list[dict]:
    return [r for r in rows if namespace is None or r.get("namespace") == namespace]


def _state_rank(state: str) -> int:
    return STATE_ORDER.index(state) if state in STATE_ORDER else len(STATE_ORDER)


def top(call: Call) -> None:
    doc = call.get("/api/v1/podgroups", "podgroups")
    rows = sorted(_in_namespace(doc.get("podgroups") or [], call.namespace),
                  key=lambda r: (_state_rank(str(r.get("state", ""))), str(r.get("domain") or ""),
                                 str(r.get("namespace")), str(r.get("name"))))
    states: dict[str, int] = {}
    for r in rows:
        states[str(r.get("state"))] = states.get(str(r.get("state")), 0) + 1
    call.show({"podgroups": rows, "states": states}, lambda value, wide: render_top(value, wide, call.namespace))


def render_top(doc: dict, wide: bool, namespace: str | None) -> str:
    rows = doc["podgroups"]
    if not rows:
        return output.no_resources(namespace)
    headers = ["namespace"] * (namespace is None) + ["name", "state", "domain", "bound", "min count", "age"]
    if wide:
        headers += ["owner", "policy", "topology key", "priority", "held domain"]
    table = []
    for r in rows:
        owner = r.get("owner") or {}
        row = [r.get("namespace")] * (namespace is None) + [
            r.get("name"), r.get("state"), r.get("domain"), f"{r.get('bound', 0)}/{r.get('members', 0)}",
            r.get("min_count"), output.age(r.get("age_s"))]
        if wide:
            row += [f"{owner.get('kind')}/{owner.get('name')}" if owner.get("kind") else "", r.get("policy"),
                    r.get("topology_key"), r.get("priority"), r.get("held_domain")]
        table.append(row)
    return output.table(headers, table)


# -- plans ---------------------------------------------------------------------------------------
def plans(call: Call) -> None:
    query = f"?namespace={call.namespace}" if call.namespace else ""
    doc = call.get(f"/api/v1/plans{query}", "plans")
    rows = _in_namespace(doc.get("plans") or [], call.namespace)
    call.show({"plans": rows}, lambda value, wide: render_plans(value, wide, call.namespace))


def _solver(plan: dict) -> str:
    path = str(plan.get("path") or "")
    if plan.get("optimal"):
        return f"{path}, optimal"
    gap = plan.get("gap")
    return f"{path}, gap {gap:.1%}" if isinstance(gap, (int, float)) else path


def render_plans(doc: dict, wide: bool, namespace: str | None) -> str:
    rows = doc["plans"]
    if not rows:
        return output.no_resources(namespace)
    headers = ["namespace"] * (namespace is None) + ["name", "state", "domain", "pods", "nodes", "solver",
                                                      "at barrier", "expires"]
    if wide:
        headers.append("node list")
    table = []
    for p in rows:
        row = [p.get("namespace")] * (namespace is None) + [
            p.get("name"), p.get("state"), p.get("domain"), p.get("pods"), len(p.get("nodes") or ()), _solver(p),
            p.get("members_at_barrier"), output.age(p.get("expires_in_s")) if p.get("state") != "bound" else ""]
        if wide:
            row.append(",".join(p.get("nodes") or ()))
        table.append(row)
    return output.table(headers, table)


# -- explain -------------------------------------------------------------------------------------
def _target(words: Sequence[str]) -> tuple[str, str]:
    """``pod/NAME``, ``pod NAME``, ``podgroup/NAME``, ``NAME`` -> (kind, name); kind "" for a bare name."""
    if len(words) == 2:
        kind, name = words
    elif len(words) == 1 and "/" in words[0]:
        kind, name = words[0].split("/", 1)
    elif len(words) == 1:
        kind, name = "", words[0]
    else:
        raise CommandError("explain takes one target: POD, PODGROUP, pod/NAME or podgroup/NAME")
    kind = kind.lower()
    if kind and kind not in POD_KINDS + GROUP_KINDS:
        raise CommandError(f"explain: {kind!r} is neither a pod nor a podgroup")
    if not name or "/" in name:
        raise CommandError(f"explain: {'/'.join(words)!r} names no object (the namespace comes from -n)")
    return ("pod" if kind in POD_KINDS else "podgroup" if kind else ""), name


def group_of_pod(api: client.ApiClient | None, namespace: str, pod: str) -> str:
    """The PodGroup pod ``namespace/pod`` belongs to, read from the API server (with phalanx's own
    reading of a pod; imported here, since it brings the solver's libraries, seconds of start-up
    that every other command does without)."""
    from cluster.convert import InvalidInput, pod_group_name

    if api is None:
        raise CommandError("explain pod/NAME needs the API server")
    try:
        raw = client.CoreV1Api(api).read_namespaced_pod(pod, namespace, _preload_content=False)
        obj = json.loads(raw.data)
    except ApiException as err:
        raise CommandError(f"pod {namespace}/{pod}: HTTP {err.status}: {err.reason}") from None
    try:
        group = pod_group_name(obj)
    except InvalidInput as err:
        raise CommandError(str(err)) from None
    if not group:
        raise CommandError(f"pod {namespace}/{pod} belongs to no PodGroup: phalanx places it as a single pod")
    return group


def explain(call: Call) -> None:
    namespace = call.namespace or "default"
    kind, name = _target(call.args.target)
    group = group_of_pod(call.api, namespace, name) if kind == "pod" else name
    reply = call.serve.request("GET", f"/api/v1/podgroups/{namespace}/{group}")
    if reply.status == 404 and not kind:  # a bare name that is no PodGroup: a pod's, perhaps
        group = group_of_pod(call.api, namespace, name)
        reply = call.serve.request("GET", f"/api/v1/podgroups/{namespace}/{group}")
    view = call.answer(reply, f"podgroup {namespace}/{group}")
    call.show(view, render_explain)


def render_explain(view: dict, wide: bool = False) -> str:
    """What ``phalanx explain`` prints, from the dashboard's page of the group."""
    count = f" (minCount {view['min_count']})" if view.get("min_count") else ""
    lines = [f"podgroup {view.get('namespace')}/{view.get('name')}: {view.get('state')}",
             f"  members: {view.get('members', 0)} exist, {view.get('bound', 0)} bound{count}"]
    owner = view.get("owner") or {}
    if owner.get("kind"):
        level = f" ({owner['level']})" if owner.get("level") else ""
        lines.append(f"  owner: {owner['kind']} {view.get('namespace')}/{owner.get('name')}{level}")
    composite = view.get("composite") or {}
    if composite.get("key"):
        lines.append("  composite: " + composite_line(composite["key"], composite.get("groups") or [],
                                                      f"{view.get('namespace')}/{view.get('name')}",
                                                      composite.get("how", ""), composite.get("why", "")))
    if view.get("explanation"):
        lines.append(f"  why: {view['explanation']}")
    placement = view.get("placement")
    if placement:
        where = f" in domain {placement['domain']}" if placement.get("domain") else ""
        state = view.get("plan_state") or "last plan"
        nodes = len(placement.get("nodes") or ())
        lines.append(f"  plan: {state}, {placement.get('pods', 0)} pods on {nodes} node{'s' * (nodes != 1)}{where} "
                     f"({_solver(placement)})")
    pods = view.get("pods") or []
    if pods:
        lines.append("  pods:")
        width = max(len(str(p.get("name"))) for p in pods)
        lines += [f"    {str(p.get('name')):<{width}}  {p.get('node') or '-'}  {p.get('phase') or ''}".rstrip()
                  for p in pods]
    if wide and view.get("conditions"):
        lines += ["  conditions:"] + [f"    {c.get('type')}={c.get('status')} {c.get('reason', '')}: "
                                       f"{c.get('message', '')}" for c in view.get("conditions") or []]
    return "\n".join(lines)


# -- whatif --------------------------------------------------------------------------------------
def read_manifests(files: Sequence[str], namespace: str, stdin: TextIO) -> list[dict]:
    """Every object of every file (``-``: standard input; multi-document YAML or JSON, ``List``
    items unwrapped), each given ``namespace`` when it names none (as ``kubectl apply -n`` does)."""
    objects: list[dict] = []
    for name in files:
        try:
            text = stdin.read() if name == "-" else open(name, encoding="utf-8").read()
            docs = list(yaml.safe_load_all(text))
        except OSError as err:
            raise CommandError(f"whatif: cannot read {name}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise CommandError(f"whatif: {name} is not YAML: {err}") from None
        for doc in docs:
            items = doc.get("items") if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") else [doc]
            for obj in items or ():
                if obj is None:
                    continue
                if not isinstance(obj, dict) or not obj.get("kind"):
                    raise CommandError(f"whatif: {name}: every document must be a Kubernetes object with a kind")
                meta = obj.setdefault("metadata", {})
                if isinstance(meta, dict) and not meta.get("namespace"):
                    meta["namespace"] = namespace
                objects.append(obj)
    if not objects:
        raise CommandError("whatif: no objects in " + ", ".join(files))
    return objects


def whatif(call: Call) -> None:
    objects = read_manifests(call.args.filename, call.namespace or "default", sys.stdin)
    reply = call.serve.request("POST", WHATIF_PATH, json.dumps({"objects": objects}).encode())
    if reply.status in (404, 405, 501):  # 501: a serve with the endpoint, started without what-if
        said = refusal(reply, "") if reply.status == 501 else ""
        raise CommandError(f"whatif: this phalanx serve does not offer what-if (POST {WHATIF_PATH} answered "
                           f"HTTP {reply.status}{said.removeprefix(': HTTP 501')}): it needs a serve with "
                           "the what-if endpoint")
    call.show(call.answer(reply, "whatif"), render_whatif)


def _group_name(group: dict) -> str:
    name = str(group.get("name") or group.get("group") or "")
    namespace = group.get("namespace")
    return f"{namespace}/{name}" if namespace and "/" not in name else name


def render_whatif(doc: dict, wide: bool) -> str:
    """Each group's name, verdict, domain, nodes and message (or explanation), with ``-o wide`` the
    number of victims; fields it does not know are left to ``-o json|yaml``."""
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not groups:
        return "No groups."
    table = []
    for g in groups:
        nodes = g.get("nodes") or []
        if isinstance(nodes, dict):  # pod -> node
            nodes = sorted(set(nodes.values()))
        shown = ",".join(map(str, nodes)) if wide or len(nodes) <= 3 else f"{len(nodes)} nodes"
        message = g.get("message") or g.get("explanation")
        waiting = g.get("waiting")
        if isinstance(waiting, list) and waiting:  # minCount placed, these left out
            message = f"{len(waiting)} would wait: {g.get('waitingWhy', '')}" + (f"; {message}" if message else "")
        row = [_group_name(g), g.get("verdict"), g.get("domain"), shown, message]
        if wide:
            victims = g.get("victims")
            row.insert(4, len(victims) if isinstance(victims, list) else "")
        table.append(row)
    headers = ["podgroup", "verdict", "domain", "nodes", "message"]
    return output.table(headers[:4] + ["victims"] * wide + headers[4:], table)


COMMANDS: dict[str, Callable[[Call], None]] = {"top": top, "plans": plans, "explain": explain, "whatif": whatif}


# -- arguments -----------------------------------------------------------------------------------
def _connection_flags(parser: argparse.ArgumentParser, all_namespaces: bool) -> None:
    parser.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context (default: the current context)")
    parser.add_argument("-n", "--namespace", help="the namespace (default: the context's, else default)")
    if all_namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    parser.add_argument("-o", "--output", choices=("json", "yaml", "wide"), default="table",
                        help="json, yaml, or wide (more columns); default: a table")
    parser.add_argument("--token-file", help="send serve this bearer token (- : standard input) instead of the "
                                             "kubeconfig user's, e.g. when that user authenticates by certificate")
    parser.add_argument("--phalanx-namespace", default=DEFAULT_NAMESPACE,
                        help=f"the namespace of phalanx serve's pod (default {DEFAULT_NAMESPACE})")
    parser.add_argument("--phalanx-selector", default=DEFAULT_SELECTOR,
                        help=f"the label selector of phalanx serve's pod (default {DEFAULT_SELECTOR})")
    parser.add_argument("--phalanx-pod", default="", help="phalanx serve's pod by name (instead of the selector)")
    parser.add_argument("--phalanx-port", type=int, default=DEFAULT_PORT,
                        help=f"serve's HTTP port inside the pod (default {DEFAULT_PORT})")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds to wait for serve's answer (default {DEFAULT_TIMEOUT:g})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="phalanx's gangs, plans, explanations and what-if, "
                                     "from phalanx serve through the API server (a port-forward)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("top", help="gangs by state and domain")
    _connection_flags(p, all_namespaces=True)
    p = sub.add_parser("plans", help="the plans phalanx holds (reservations), pod by pod with -o wide")
    _connection_flags(p, all_namespaces=True)
    p = sub.add_parser("explain", help="a PodGroup's (or a pod's group's) state, explanation and plan")
    p.add_argument("target", nargs="+", metavar="TARGET", help="PODGROUP, pod/NAME, podgroup/NAME or pod NAME")
    _connection_flags(p, all_namespaces=False)
    p = sub.add_parser("whatif", help="where these manifests' gangs would go, planned against the live cluster")
    p.add_argument("-f", "--filename", action="append", required=True,
                   help="a manifest file (YAML or JSON, several documents; - : standard input), repeatable")
    _connection_flags(p, all_namespaces=False)
    return parser


def _token(args: argparse.Namespace, context: KubeContext) -> str | None:
    if not args.token_file:
        return context.token
    try:
        token = (sys.stdin.read() if args.token_file == "-" else open(args.token_file, encoding="utf-8").read()).strip()
    except OSError as err:
        raise CommandError(f"--token-file {args.token_file}: {err.strerror}") from None
    if not token:
        raise CommandError(f"--token-file {args.token_file}: no token in it")
    return token


def connect(args: argparse.Namespace) -> tuple[KubeContext, Transport]:
    context = load(args.kubeconfig, args.context)
    token = _token(args, context)
    where = ServeLocation(args.phalanx_namespace, args.phalanx_selector, args.phalanx_pod, args.phalanx_port)
    pod = find_pod(context.api, where)
    return context, PortForwardTransport(context.api, where.namespace, pod, where.port, token, args.request_timeout)


def run(args: argparse.Namespace, context: KubeContext, serve: Transport, out: TextIO) -> None:
    namespace = None if getattr(args, "all_namespaces", False) else (args.namespace or context.namespace)
    COMMANDS[args.command](Call(args, namespace, serve, context.api, out))


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    if args.token_file == "-" and args.command == "whatif" and "-" in args.filename:
        print(f"{PROG}: --token-file - and -f - cannot both read standard input", file=sys.stderr)
        return 2
    try:
        context, serve = connect(args)
        run(args, context, serve, out)
    except (CommandError, KubeconfigError, ServeUnreachable) as err:
        print(f"{PROG} {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
