"""simulate --trace reads the public GPU-cluster traces people have (issue 54): Helios'
cluster_log.csv, Philly's cluster_job_log and Alibaba PAI's job and task tables. The
fixtures under tests/fixtures/traces/ are a few hand-written rows in each real schema
(Helios' first three are its README's example rows, Philly's first job its README's
example entry); each test's expected jobs are worked out by hand in the comments."""

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from transit_launch.errors import UsageError
from transit_launch.sim.tracefile import load

FIX = Path(__file__).resolve().parent / "fixtures" / "traces"
HELIOS, PHILLY, PAI = FIX / "helios" / "cluster_log.csv", FIX / "philly" / "cluster_job_log", FIX / "pai"


def test_helios_cluster_log():
    t = load(HELIOS)
    assert t.source.endswith("(helios)")  # told by its header: vc, and no type or gpu_time
    # submit order: 1425515 at 18:40:00, then 1425511 (+61 s), 1425512 (+87), 1425513 (+88);
    # durations are the duration column, GPUs gpu_num, states as written
    assert t.ids == ["1425515", "1425511", "1425512", "1425513"]
    assert t.submit == [0.0, 61.0, 87.0, 88.0]
    assert t.duration == [3600.0, 36848.0, 249.0, 675233.0]
    assert t.gpus == [16, 1, 4, 1]
    assert t.states == ["NODE_FAIL", "COMPLETED", "FAILED", "CANCELLED"]
    assert t.limits == [] and set(t.types) == {""}
    assert t.epoch == datetime(2020, 6, 9, 18, 40, tzinfo=timezone.utc)
    # 1425514 has no GPUs, 1425516 ran 0 s, 1425517 was submitted on 31 June, 1425518 is cut short
    assert t.dropped == {"not a GPU job": 1, "zero or negative duration": 1, "unparsable submit time": 1,
                         "short row": 1}
    assert load(HELIOS, "helios").ids == t.ids


def test_helios_columns_in_another_order(tmp_path):
    p = tmp_path / "log.csv"
    p.write_text("queue,duration,end_time,start_time,submit_time,state,node_num,cpu_num,gpu_num,vc,user,job_id\n"
                 "0,100,,,2020-06-09 00:00:00,COMPLETED,1,4,2,vcA,uA,7\n")
    t = load(p)
    assert t.source.endswith("(helios)") and (t.ids, t.gpus, t.duration) == (["7"], [2], [100.0])


def test_philly_cluster_job_log():
    t = load(PHILLY)
    assert t.source.endswith("(philly)")  # told by its content: a JSON list
    # ..._14200 submitted 01:00:00, one attempt of 3600 s on two machines of 8 GPUs: 16, Killed
    # ..._14199 (the README's) at 01:11:39 (+699 s): attempts 01:12:09-01:13:23 (74 s) and
    #   10-07 01:13:30 - 10-09 06:53:12 (2 days 5:39:42 = 193182 s): 193256 s on 8 GPUs, Pass
    # ..._14201 at 01:20:00 (+1200 s): two attempts of 60 s on 2 GPUs, Failed
    assert t.ids == ["application_1506638472019_14200", "application_1506638472019_14199",
                     "application_1506638472019_14201"]
    assert t.submit == [0.0, 699.0, 1200.0]
    assert t.duration == [3600.0, 193256.0, 120.0]
    assert t.gpus == [16, 8, 2]
    assert t.states == ["CANCELLED", "COMPLETED", "FAILED"]
    assert t.limits == []
    assert t.epoch == datetime(2017, 10, 7, 1, 0, tzinfo=timezone.utc)
    # _14202 no attempts, _14203 last attempt's end_time null, _14204 an attempt's start
    # 'None', _14205 no GPUs, and a string where a job should be
    assert t.dropped == {"no attempts (never ran)": 1, "still running when the log was taken": 1,
                         "attempt without a start or end time": 1, "not a GPU job": 1, "malformed job record": 1}


def test_pai_job_and_task_tables(tmp_path):
    # job 6f1e..: submitted 4550800, tasks ps (no GPU, launched 4550950) and worker (2 x 100%):
    #   2 GPUs, 4554550 - 4550950 = 3600 s, Failed
    # job 4b3f.. (the README's job row): submitted 4550879 (+79 s), one instance at 50%: 1 GPU,
    #   4551416 - 4550900 = 516 s, Terminated
    # job 7a8b..: submitted 4551000 (+200 s), 4 instances at 150%: 4 x 2 = 8 GPUs,
    #   4558300 - 4551100 = 7200 s, Terminated
    expected_ids = ["1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7",
                    "8cb3bec23d14dbde320b6613452e768cbbf35b8bd64ee28fcceb77d3c47d",
                    "2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8"]
    for given in (PAI, PAI / "pai_job_table.csv", PAI / "pai_task_table.csv"):  # either table, or their folder
        t = load(given)
        assert t.source.endswith("(pai)"), given
        assert t.ids == expected_ids
        assert t.submit == [0.0, 79.0, 200.0]
        assert t.duration == [3600.0, 516.0, 7200.0]
        assert t.gpus == [2, 1, 8]
        assert t.states == ["FAILED", "COMPLETED", "COMPLETED"]
        assert t.limits == []
        # 4550800 s = 52 days 16:06:40 after 1970-01-01 UTC: 00:06:40 the next day in UTC+8
        assert t.epoch == datetime(1970, 2, 23, 0, 6, 40, tzinfo=timezone(timedelta(hours=8)))
        # 8b9c.. Running, 9c0d.. plan_gpu 0, 0d1e.. no task rows, 1e2f.. task start 0, 2f3a..
        # plan_gpu 'abc', the cut job row, and the task row of job ffff.. (no such job)
        assert t.dropped == {"running or waiting when the trace was taken": 1, "not a GPU job": 1, "no task rows": 1,
                             "no launch or end time": 1, "unparsable task row": 1, "unreadable or short job row": 1,
                             "task rows of no job in the job table": 1}
    # --format pai reads any name as the job table, with pai_task_table.csv beside it
    shutil.copy(PAI / "pai_job_table.csv", tmp_path / "jobs.csv")
    shutil.copy(PAI / "pai_task_table.csv", tmp_path / "pai_task_table.csv")
    assert load(tmp_path / "jobs.csv", "pai").ids == expected_ids


def test_auto_detection_keeps_the_other_formats(tmp_path):
    g = tmp_path / "g.csv"
    g.write_text("submit_time,duration,gpus\n0,100,8\n")
    assert load(g).source.endswith("(generic)")
    s = tmp_path / "t.swf"
    s.write_text("1 0 0 100 8 -1 -1 8 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n")
    assert load(s).source.endswith("(swf)")
    # a JSON file of any name is Philly's
    j = tmp_path / "jobs.json"
    j.write_text(json.dumps([{"jobid": "a", "status": "Pass", "submitted_time": "2017-10-07 01:00:00",
                              "attempts": [{"start_time": "2017-10-07 01:00:00", "end_time": "2017-10-07 01:01:40",
                                            "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}]}]))
    t = load(j)
    assert t.source.endswith("(philly)") and (t.duration, t.gpus) == ([100.0], [1])


def test_philly_attempt_that_ends_before_it_starts(tmp_path):
    def job(jobid, start, end):
        return {"jobid": jobid, "status": "Pass", "submitted_time": "2017-10-07 00:00:00",
                "attempts": [{"start_time": start, "end_time": end, "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}]}
    p = tmp_path / "cluster_job_log"
    p.write_text(json.dumps([job("a", "2017-10-07 01:00:00", "2017-10-07 00:59:00"),
                             job("b", "2017-10-07 01:00:00", "2017-10-07 01:00:00"),
                             job("c", "2017-10-07 01:00:00", "2017-10-07 01:00:30")]))
    t = load(p)
    assert (t.ids, t.duration) == (["c"], [30.0])
    assert t.dropped == {"attempt ending before it starts": 1, "zero or negative duration": 1}


@pytest.mark.parametrize("path, fmt, needle", [
    (HELIOS, "seren", "has the helios column set, not seren"),
    ("generic", "helios", "has the generic column set, not helios"),
    (PHILLY, "generic", "unrecognised trace columns"),
])
def test_a_named_format_that_is_not_the_file(tmp_path, path, fmt, needle):
    if path == "generic":
        path = tmp_path / "g.csv"
        path.write_text("submit_time,duration,gpus\n0,100,8\n")
    with pytest.raises(UsageError, match=needle):
        load(path, fmt)


def _bad(tmp_path):
    """name -> (file or folder to give --trace, what its one line says)."""
    d = tmp_path / "bad"
    d.mkdir()
    (d / "cluster_job_log").write_text('[{"jobid": "a", "attempts": [')
    (d / "object.json").write_text('{"jobid": "a"}')
    (d / "pai").mkdir()
    (d / "pai" / "pai_job_table.csv").write_text("j,i,u,Terminated,1.0,2.0\n")
    (d / "cluster_log.csv").write_text(HELIOS.read_text().splitlines()[0] + "\n1,u,vc,8,8,1,COMPLETED,never,,,10,0\n")
    (d / "columns.csv").write_text("a,b\n1,2\n")
    return {
        "philly, broken JSON": (d / "cluster_job_log", "is not valid JSON (Expecting value: line 1 column 30)"),  # after the 29 characters
        "philly, not a list": (d / "object.json", "is JSON but not a list of jobs"),
        "pai, no task table": (d / "pai" / "pai_job_table.csv",
                               f"cannot read trace {d / 'pai' / 'pai_task_table.csv'}: no such file"),
        "helios, no row left": (d / "cluster_log.csv", "no jobs left after filtering; dropped: 1 unparsable submit time"),
        "none of them": (d / "columns.csv", "unrecognised trace columns"),
    }


@pytest.mark.parametrize("case", ["philly, broken JSON", "philly, not a list", "pai, no task table",
                                  "helios, no row left", "none of them"])
def test_a_bad_trace_file_is_one_line_and_exit_2(cli, tmp_path, case):
    path, needle = _bad(tmp_path)[case]
    rc, out, err = cli("simulate", "--trace", str(path), "--racks", "1", "--quiet")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("transit-launch: error: ") and needle in err, err
    assert "Traceback" not in err


def test_each_format_replays_through_the_cli(cli):
    for path, fmt, jobs in ((HELIOS, "helios", 4), (PHILLY, "philly", 3), (PAI, "pai", 3)):
        rc, out, err = cli("simulate", "--trace", str(path), "--format", fmt, "--racks", "1", "--gpus-per-node", "8",
                           "--reductions", "0", "--quiet", "--json")
        assert rc == 0, err
        head = json.loads(out)["trace"]
        assert head["jobs"] == jobs and head["source"].endswith(f"({fmt})")


def test_a_pai_task_that_never_launched_beside_one_that_ran(tmp_path):
    """A job whose worker ran (4551000 to 4551600) and whose ps task failed before launch
    (start 0): the job is the worker's, 1 GPU for 600 s; the task that never ran is no
    launch time of the job's (it was read as the job's start and the job dropped)."""
    (tmp_path / "pai_job_table.csv").write_text("J1,inst1,u,Terminated,4550900.0,4551600.0\n")
    (tmp_path / "pai_task_table.csv").write_text("J1,worker,1.0,Terminated,4551000.0,4551600.0,600.0,29.3,100.0,V100\n"
                                                 "J1,ps,1.0,Failed,0.0,0.0,400.0,8.0,,\n")
    t = load(tmp_path / "pai_job_table.csv", "pai")
    assert (t.ids, t.gpus, t.duration, t.dropped) == (["inst1"], [1], [600.0], {})
