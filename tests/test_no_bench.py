"""Neither the product nor the tests read bench/ (issue 53): bench/ is the lab around the
product, its results keep changing, and the tests read frozen copies of the records they
were fitted to (tests/frozen.py, tests/fixtures/bench/). Found with ast: an import of bench,
or a string that names the folder as a path ("bench", or one starting with "bench/"), in
code, not in docstrings or comments that cite it. The bench checks below are the tests
whose subject is bench/ itself (its documents, its scripts' output, its probe's C): they
belong in bench/tests/ and stay here, named, until they move."""

import ast
from pathlib import Path

import transit_launch

PKG = Path(transit_launch.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent
# (test file, function) -> what of bench/ it checks
_OFFLOAD_REPORT = "bench/offload.py --report on its records"
BENCH_CHECKS = {
    ("test_bench_records.py", "<module>"): "bench/results/ as the docs and INDEX.md name it",
    ("test_bench_records.py", "test_every_results_path_the_docs_name_exists"): "the result paths the docs name",
    ("test_results_doc.py", "<module>"): "every RESULTS.md title cited from code and docs is a heading of it",
    ("test_prediction.py", "test_results_md_shows_the_tables_as_they_are_now"): "RESULTS.md's tables are "
                                                                                "bench/prediction.py's output",
    ("test_budget_promise.py", "test_results_md_states_what_the_file_measured"): "RESULTS.md says what the "
                                                                                 "record says",
    ("test_fake_residency.py", "test_the_probe_builds_against_the_shims_cuda_headers"): "bench's probe compiles",
    ("test_lint.py", "test_the_tree_is_clean_under_ruff"): "ruff over bench/ too",
    ("test_package.py", "test_the_suite_collects_without_torch"): "bench's own tests collect from the sdist",
    **{("test_calibration.py", f): _OFFLOAD_REPORT for f in (
        "test_issue20_goals_judged_from_the_recorded_curve",
        "test_offload_gate_compares_each_run_with_the_reference_of_its_own_lease",
        "test_offload_gate_full_curve_verdicts", "test_offload_gate_report_from_recorded_runs",
        "test_offload_report_judges_losses_of_the_deterministic_run",
        "test_offload_report_sets_apart_a_peer_over_the_budget",
        "test_offload_report_takes_the_later_measurement_of_a_run")},
}


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
                and (n.value == "bench" or n.value.startswith(("bench/", "bench\\"))))
        if imported or path:
            hits.append((owner.get(id(n), "<module>"), n.lineno))
    return sorted(hits, key=lambda h: h[1])


def test_the_product_reads_nothing_of_bench():
    hits = [f"{f.relative_to(PKG.parent)}:{line}" for f in sorted(PKG.rglob("*.py"))
            for _, line in reads_of_bench(f.read_text())]
    assert not hits, hits


def test_the_tests_read_frozen_fixtures_not_bench():
    hits = [f"{f.name}:{line} ({func})" for f in sorted(TESTS.glob("*.py")) if f.name != Path(__file__).name
            for func, line in reads_of_bench(f.read_text()) if (f.name, func) not in BENCH_CHECKS]
    assert not hits, hits


def test_the_scan_finds_what_it_forbids():
    """The readers this issue replaced, and an import: each found (the scan is not vacuous);
    a docstring that cites bench/ is not a read."""
    old = ('RESULTS = ROOT / "bench" / "results"\n'
           'def f():\n    """bench/RESULTS.md says so."""\n    return open("bench/results/x.json")\n'
           'import bench.common\nfrom bench import prediction\n')
    assert reads_of_bench(old) == [("<module>", 1), ("f", 4), ("<module>", 5), ("<module>", 6)]
