"""bench/RESULTS.md's generated tables: each block between `<!-- report:NAME -->` and
`<!-- /report:NAME -->` is what BLOCKS[NAME] makes from its result files today.

    python3 -m bench.report --write    # rewrite the blocks in bench/RESULTS.md
    python3 -m bench.report --check    # exit 1 if a block differs from what the files give
    python3 -m bench.report NAME       # print one block

bench/tests/test_report.py keeps the checked-in blocks equal to this output. The prose around
the blocks is written by hand; the record behind each section is in bench/LOG.md."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import runpy
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "bench" / "RESULTS.md"
MARK = re.compile(r"(<!-- report:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)


def _fenced(text: str) -> str:
    return f"```\n{text.rstrip(chr(10))}\n```\n"


def _script(path: str, *args: str) -> str:
    """What `python3 PATH ARGS` prints (run in this process, as the scripts' own tests run them)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), mock.patch.object(sys, "argv", [path, *args]), \
            mock.patch.object(sys, "path", [*sys.path, str((ROOT / path).parent)]):
        runpy.run_path(str(ROOT / path), run_name="__main__")
    return buf.getvalue()


def _load(path: str) -> dict:
    """A bench script's names, imported as its own run sees them (its folder on sys.path)."""
    with mock.patch.object(sys, "path", [*sys.path, str((ROOT / path).parent)]):
        return runpy.run_path(str(ROOT / path))


def _md(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def prediction(results: Path = RESULTS) -> str:
    """The plan's efficiency against the measured runs: `python3 bench/prediction.py` (its records
    are tests/prediction_records.py's frozen copies, so `results` does not move them)."""
    return _fenced(_script("bench/prediction.py"))


def scale_in_emulated(results: Path = RESULTS) -> str:
    """N -> N/2 emulated on one GPU: `python3 bench/scale_in_emulated.py`'s table over `results`."""
    ns = _load("bench/scale_in_emulated.py")
    rows = ns["rows"]
    ns["rows"] = lambda root=results: rows(root)  # main() reads the records through rows()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), mock.patch.object(sys, "argv", ["scale_in_emulated.py"]):
        ns["main"]()
    return _fenced(buf.getvalue())


HOST_STEP = "2026-12-06/host-step/host_step_14.json"


def host_step(results: Path = RESULTS) -> str:
    """Issue 50's held-out FSDP2 shape: `python3 bench/host_step.py --report` on its newest file."""
    host = _load("bench/host_step.py")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        host["report"](json.loads((results / HOST_STEP).read_text()))
    return f"`{HOST_STEP}`:\n\n" + _fenced(buf.getvalue())


SECOND_PROCESS = "2026-12-02/probes/second_process_2026-12-02.json"


def second_process(results: Path = RESULTS) -> str:
    """What a second process allocated beside a budgeted job, and so what the job held."""
    d = json.loads((results / SECOND_PROCESS).read_text())
    sp, [job] = d["second_process"], d["job_summary"]["processes"]
    gb = 1e9
    held = d["idle"]["free_bytes"] - sp["allocated_bytes"] - sp["free_at_peak_bytes"]
    budget = int(d["gpu_budget"].rstrip("B"))
    unplaced = held / gb - budget / gb - job["device_buffer_gb"]
    rows = [
        ["the card free before the job", f"{d['idle']['free_bytes'] / gb:.2f} GB"],
        ["the job's GPU budget", f"{budget / gb:.2f} GB"],
        [f"the second process got (asked {sp['max_bytes'] / gb:.1f} GB, refused: "
         f"{'yes' if sp['refused'] else 'no'})", f"{sp['allocated_bytes'] / gb:.2f} GB"],
        ["still free at that point", f"{sp['free_at_peak_bytes'] / gb:.2f} GB"],
        ["**so the job held at most**", f"**{held / gb:.2f} GB**"],
        ["of which the adapter's ring", f"{job['device_buffer_gb']:.2f} GB"],
        ["of which the shim does not place (context, libraries)", f"{unplaced:.2f} GB"],
        ["in use as the shim counted it (cudaMemGetInfo)", f"{job['gpu_in_use_steady_gb']:.2f} GB"],
        ["the job: return code, median step", f"{d['job_returncode']}, {job['median_iteration_ms']:.0f} ms"],
    ]
    return f"`{SECOND_PROCESS}`, measured after step {d['measured_at_step']}:\n\n" + _md(["", ""], rows)


POLICIES = "2026-11-29/shim_policies_2026-11-29_flash.jsonl"


def policies(results: Path = RESULTS) -> str:
    """The shim's policies under a budget (the examples' 1.0 B trainer, flash attention)."""
    runs = [json.loads(line) for line in (results / POLICIES).read_text().splitlines() if line.strip()]
    ref = next(r for r in runs if r["name"] == "reference")
    rows = [[r["name"], r["policy"], "-" if not r["budget_bytes"] else f"{r['budget_bytes'] / 1e9:.2f}",
             f"{r['tflops']:.2f}" if r.get("tflops") else "-",
             f"{100 * r['tflops'] / ref['tflops']:.2f}" if r.get("tflops") else "-",
             f"{r['median_step_time']:.4f}" if r.get("median_step_time") else "-", r["rc"]] for r in runs]
    return f"`{POLICIES}`:\n\n" + _md(["run", "policy", "budget GB", "per-GPU TFLOPS", "% of reference",
                                        "median step s", "rc"], rows)


BLOCKS = {"prediction": prediction, "scale-in-emulated": scale_in_emulated, "host-step": host_step,
          "second-process": second_process, "policies": policies}


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every marked block replaced by what its function makes from `results`."""
    def block(m):
        if m.group("name") not in BLOCKS:
            raise KeyError(f"bench/RESULTS.md marks a block {m.group('name')!r} that bench/report.py does not make")
        return m.group(1) + BLOCKS[m.group("name")](results) + m.group(4)
    return MARK.sub(block, text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", choices=sorted(BLOCKS), help="print one block")
    ap.add_argument("--write", action="store_true", help="rewrite the blocks in bench/RESULTS.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is not what the files give")
    a = ap.parse_args(argv)
    if a.name:
        print(BLOCKS[a.name](), end="")
        return 0
    text = DOC.read_text()
    new = render(text)
    if a.write:
        if new != text:
            DOC.write_text(new)
        print(f"bench/RESULTS.md: {len(MARK.findall(new))} blocks, {'rewritten' if new != text else 'unchanged'}")
        return 0
    if a.check:
        stale = [m.group("name") for m, n in zip(MARK.finditer(text), MARK.finditer(new)) if m.group(0) != n.group(0)]
        if stale:
            print(f"bench/RESULTS.md: stale blocks {', '.join(stale)}: run python3 -m bench.report --write")
            return 1
        print(f"bench/RESULTS.md: {len(MARK.findall(text))} blocks current")
        return 0
    ap.error("give --write, --check or a block's name")


if __name__ == "__main__":
    sys.exit(main())
