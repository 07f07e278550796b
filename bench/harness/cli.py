"""The command line of `python3 -m bench` (bench/__main__.py has the usage)."""

import argparse
import datetime
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bench.harness import index, runner, setup
from bench.harness.suites import SUITES

ROOT = Path(__file__).resolve().parents[2]


def gpu_count() -> int:
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in res.stdout.splitlines()) if res.returncode == 0 else 0


def listing() -> str:
    from transit_launch.table import table
    rows = [[s.name, "CPU" if not s.gpus else f"{s.gpus}-{s.lanes}" if s.lanes > s.gpus else s.gpus, f"~{s.minutes}", " ".join(s.carry) or "-", ", ".join(st.name for st in s.steps)]
            for s in SUITES.values()]
    text = table(["suite", "GPUs", "minutes", "carry", "steps"], rows) + "\n"
    for s in SUITES.values():
        text += f"\n{s.name}: {s.measures}." + (f"\n  budgets: {s.budget}." if s.budget else "") + "\n"
    return text


def fresh_folder(date: str, suite: str) -> Path:
    """bench/results/<date>/<suite>/, or <suite>-2, -3, ... when the suite ran that day already."""
    base = index.RESULTS / date
    folder, k = base / suite, 2
    while folder.exists():
        folder, k = base / f"{suite}-{k}", k + 1
    return folder


def file_in(src: Path) -> int:
    """Copy a run made elsewhere (its folder with run.json) under bench/results/ and index it."""
    try:
        entry = index.read_manifest(src)
    except (OSError, ValueError, TypeError) as e:
        print(f"bench: {src}: no readable run.json ({e})", file=sys.stderr)
        return 2
    dest = fresh_folder(entry.date, entry.suite)
    shutil.copytree(src, dest)
    entry.files = sorted(str(p.relative_to(index.RESULTS)) for p in dest.rglob("*") if p.is_file())
    index.write_manifest(dest, entry)
    index.append(entry)
    print(f"filed {src} as {dest} ({len(entry.files)} files, listed in {index.INDEX})")
    return 0


def parse(argv):
    ap = argparse.ArgumentParser(prog="python3 -m bench", description="Run a benchmark suite and file its results.")
    ap.add_argument("suite", nargs="?", help="one of: " + ", ".join(SUITES))
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all that nvidia-smi lists)")
    ap.add_argument("--out", default="", help="results folder (default: bench/results/<date>/<suite>/, indexed)")
    ap.add_argument("--only", default="", help="comma-separated step names of the suite")
    ap.add_argument("--list", action="store_true", help="the suites and what each measures")
    ap.add_argument("--dry-run", action="store_true", help="print the setup and the steps, run nothing")
    ap.add_argument("--file-in", default="", metavar="DIR", help="file a run made with --out into bench/results/")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.list:
        print(listing(), end="")
        return 0
    if a.file_in:
        return file_in(Path(a.file_in))
    if a.suite not in SUITES:
        print(f"bench: {'no suite given' if not a.suite else f'unknown suite {a.suite!r}'}; "
              f"one of: {', '.join(SUITES)} (--list says what each measures)", file=sys.stderr)
        return 2
    suite = SUITES[a.suite]
    steps = suite.steps
    if a.only:
        names = a.only.split(",")
        unknown = [n for n in names if n not in {s.name for s in suite.steps}]
        if unknown:
            print(f"bench: {suite.name} has no step {', '.join(unknown)}; its steps: "
                  f"{', '.join(s.name for s in suite.steps)}", file=sys.stderr)
            return 2
        steps = tuple(s for s in suite.steps if s.name in names)
    need = max(s.gpus for s in steps)
    lanes = len({s.lane for s in steps if s.lane is not None})
    # a dry run shows the suite as on a machine with the GPUs it can use
    gpus = a.gpus if a.gpus is not None else max(need, lanes) if a.dry_run else gpu_count()
    if gpus < need:
        print(f"bench: {suite.name} needs {need} GPU(s), {gpus} here (--gpus; --only picks steps that need fewer)",
              file=sys.stderr)
        return 2
    date = datetime.date.today().isoformat()
    out = Path(a.out).resolve() if a.out else fresh_folder(date, suite.name)
    command = shlex.join(["python3", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    print(f"bench: {suite.name} on {gpus} GPU(s), about {suite.minutes} min; results in {out}")
    env = setup.prepare(build_shim=need > 0, dry_run=a.dry_run)
    if env is None:
        return 1
    if not a.dry_run:
        missing = setup.missing_modules(suite.modules, env)
        if missing:
            print(f"bench: {', '.join(missing)} missing: carry .whl (bash bench/fetch_wheels.sh)", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
    results = runner.run(suite, steps, gpus, env, out, a.dry_run)
    if results is None:
        return 1
    if a.dry_run:
        return 0
    failed = [r["step"] for r in results if r["rc"] != 0]
    (out / "steps.json").write_text(json.dumps(results, indent=1) + "\n")
    filed = index.RESULTS in out.parents  # the index names files relative to bench/results/
    entry = index.Entry(date=date, suite=suite.name, command=command, commit=index.commit(),
                        status="ok" if not failed else "failed: " + ", ".join(failed),
                        files=sorted(str(p.relative_to(index.RESULTS if filed else out))
                                     for p in [*out.rglob("*"), out / "run.json"] if p.is_file() or p.name == "run.json"))
    index.write_manifest(out, entry)
    if filed:
        index.append(entry)
        print(f"bench: indexed in bench/results/INDEX.md ({entry.status})")
    else:
        print(f"bench: {entry.status}; file it with: python3 -m bench --file-in {out}")
    return 0 if not failed else 1
