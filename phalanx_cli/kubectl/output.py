"""kubectl's output conventions: a table with upper-case headers, columns two spaces apart, ``<none>``
for an empty cell and "No resources found" when there is nothing (``kubectl get``); ``-o wide``
adds columns; ``-o json`` and ``-o yaml`` print the document serve answered."""

from __future__ import annotations

import json
from typing import Any, Sequence

import yaml

FORMATS = ("table", "wide", "json", "yaml")
NONE = "<none>"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h).upper() for h in headers]] + [[NONE if c in ("", None) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def document(value: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(value, indent=4, sort_keys=False)
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip("\n")


def age(seconds: float | None) -> str:
    """kubectl's short duration: 45s, 3m12s, 5h4m, 2d3h."""
    if seconds is None:
        return ""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s < 36000 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def no_resources(namespace: str | None) -> str:
    return "No resources found" + (f" in {namespace} namespace." if namespace else ".")
