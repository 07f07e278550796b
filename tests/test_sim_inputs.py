"""simulate's inputs and per-job output (issue 54): SWF traces, the generic CSV's time limits
and byte-order mark, --jobs-out, --json-out, --seeds with --trace."""

import csv
import json

import pytest

from transit_launch.sim.swf import load_swf
from transit_launch.sim.trace import load_csv
from transit_launch.sim.tracefile import load

SWF = """; Version: 2.2
; UnixStartTime: 1700000000
;
  1   0  5  3600  8 -1 -1  8  7200 -1 1 3 1 -1 1 1 -1 -1
  2  60  0   100 -1 -1 -1 16    -1 -1 0 3 1 -1 1 1 -1 -1
  3  30  0    50  4 -1 -1  4    60 -1 5 3 1 -1 1 1 -1 -1
  4  90  0     0  4 -1 -1  4    60 -1 1 3 1 -1 1 1 -1 -1
  5  95  0   100  0 -1 -1  0    60 -1 1 3 1 -1 1 1 -1 -1
  6  99  0   abc  4 -1 -1  4    60 -1 1 3 1 -1 1 1 -1 -1
  7 100  0   100
"""


def test_swf_fields(tmp_path):
    p = tmp_path / "log.swf"
    p.write_text(SWF)
    t = load(p)  # told by the name
    assert t.source.endswith("(swf)")
    # sorted by submit: jobs 1 (0 s), 3 (30 s), 2 (60 s)
    assert t.ids == ["1", "3", "2"] and t.submit == [0.0, 30.0, 60.0]
    assert t.duration == [3600.0, 50.0, 100.0]
    assert t.gpus == [8, 4, 16]              # job 2: allocated -1, requested 16
    assert t.limits == [7200.0, 60.0, 0.0]   # job 2 asked no time: modelled
    assert t.states == ["COMPLETED", "CANCELLED", "FAILED"]
    assert t.epoch.timestamp() == 1700000000
    assert t.dropped == {"zero or negative duration": 1, "not a GPU job": 1, "unparsable number": 1, "short row": 1}
    assert load(p, "swf").ids == load_swf(p).ids


def test_generic_csv_with_a_bom_and_time_limits(tmp_path):
    p = tmp_path / "g.csv"
    # a spreadsheet's export: a byte-order mark, columns in another order, CRLF line ends
    p.write_bytes("\ufeffgpus,time_limit,duration,submit_time\r\n8,3600,100,0\r\n4,,50,10\r\n2,-5,50,20\r\n"
                  .encode("utf-8"))
    t = load_csv(p)
    assert t.gpus == [8, 4] and t.limits == [3600.0, 0.0] and t.duration == [100.0, 50.0]
    assert t.dropped == {"unparsable time limit": 1}


def test_jobs_out(cli, tmp_path):
    # one rack of four 8-GPU nodes, Slurm's defaults. a takes 3 nodes for 100 s (limit 2 min,
    # planned to end at 120); b wants all 4 from t=10: the next backfill pass is at 30. c (1
    # node, 60 s, limit 1 min) arrives at 20; at the pass, 30 + 60 = 90 <= 120: it backfills
    # at 30 and ends at 90; a ends at 100 and b runs 100-150.
    p = tmp_path / "t.csv"
    p.write_text("job_id,submit_time,duration,gpus\na,0,100,24\nb,10,50,32\nc,20,60,8\n")
    out = tmp_path / "jobs.csv"
    rc, _, err = cli("simulate", "--trace", str(p), "--racks", "1", "--gpus-per-node", "8", "--reductions", "0",
                     "--jobs-out", str(out), "--quiet")
    assert rc == 0, err
    rows = list(csv.DictReader(out.open()))
    assert [(r["job"], r["start"], r["end"], r["limit"], r["nodes"], r["racks"], r["scaled_in"]) for r in rows] == [
        ("a", "0.000", "100.000", "120", "3", "1", "0"),
        ("b", "100.000", "150.000", "60", "4", "1", "0"),
        ("c", "30.000", "90.000", "60", "1", "1", "0")]
    assert {r["scenario"] for r in rows} == {"1 racks, baseline"} and {r["seed"] for r in rows} == {"0"}


def test_jobs_out_marks_scaled_in_jobs(cli, tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("submit_time,duration,gpus\n0,100,32\n")
    out = tmp_path / "jobs.csv"
    rc, _, err = cli("simulate", "--trace", str(p), "--racks", "1", "--gpus-per-node", "8", "--reductions", "0.5",
                     "--efficiency", "linear", "--jobs-out", str(out), "--quiet")
    assert rc == 0, err
    rows = {r["scenario"]: r for r in csv.DictReader(out.open())}
    # 4 nodes -> 2: twice as long (linear), limit 120 -> 240
    assert (rows["1 racks, scale-in 50%"]["nodes"], rows["1 racks, scale-in 50%"]["end"],
            rows["1 racks, scale-in 50%"]["limit"], rows["1 racks, scale-in 50%"]["scaled_in"]) == \
        ("2", "200.000", "240", "1")
    assert rows["1 racks, baseline"]["scaled_in"] == "0"


def test_seeds_with_a_trace_draw_the_limits(cli, tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("submit_time,duration,gpus\n" + "".join(f"{i * 5},{100 + 37 * i},{8 * (1 + i % 4)}\n"
                                                          for i in range(40)))
    rc, _, err = cli("simulate", "--trace", str(p), "--racks", "1", "--gpus-per-node", "8", "--seeds", "2")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--limit-factor above 1" in err
    out = tmp_path / "jobs.csv"
    rc, stdout, err = cli("simulate", "--trace", str(p), "--racks", "1", "--gpus-per-node", "8", "--seeds", "2",
                          "--limit-factor", "4", "--reductions", "0", "--jobs-out", str(out), "--json", "--quiet")
    assert rc == 0, err
    d = json.loads(stdout)
    assert d["seeds"] == [0, 1]
    assert d["scheduler"] == {"bf_max_job_test": 500, "bf_interval": 30, "bf_resolution": 60, "plan_on": "limits",
                              "bf_window": 86400, "bf_reserve": 1, "limit_factor": 4}
    rows = list(csv.DictReader(out.open()))
    lim = {s: [float(r["limit"]) for r in rows if r["seed"] == s] for s in ("0", "1")}
    dur = [100 + 37 * i for i in range(40)]
    assert lim["0"] != lim["1"] and all(d <= a <= 4 * d + 60 for d, a in zip(dur, lim["0"] + lim["1"]))


@pytest.mark.parametrize("mode", [[], ["--node-failures", "0.2", "--no-band"]], ids=["scale-in", "node-failures"])
def test_json_out_is_the_json_beside_the_text(cli, tmp_path, mode):
    """--json-out FILE: one replay, the text on stdout as without it and in FILE the bytes
    --json prints."""
    args = ["simulate", "--synthetic", "200", "--racks", "8", *mode, "--quiet"]
    f = tmp_path / "out.json"
    rc, text, err = cli(*args, "--json-out", str(f))
    assert rc == 0, err
    assert (rc, text, err) == cli(*args)
    assert (0, f.read_text(), "") == cli(*args, "--json")
    assert json.loads(f.read_text())["trace"]
    # with --json too: the same JSON on stdout and in the file
    rc, out, err = cli(*args, "--json", "--json-out", str(tmp_path / "again.json"))
    assert rc == 0 and out == f.read_text() == (tmp_path / "again.json").read_text(), err


@pytest.mark.parametrize("args,needle", [
    (["--limit-factor", "0.5"], "--limit-factor takes 1 to 100"),
    (["--bf-interval", "-1"], "--bf-interval takes 0 to 86400 seconds"),
    (["--plan-on", "oracle"], "invalid choice"),
    (["--jobs-out", "/nonexistent-dir/x.csv"], "--jobs-out"),
    (["--jobs-out", "/tmp/x.txt"], "must end in .csv"),
    (["--json-out", "/nonexistent-dir/x.json"], "--json-out: /nonexistent-dir/x.json: directory /nonexistent-dir does not exist"),
    (["--json-out", "/tmp/x.csv"], "--json-out: /tmp/x.csv: the file name must end in .json"),
    (["--json-out", "/tmp"], "--json-out: /tmp is a directory"),
])
def test_bad_options(cli, args, needle):
    rc, out, err = cli("simulate", "--synthetic", "10", *args)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
