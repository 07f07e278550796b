"""bench/RESULTS.md is cited by section title from code, docs and tests, e.g.
`bench/RESULTS.md, "What the plan predicts"`: every title so cited must still be (the start
of) a heading of bench/RESULTS.md, so that rewriting the record cannot leave a citation
dangling. (That every bench/results/ path it names exists is tests/test_bench_records.py's.)"""

import re

import pytest

from tests.conftest import ROOT

RESULTS = ROOT / "bench" / "RESULTS.md"
SUFFIXES = {".py", ".c", ".h", ".md", ".toml", ".sh"}
SKIP = {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__"}
# RESULTS.md, then a comma or spaces, then a double-quoted title (which may run over a line
# break inside a comment or docstring); not a string literal "...RESULTS.md", nor a format field
CITE = re.compile(r'RESULTS\.md(?:,[ \t]*|[ \t]+)"([A-Za-z0-9\'][^"]{2,300})"')
LINE_BREAK = re.compile(r"\s*\n\s*(?:\*|#+|//)?\s*")


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", LINE_BREAK.sub(" ", s)).strip()


def sources():
    for p in sorted(ROOT.rglob("*")):
        rel = p.relative_to(ROOT)
        if p.suffix in SUFFIXES and p.is_file() and not SKIP & set(rel.parts) and p != RESULTS:
            yield p


def cited():
    for p in sources():
        text = p.read_text(errors="replace")
        for m in CITE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield f"{p.relative_to(ROOT)}:{line}", _norm(m.group(1))


def headings():
    return [_norm(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*\S)\s*$", RESULTS.read_text(), re.M)]


CITED = sorted(set(cited()))


def test_the_sources_cite_sections():
    assert len(CITED) >= 10, CITED


@pytest.mark.parametrize("where,title", CITED, ids=[f"{w}:{t[:40]}" for w, t in CITED])
def test_every_cited_title_is_a_heading(where, title):
    heads = headings()
    assert any(h == title or h.startswith(title) for h in heads), \
        f'{where} cites bench/RESULTS.md "{title}", which is no heading of it'


def test_the_readme_performance_table_names_sections():
    """README's Performance table names the RESULTS.md section of each row in its last column."""
    readme = (ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("|") and line.rstrip().endswith("|")]
    named = [t for line in rows for t in re.findall(r'"([^"]+)"\s*\|\s*$', line)]
    assert named, "README's Performance table names no RESULTS.md section"
    heads = headings()
    for title in named:
        assert any(h.startswith(_norm(title)) for h in heads), title


def test_headings_are_unique():
    heads = headings()
    assert sorted(h for h in set(heads) if heads.count(h) > 1) == []
