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


# the newest leases' files, in the order RESULTS.md tells them: the last run of the early copies (retired) beside
# the host path at a6d4988, the split's search at a6c6edb, then the calls before it
HOST_STEP = ("2026-12-08/host-step/host_step_34.json", "2026-12-07/host-step/host_step_30.json", "2026-12-07/host-step/host_step_31.json",
             "2026-12-07/host-step/host_step_28.json", "2026-12-07/host-step/host_step_29.json")


def host_step(results: Path = RESULTS) -> str:
    """Issue 50's held-out FSDP2 shape: `python3 bench/host_step.py --report` on each file."""
    host = _load("bench/host_step.py")
    out = []
    for name in HOST_STEP:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            host["report"](json.loads((results / name).read_text()))
        out.append(f"`{name}`:\n\n" + _fenced(buf.getvalue()))
    return "\n\n".join(out)


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


def _offload(day: str, *names: str) -> list[str]:
    return [f"{day}/offload_{n}_{day}.json" for n in names]


# bench/LOG.md, "The curve with every peer": the files in its command's order (a run is judged
# against the reference of its own file, else the first one given)
GATE = [*_offload("2026-11-29", "transit", "peers", "peers_accum1", "peers_accum3", "zinf_accum3"),
        *_offload("2026-11-30", "overlap_ac_accum1_3", "overlap_ac_accum12", "peers_ac_accum1"),
        "2026-11-30/offload_zenflow_ac_accum1_2026-11-30b.json",
        *_offload("2026-11-30", "twinflow_ac_accum3", "overlap_fixed_ac", "green16_ac", "ring_ac", "ring2_ac",
                  "ring2_ac12", "ring3_ac", "ring3_ac12", "zenflow_ac_accum3", "twinflow_ac_accum12")]
# the table's rows: (label, the report's run); the section's emphasis and its two remarks, kept
# here beside the layout (the numbers in them are the records')
GATE_PEERS = [("transit plain advise (the default then)", "advise"), ("transit staged (retired)", "advise-staged256"),
              ("torchao CPUOffloadOptimizer", "torchao-offload"), ("ZeRO-Offload", "zero-offload"),
              ("ZeRO-Infinity", "zero-infinity"), ("Twin-Flow (ZeRO-Offload++)", "zero-twinflow"),
              ("ZenFlow (another update rule)", "zenflow"), ("FSDP2 CPU offload", "fsdp-cpu-offload")]
GATE_BOLD = {("zero-twinflow", 12), ("zenflow", 3)}
GATE_NOTES = {("zenflow", 3): "losses differ {loss}", ("fsdp-cpu-offload", 12): "against {ref_s} (2026-11-29)"}


def _markdown_rows(out: str) -> list[dict]:
    """The rows of a Markdown table in `out`, by its header's names."""
    lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines()
             if line.startswith("|")]
    return [dict(zip(lines[0], r)) for r in lines[2:]]


def gate(results: Path = RESULTS) -> str:
    """The gate with recomputation: `python3 bench/offload.py --report GATE --markdown`, % of the
    reference in each run's own file, at 1, 3 and 12 microbatches."""
    off = _load("bench/offload.py")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        off["report"](argparse.Namespace(report=[str(results / f) for f in GATE], markdown=True, plot=None))
    rows = _markdown_rows(buf.getvalue())
    at = {(r["run"].split(" (")[0], int(r["accum"])): r for r in rows}
    points = sorted({int(r["accum"]) for r in rows})
    ratio = {int(r["accum"]): r["x paper"] for r in rows if r["x paper"]}
    ref_s = {a: f"{float(at['reference', a]['med s']):.1f}" for a in points}

    def cell(run, accum):
        r = at.get((run, accum))
        if r is None:
            return "not run"
        remark = GATE_NOTES.get((run, accum), "").format(loss=re.sub(r"e([+-])0", r"e\1", r["max rel loss diff"]),
                                                         ref_s=ref_s[accum])
        if not r["x paper"]:  # no measured step: the report's status stands in its TFLOPS column
            cut = re.fullmatch(r"timed out after (\d+) steps of \[(.*)\] s", r["TFLOPS"])
            steps = [float(s) for s in cut[2].split(",")] if cut else []
            return ", ".join(filter(None, [f"timed out after {cut[1]} steps of {min(steps)}-{max(steps)} s"
                                           if cut else r["TFLOPS"], remark]))
        cut = re.search(r"\((\d+) measured, cut by timeout\)", r["run"])
        note = "; ".join(filter(None, ["over" if r["in budget"] == "NO" else "",
                                       f"{cut[1]} steps, cut by the timeout" if cut else "", remark]))
        text = r["% ref"] + (f" ({note})" if note else "")
        return f"**{text}**" if (run, accum) in GATE_BOLD else text

    header = ["peer", *(f"{float(ratio[a]):.3g}x ({a}{' microbatch' if a == 1 else ''})" for a in points)]
    return _md(header, [[label, *(cell(run, a) for a in points)] for label, run in GATE_PEERS])


RHO = "2026-11-30/rho_sockets_2026-11-30.json"


def rho(results: Path = RESULTS) -> str:
    """rho of the 2-GPU layout and its scaled-in 1-GPU one over NCCL sockets between network
    namespaces: each rank's tokens/s under each cap (the runs and their spread where repeated)."""
    d = json.loads((results / RHO).read_text())
    caps = d["bandwidths"].split(",")
    steps = re.search(r"--steps (\d+)", d["command"])[1]
    rows = []
    for lay in d["layouts"]:
        sw = lay["sweep"]
        runs = [[r["throughput"] for r in sw["runs"] if r["bandwidth"] == bw["bandwidth_bps"] and r["rc"] == 0]
                for bw in sw["bandwidths"]]
        speeds = []
        for i, (bw, ts) in enumerate(zip(sw["bandwidths"], runs)):
            each = ", ".join(f"{t:,.0f}" for t in ts)
            speeds.append(f"{bw['throughput_median']:,.0f}" + (
                "" if len(ts) < 2 else f" (runs {each}: spread {100 * bw['throughput_spread']:.2g}%)" if i == 0
                else f" ({each}: {100 * bw['throughput_spread']:.2g}%)"))
        pairs = [a / b for a in runs[0] for b in runs[1]]
        spread = f" ({min(pairs):.2f}-{max(pairs):.2f} over the repeats' pairs)" if len(pairs) > 1 else ""
        tx = {f"{v['tx'] / 1e9:.1f}" for bw in sw["bandwidths"] for v in bw["traffic_bytes"].values()}
        moved = "0" if tx == {"0.0"} else " to ".join(sorted(tx, key=float)) + " GB"
        label = f"{lay['ranks']} GPU{'s' if lay['ranks'] > 1 else ''}, " + (
            "no offloading" if lay["policy"] == "none" else lay["policy"])
        rows.append([label, lay["ranks"], *speeds, f"**{lay['rho']:.2f}**{spread}", moved])
    header = ["layout", "ranks", f"tokens/s per rank under the {caps[0]} cap",
              *(f"under the {c} cap" for c in caps[1:]), f"rho({', '.join(caps)})",
              f"bytes on each veth per run (tx, {steps} steps + start)"]
    return _md(header, rows)


SIM_SPEED = "2026-12-07/sim-speed/sim_speed_2.json"


def sim_speed(results: Path = RESULTS) -> str:
    """The planner's latency and the simulator's speed: `python3 bench/sim_speed.py --report`."""
    return f"`{SIM_SPEED}`:\n\n" + _load("bench/sim_speed.py")["report"](json.loads((results / SIM_SPEED).read_text())) + "\n"


BLOCKS = {"prediction": prediction, "scale-in-emulated": scale_in_emulated, "host-step": host_step,
          "second-process": second_process, "policies": policies, "gate": gate, "rho": rho, "sim-speed": sim_speed}


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
