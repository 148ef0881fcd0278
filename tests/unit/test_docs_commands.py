"""The manual shows only what exists: every ``phalanx`` command, its flags and every ``make`` target
written in a code span or block of README.md and docs/*.md, and every relative link.

A command is checked against the help the command itself prints (``phalanx SUB --help``, from the
same parser ``phalanx`` runs), so a flag renamed in the code and not in the docs fails here. Links
are checked against the files and, for ``page.md#anchor``, against the headings GitHub turns into
anchors.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import re
import shlex
import unicodedata
from dataclasses import dataclass
from functools import cache

import pytest

from phalanx_cli.kubectl import main as kubectl_plugin
from phalanx_cli.main import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# links into the manual too: the e2e README and the dated records of earlier benchmark runs
LINKING_PAGES = [*PAGES, ROOT / "tests" / "e2e" / "README.md",
                 *sorted((ROOT / "bench" / "results" / "history").glob("*.md"))]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
# a command starts a line, a code span, or follows a shell separator; `.venv/bin/phalanx` counts too
COMMAND = re.compile(r"(?:^|&&|;|\|\||\$\()\s*(?:\S*/bin/)?(phalanx|make)\s+([^;&|)]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_/]*$")  # SUITE, NAMESPACE/NAME, FILE


@dataclass(frozen=True)
class Shown:
    page: str
    program: str  # "phalanx" or "make"
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}: `{self.program} {' '.join(self.words)}`"


def code_of(text: str) -> list[str]:
    """Every line of a fenced block (comments dropped, ``\\`` continuations joined) and every code span."""
    lines = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n", " ", block)
        lines += [line.split(" #")[0] for line in joined.splitlines() if not line.lstrip().startswith("#")]
    outside = FENCE.sub("", text)
    lines += [span.replace("\\|", "|") for span in INLINE.findall(outside)]
    return lines


def commands_in(text: str, page: str) -> list[Shown]:
    shown = []
    for line in code_of(text):
        for match in COMMAND.finditer(line):
            try:
                words = shlex.split(match.group(2))
            except ValueError:
                words = match.group(2).split()
            if words:
                shown.append(Shown(page, match.group(1), tuple(words)))
    return shown


def help_of(words: list[str]) -> str | None:
    """What ``phalanx WORDS --help`` prints, or None when argparse refuses the words."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args([*words, "--help"])
        except SystemExit as done:
            return out.getvalue() if done.code == 0 else None
    return None


@cache
def subcommand_help(sub: str) -> str | None:
    return help_of([sub])


@cache
def make_targets() -> frozenset[str]:
    makefile = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9_-]+)\s*:(?!=)", makefile, re.M))


def flags_of(words: tuple[str, ...]) -> list[str]:
    """The long flags a shown command uses (``--a/--b`` is two, ``--x=1`` is ``--x``)."""
    found = []
    for word in words:
        for part in word.strip("[](),.").split("/"):
            if part.startswith("--"):
                found.append(part.split("=")[0].rstrip(".,:"))
    return found


def problems_of(shown: Shown) -> list[str]:
    if shown.program == "make":
        targets = [w for w in shown.words if not w.startswith("-") and "=" not in w and not PLACEHOLDER.match(w)]
        return [f"{shown}: no make target {t!r}" for t in targets if t not in make_targets()]
    sub, *rest = shown.words
    if sub.startswith("-") or PLACEHOLDER.match(sub):
        return []  # `phalanx --help`, `phalanx SUBCOMMAND`
    text = subcommand_help(sub)
    if text is None:
        return [f"{shown}: no subcommand {sub!r}"]
    problems = [f"{shown}: {sub} has no flag {flag}" for flag in flags_of(tuple(rest))
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
    choices = re.search(r"^ {2}\{([^}]+)\}", text, re.M)  # a positional with choices (bench's suite)
    positional = next((w for w in rest if not w.startswith(("-", "[")) and "|" not in w), None)
    if choices and positional and not PLACEHOLDER.match(positional) and positional not in choices.group(1).split(","):
        problems.append(f"{shown}: {sub} has no {positional!r} (one of {choices.group(1)})")
    return problems


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    kept = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN" or c == "_")
    return kept.replace(" ", "-")


@cache
def anchors_of(path: pathlib.Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", path.read_text()), re.M):
        base = github_anchor(heading)
        count = seen.get(base, 0)
        anchors.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return frozenset(anchors)


def broken_links(page: pathlib.Path, text: str) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        if not path.exists():
            broken.append(f"{page.name}: {target}: no file {file_part}")
        elif anchor and path.suffix == ".md" and anchor not in anchors_of(path):
            broken.append(f"{page.name}: {target}: no heading #{anchor} in {path.name}")
    return broken


def all_shown() -> list[Shown]:
    return [s for page in PAGES for s in commands_in(page.read_text(), str(page.relative_to(ROOT)))]


def test_the_manual_shows_commands():
    shown = all_shown()
    assert {s.words[0] for s in shown if s.program == "phalanx"} >= {"serve", "controller", "explain", "demo", "bench"}
    assert {"test", "e2e", "demo"} <= {s.words[0] for s in shown if s.program == "make"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_shown_command_and_flag_exists(page: pathlib.Path):
    problems = [p for s in commands_in(page.read_text(), page.name) for p in problems_of(s)]
    assert problems == []


@pytest.mark.parametrize("page", LINKING_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: pathlib.Path):
    assert broken_links(page, page.read_text()) == []


def cli_sections(text: str, program: str = "phalanx") -> dict[str, str]:
    """docs/cli.md's sections by subcommand: the body under each ``## phalanx SUB`` heading (up to
    the next ``## `` heading, whatever it names)."""
    parts = re.split(r"^## (.+)\n", text, flags=re.M)
    return {heading.removeprefix(f"{program} "): body for heading, body in zip(parts[1::2], parts[2::2], strict=True)
            if heading.startswith(f"{program} ")}


def flags_in_help(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)) - {"--help"}


def test_the_cli_page_documents_every_subcommand_and_flag_and_no_other():
    """Each ``## phalanx SUB`` section of docs/cli.md names exactly the flags ``phalanx SUB --help`` has."""
    sections = cli_sections((ROOT / "docs" / "cli.md").read_text())
    listed = re.search(r"\{([^}]+)\}", help_of([]) or "")
    assert listed, "phalanx --help lists no subcommands"
    subcommands = set(listed.group(1).split(","))
    assert set(sections) == subcommands
    for sub, body in sections.items():
        shown = {flag for line in code_of(body) for flag in flags_of(tuple(line.split()))}
        assert shown == flags_in_help(subcommand_help(sub) or ""), sub


def kubectl_plugin_flags() -> set[str]:
    """Every long flag of every ``kubectl phalanx`` command, from the plugin's own parser."""
    parser = kubectl_plugin.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {flag for sub in commands.choices.values() for action in sub._actions for flag in action.option_strings
            if flag.startswith("--")} - {"--help"}


def kubectl_commands_in(text: str) -> list[tuple[str, ...]]:
    """The words after every ``kubectl phalanx`` in the code of a page."""
    shown = []
    for line in code_of(text):
        for match in re.finditer(r"kubectl phalanx\s+([^;&|)`]*)", line):
            try:
                shown.append(tuple(shlex.split(match.group(1))))
            except ValueError:
                shown.append(tuple(match.group(1).split()))
    return shown


def test_the_kubectl_plugin_sections_document_every_flag_and_no_other():
    """docs/cli.md's ``## kubectl phalanx`` and docs/kubectl-plugin.md's flag table name exactly the
    plugin's flags; every ``kubectl phalanx`` command shown anywhere uses a command and flags it has."""
    flags = kubectl_plugin_flags()
    cli = cli_sections((ROOT / "docs" / "cli.md").read_text(), "kubectl")
    page = (ROOT / "docs" / "kubectl-plugin.md").read_text()
    for body in (cli["phalanx"], page.split("## Flags", 1)[1].split("\n## ", 1)[0]):
        assert {flag for line in code_of(body) for flag in flags_of(tuple(line.split()))} == flags
    commands = {"top", "plans", "explain", "whatif"}
    for page_path in PAGES:
        for words in kubectl_commands_in(page_path.read_text()):
            if words and words[0] != "..." and not PLACEHOLDER.match(words[0]):
                assert set(words[0].split("|")) <= commands, (page_path.name, words)
            assert set(flags_of(words)) <= flags, (page_path.name, words)


def test_a_planted_kubectl_plugin_flag_is_caught():
    (words,) = kubectl_commands_in("Run `kubectl phalanx top -A --watch` to see it.")
    assert words[0] == "top" and set(flags_of(words)) - kubectl_plugin_flags() == {"--watch"}


def test_a_cli_section_with_a_flag_the_command_lacks_is_caught():
    sections = cli_sections("## phalanx demo\n\n| `--port` | `--headless` | `--duration` | `--solver-only` | `--colour` |\n")
    shown = {flag for line in code_of(sections["demo"]) for flag in flags_of(tuple(line.split()))}
    assert shown - flags_in_help(subcommand_help("demo") or "") == {"--colour"}


PLANTED = """
Run `phalanx serve --kubeconfig in-cluster --no-such-flag 3` and then

```
phalanx bench solver --quick --json out.json
phalanx bench nonsense
.venv/bin/phalanx frobnicate --x
make test && make no-such-target   # a comment naming phalanx explain --bogus is ignored
```

`phalanx serve --tls-cert/--tls-kee` and `make demo DEMO_ARGS="--headless"`.
"""


def test_a_planted_bad_flag_target_or_subcommand_is_caught():
    problems = [p for s in commands_in(PLANTED, "planted.md") for p in problems_of(s)]
    assert len(problems) == 5, problems
    for needle in ("no flag --no-such-flag", "no 'nonsense'", "no subcommand 'frobnicate'",
                   "no make target 'no-such-target'", "no flag --tls-kee"):
        assert any(needle in p for p in problems), (needle, problems)


def test_good_commands_pass():
    good = "`phalanx explain ns/db --grpc-addr 127.0.0.1:50051`, `phalanx bench SUITE [--quick] [--seeds N]`"
    shown = commands_in(good, "good.md")
    assert len(shown) == 2
    assert [p for s in shown for p in problems_of(s)] == []


def test_a_broken_link_or_anchor_is_caught(tmp_path: pathlib.Path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The cycle's lock — `x`\n")
    page = tmp_path / "page.md"
    text = ("[ok](other.md) [ok](other.md#the-cycles-lock--x) [web](https://example.com) [self](#top)\n"
            "# Top\n[gone](missing.md) [bad anchor](other.md#nowhere)\n")
    page.write_text(text)
    assert sorted(broken_links(page, text)) == [
        "page.md: missing.md: no file missing.md",
        "page.md: other.md#nowhere: no heading #nowhere in other.md",
    ]


def test_the_docs_list_every_bench_suite_and_what_make_bench_runs():
    """docs/cli.md's suite table names every ``phalanx bench`` suite and no other; docs/benchmarks.md
    names exactly the suites ``make bench`` runs (the Makefile's BENCH_QUICK)."""
    import re

    from bench import SUITES

    cli = (ROOT / "docs" / "cli.md").read_text()
    table = cli.split("| suite | what it measures", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `([a-z-]+)` \|", table, re.M)) == set(SUITES)
    quick = re.search(r"^BENCH_QUICK\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    said = (ROOT / "docs" / "benchmarks.md").read_text().split("`make bench` runs", 1)[1].split(";", 1)[0]
    assert re.findall(r"`([a-z-]+)`", said) == quick
