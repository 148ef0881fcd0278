"""docs/design.md's rule tables and the code cite each other: every rule has one home that exists.

Each row of "Where each KEP-6277 and LWS-guide rule lives" names an id and the one place that
implements the rule (a file and a function or class in it, ``Class.method`` for a method). The check
goes both ways: the named definition exists (read with ``ast``, nothing imported) and cites the
row as ``(docs/design.md: <id>)`` in its docstring, its body or the comment lines just above it;
and every ``docs/design.md: <id>`` in the code names a row that exists and is implemented. Rows
whose home reads "not implemented" name no code and may not be cited.
"""

from __future__ import annotations

import ast
import pathlib
import re
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
SECTION = "## Where each KEP-6277 and LWS-guide rule lives"
CODE = ("solver", "cluster", "cycle", "extender", "rpc", "controller", "phalanx_cli", "bench")

ID = r"[A-Za-z0-9-]+/[A-Za-z0-9-]+"
CITATION = re.compile(rf"docs/design\.md: ({ID}(?:, {ID})*)")
SPAN = re.compile(r"`([^`]+)`")
NOT_IMPLEMENTED = "not implemented"


@dataclass(frozen=True)
class Row:
    id: str
    home: str  # the "implemented in" cell as written

    @property
    def implemented(self) -> bool:
        return not self.home.startswith(NOT_IMPLEMENTED)


def rule_rows(design: str) -> list[Row]:
    """The rows of the rule tables: the first cell is the id (a code span), the last the home."""
    section = design.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        rows.append(Row(cells[0].strip("`"), cells[-1]))
    return rows


def _with_comments_above(node: ast.AST, lines: list[str]) -> tuple[int, int]:
    """The node's line range (1-based, inclusive) grown upwards over its decorators and the comment
    lines directly above them."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return first, node.end_lineno or node.lineno


def find_definition(tree: ast.Module, dotted: str) -> ast.AST | None:
    """``name`` at the top of the module, or ``Class.member`` (a method or nested class)."""
    scope: list[ast.stmt] = tree.body
    found: ast.AST | None = None
    for part in dotted.split("."):
        found = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if found is None:
            return None
        scope = found.body
    return found


def cited_ids(text: str) -> set[str]:
    return {one for match in CITATION.findall(text) for one in match.split(", ")}


def home_problem(row: Row, root: pathlib.Path) -> str:
    """What is wrong with the row's home (its file, its definition, the citation there), or ""."""
    spans = SPAN.findall(row.home)
    if len(spans) != 2:
        return f"{row.id}: the home must be one `file` and one `definition`, got {row.home!r}"
    path, name = spans
    source_file = root / path
    if not path.endswith(".py") or not source_file.is_file():
        return f"{row.id}: no file {path}"
    source = source_file.read_text()
    node = find_definition(ast.parse(source), name)
    if node is None:
        return f"{row.id}: {path} defines no {name}"
    lines = source.splitlines()
    first, last = _with_comments_above(node, lines)
    if row.id not in cited_ids("\n".join(lines[first - 1:last])):
        return f"{row.id}: {path} {name} does not cite (docs/design.md: {row.id})"
    return ""


def problems(design: str, root: pathlib.Path) -> list[str]:
    """Every way the tables and the code disagree (empty when they agree)."""
    rows = rule_rows(design)
    found = []
    ids = [r.id for r in rows]
    found += [f"{i}: the id is in the tables twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    found += [f"{r.id}: not an id of the form SPEC/rule" for r in rows if not re.fullmatch(ID, r.id)]
    found += [p for p in (home_problem(r, root) for r in rows if r.implemented) if p]
    implemented = {r.id for r in rows if r.implemented}
    for package in CODE:
        for source_file in sorted((root / package).rglob("*.py")):
            for cited in sorted(cited_ids(source_file.read_text()) - implemented):
                where = source_file.relative_to(root)
                found.append(f"{where} cites {cited}, which is no implemented row of docs/design.md")
    return found


def test_the_tables_have_rows() -> None:
    rows = rule_rows(DESIGN.read_text())
    assert sum(r.id.startswith("KEP-6277/") for r in rows) >= 30
    assert sum(r.id.startswith("LWS/") for r in rows) >= 15


def test_every_rule_has_one_home_that_cites_it_and_every_citation_a_row() -> None:
    assert problems(DESIGN.read_text(), ROOT) == []


# -- the check itself fails on a planted bad row ---------------------------------------------------

def _tree(tmp_path: pathlib.Path, code: str) -> pathlib.Path:
    (tmp_path / "cycle").mkdir()
    (tmp_path / "cycle" / "binding.py").write_text(code)
    return tmp_path


GOOD_CODE = '''
class Binding:
    # the barrier (docs/design.md: KEP-6277/barrier)
    def complete(self) -> bool:
        return True


def helper() -> None:
    """Cites two rows (docs/design.md: LWS/a, LWS/b)."""
'''


def _design(*rows: str) -> str:
    return "\n".join(["# Design", "", SECTION, "", "| id | rule | section | implemented in |", "|---|---|---|---|",
                      *rows, "", "## Next", "| `NOT/a-row` | x | y | `nowhere.py` `f` |"])


GOOD_ROWS = ("| `KEP-6277/barrier` | the barrier | Story 1 | `cycle/binding.py` `Binding.complete` |",
             "| `LWS/a` | a | s | `cycle/binding.py` `helper` |",
             "| `LWS/b` | b | s | `cycle/binding.py` `helper` |",
             "| `LWS/c` | c | s | not implemented (not in LWS v0.9.0) |")


def test_a_good_table_passes(tmp_path: pathlib.Path) -> None:
    assert problems(_design(*GOOD_ROWS), _tree(tmp_path, GOOD_CODE)) == []


@pytest.mark.parametrize(("bad_row", "expected"), [
    ("| `LWS/d` | d | s | `cycle/missing.py` `helper` |", "LWS/d: no file cycle/missing.py"),
    ("| `LWS/d` | d | s | `cycle/binding.py` `Binding.absent` |", "LWS/d: cycle/binding.py defines no Binding.absent"),
    ("| `LWS/d` | d | s | `cycle/binding.py` `helper` |", "LWS/d: cycle/binding.py helper does not cite"),
    ("| `LWS/d` | d | s | `cycle/binding.py` |", "LWS/d: the home must be one `file` and one `definition`"),
    ("| `LWS/a` | again | s | `cycle/binding.py` `helper` |", "LWS/a: the id is in the tables twice"),
    ("| `no-slash` | d | s | not implemented |", "no-slash: not an id of the form SPEC/rule"),
])
def test_a_planted_bad_row_fails(tmp_path: pathlib.Path, bad_row: str, expected: str) -> None:
    found = problems(_design(*GOOD_ROWS, bad_row), _tree(tmp_path, GOOD_CODE))
    assert any(p.startswith(expected) for p in found), found


def test_a_citation_of_a_missing_or_unimplemented_row_fails(tmp_path: pathlib.Path) -> None:
    code = GOOD_CODE + "\n# stale (docs/design.md: LWS/gone)\n# too early (docs/design.md: LWS/c)\n"
    found = problems(_design(*GOOD_ROWS), _tree(tmp_path, code))
    assert found == ["cycle/binding.py cites LWS/c, which is no implemented row of docs/design.md",
                     "cycle/binding.py cites LWS/gone, which is no implemented row of docs/design.md"]


def test_a_citation_elsewhere_in_the_file_does_not_count(tmp_path: pathlib.Path) -> None:
    code = GOOD_CODE.replace("    # the barrier (docs/design.md: KEP-6277/barrier)\n", "") + \
        "\n# the barrier (docs/design.md: KEP-6277/barrier)\n"
    found = problems(_design(*GOOD_ROWS), _tree(tmp_path, code))
    assert found == ["KEP-6277/barrier: cycle/binding.py Binding.complete does not cite "
                     "(docs/design.md: KEP-6277/barrier)"]
