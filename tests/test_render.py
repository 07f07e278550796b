"""Rendered sbatch scripts and torchrun commands: golden files, and the script run
against stand-ins for srun/scontrol that record what they were asked to do."""

import os
import stat
import subprocess

import pytest

from tests.conftest import check_golden
from transit_launch.preload.inject import ALLOC_CONF, PASS_THROUGH, shim_env
from transit_launch.slurm.render import torchrun_tail

SHIM = "/opt/transit/lib/libtransit.so"
ADAPTER = "/opt/transit/adapter"
CLEAN = {k: None for k in PASS_THROUGH} | {"TRANSIT_SHIM": "", "TRANSIT_ADAPTER_DIR": ADAPTER}  # no shim
TITAN = ["--", "python", "-m", "torchtitan.train", "--job.config_file", "llama3_70b.toml"]


def test_sbatch_golden_with_shim(cli):
    rc, out, err = cli("render", "--model", "llama3-70b", "--global-batch", "240", "--partition", "gpu",
                       "--time", "04:00:00", *TITAN,
                       env=CLEAN | {"TRANSIT_SHIM": SHIM, "NCCL_NVLS_ENABLE": "0"})
    assert rc == 0, err
    check_golden("sbatch_llama3_70b.sh", out)


def test_sbatch_golden_without_shim(cli):
    rc, out, err = cli("render", "--nodes", "3", "--gpus-per-node", "8", "--policy", "prefetch",
                       "--gpu-budget", "40GB", "--stats", "/scratch/stats", "--log", "info",
                       "--account", "proj1", "--", "./train.sh", "--steps", "10", env=CLEAN)
    assert rc == 0
    assert "libtransit.so is not installed" in err  # told once on stderr, and in the script
    check_golden("sbatch_no_shim.sh", out)


def test_local_golden(cli):
    rc, out, err = cli("render", "--local", "--gpus-per-node", "1", "--policy", "advise", "--gpu-budget", "40GB",
                       "--", "python", "examples/train.py", "--steps", "20",
                       env=CLEAN | {"TRANSIT_SHIM": SHIM, "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"})
    assert rc == 0, err
    check_golden("local_advise.txt", out)


def test_render_to_file(cli, tmp_path):
    dest = tmp_path / "job.sbatch"
    rc, out, err = cli("render", "--model", "llama3-8b", "-o", str(dest), *TITAN, env=CLEAN)
    assert rc == 0 and out == "" and f"wrote {dest}" in err
    assert dest.read_text().startswith("#!/bin/bash\n")


@pytest.mark.parametrize("cmd,tail", [
    (["python", "train.py", "--x"], ["train.py", "--x"]),
    (["python3.12", "-m", "torchtitan.train"], ["-m", "torchtitan.train"]),
    (["/usr/bin/python3", "-u", "x.py"], ["--no-python", "/usr/bin/python3", "-u", "x.py"]),
    (["./job.sh", "a b"], ["--no-python", "./job.sh", "a b"]),
    # a named interpreter is kept (it was dropped: torchrun's own Python ran the script)
    (["/opt/venv/bin/python", "train.py"], ["--no-python", "/opt/venv/bin/python", "train.py"]),
    # the user's own torchrun is adopted, not nested inside the script's
    (["torchrun", "--nproc-per-node", "4", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    (["torchrun", "--nproc_per_node=4", "--standalone", "-m", "torchtitan.train"], ["-m", "torchtitan.train"]),
    (["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node=4", "x.py"], ["x.py"]),
    (["torchrun", "--no-python", "./job.sh"], ["--no-python", "./job.sh"]),
])
def test_torchrun_tail(cmd, tail):
    assert torchrun_tail(cmd, 4) == tail


@pytest.mark.parametrize("cmd,why", [
    (["torchrun", "--nproc-per-node", "8", "train.py"], "torchrun --nproc-per-node 8: the plan runs 4 GPUs a node"),
    (["torchrun", "--nnodes", "2", "train.py"], "the command's torchrun option --nnodes: the script runs torchrun"),
    (["torchrun", "--rdzv-endpoint=h:1", "train.py"], "torchrun option --rdzv-endpoint"),
    (["torchrun", "--nproc-per-node"], "has no value"),
    (["torchrun", "--standalone"], "names no training script"),
    (["python", "-m", "torch.distributed.launch", "x.py"], "torch.distributed.launch (deprecated)"),
])
def test_a_users_torchrun_that_contradicts_the_plan_is_one_line(cli, cmd, why):
    rc, out, err = cli("render", "--model", "llama3-8b", "--nodes", "2", "--", *cmd)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and why in err, (rc, err)


def test_a_users_torchrun_renders_one_torchrun(cli):
    rc, out, err = cli("render", "--model", "llama3-8b", "--nodes", "2", "--", "torchrun", "--nproc-per-node", "4",
                       "train.py", "--steps", "10")
    assert rc == 0, err
    assert out.count("srun --export=ALL torchrun") == 1 and out.count(" torchrun ") == 1
    assert "    train.py --steps 10\n" in out


def test_env_passes_multicast_vars_only_when_set():
    env = shim_env("advise", environ={"NCCL_NVLS_ENABLE": "0", "UNRELATED": "1"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and "UNRELATED" not in env
    assert "TORCH_SYMM_MEM_DISABLE_MULTICAST" not in env
    assert env["PYTORCH_ALLOC_CONF"] == ALLOC_CONF == "backend:native,expandable_segments:False"


def _stub(path, body):
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_rendered_script_runs_with_slurm_stand_ins(cli, tmp_path):
    """Execute the script with scontrol/srun/torchrun stand-ins on PATH: they record
    their arguments and the environment torchrun would start the ranks with."""
    rc, script, _ = cli("render", "--model", "llama3-70b", "--nodes", "2", "--policy", "advise", *TITAN,
                        env=CLEAN | {"TRANSIT_SHIM": SHIM})
    assert rc == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    _stub(bin_dir / "scontrol", f'echo "scontrol $*" >> {log}; '
                                f'if [ "$2" = node ]; then echo "NodeName=node-a NodeAddr=10.1.0.7 State=IDLE"; '
                                f'else printf "node-a\\nnode-b\\n"; fi\n')
    _stub(bin_dir / "srun", f'echo "srun $*" >> {log}; while [[ $1 == --* ]]; do shift; done; exec "$@"\n')
    _stub(bin_dir / "torchrun", f'echo "torchrun $*" >> {log}; '
                                f'echo "LD_PRELOAD=$LD_PRELOAD TRANSIT_POLICY=$TRANSIT_POLICY '
                                f'PYTORCH_ALLOC_CONF=$PYTORCH_ALLOC_CONF" >> {log}\n')
    (tmp_path / "job.sh").write_text(script)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
           "SLURM_JOB_ID": "42", "LD_PRELOAD": "/usr/lib/libkeep.so"}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr  # stderr also has ld.so's notes on the absent libraries
    calls = log.read_text().splitlines()
    assert calls[0] == "scontrol show hostnames node-[a-b]"
    assert calls[1] == "scontrol show node node-a -o"
    assert calls[2].startswith("srun --export=ALL torchrun --nnodes 2 --nproc-per-node 4")
    assert calls[3] == ("torchrun --nnodes 2 --nproc-per-node 4 --rdzv-id 42 --rdzv-backend c10d "
                        "--rdzv-endpoint 10.1.0.7:29542 -m torchtitan.train --job.config_file llama3_70b.toml")
    # job 42's port: 29500 + 42 (no --port: from the job id, so jobs sharing a head node differ)
    assert calls[4] == (f"LD_PRELOAD={SHIM}:/usr/lib/libkeep.so TRANSIT_POLICY=advise "
                        "PYTORCH_ALLOC_CONF=backend:native,expandable_segments:False")


def _rdzv_endpoint(script: str, job_id: str, tmp_path) -> str:
    """The endpoint the script's torchrun line gets in job job_id (stand-ins for scontrol, srun)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _stub(bin_dir / "scontrol", 'if [ "$2" = node ]; then echo "NodeName=a NodeAddr=10.0.0.1"; else echo a; fi\n')
    _stub(bin_dir / "srun", 'while [[ $1 == --* ]]; do shift; done; exec "$@"\n')
    _stub(bin_dir / "torchrun", 'while [ $# -gt 0 ]; do [ "$1" = --rdzv-endpoint ] && echo "$2"; shift; done\n')
    (tmp_path / "job.sh").write_text(script)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "a", "SLURM_JOB_ID": job_id}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_rendezvous_port_comes_from_the_job_id(cli, tmp_path):
    """Two jobs whose head node is one machine must not both take torchrun's 29500: without
    --port the port is 29500 + (job id mod 1000); --port fixes it for every job."""
    rc, script, _ = cli("render", "--nodes", "1", "--policy", "off", "--", "python", "t.py", env=CLEAN)
    assert rc == 0
    assert _rdzv_endpoint(script, "7", tmp_path) == "10.0.0.1:29507"
    assert _rdzv_endpoint(script, "8", tmp_path) == "10.0.0.1:29508"
    assert _rdzv_endpoint(script, "123999", tmp_path) == "10.0.0.1:30499"  # the span's last port
    rc, script, _ = cli("render", "--nodes", "1", "--policy", "off", "--port", "31000", "--", "python", "t.py",
                        env=CLEAN)
    assert rc == 0
    assert _rdzv_endpoint(script, "7", tmp_path) == "10.0.0.1:31000"
    rc, _, err = cli("render", "--nodes", "1", "--port", "70000", "--", "python", "t.py", env=CLEAN)
    assert rc == 2 and err.count("\n") == 1 and "--port" in err


def test_overlap_goes_into_the_job(cli):
    """--overlap stream: the script exports TRANSIT_OVERLAP_STEP for the adapter; with
    policy off (nothing loads the adapter) it is refused in one line, for render and run."""
    rc, out, err = cli("render", "--local", "--gpus-per-node", "1", "--policy", "advise", "--overlap", "stream",
                       "--", "python", "train.py", env=CLEAN | {"TRANSIT_SHIM": SHIM})
    assert rc == 0, err
    assert "TRANSIT_OVERLAP_STEP=stream " in out and out.index("TRANSIT_OVERLAP_STEP") < out.index("torchrun")
    rc, out, err = cli("render", "--local", "--gpus-per-node", "1", "--policy", "advise", "--", "python", "train.py",
                       env=CLEAN | {"TRANSIT_SHIM": SHIM})
    assert rc == 0 and "TRANSIT_OVERLAP_STEP" not in out
    for args in (["render", "--nodes", "2", "--policy", "off"], ["run", "--policy", "off"]):
        rc, out, err = cli(*args, "--overlap", "stream", "--", "true", env=CLEAN)
        assert rc == 2 and out == "" and err.count("\n") == 1 and "needs a shim policy other than off" in err, err
    rc, out, err = cli("run", "--overlap", "on", "--", "true", env=CLEAN)
    assert rc == 2 and "invalid choice" in err


def test_run_gives_the_overlap_to_the_command(cli):
    rc, out, err = cli("run", "--policy", "advise", "--overlap", "host", "--", "sh", "-c",
                       "echo step=$TRANSIT_OVERLAP_STEP", env=CLEAN)
    assert rc == 0 and "step=host" in out.splitlines(), (out, err)


# --- the SPANK plugin's route (render --inject) ------------------------------------------------

# how Slurm 22.05's sbatch --help lists a SPANK plugin's options, after its own (the lab's, trimmed)
SBATCH_HELP = """Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]
      --wrap[=command string] wrap command string in a sh script and submit

Options provided by plugins:
      --transit=POLICY        run with libtransit.so: off, base, prefetch or advise
      --transit-budget=SIZE   GPU memory the transit shim lets managed data use
"""


def test_the_plugin_is_found_in_sbatchs_help():
    from transit_launch.slurm.render import offers_transit
    assert offers_transit(SBATCH_HELP)
    assert not offers_transit(SBATCH_HELP.replace("--transit=POLICY", "--transitx=POLICY"))
    assert not offers_transit("      --wrap[=command string] mentions --transit=POLICY in its text\n")


def test_inject_spank_writes_the_plugins_options_instead_of_exports(cli):
    rc, out, err = cli("render", "--nodes", "2", "--policy", "advise", "--gpu-budget", "40GB", "--stats",
                       "/scratch/stats", "--overlap", "stream", "--inject", "spank", "--", "python", "train.py",
                       env=CLEAN | {"TRANSIT_SHIM": SHIM})
    assert rc == 0, err
    assert ("#SBATCH --transit=advise\n#SBATCH --transit-budget=40GB\n#SBATCH --transit-stats=/scratch/stats\n"
            in out)
    exports = [line for line in out.splitlines() if line.startswith("export ")]
    assert exports == ["export TRANSIT_OVERLAP_STEP=stream"], exports  # the plugin has no option for it
    assert SHIM not in out and "not installed" not in err  # the site's shim, whatever this machine has
    rc, out, err = cli("render", "--nodes", "2", "--policy", "advise", "--inject", "script", "--", "python",
                       "train.py", env=CLEAN | {"TRANSIT_SHIM": SHIM})
    assert rc == 0 and "--transit" not in out and f"export LD_PRELOAD={SHIM}" in out, err


@pytest.mark.parametrize("args, said", [
    (["--local"], "--local renders a torchrun command without sbatch"),
    (["--model", "llama3-8b", "--on-node-loss", "scale-in", "--checkpoint-dir", "/ckpt"],
     "each attempt sets the shim's environment"),
    (["--stats", "/scratch/my stats"], "an #SBATCH value cannot hold whitespace"),
    # sbatch ends a value at '#' and drops '\\': the plugin would get /scratch/ab, the check saw another
    (["--stats", "/scratch/a\\b#c"], "an #SBATCH value cannot hold whitespace, quotes, '#'"),
    (["--output", "/scratch\\/x.out"], "an #SBATCH value cannot hold whitespace, quotes, '#'"),
    (["--job-name", "a#b"], "an #SBATCH value cannot hold whitespace, quotes, '#'"),
])
def test_inject_spank_where_it_cannot_work_is_one_line(cli, args, said):
    rc, out, err = cli("render", "--nodes", "1", "--policy", "advise", "--inject", "spank", *args, "--", "python",
                       "train.py", env=CLEAN)
    assert rc == 2 and out == "" and err.count("\n") == 1 and said in err, err


def test_inject_auto_exports_where_sbatch_has_no_plugin(cli, tmp_path):
    """auto without a plugin in sbatch (here: an sbatch that lists none) is the export route."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "sbatch", "echo '      --wrap[=command string] wrap command string'\n")
    rc, out, err = cli("render", "--nodes", "1", "--policy", "advise", "--", "python", "train.py",
                       env=CLEAN | {"TRANSIT_SHIM": SHIM, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert rc == 0 and "--transit" not in out and f"export LD_PRELOAD={SHIM}" in out, err
    _stub(bin_dir / "sbatch", f"cat <<'EOF'\n{SBATCH_HELP}EOF\n")
    rc, out, err = cli("render", "--nodes", "1", "--policy", "advise", "--", "python", "train.py",
                       env=CLEAN | {"TRANSIT_SHIM": SHIM, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert rc == 0 and "#SBATCH --transit=advise\n" in out and "LD_PRELOAD" not in out, err
