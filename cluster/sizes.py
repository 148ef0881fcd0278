"""How many entries every long-lived collection of a component holds, found by walking it.

One walker for every component (the workload cycle and everything it owns, the cluster cache, the
controller), so a map added later is measured without anyone remembering to list it: from a root
object, every attribute that is a dict, set, list or deque is counted (``path -> len``), and every
attribute that is an object of phalanx's own packages is walked in turn (each object once, under the
shortest path that reaches it), and so is every object of a short list (up to ``SHORT`` items:
listeners, threads), a bound method's object included — so what subscribed to the cycle (the
dashboard's history) is measured with it. A dict whose values are collections (e.g. node -> set of
pod uids) also reports the total of its values' lengths under ``path[*]``, so a map whose inner sets
grow is seen too. A collection with a limit of its own (a deque's ``maxlen``, or an entry of its
(or the object's) ``SIZE_CAPS``: attribute -> most entries it keeps) is named ``path<=limit``. Used by
``phalanx bench soak`` and by the ``phalanx_internal_entries`` gauge.
"""

from __future__ import annotations

from collections import deque
from typing import Any

PACKAGES = ("cycle", "cluster", "controller", "extender", "rpc", "solver")
COUNTED = (dict, set, list, deque)
SHORT = 64  # lists up to this long have their elements walked (listeners); longer ones are data


def _ours(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.split(".", 1)[0] in PACKAGES and hasattr(value, "__dict__") and not isinstance(value, type)


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(obj).items())  # a C-level copy: safe while other threads add attributes
    except TypeError:
        return []


def collection_sizes(root: Any, prefix: str) -> dict[str, int]:
    """``{"prefix.attr.attr": len}`` for every collection reachable from ``root`` through objects
    of phalanx's packages (breadth first; see the module docstring)."""
    out: dict[str, int] = {}
    seen = {id(root)}
    todo: deque[tuple[str, Any]] = deque([(prefix, root)])
    while todo:
        path, obj = todo.popleft()
        caps = getattr(obj, "SIZE_CAPS", {})  # the class's, or the object's own limits
        for name, value in _attributes(obj):
            where = f"{path}.{name.lstrip('_')}"
            cap = caps.get(name, getattr(value, "maxlen", None))
            if cap is not None and isinstance(value, COUNTED):
                where = f"{where}<={cap}"
            if isinstance(value, COUNTED):
                out[where] = len(value)
                if isinstance(value, dict):
                    inner = [len(v) for v in list(value.values()) if isinstance(v, COUNTED)]
                    if inner:
                        out[f"{where}[*]"] = sum(inner)
                elif len(value) <= SHORT:  # a short list (listeners, threads): its objects are walked too
                    for item in list(value):
                        owner = getattr(item, "__self__", item)  # a listener's bound method: its object
                        if _ours(owner) and id(owner) not in seen:
                            seen.add(id(owner))
                            todo.append((f"{where}[{type(owner).__name__}]", owner))
            elif _ours(value) and id(value) not in seen:
                seen.add(id(value))
                todo.append((where, value))
    return out
