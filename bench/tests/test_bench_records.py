"""The recorded results as files: every bench/results/ path the docs name exists (README,
bench/RESULTS.md, bench/LOG.md, docs/: the move into dated folders and the log left nothing
dangling), and every result file is in a dated folder and named in bench/results/INDEX.md."""

import itertools
import re

import pytest

from tests.conftest import ROOT

RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "LOG.md",
        *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"bench/results/[A-Za-z0-9_.*{},/-]*[A-Za-z0-9_*}]")


def expand(pattern: str) -> list[str]:
    """A path with {a,b} lists, as the shell expands it."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def named():
    for doc in DOCS:
        for m in PATH.finditer(doc.read_text()):
            yield doc.relative_to(ROOT), m.group(0).rstrip(".,")


@pytest.mark.parametrize("doc,path", sorted(set(named())), ids=lambda x: str(x))
def test_every_results_path_the_docs_name_exists(doc, path):
    for p in expand(path):
        rel = p.removeprefix("bench/results/")
        found = list(RESULTS.glob(rel)) if "*" in p else [RESULTS / rel] if (RESULTS / rel).exists() else []
        assert found, f"{doc} names {p}, which is not in bench/results/"


def test_results_are_in_dated_folders_and_indexed():
    index = (RESULTS / "INDEX.md").read_text()
    flat = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "INDEX.md"]
    assert flat == [], "result files belong in bench/results/<date>/ (bench/harness/date_results.py)"
    assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.name) for p in RESULTS.iterdir() if p.is_dir())
    files = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file() and p.name != "INDEX.md"]
    assert files and [f for f in files if f"`{f}`" not in index] == []
