"""The controller reads API objects only through cluster.kinds' typed records (parse once, at the border).

The rule, checked on every module of ``controller/`` with ``ast``: a *raw access* is

- a subscript whose key is a string literal (``x["metadata"]``, read, written or deleted), or
- a call ``.get(...)``, ``.pop(...)`` or ``.setdefault(...)`` whose first argument is a string literal
  (``x.get("spec")``);

and no module has one, except the reads ``ALLOWED`` lists: the KEP-6277 scheduling block (the user's
``spec.scheduling`` value, whose field-by-field validation *is* the admission rules of
``controller.config`` and ``controller.lws_config``, so it is read there, not in ``cluster/``) and
one HTTP header. Anything else a controller module wants from an object is a field of a record in
``cluster.kinds``; the JSON it writes comes from that module's writers or from dict literals.

Not covered: a key held in a variable (``x[key]``) or reached through ``operator.itemgetter``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CONTROLLER = Path(__file__).resolve().parents[2] / "controller"

SCHEDULING_BLOCK = frozenset({
    "schedulingPolicy", "schedulingConstraints", "disruptionMode", "resourceClaims", "gang", "basic", "minCount",
    "topology", "key", "name", "replica",
})
ALLOWED = {
    "config.py": SCHEDULING_BLOCK,
    "lws_config.py": SCHEDULING_BLOCK,
    "webhook.py": frozenset({"Content-Length"}),  # an HTTP request header, not an API object
}
DICT_METHODS = ("get", "pop", "setdefault")


def raw_accesses(source: str) -> list[tuple[int, str]]:
    """(line, key) of every raw access in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DICT_METHODS
              and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if isinstance(key, str):
            found.append((node.lineno, key))
    return sorted(found)


def violations(module: str, source: str) -> list[str]:
    allowed = ALLOWED.get(module, frozenset())
    return [f"{module}:{line}: [{key!r}]" for line, key in raw_accesses(source) if key not in allowed]


def test_the_controller_reads_no_raw_api_object():
    modules = sorted(CONTROLLER.glob("*.py"))
    assert modules, CONTROLLER
    found = [v for path in modules for v in violations(path.name, path.read_text())]
    assert not found, "raw dict access outside cluster/ (read it through cluster.kinds):\n" + "\n".join(found)


PLANTED = '''
def sync(sts, pod, body):
    name = sts["metadata"]["name"]
    spec = sts.get("spec") or {}
    labels = pod.get("metadata", {}).pop("labels", None)
    body["metadata"] = {}
    del body["status"]
    fields.setdefault("schedulingPolicy", {})
    return pod["spec"]["containers"][0], items[0], table[name]
'''


def test_the_rule_finds_every_planted_access():
    assert raw_accesses(PLANTED) == [
        (3, "metadata"), (3, "name"), (4, "spec"), (5, "labels"), (5, "metadata"), (6, "metadata"), (7, "status"),
        (8, "schedulingPolicy"), (9, "containers"), (9, "spec")]


@pytest.mark.parametrize("module", ["objects.py", "reconciler.py", "config.py"])
def test_a_planted_access_fails_in_any_module(module):
    assert violations(module, "def f(sts):\n    return sts['spec']['replicas']\n") == [
        f"{module}:2: ['replicas']", f"{module}:2: ['spec']"]


def test_only_the_scheduling_block_is_read_raw_and_only_where_it_is_validated():
    source = "def f(raw):\n    return raw.get('schedulingPolicy')\n"
    assert violations("config.py", source) == []
    assert violations("lws_config.py", source) == []
    assert violations("reconciler.py", source) == ["reconciler.py:2: ['schedulingPolicy']"]


CYCLE = CONTROLLER.parent / "cycle"
#: the cycle's own notifications to its listeners (a kind and a dict it made itself), not API objects
CYCLE_ALLOWED = {"holds.py": frozenset({"group"}), "plugin_mode.py": frozenset({"arrived"})}


def test_the_workload_cycle_reads_no_raw_api_object():
    # the entry points read a request's pod once (cluster.convert.read_pod) and the cache hands
    # typed records and events: nothing in cycle/ indexes an API object
    found = []
    for path in sorted(CYCLE.glob("*.py")):
        allowed = CYCLE_ALLOWED.get(path.name, frozenset())
        found += [f"{path.name}:{line}: [{key!r}]" for line, key in raw_accesses(path.read_text()) if key not in allowed]
    assert found == []
