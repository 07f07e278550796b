"""Move result files named with a date from bench/results/ into bench/results/<date>/ and
rewrite every `results/NAME` that names one (README, docs, bench, tests), so no reference
dangles; each date's moved files become one row of bench/results/INDEX.md.

The one-off move of the flat files from before the harness, kept so that a file dropped
flat (by hand, not through `python3 -m bench`) is filed the same way. Idempotent:

    python3 bench/harness/date_results.py [--dry-run]
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# `results/X` where X names a file (or a glob or brace list of files) with a date in its
# name and is not in a dated folder yet
REF = re.compile(r"results/(?!\d{4}-\d{2}-\d{2}(?![\w.*{-]))([A-Za-z0-9_.*{},\-]*?(\d{4}-\d{2}-\d{2})[A-Za-z0-9_.*{}\-]*)")
# the same in Python: ROOT / "bench" / "results" / "NAME" and ROOT / "bench/results" / f"NAME"
PY_REFS = [(re.compile(r'"results" / "(?!\d{4}-\d{2}-\d{2}")([^"/]*?(\d{4}-\d{2}-\d{2})[^"/]*)"'), r'"results" / "\2" / "\1"'),
           (re.compile(r'"bench/results" / (f?)"([^"/]*?(\d{4}-\d{2}-\d{2})[^"/]*)"'), r'"bench/results/\3" / \1"\2"')]
# not the results themselves, nor this script or its test (their examples are flat names)
SKIP = (("bench", "results"), ("bench", "tests"))
# where references live: the prose and the code that names recorded files
SOURCES = ["README.md", "docs/*.md", "bench/*.md", "bench/**/*.py", "bench/**/*.sh", "bench/**/*.md",
           "tests/*.py", "tests/**/*.py", "tests/**/*.c", "bench/**/*.c", "transit_launch/**/*.py",
           "examples/*"]


def flat_files():
    return sorted(p for p in RESULTS.iterdir() if p.is_file() and DATE.search(p.name))


def rewrite(text: str) -> str:
    text = REF.sub(lambda m: f"results/{m.group(2)}/{m.group(1)}", text)
    for pattern, repl in PY_REFS:
        text = pattern.sub(repl, text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would move and change")
    a = ap.parse_args()
    from bench.harness import index  # noqa: E402 (run as a script: the checkout is on sys.path below)
    moved: dict[str, list[str]] = {}
    for p in flat_files():
        date = DATE.search(p.name).group(0)
        moved.setdefault(date, []).append(p.name)
        if not a.dry_run:
            (RESULTS / date).mkdir(exist_ok=True)
            p.rename(RESULTS / date / p.name)
    changed = []
    seen = set()
    for pattern in SOURCES:
        for f in sorted(ROOT.glob(pattern)):
            if f in seen or not f.is_file() or f.relative_to(ROOT).parts[:2] in SKIP or f == Path(__file__).resolve():
                continue
            seen.add(f)
            old = f.read_text()
            new = rewrite(old)
            if new != old:
                changed.append(str(f.relative_to(ROOT)))
                if not a.dry_run:
                    f.write_text(new)
    for date, names in sorted(moved.items()):
        print(f"{date}: {len(names)} files")
        if not a.dry_run:
            index.append(index.Entry(date=date, suite="(before the harness)", command="see bench/RESULTS.md",
                                     commit="", files=[f"{date}/{n}" for n in names]))
    print("rewrote:", *changed or ["nothing"], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
