"""--transit-stats on the real Slurm lab (tests/slurm_lab.py): a directory that is not there
is refused at submission in one line, and an existing one gets one report per rank.

Before (issue 51's newcomer trial): sbatch took `--transit-stats=DIR/nosuch`; the shim took
the path for a file, which each rank replaced (only the last rank's report was left), and
under a missing parent every rank's report was lost to a warning in the job's output."""

import json

import pytest

from tests.slurm_lab import missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.mark.parametrize("where", ["nosuch", "nosuch/deeper", "nosuch/stats-%r.json"])
def test_a_missing_stats_directory_is_refused_at_submit(lab, tmp_path, where):
    target = tmp_path / where
    res = lab.cmd("sbatch", "--transit=advise", f"--transit-stats={target}", "--wrap", "true")
    ours = [line for line in res.stderr.splitlines() if "transit:" in line]
    assert res.returncode != 0 and len(ours) == 1, res.stderr
    assert "the --transit-stats directory is not there on this host: make it first" in ours[0], ours  # a long path unsaid
    assert not target.exists()
    res = lab.cmd("sbatch", "--transit=advise", "--transit-stats=no_such_stats", "--wrap", "true")  # short: echoed
    assert res.returncode != 0 and "the --transit-stats directory no_such_stats is not there" in res.stderr


def test_a_file_name_per_rank_needs_its_directory(lab, tmp_path):
    """The shim's %r (and %p) make one file a rank: the name is no directory, its directory is."""
    res = lab.cmd("sbatch", "--parsable", "-o", "/dev/null", "--transit=advise",
                  f"--transit-stats={tmp_path}/stats-%r.json", "--wrap", "true")
    assert res.returncode == 0 and "transit:" not in res.stderr, res.stderr
    lab.wait_job(res.stdout.strip(), timeout=120)


def test_each_rank_writes_its_report_into_the_directory(lab, built, tmp_path):
    tmp_path.chmod(0o755)
    stats = tmp_path / "stats"
    stats.mkdir()
    app = built["app"]
    res = lab.cmd("sbatch", "--parsable", "-N1", "-o", str(tmp_path / "out.txt"), "--transit=advise",
                  f"--transit-stats={stats}", "--wrap",
                  f"RANK=0 /usr/bin/srun -N1 -n1 {app} alloc 1048576 && RANK=1 /usr/bin/srun -N1 -n1 {app} alloc 2097152")
    assert res.returncode == 0, res.stderr
    info = lab.wait_job(res.stdout.strip(), timeout=120)
    assert info["JobState"] == "COMPLETED", (tmp_path / "out.txt").read_text()
    assert sorted(p.name for p in stats.iterdir()) == ["transit-rank0.json", "transit-rank1.json"]
    peaks = [json.loads((stats / f"transit-rank{r}.json").read_text())["managed_peak_bytes"] for r in (0, 1)]
    assert peaks == [1048576, 2097152]  # each rank's own allocation, not one report over the other


def test_a_file_is_no_stats_directory_and_a_pid_pattern_needs_only_its_directory(lab, tmp_path):
    """A regular file given as the directory is refused as one (every rank would replace it);
    a %p name (one file a process) is taken where its directory exists, as %r is."""
    f = tmp_path / "a-file"
    f.write_text("x")
    res = lab.cmd("sbatch", "--transit=advise", f"--transit-stats={f}", "--wrap", "true")
    assert res.returncode != 0 and "is not there on this host: make it first" in res.stderr, res.stderr
    res = lab.cmd("sbatch", "--parsable", "-o", "/dev/null", "--transit=advise",
                  f"--transit-stats={tmp_path}/stats-%p.json", "--wrap", "true")
    assert res.returncode == 0 and "transit:" not in res.stderr, res.stderr
    lab.wait_job(res.stdout.strip(), timeout=120)
