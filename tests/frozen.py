"""Where the tests read recorded measurements: tests/fixtures/bench/, frozen copies of the
files under bench/ they were fitted to and checked against, at the same relative paths
(tests/fixtures/bench/results/2026-12-02/... is bench/results/2026-12-02/...). The tests
read nothing under bench/ itself, which keeps changing (tests/test_no_bench.py); a new record
counts for the tests once it is copied here."""

from pathlib import Path

FROZEN = Path(__file__).resolve().parent / "fixtures/bench"
RESULTS = FROZEN / "results"
CARDS = FROZEN / "cards"
