"""The README's benchmark summary quotes only what the manual's tables say: every bullet of
"Benchmarks, in short" links the section of docs/benchmarks.md it comes from, and every number it
quotes (ranges by their ends) is a number of that section, as written or rounded to the places the
README gives it (23.6 s quoted as 24 s)."""

from __future__ import annotations

import pathlib
import re
from decimal import ROUND_HALF_UP, Decimal

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NUMBER = r"\d[\d,]*(?:\.\d+)?"


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(markdown: str) -> dict[str, str]:
    """Each heading's anchor -> its text, down to the next heading of its level or above."""
    lines = markdown.splitlines()
    heads = [(i, len(m.group(1)), slug(m.group(2))) for i, line in enumerate(lines)
             if (m := re.match(r"(#+) (.*)", line))]
    out = {}
    for k, (start, level, anchor) in enumerate(heads):
        end = next((i for i, lvl, _ in heads[k + 1:] if lvl <= level), len(lines))
        out[anchor] = "\n".join(lines[start:end])
    return out


def bullets() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    summary = readme[readme.index("## Benchmarks, in short"):readme.index("## The manual")]
    return [b for b in re.split(r"\n(?=- \*\*)", summary) if b.startswith("- **")]


def quoted(bullet: str) -> set[str]:
    """The numbers a bullet quotes (the ends of a range apart), links left out; single digits
    (counts of things in prose) are not checked."""
    prose = re.sub(r"\]\([^)]*\)", "]", bullet)
    out = set()
    for m in re.finditer(rf"({NUMBER})(?:\s*[–-]\s*({NUMBER}))?", prose):
        for n in m.groups():
            if n and len(re.sub(r"[,.]", "", n.rstrip(","))) >= 2:
                out.add(n.rstrip(",").replace(",", ""))
    return out


def matches(number: str, written: set[str]) -> bool:
    places = Decimal(1).scaleb(-len(number.partition(".")[2]))
    want = Decimal(number)
    return any(Decimal(w).quantize(places, ROUND_HALF_UP) == want for w in written)


BULLETS = bullets()


def test_the_summary_has_its_bullets():
    assert len(BULLETS) >= 10, BULLETS


@pytest.mark.parametrize("bullet", BULLETS, ids=[re.match(r"- \*\*([^*]+)", b).group(1) for b in BULLETS])
def test_each_number_the_readme_quotes_is_in_the_section_it_links(bullet):
    anchors = re.findall(r"\(docs/benchmarks\.md#([^)]+)\)", bullet)
    assert anchors, "the bullet links no section of docs/benchmarks.md"
    manual = sections((ROOT / "docs" / "benchmarks.md").read_text())
    missing = [a for a in anchors if a not in manual]
    assert not missing, f"no such section in docs/benchmarks.md: {missing}"
    written = {n.replace(",", "") for a in anchors for n in re.findall(NUMBER, manual[a])}
    stray = sorted(n for n in quoted(bullet) if not matches(n, written))
    assert not stray, f"numbers the README quotes that its sections ({', '.join(anchors)}) do not: {stray}"


def test_a_number_not_in_its_section_is_caught():
    """The check is not vacuous: a quoted number the section lacks fails it."""
    assert matches("24", {"23.6"}) and matches("1.2", {"1.20"}) and not matches("9.3", {"2.45", "93"})
    assert quoted("- **X**: 1.58–1.75× in-tree, 3 racks ([x](docs/benchmarks.md#x-1-2))") == {"1.58", "1.75"}
