"""Options the SPANK plugin would ignore say so (issue 28, item 3), on the real Slurm lab
(tests/slurm_lab.py, whose plugstack line has the site default off):

- --transit-budget or --transit-stats under a policy of off (no --transit on this site,
  or --transit=off) load no shim: sbatch, salloc and srun print one line on the user's
  terminal (slurm_info there reaches stderr as "sbatch: ..."), without repeating the
  value, and the job runs as before;
- TRANSIT_OVERLAP_STEP in a step that --transit=off leaves without the shim: the step's
  own stderr (the job's output) gets one line per step, from its first task (slurm_error
  in the task reaches it as "slurmstepd-NODE: error: ..."; slurm_info does not)."""

import pytest

from tests.slurm_lab import missing
from tests.test_spank_lab import SRUN, entries, rows_of, script, submit

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

BUDGET = "--transit-budget does nothing"
OVERLAP = "transit: warning: TRANSIT_OVERLAP_STEP does nothing: --transit=off loads no shim"


def ours(text: str) -> list[str]:
    return [line for line in text.splitlines() if "transit:" in line]


@pytest.mark.parametrize("args,line", [
    (["--transit-budget=71GB"], "sbatch: transit: warning: --transit-budget does nothing: without --transit this "
                                "cluster's policy is off and loads no shim (add --transit=advise)"),
    (["--transit=off", "--transit-budget=71GB"], "sbatch: transit: warning: --transit-budget does nothing: "
                                                 "--transit=off loads no shim"),
    (["--transit-budget=71GB", "--transit-stats=/tmp/stats-71"], "sbatch: transit: warning: --transit-budget and "
                                                                 "--transit-stats do nothing: without --transit this "
                                                                 "cluster's policy is off and loads no shim "
                                                                 "(add --transit=advise)"),
    (["--transit-stats=/tmp/stats-71"], "sbatch: transit: warning: --transit-stats does nothing: without --transit "
                                        "this cluster's policy is off and loads no shim (add --transit=advise)"),
    # under a policy the stats directory must exist (sbatch's cwd here; tests/test_spank_stats_lab.py)
    (["--transit=advise", "--transit-budget=71GB", "--transit-stats=."], None),
    (["--transit=prefetch"], None),
    ([], None),
])
def test_budget_under_policy_off_warns_at_submit(lab, args, line):
    res = lab.cmd("sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "true")
    assert res.returncode == 0, res.stderr  # a warning, not a refusal: the job is submitted
    assert ours(res.stderr) == ([line] if line else []), res.stderr
    assert "71" not in res.stderr  # the user's values are not repeated
    lab.wait_job(res.stdout.strip(), timeout=120)


def test_salloc_and_srun_warn_too(lab):
    res = lab.cmd("salloc", "-N1", "--transit-budget=71GB", SRUN, "/bin/true", timeout=60)
    assert res.returncode == 0 and [l for l in ours(res.stderr) if BUDGET in l] == [
        "salloc: transit: warning: --transit-budget does nothing: without --transit this cluster's policy is off "
        "and loads no shim (add --transit=advise)"], res.stderr
    # srun inside a job: the job's choice counts (SLURM_SPANK_TRANSIT_POLICY), not the site's
    body = f'{SRUN} -N1 --transit-budget=40GB /bin/bash -c "$row" step\n'
    rows_on, out_on = rows_of(lab, submit(lab, "-N1", "--transit=advise", str(script(lab, "on.sh", body))))
    rows_dflt, out_dflt = rows_of(lab, submit(lab, "-N1", str(script(lab, "dflt.sh", body))))
    assert not ours(out_on) and rows_on[-1]["budget"] == "40GB" and lab.shim in entries(rows_on[-1]["preload"])
    assert ours(out_dflt) == ["srun: transit: warning: --transit-budget does nothing: without --transit this "
                              "cluster's policy is off and loads no shim (add --transit=advise)"], out_dflt
    assert rows_dflt[-1]["preload"] == "" and rows_dflt[-1]["budget"] == "", rows_dflt


def test_overlap_under_off_warns_once_per_step(lab):
    """--transit=off with TRANSIT_OVERLAP_STEP exported at submit (the batch step and both
    srun steps have it) and inside the script: one line per step, from its first task."""
    body = f"""{SRUN} -N2 --ntasks-per-node=2 /bin/bash -c "$row" four-tasks
export TRANSIT_OVERLAP_STEP=1
{SRUN} -N1 -n1 /bin/bash -c "$row" exported
TRANSIT_OVERLAP_STEP= {SRUN} -N1 -n1 /bin/bash -c "$row" empty
"""
    env = dict(lab.env, TRANSIT_OVERLAP_STEP="staged")
    job = submit(lab, "-N2", "--ntasks-per-node=2", "--transit=off", str(script(lab, "overlap-off.sh", body)),
                 env=env)
    rows, out = rows_of(lab, job)
    assert [r["tag"] for r in rows].count("four-tasks") == 4, out
    warned = [l for l in ours(out) if "TRANSIT_OVERLAP_STEP" in l]
    # batch, four-tasks and exported have it set; the step with it empty does not
    assert len(warned) == 3 and all(l.startswith("slurmstepd-") and l.endswith(OVERLAP) for l in warned), out
    assert all(lab.shim not in entries(r["preload"]) for r in rows), rows
    assert "staged" not in "\n".join(warned)


@pytest.mark.parametrize("args", [["--transit=advise"], []])
def test_overlap_with_the_shim_or_the_site_default_is_quiet(lab, args):
    """With the shim the overlap runs; under the site's default off the plugin leaves the
    environment alone (a script rendered by transit-launch loads the shim itself)."""
    body = f'{SRUN} -N1 /bin/bash -c "$row" step\n'
    env = dict(lab.env, TRANSIT_OVERLAP_STEP="1")
    rows, out = rows_of(lab, submit(lab, "-N1", *args, str(script(lab, "overlap-q.sh", body)), env=env))
    assert not ours(out), out
    assert all((lab.shim in entries(r["preload"])) == bool(args) for r in rows), rows


def test_overlap_under_off_with_a_shim_of_the_users_own_is_quiet(lab):
    """--transit=off takes out the site's shim; a libtransit.so the user preloads still runs
    the overlap, so there is nothing to warn about."""
    own = "/opt/mine/libtransit.so"
    body = f'LD_PRELOAD={own} TRANSIT_OVERLAP_STEP=1 {SRUN} -N1 /bin/bash -c "$row" step\n'
    rows, out = rows_of(lab, submit(lab, "-N1", "--transit=off", str(script(lab, "overlap-own.sh", body))))
    assert not ours(out) and rows[-1]["preload"] == own, (out, rows)
