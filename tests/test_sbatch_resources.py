"""The site's own #SBATCH lines and the usual resources on `render` and `submit` (issue 28):
what each becomes in the script, what is refused in one line, and what Slurm itself makes
of the rendered script on the lab cluster (tests/slurm_lab.py)."""

import pytest

from tests.slurm_lab import missing

ARGS = ["--cpus-per-task", "2", "--mem", "100M", "--exclusive", "--constraint", "fast&big",
        "--sbatch-arg=--comment=site-rule", "--sbatch-arg=--requeue"]


def _sbatch_lines(text):
    return [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]


def test_resources_and_site_lines_become_sbatch_lines(cli):
    rc, out, err = cli("render", "--nodes", "2", *ARGS, "--", "python", "train.py")
    assert rc == 0, err
    lines = _sbatch_lines(out)
    for want in ("#SBATCH --cpus-per-task=2", "#SBATCH --mem=100M", "#SBATCH --exclusive",
                 "#SBATCH --constraint=fast&big", "#SBATCH --comment=site-rule", "#SBATCH --requeue"):
        assert want in lines, (want, lines)
    assert lines.index("#SBATCH --requeue") > lines.index("#SBATCH --nodes=2")  # the site's lines come last
    rc, out, err = cli("render", "--nodes", "2", "--", "python", "train.py")
    assert not [ln for ln in _sbatch_lines(out) if ln.split("=")[0] in ("#SBATCH --mem", "#SBATCH --exclusive")]


@pytest.mark.parametrize("args,needle", [
    (["--mem", "lots"], "--mem 'lots' is not sbatch's memory size"),
    (["--mem", "1.5G"], "--mem '1.5G' is not sbatch's memory size"),
    (["--cpus-per-task", "0"], "--cpus-per-task"),
    (["--constraint", "a b"], "--constraint 'a b'"),
    (["--sbatch-arg=qos=high"], "give one sbatch option as --name or --name=value"),
    (["--sbatch-arg=--comment=a b"], "give one sbatch option"),
    (["--sbatch-arg=--comment=x\n#SBATCH --uid=0"], "give one sbatch option"),
    (["--sbatch-arg=--nodes=64"], "--sbatch-arg --nodes: transit-launch sets --nodes itself"),
    (["--sbatch-arg=--gpus-per-node=1"], "sets --gpus-per-node itself"),
    # the plugin's options: a line of them would contradict the route render took (--inject)
    (["--sbatch-arg=--transit=base"], "--sbatch-arg --transit: transit-launch sets --transit itself (--policy)"),
    (["--sbatch-arg=--transit-stats=/x"], "sets --transit-stats itself (--stats)"),
])
def test_bad_resources_are_one_line(cli, args, needle):
    rc, out, err = cli("render", "--nodes", "1", *args, "--", "python", "train.py")
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_local_refuses_sbatch_resources(cli):
    rc, out, err = cli("render", "--local", "--nodes", "1", "--mem", "10G", "--", "python", "train.py")
    assert rc == 2 and "--mem" in err and "for sbatch" in err, err


@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_slurm_takes_the_rendered_resources(lab, cli, tmp_path):
    """The script goes to the real sbatch (held, so it never runs): Slurm records every
    resource and site line as the job's own."""
    rc, out, err = cli("render", "--nodes", "1", "--gpus-per-node", "1", *[a for a in ARGS if a != "fast&big"
                                                                          and a != "--constraint"],
                       "--", "python", "train.py")
    assert rc == 0, err
    script = tmp_path / "job.sh"
    script.write_text(out)
    res = lab.cmd("sbatch", "--parsable", "--hold", str(script))
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    try:
        info = lab.cmd("scontrol", "show", "job", "-o", job).stdout
        fields = dict(kv.split("=", 1) for kv in info.split() if "=" in kv)
        assert fields["Comment"] == "site-rule" and fields["Requeue"] == "1", info
        assert fields["MinMemoryNode"] == "100M" and fields["MinCPUsNode"] == "2", info
        assert fields["OverSubscribe"] == "NO", info  # --exclusive
    finally:
        lab.cmd("scancel", job)
