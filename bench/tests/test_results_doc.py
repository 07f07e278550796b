"""bench/RESULTS.md (the current tables) and bench/LOG.md (the record in the order measured)
are cited by section title from code, docs and tests, e.g. `bench/RESULTS.md, "What the plan
predicts"` or `bench/LOG.md, "The streamed step by default"`: every title so cited must still
be (the start of) a heading of the file it names, so that rewriting either cannot leave a
citation dangling. (That every bench/results/ path they name exists is
bench/tests/test_bench_records.py's; that RESULTS.md's generated tables are current is
bench/tests/test_report.py's.)"""

import re

import pytest

from tests.conftest import ROOT

RESULTS = ROOT / "bench" / "RESULTS.md"
LOG = ROOT / "bench" / "LOG.md"
DOCS = {"RESULTS.md": RESULTS, "LOG.md": LOG}
SUFFIXES = {".py", ".c", ".h", ".md", ".toml", ".sh"}
SKIP = {"venv", "build", "dist", "node_modules", "__pycache__"}  # and every hidden folder (.git, .venv, ...)
# RESULTS.md or LOG.md, then a comma (and perhaps a line break) or spaces, then a double-quoted title (which may run over a
# line break inside a comment or docstring); not a string literal "...RESULTS.md", nor a format field
CITE = re.compile(r'\b(RESULTS\.md|LOG\.md)(?:,[ \t]*(?:\n[ \t]*(?:\*|#+|//)?[ \t]*)?|[ \t]+)"([A-Za-z0-9\'][^"]{2,300})"')
LINE_BREAK = re.compile(r"\s*\n\s*(?:\*|#+|//)?\s*")


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", LINE_BREAK.sub(" ", s)).strip()


def sources():
    """Every file that may cite a section, LOG.md excepted (its sections are the record as written)."""
    for p in sorted(ROOT.rglob("*")):
        rel = p.relative_to(ROOT)
        if (p.suffix in SUFFIXES and p.is_file() and not SKIP & set(rel.parts)
                and not any(part.startswith(".") for part in rel.parts) and p != LOG):
            yield p


def cited():
    for p in sources():
        text = p.read_text(errors="replace")
        for m in CITE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield f"{p.relative_to(ROOT)}:{line}", m.group(1), _norm(m.group(2))


def headings(doc=RESULTS):
    return [_norm(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*\S)\s*$", doc.read_text(), re.M)]


CITED = sorted(set(cited()))


def test_the_sources_cite_sections():
    assert len([c for c in CITED if c[1] == "LOG.md"]) >= 10, CITED
    assert [c for c in CITED if c[1] == "RESULTS.md"], CITED


@pytest.mark.parametrize("where,doc,title", CITED, ids=[f"{w}:{d}:{t[:40]}" for w, d, t in CITED])
def test_every_cited_title_is_a_heading(where, doc, title):
    heads = headings(DOCS[doc])
    other = "LOG.md" if doc == "RESULTS.md" else "RESULTS.md"
    hint = f" (it is one of bench/{other}: cite that)" if any(h.startswith(title) for h in headings(DOCS[other])) else ""
    assert any(h == title or h.startswith(title) for h in heads), \
        f'{where} cites bench/{doc} "{title}", which is no heading of it{hint}'


def test_the_readme_performance_table_names_sections():
    """README's Performance table names the RESULTS.md section of each row in its last column,
    and its section links RESULTS.md."""
    readme = (ROOT / "README.md").read_text()
    perf = readme[readme.index("\n## Performance"):]
    perf = perf[:perf.index("\n## ", 1)]
    assert "(bench/RESULTS.md)" in perf, "README's Performance section does not link bench/RESULTS.md"
    rows = [line for line in perf.splitlines() if line.startswith("|") and line.rstrip().endswith("|")]
    named = [t for line in rows for t in re.findall(r'"([^"]+)"\s*\|\s*$', line)]
    assert len(named) >= 5, "README's Performance table names no RESULTS.md section"
    heads = headings()
    for title in named:
        assert any(h.startswith(_norm(title)) for h in heads), title


def test_the_readme_performance_figures_are_in_the_sections_they_name():
    """Every percentage in a row of README's Performance table (each end of a range), every
    count ("54 of 67") and size ("2.9 GB") is in the RESULTS.md section the row names: a figure typed into the README and not into the report
    (whose tables are generated from the result files) fails here."""
    readme = (ROOT / "README.md").read_text()
    perf = readme[readme.index("\n## Performance"):]
    perf = perf[:perf.index("\n## ", 1)]
    sections = {part.split("\n", 1)[0]: part for part in re.split(r"(?m)^## ", RESULTS.read_text())}
    rows = [line for line in perf.splitlines() if re.search(r'"([^"]+)"\s*\|\s*$', line)]
    assert len(rows) >= 5
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        title = cells[-1].strip('"')
        body = next(text for head, text in sections.items() if head.startswith(title))
        figures = {x for pair in re.findall(r"(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))?%", cells[1]) for x in pair if x}
        counts = set(re.findall(r"\d+ of \d+|\d+(?:\.\d+)? GB", cells[1]))  # "54 of 67 TorchTitan runs", "2.9 GB"
        assert figures or counts, line
        absent = sorted(x for x in figures | counts if not re.search(rf"(?<![\d.]){re.escape(x)}(?!\d)", body))
        assert not absent, f'README\'s row for "{title}" gives {absent}, not in that RESULTS.md section'


@pytest.mark.parametrize("doc", DOCS.values(), ids=DOCS)
def test_headings_are_unique(doc):
    heads = headings(doc)
    assert sorted(h for h in set(heads) if heads.count(h) > 1) == []


def test_the_log_keeps_every_section_newest_first():
    """LOG.md's sections sit under date headings, newest first, and each dated heading's own
    latest date is no later than the date it sits under."""
    days = re.findall(r"^# (\d{4}-\d{2}-\d{2})$", LOG.read_text(), re.M)
    assert days and days == sorted(days, reverse=True) and len(set(days)) == len(days)
    day = None
    for line in LOG.read_text().splitlines():
        if re.fullmatch(r"# \d{4}-\d{2}-\d{2}", line):
            day = line[2:]
        elif line.startswith("## ") and (dates := re.findall(r"\d{4}-\d{2}-\d{2}", line)):
            assert day and max(dates) <= day, line
