"""Figures README.md and docs/*.md quote in their prose (output blocks are
tests/readme_outputs.py's): each is a fragment of the page made here from the output of the
command the page names, and must appear in the page as made (line breaks aside). On a
failure the message gives today's fragment: paste it into the page."""

from __future__ import annotations

import functools
import json
import re

import pytest

from tests.readme_outputs import README, SIM, SIM_GROUP, run, text_and_json

DOCS = README.parent / "docs"
PLAN = ["plan", "--model", "llama3-70b"]
# one xdist worker runs the module: out()'s cache then runs each command (SIM's simulation
# takes seconds) once, not once per worker; SIM's run is the one tests/test_readme.py compares
# with README's block (readme_outputs.text_and_json)
pytestmark = pytest.mark.xdist_group(SIM_GROUP)


@functools.cache
def out(*args: str) -> str:
    return run(list(args))


def js(*args: str) -> dict:
    if list(args) == SIM:
        return text_and_json(args)[1]
    return json.loads(out(*args, "--json"))


def change(d: dict, scenario: str, reference: str, metric: str) -> dict:
    c = next(c for c in d["comparisons"] if (c["scenario"], c["reference"]) == (scenario, reference))
    return c["metrics"][metric]


def pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def rng(m: dict) -> str:
    lo, hi = m["change_pct_range"]
    return f"[{lo * 100:+.0f}..{hi * 100:+.0f}]"


def both(d: dict, racks: int, metric: str) -> tuple[dict, dict]:
    """The metric at scale-in 25% and 50% against the baseline of `racks`."""
    return tuple(change(d, f"{racks} racks, scale-in {r}%", f"{racks} racks, baseline", metric) for r in (25, 50))


# --- docs/simulate.md --------------------------------------------------------------------

def sim_traversals(racks: int) -> str:
    a, b = both(js(*SIM), racks, "rack_traversals")
    if racks == 32:
        return f"| 32 racks, rack traversals at 25% / 50% | (not given) | {pct(a['change_pct'])} {rng(a)} / " \
               f"{pct(b['change_pct'])} {rng(b)} |"
    return (f"| 76 racks, rack traversals at 25% / 50% | -24.2% / -49.2% | {pct(a['change_pct'])} {rng(a)} / "
            f"{pct(b['change_pct'])} {rng(b)}: {a['reference']:,.0f} -> {a['value']:,.0f} / {b['value']:,.0f} |")


def sim_idle() -> str:
    a, b = both(js(*SIM), 76, "idle_gpu_hours")
    return (f"| 76 racks, idle GPU time at 25% / 50% | changes by less than 1% | {pct(a['change_pct'])} {rng(a)} / "
            f"{pct(b['change_pct'])} {rng(b)}: {a['reference'] / 1e6:.2f} M GPU-h {a['change']:+,.0f} / "
            f"{b['change']:+,.0f} |")


def sim_queue_76() -> str:
    a, b = both(js(*SIM), 76, "queue_mean_min")
    return (f"| 76 racks, queue time | no benefit materialises (light load) | {pct(a['change_pct'])} / "
            f"{pct(b['change_pct'])}, but of {a['reference']:.2f} min: to {a['value']:.2f} / {b['value']:.2f} min |")


def sim_queue_32() -> str:
    a, b = both(js(*SIM), 32, "queue_mean_min")
    return (f"| 32 racks, mean queue at 25% / 50% | -85.2% / -95.3% | {pct(a['change_pct'])} {rng(a)} / "
            f"{pct(b['change_pct'])} {rng(b)}: {a['reference']:,.0f} -> {a['value']:,.0f} / {b['value']:,.0f} min |")


def sim_speedup() -> str:
    q = [both(js(*SIM, "--speedup", s, "--no-band"), 32, "queue_mean_min")[1]["change_pct"] for s in ("0", "1.37")]
    return (f"| 32 racks, speed-up 0 vs 1.37 (`--speedup`) | negligible impact | queue at 50%: {pct(q[0])} vs "
            f"{pct(q[1])} |")


def sim_curve() -> str:
    e = js(*SIM)["efficiency_at"]
    return f"{e['0.25']:.1%} per GPU at 25% fewer nodes, {e['0.5']:.1%} at 50%"


def sim_linear() -> str:
    a, b = both(js(*SIM, "--efficiency", "linear", "--no-band"), 32, "queue_mean_min")
    return f"the 32-rack queue falls {-round(a['change_pct'] * 100)}% / {-round(b['change_pct'] * 100)}%"


def sim_load() -> str:
    load, racks, reduced = (float(SIM[SIM.index(f) + 1]) for f in ("--load", "--racks", "--reduced-racks"))
    base = next(s for s in js(*SIM)["scenarios"] if s["scenario"] == "76 racks, baseline")["mean"]["all"]
    return (f"The load, {load:g} on {racks:.0f} racks ({load * racks / reduced:.2f} on {reduced:.0f}), is an "
            f"assumption: the paper calls Kalos lightly loaded, and ACME's summary gives no offered load; the "
            f"{base['jobs']:,.0f} jobs then span {base['window_h'] / 24:.0f} days, and the 76-rack baseline's mean "
            f"queue ({base['queue_mean_min']:.2f} min)")


def readme_sim() -> str:
    a, _ = both(js(*SIM), 32, "queue_mean_min")
    return (f"on the capacity-constrained 32 racks the mean queue falls {-round(a['change_pct'] * 100)}% at 25% "
            "fewer nodes")


# --- README.md's plan prose and docs/plan.md -------------------------------------------------

def _eff(d: dict, nodes: int) -> str:
    return f"{next(o for o in d['options'] if o['nodes'] == nodes)['predicted_efficiency']:.0%}"


def readme_plan() -> str:
    d, g = js(*PLAN), js(*PLAN, "--parallel", "fsdp", "--gpu", "h100-80gb", "--gpus-per-node", "4", "--seq-len",
                          "8192", "--local-batch", "1", "--global-batch", "240")
    n, m = d["recommended"]["nodes"], g["recommended"]["nodes"]
    return (f"from its {d['min_nodes_no_offload']}-node minimum it recommends {n} nodes at {_eff(d, n)} predicted "
            f"efficiency, the fewest that keep 90%. The tour below fixes the global batch at 240 sequences, which "
            f"gives each step several microsteps (10 on 6 nodes, 30 on 2) to spread the same PCIe traffic over: "
            f"from {g['min_nodes_no_offload']} nodes it recommends {m} at {_eff(g, m)} ({m - 1} would be "
            f"{_eff(g, m - 1)})")


def plan_scout() -> str:
    d = js("plan", "--model", "llama4-scout")
    n, o = d["recommended"]["nodes"], d["other_layout"]
    return (f"`plan --model llama4-scout`, fsdp's best is {n} nodes at {_eff(d, n)} and the line points to "
            f"`--parallel {o['parallel']}`, {o['nodes']} nodes at {o['predicted_efficiency']:.0%} "
            f"(`other_layout` in `--json`)")


def plan_long() -> str:
    left, total = map(int, re.search(r"(\d+) of (\d+) rows left out", out("plan", "--model", "llama3-405b")).groups())
    return f"plan --model llama3-405b` shows {total - left} of {total})"


def plan_qwen() -> str:
    q = ["plan", "--model", "qwen3-30b-a3b"]
    d = js(*q, "--local-batch", "4")
    s, b = js(*q, "--local-batch", "4", "--seq-len", "4096"), js(*q, "--local-batch", "2")
    assert s["min_gpus_no_offload"] == b["min_gpus_no_offload"], "the page gives one figure for both"
    return (f"`plan --model qwen3-30b-a3b --local-batch 4` needs {d['min_gpus_no_offload']}. The difference is the "
            f"loss: TorchTitan 0.2.2 holds 12 bytes per token and vocabulary entry there, "
            f"{d['per_gpu_gb']['logits']:.1f} GB for 4 x 8,192 tokens x 151,936 entries on every GPU whatever the "
            f"data-parallel degree, which TorchTitan's own runs on the H200 confirm (bench/LOG.md, \"Why the plan "
            f"needs 32 H100s for Qwen3-30B-A3B\"). At sequence 4,096 or local batch 2 the plan needs "
            f"{s['min_gpus_no_offload']}.")


FIGURES = [
    (DOCS / "simulate.md", lambda: sim_traversals(76)), (DOCS / "simulate.md", sim_idle),
    (DOCS / "simulate.md", sim_queue_76), (DOCS / "simulate.md", sim_queue_32),
    (DOCS / "simulate.md", lambda: sim_traversals(32)), (DOCS / "simulate.md", sim_speedup),
    (DOCS / "simulate.md", sim_curve), (DOCS / "simulate.md", sim_linear), (DOCS / "simulate.md", sim_load),
    (README, readme_sim), (README, readme_plan),
    (DOCS / "plan.md", plan_scout), (DOCS / "plan.md", plan_long), (DOCS / "plan.md", plan_qwen),
]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("page,make", FIGURES, ids=[f"{p.name}:{getattr(m, '__name__', '')}{i}"
                                                    for i, (p, m) in enumerate(FIGURES)])
def test_quoted_figures_are_todays(page, make):
    fragment = make()
    assert _flat(fragment) in _flat(page.read_text()), f"{page.name} should say: {fragment}"


def test_node_loss_doc_says_torchtitan_is_refused():
    """docs/slurm.md describes node-loss scale-in: it must say what render and submit refuse."""
    from transit_launch.errors import UsageError
    from transit_launch.slurm import nodeloss
    with pytest.raises(UsageError, match="does not work with --torchtitan"):
        nodeloss.check(nodeloss.NodeLossOptions(mode="scale-in"), None, 1, False, titan=object())
    section = (DOCS / "slurm.md").read_text().split("## When a node is lost", 1)[1].split("\n## ", 1)[0]
    assert "Not with `--torchtitan` yet" in section and "is refused in one line" in _flat(section)
