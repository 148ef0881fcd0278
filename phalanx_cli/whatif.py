"""``phalanx whatif -f FILE``: where the PodGroups of a manifest would go if it were applied now.

A gRPC client of a running ``phalanx serve`` (the ``WhatIf`` call; addresses, token and TLS as for
``phalanx explain``). The files are YAML or JSON, several documents each (``-``: stdin); ``kind:
List`` documents are unpacked. serve compiles the objects as phalanx's controller would and plans
them together on the live cluster, reserving and writing nothing.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Sequence, TextIO

import grpc
import yaml
from google.protobuf import json_format

from cluster.whatif import MAX_MANIFEST_BYTES, manifest_objects, manifest_too_large
from proto.phalanx.v1 import workload_cycle_pb2 as pb
from proto.phalanx.v1 import workload_cycle_pb2_grpc as pb_grpc

from .explain import CALL_TIMEOUT, Credentials

OUTPUTS = ("table", "json", "yaml")
#: ``--exit-code``: every group fits now, whole | a group fits only by preempting | a group does not
#: fit, or members of one would wait (1 stays an error: no answer)
EXIT_FITS, EXIT_PREEMPTS, EXIT_SHORT = 0, 3, 4


def exit_code(reply: pb.WhatIfReply) -> int:
    """The ``--exit-code`` of an answer (the worst group's)."""
    if any(g.verdict == "does-not-fit" or g.waiting for g in reply.groups):
        return EXIT_SHORT
    if any(g.verdict == "fits-after-preemption" for g in reply.groups):
        return EXIT_PREEMPTS
    return EXIT_FITS


class ManifestError(ValueError):
    """A file that cannot be read as Kubernetes objects."""


def read_objects(paths: Sequence[str], stdin: TextIO = sys.stdin) -> list[Any]:
    """Every document of ``paths`` (``-`` is stdin), ``kind: List`` items unpacked, empty ones left out."""
    objects: list[Any] = []
    for path in paths:
        try:
            with (contextlib.nullcontext(stdin) if path == "-" else open(path, encoding="utf-8")) as f:
                objects += manifest_objects(f.read())
        except OSError as err:
            raise ManifestError(f"{path}: {err.strerror or err}") from None
        except yaml.YAMLError as err:
            raise ManifestError(f"{path}: not YAML: {err}") from None
    if not objects:
        raise ManifestError(f"no object in {', '.join(paths)}")
    return objects


def _how(group: pb.WhatIfGroup) -> str:
    if not group.path:
        return ""
    return group.path + (", optimal" if group.optimal else (f", gap {group.gap:.1%}" if group.HasField("gap") else ""))


def render_table(reply: pb.WhatIfReply) -> str:
    """One row per PodGroup (kubectl's upper-case headers), then its nodes, victims and why."""
    header = ("PODGROUP", "SOURCE", "VERDICT", "DOMAIN", "PODS", "SOLVER")
    rows = [header] + [(f"{g.namespace}/{g.name}", g.source, g.verdict, g.domain or "-", str(g.members), _how(g) or "-")
                       for g in reply.groups]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for g in reply.groups:
        lines.append(f"\n{g.namespace}/{g.name} ({g.source}): {g.verdict}"
                     + (f" in {g.topology_key}={g.domain}" if g.topology_key and g.domain else ""))
        if g.composite:
            lines.append(f"  answered with compositepodgroup {g.composite}, as one unit")
        if g.running:
            added = g.members - g.running
            lines.append(f"  {g.running} running stay where they are; "
                         + (f"{added} to place beside them" if added else "nothing new to place"))
        width = max((len(p) for p in g.nodes), default=0)
        lines += [f"  {pod:<{width}}  {node}" for pod, node in sorted(g.nodes.items())]
        if g.waiting:
            lines.append(f"  would wait ({len(g.waiting)} of {g.members} pods; minCount {g.min_count} placed): "
                         + ", ".join(g.waiting[:10]) + (f", +{len(g.waiting) - 10}" if len(g.waiting) > 10 else ""))
            lines.append(f"    why: {g.waiting_why}")
        if g.victims:
            lines.append(f"  would evict {len(g.victims)} pods (PDB violations: {g.pdb_violations}):")
            lines += [f"    {v.pod} (priority {v.priority}, {v.unit})" for v in g.victims]
        if g.explanation:
            lines.append(f"  why: {g.explanation}")
        if g.advice:
            lines.append(f"  advice: {g.advice}")
    return "\n".join(lines)


def render(reply: pb.WhatIfReply, output: str) -> str:
    if output == "table":
        return render_table(reply)
    data = json_format.MessageToDict(reply, always_print_fields_with_no_presence=True)
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=True)
    return yaml.safe_dump(data, sort_keys=True).rstrip()


def whatif(paths: Sequence[str], addr: str, out: TextIO, credentials: Credentials = Credentials(),
           output: str = "table", namespace: str = "", with_exit_code: bool = False) -> int:
    try:
        objects = read_objects(paths)
    except ManifestError as err:
        print(f"phalanx whatif: {err}", file=sys.stderr)
        return 1
    request = pb.WhatIfRequest(objects_json=[json.dumps(o) for o in objects], namespace=namespace)
    size = sum(len(text) for text in request.objects_json)
    if size > MAX_MANIFEST_BYTES:
        print(f"phalanx whatif: {manifest_too_large(size).removeprefix('phalanx: ')}", file=sys.stderr)
        return 1
    with credentials.channel(addr, max_message=2 * MAX_MANIFEST_BYTES) as channel:
        try:
            reply = pb_grpc.WorkloadCycleStub(channel).WhatIf(request, timeout=CALL_TIMEOUT * 3,
                                                               metadata=credentials.metadata())
        except grpc.RpcError as err:
            if err.code() is grpc.StatusCode.INVALID_ARGUMENT:
                print(f"phalanx whatif: the manifest would be refused:\n{err.details()}", file=sys.stderr)
            else:
                print(f"phalanx whatif: {err.code().name.lower()}: {err.details()} (server {addr})", file=sys.stderr)
            return 1
    print(render(reply, output), file=out)
    return exit_code(reply) if with_exit_code else 0
