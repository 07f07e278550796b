"""A real Slurm cluster on this machine for the tests (Debian's Slurm 22.05, multiple-slurmd
build): munge, slurmctld and four slurmd "nodes" with four fake GPUs each, all state in
one temporary directory, torn down whatever happens. Recipe and pitfalls:
../shared/notes/slurm-test-cluster.md. Needs root and the Debian packages (.ci/run
installs them)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

NODES = 4
GPUS = 4
PACKAGES = ("slurmctld", "slurmd", "sbatch", "munged", "mungekey", "munge", "unmunge")


def missing() -> str | None:
    """Why the lab cannot start here, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd and munged run as root in the test cluster)"
    absent = [p for p in PACKAGES if not shutil.which(p) and not Path("/usr/sbin", p).exists()]
    if absent:
        return f"needs Debian's Slurm and munge packages (missing {', '.join(absent)}; .ci/run installs them)"
    if not Path("/usr/include/slurm/spank.h").exists():
        return "needs libslurm-dev (spank.h)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "slurmd 22.05 needs a cgroup filesystem at /sys/fs/cgroup"
    return None


SLURM_CONF = """ClusterName=lab
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={lab}/run/munge/munge.socket.2
StateSaveLocation={lab}/state/ctld
SlurmdSpoolDir={lab}/state/slurmd-%n
SlurmctldPidFile={lab}/run/slurmctld.pid
SlurmdPidFile={lab}/run/slurmd-%n.pid
SlurmctldLogFile={lab}/log/slurmctld.log
SlurmdLogFile={lab}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
PlugStackConfig={lab}/etc/plugstack.conf
GresTypes=gpu
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=n[1-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{node_port}-{node_port_end}] CPUs=2 RealMemory=2000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _free_port_block(n: int) -> int:
    """A base port with n free ports after it (the lab must not clash with a stale one)."""
    for base in range(17000, 30000, 50):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block for the Slurm lab")


class SlurmLab:
    def __init__(self, root: Path, plugstack: str = ""):
        self.lab = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.lab / "etc" / "slurm.conf"
        self.plugstack = plugstack
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs_started = False

    # --- bring-up ---------------------------------------------------------------
    def start(self, timeout: float = 60) -> "SlurmLab":
        lab = self.lab
        os.chmod(lab, 0o755)  # munged wants a+x on every directory above its socket
        for d in ("etc/munge", "log", "state/ctld", "dev", "jobs", "run/munge"):
            (lab / d).mkdir(parents=True, exist_ok=True)
        os.chmod(lab / "etc/munge", 0o700)
        os.chmod(lab / "run/munge", 0o755)
        key = lab / "etc/munge/munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        os.chmod(key, 0o600)
        self.sock = lab / "run/munge/munge.socket.2"
        subprocess.run(["munged", f"--key-file={key}", f"--socket={self.sock}", f"--pid-file={lab}/run/munged.pid",
                        f"--log-file={lab}/log/munged.log", f"--seed-file={lab}/run/munge.seed"],
                       check=True, capture_output=True)
        self.procs_started = True
        for i in range(GPUS):
            link = lab / "dev" / f"gpu{i}"
            if not link.exists():
                link.symlink_to("/dev/null")
        base = _free_port_block(NODES + 1)
        self.conf.write_text(SLURM_CONF.format(host=self.host, lab=lab, ctld_port=base, node_port=base + 1,
                                               node_port_end=base + NODES, nodes=NODES, gpus=GPUS))
        (lab / "etc/gres.conf").write_text(f"AutoDetect=off\nNodeName=n[1-{NODES}] Name=gpu File={lab}/dev/gpu[0-{GPUS - 1}]\n")
        self.write_plugstack(self.plugstack)
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env, capture_output=True)
        self._wait(lambda: self.cmd("scontrol", "ping").stdout.find("UP") >= 0, timeout, "slurmctld")
        for n in range(1, NODES + 1):
            (lab / f"state/slurmd-n{n}").mkdir(parents=True, exist_ok=True)
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", f"n{n}"], check=True, env=self.env,
                           capture_output=True)
        self._wait(lambda: self.cmd("sinfo", "-h", "-t", "idle", "-o", "%D").stdout.strip() == str(NODES),
                   timeout, "four idle nodes")
        return self

    def write_plugstack(self, text: str) -> None:
        (self.lab / "etc/plugstack.conf").write_text(text + ("\n" if text and not text.endswith("\n") else ""))

    def _wait(self, ok, timeout, what):
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                if ok():
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Slurm lab: {what} not up after {timeout} s; logs in {self.lab / 'log'}:\n"
                           + self.logs())

    def logs(self) -> str:
        out = []
        for p in sorted((self.lab / "log").glob("*.log")):
            out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    # --- use ----------------------------------------------------------------------
    def cmd(self, *args, input=None, env=None, timeout=60):
        return subprocess.run(args, capture_output=True, text=True, env=env or self.env, input=input,
                              timeout=timeout, cwd=self.lab / "jobs")

    def wait_job(self, job_id: str, timeout: float = 60) -> dict:
        """Poll scontrol (sbatch --wait backs off to 10 s and more) until the job ends."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            res = self.cmd("scontrol", "show", "job", "-o", job_id)
            fields = dict(kv.split("=", 1) for kv in res.stdout.split() if "=" in kv)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return fields
            time.sleep(0.2)
        raise RuntimeError(f"job {job_id} did not finish in {timeout} s:\n{self.logs()}")

    # --- node loss ------------------------------------------------------------------
    def kill_node(self, node: str, job_id: str, mark_down: bool = True) -> None:
        """What losing node `node` does to job `job_id`: its slurmd, the job's slurmstepd
        there and every process of the job on it die at once (SIGKILL). The processes are
        found by the SLURMD_NODENAME and SLURM_JOB_ID in their environment (all "nodes"
        share this machine); slurmstepd as their parent. mark_down: also tell slurmctld,
        which would otherwise notice after SlurmdTimeout (30 s) and its next ping."""
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        tasks, steps = [], set()
        for pid in pids:
            try:
                raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                env = dict(kv.split(b"=", 1) for kv in raw if b"=" in kv)
                if env.get(b"SLURMD_NODENAME") != node.encode() or env.get(b"SLURM_JOB_ID") != job_id.encode():
                    continue
                tasks.append(pid)
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if Path(f"/proc/{ppid}/cmdline").read_bytes().startswith(b"slurmstepd"):
                    steps.add(ppid)
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or not ours to read
        slurmd = int((self.lab / "run" / f"slurmd-{node}.pid").read_text().strip())
        for pid in [slurmd, *steps, *tasks]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if mark_down:
            res = self.cmd("scontrol", "update", f"nodename={node}", "state=down", "reason=node-loss-test")
            assert res.returncode == 0, res.stderr

    def revive_node(self, node: str, timeout: float = 60) -> None:
        """Start the node's slurmd again and wait until it is idle (ReturnToService=2
        brings a DOWN node back when its slurmd registers)."""
        subprocess.run(["slurmd", "-f", str(self.conf), "-N", node], check=True, env=self.env, capture_output=True)

        def idle():
            state = self.cmd("sinfo", "-h", "-n", node, "-o", "%t").stdout.strip()
            if state.startswith("down") and not state.endswith("*"):  # registered, but still marked down
                self.cmd("scontrol", "update", f"nodename={node}", "state=resume")
            return state == "idle"
        self._wait(idle, timeout, f"node {node} back")

    # --- teardown -------------------------------------------------------------------
    def stop(self) -> None:
        if not self.procs_started:
            return
        try:
            self.cmd("scancel", "-u", "root", timeout=10)
            self.cmd("scontrol", "shutdown", timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        time.sleep(0.5)
        try:
            subprocess.run(["munged", "--stop", f"--socket={self.sock}"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pidfile in (self.lab / "run").glob("*.pid"):
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError, OSError):
                pass
