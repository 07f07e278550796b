"""The benchmark harness: suites as data (suites.py), the runner (runner.py), the results
index (index.py). `python3 -m bench --list` shows the suites."""
