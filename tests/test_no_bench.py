"""Neither the product nor the tests read bench/ (issue 53): bench/ is the lab around the
product, its results keep changing, and the tests read frozen copies of the records they
were fitted to (tests/frozen.py, tests/fixtures/bench/). Found with ast: an import of bench,
or a string that names the folder as a path ("bench", or one starting with "bench/"), in
code, not in docstrings or comments that cite it. Tests whose subject is bench/ itself (its
documents, its records, its scripts' output, its probes) are bench's own, in bench/tests/;
BENCH_CHECKS names the few here that must name bench/, each with the reason it stays."""

import ast
import re
from pathlib import Path

import transit_launch

PKG = Path(transit_launch.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent
# (test file, function) -> why it names bench/ and still belongs in tests/
BENCH_CHECKS = {
    ("test_lint.py", "test_the_tree_is_clean_under_ruff"): "the lint CI runs over the whole tree the sdist "
                                                           "carries (package, tests and bench/ in one ruff call); "
                                                           "it reads bench/ only as ruff's argument",
    ("test_package.py", "test_the_suite_collects_without_torch"): "the README's test command collects tests/ and "
                                                                   "bench/tests/ together: the subject is that "
                                                                   "command; it names bench/tests/ only as "
                                                                   "pytest's argument",
}


# bench/ as a path's part ("bench/x", "../bench/x", an f-string's "/bench/x") or as a module to
# import by name ("bench.common" for importlib); the frozen copies under tests/fixtures/bench are not it
NAMES_BENCH = re.compile(r"(^|[/\\])bench([/\\]|$)|^bench\.\w")


def _docstrings(tree) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def reads_of_bench(source: str) -> list[tuple[str, int]]:
    """(function, line) of each import of bench and each string naming bench/ as a path."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    owner = {}
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
            for n in ast.walk(f):
                owner.setdefault(id(n), f.name)  # the outermost function
    hits = []
    for n in ast.walk(tree):
        names = ([a.name for a in n.names] if isinstance(n, ast.Import)
                 else [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
        imported = any(m == "bench" or m.startswith("bench.") for m in names)
        path = (isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
                and bool(NAMES_BENCH.search(n.value.replace("fixtures/bench", ""))))
        if imported or path:
            hits.append((owner.get(id(n), "<module>"), n.lineno))
    return sorted(hits, key=lambda h: h[1])


def test_the_product_reads_nothing_of_bench():
    hits = [f"{f.relative_to(PKG.parent)}:{line}" for f in sorted(PKG.rglob("*.py"))
            for _, line in reads_of_bench(f.read_text())]
    assert not hits, hits


def unlisted_reads(folder: Path, allowed=BENCH_CHECKS) -> list[str]:
    """`file:line (function)` of each read of bench/ in folder's test modules that `allowed` does not name."""
    return [f"{f.name}:{line} ({func})" for f in sorted(folder.glob("*.py")) if f.name != Path(__file__).name
            for func, line in reads_of_bench(f.read_text()) if (f.name, func) not in allowed]


def test_the_tests_read_frozen_fixtures_not_bench():
    hits = unlisted_reads(TESTS)
    assert not hits, hits


def test_a_read_planted_in_the_tests_fails(tmp_path):
    """A read of bench/ planted in a test module is found: in a new file, and in a listed
    file's other functions and module level (the list names functions, not files)."""
    (tmp_path / "test_new.py").write_text('import json\n\ndef test_x():\n'
                                          '    return json.load(open("bench/results/INDEX.md"))\n')
    (tmp_path / "test_listed.py").write_text('def test_listed():\n    return "bench/x"\n\n'
                                             'def test_other():\n    return "bench/y"\n\nR = "bench"\n')
    others = ["test_listed.py:5 (test_other)", "test_listed.py:7 (<module>)", "test_new.py:4 (test_x)"]
    assert unlisted_reads(tmp_path, allowed={("test_listed.py", "test_listed"): "planted"}) == others
    assert unlisted_reads(tmp_path) == ["test_listed.py:2 (test_listed)", *others]


def test_every_listed_check_still_names_bench():
    """An entry whose test moved to bench/tests/ (or stopped naming bench/) leaves the list."""
    reads = {(f.name, func) for f in TESTS.glob("*.py") for func, _ in reads_of_bench(f.read_text())}
    assert set(BENCH_CHECKS) - reads == set()


def test_no_test_imports_bench():
    """tests/ runs against the installed package; bench/ is the lab around it. (A line scan over
    every folder of tests/, the helpers' subfolders too; the ast scan above reads its top level.)"""
    reach = re.compile(r"(sys\.path\.(insert|append)|syspath_prepend)\([^)\n]*bench|^\s*(from|import)\s+bench\b",
                       re.M)
    offenders = [str(f.relative_to(TESTS.parent)) for f in sorted(TESTS.rglob("*.py")) if reach.search(f.read_text())]
    assert offenders == []


def test_the_scan_finds_what_it_forbids():
    """The readers this issue replaced, and an import: each found (the scan is not vacuous);
    a docstring that cites bench/ is not a read."""
    old = ('RESULTS = ROOT / "bench" / "results"\n'
           'def f():\n    """bench/RESULTS.md says so."""\n    return open("bench/results/x.json")\n'
           'import bench.common\nfrom bench import prediction\n'
           'def g(root):\n    return importlib.import_module("bench.common"), open(f"{root}/bench/RESULTS.md")\n'
           'INDEX = HERE / "../bench/results/INDEX.md"\nFROZEN = HERE / "fixtures/bench"\nWORD = "a bench of 3"\n')
    assert reads_of_bench(old) == [("<module>", 1), ("f", 4), ("<module>", 5), ("<module>", 6), ("g", 8), ("g", 8),
                                   ("<module>", 9)]
