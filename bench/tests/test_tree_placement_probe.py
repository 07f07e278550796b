"""bench/probes/tree_placement_probe.py (run by hand, root and Slurm): bad arguments get one line
and exit 2 before any lab starts; its cases are test_sim_placement's and their hand derivations
are the simulator's answers; Slurm's answers are read and compared as given (no Slurm here)."""

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "probes" / "tree_placement_probe.py"


def run(*args, tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def probe():
    spec = importlib.util.spec_from_file_location("tree_placement_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("args", [[], ["--only", "LAB_CASES[99]"], ["--only", ","], ["--timeout", "0"],
                                  ["--out", "no/such/dir/r.json"], ["--out", "."]])
def test_bad_arguments_are_one_line(args, tmp_path):
    res = run(*args, tmp_path=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("tree_placement_probe: "), res.stderr
    assert not res.stdout


def test_the_cases_are_the_tests_and_tree_gives_their_hand_derivations():
    from tests.test_sim_placement import LAB_CASES
    p = probe()
    cases = p.cases()
    assert [(c["used"], c["nodes"], c["gpus"], c["by_hand"]) for c in cases[:len(LAB_CASES)]] == \
        [(dict(u), n, g, w) for u, n, g, w in LAB_CASES]
    assert len({c["name"] for c in cases}) == len(cases)
    for c in cases:
        assert p.simulated(c["used"], c["nodes"], c["gpus"], "tree") == c["by_hand"], c["name"]
        assert sum(c["used"].values()) + c["gpus"] <= p.N_NODES * p.GPN


def test_list_needs_no_lab(tmp_path):
    res = run("--list", "--only", "extra[3]", tmp_path=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == (
        "extra[3]: used {'n1': 1, 'n5': 8, 'n6': 8, 'n7': 8}, 1 node(s) 8 GPUs: tree ['n8'], pack ['n2'], "
        "by hand ['n8']"), res.stdout


def test_compare_reads_slurms_nodes_as_given():
    p = probe()
    case = {"name": "x", "used": {4: 7}, "nodes": 1, "gpus": 1, "by_hand": [0]}
    assert p.compare(case, [0])["agree"] and p.compare(case, [0])["slurm"] == ["n1"]
    other = p.compare(case, [4])
    assert not other["agree"] and other["slurm"] == ["n5"] and other["tree"] == ["n1"] and other["pack"] == ["n5"]
    assert not p.compare(case, None)["agree"]  # Slurm did not start it
    assert p.gres_used("gpu:7(IDX:0-6)") == 7 and p.gres_used("gpu:0(IDX:N/A)") == 0 and p.gres_used("(null)") == 0
    assert p.node_index("n16") == 15
    with pytest.raises(ValueError):
        p.node_index("n17")
