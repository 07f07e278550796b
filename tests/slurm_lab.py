"""A real Slurm cluster on this machine for the tests (Debian's Slurm 22.05, multiple-slurmd
build): munge, slurmctld and four slurmd "nodes" with four fake GPUs each, all state in
one temporary directory, torn down whatever happens (the pitfalls met are in the comments
below). Needs root and the Debian packages (.ci/run
installs them)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
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
SchedulerParameters={sched}
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
NodeName=n[1-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{node_port}-{node_port_end}] CPUs={cpus} RealMemory=1000000 Gres=gpu:{gpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


# The lab's ports: a block of BLOCK from PORT_LOW up, aligned, below Linux's ephemeral
# range (32768 up, where srun, slurmstepd and gloo listen): slurmctld on the first, the
# slurmds on the next NODES, the rest for the jobs' rendezvous (job_ports). A block is
# taken only when all of it is free, and slurmctld holding its first port keeps another
# lab from taking any of it (labs of other test runs on this machine, at the same time).
BLOCK, PORT_LOW, PORT_HIGH = 50, 17000, 30000
START_TRIES = 5
CLASH = "Address already in use"  # what slurmctld and slurmd log when their bind fails


class PortClash(RuntimeError):
    """A daemon could not bind its port: something took it after the probe."""


class DaemonDied(RuntimeError):
    """A daemon went away at its start for another reason: its pid file names a process that
    is gone (or a zombie). start() tries a clean start once more where the dead daemon logged
    nothing fatal (a crash that says why, the SPANK plugin's included, is the error at once),
    keeps the first try's logs, and a second death is the error. (The "slurmd-n4 died" of
    loaded CI runs, a log ending just before "slurmd started on", was no death: the check read
    the pid file in the instant slurmd's create_pidfile() had opened it with O_TRUNC and not
    yet written the pid, and took the empty file for a dead daemon; see _pid.)"""

    def __init__(self, msg: str, fatal: bool):
        super().__init__(msg)
        self.fatal = fatal


def _free_port_block(skip: set[int] = frozenset()) -> int:
    """The first block whose ports are all free now (a probe: the daemons bind later, so
    start() checks that they did and tries another block when one did not). Bound, not probed,
    is not open to this lab: slurmctld and slurmd take their ports from slurm.conf and bind
    them themselves (Debian's Slurm has no socket activation and inherits no listening fd),
    so a socket the test held would make their own bind fail."""
    for base in range(PORT_LOW, PORT_HIGH, BLOCK):
        if base in skip:
            continue
        ok = True
        for p in range(base, base + BLOCK):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block for the Slurm lab")


SCHED = "batch_sched_delay=0"


class SlurmLab:
    def __init__(self, root: Path, plugstack: str = "", nodes: int = NODES, gpus: int = GPUS, cpus: int = 2,
                 sched: str = SCHED, switches: int = 0):
        """The defaults are the lab the suite shares. Other labs (the simulator's cross-check,
        tests/test_sim_slurm.py): `nodes` of `gpus` fake GPUs and `cpus` CPUs each, `sched`
        as SchedulerParameters, and with switches > 0 a topology/tree of that many leaf
        switches ("racks") over consecutive equal blocks of nodes."""
        self.nodes, self.gpus, self.cpus, self.sched, self.switches = nodes, gpus, cpus, sched, switches
        self.lab = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.lab / "etc" / "slurm.conf"
        self.plugstack = plugstack
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.sock = self.lab / "run/munge/munge.socket.2"
        self.procs_started = False
        self._watch = None  # (the watchdog, the pipe's write end): see _start_watchdog

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
        self._start_watchdog()
        subprocess.run(["munged", f"--key-file={key}", f"--socket={self.sock}", f"--pid-file={lab}/run/munged.pid",
                        f"--log-file={lab}/log/munged.log", f"--seed-file={lab}/run/munge.seed"],
                       check=True, capture_output=True)
        self.procs_started = True
        for i in range(self.gpus):
            link = lab / "dev" / f"gpu{i}"
            if not link.exists():
                link.symlink_to("/dev/null")
        (lab / "etc/gres.conf").write_text(f"AutoDetect=off\nNodeName=n[1-{self.nodes}] Name=gpu "
                                          f"File={lab}/dev/gpu[0-{self.gpus - 1}]\n")
        self.write_plugstack(self.plugstack)
        tried: set[int] = set()
        died = None
        for _ in range(START_TRIES):
            base = _free_port_block(tried)
            tried.add(base)
            try:
                self._start_slurm(base, timeout)
                return self
            except PortClash:
                self._stop_slurm()  # ours only (pid files); then the next free block
            except DaemonDied as e:
                if died or e.fatal:
                    raise RuntimeError(f"{e}" + (f"\n(the first start's death, before a clean retry: {died})"
                                                 if died else "")) from e
                died = str(e).splitlines()[0]
                print(f"{e}\n(starting the lab again; these logs are kept in {self.lab / 'log-first-start'})",
                      file=sys.stderr)
                shutil.copytree(self.lab / "log", self.lab / "log-first-start", dirs_exist_ok=True)
                self._stop_slurm()
        raise RuntimeError(f"Slurm lab: ports taken under it {START_TRIES} times (blocks {sorted(tried)})"
                           + (f"; before them: {died}" if died else ""))

    def _start_slurm(self, base: int, timeout: float) -> None:
        """slurmctld and the slurmds on the port block at base, each checked to be up: ping
        answers UP only with our munge key (a daemon of another lab on the port cannot),
        and the nodes go idle only when our slurmds registered; a daemon that died on a
        bind failure raises PortClash at once."""
        lab = self.lab
        self.port_base, self._next_job_port = base, base + self.nodes + 1
        self.conf.write_text(SLURM_CONF.format(host=self.host, lab=lab, ctld_port=base, node_port=base + 1,
                                               node_port_end=base + self.nodes, nodes=self.nodes, gpus=self.gpus,
                                               cpus=self.cpus, sched=self.sched) + self._topology())
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env, capture_output=True)
        # a short timeout: a ping held by whatever took the port would wait out MessageTimeout
        self._wait(lambda: self.cmd("scontrol", "ping", timeout=3).stdout.find("UP") >= 0, timeout, "slurmctld",
                   daemons=["slurmctld"])
        for n in range(1, self.nodes + 1):
            (lab / f"state/slurmd-n{n}").mkdir(parents=True, exist_ok=True)
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", f"n{n}"], check=True, env=self.env,
                           capture_output=True)
        self._wait(lambda: self.cmd("sinfo", "-h", "-t", "idle", "-o", "%D").stdout.strip() == str(self.nodes),
                   timeout, "four idle nodes" if self.nodes == 4 else f"{self.nodes} idle nodes",
                   daemons=["slurmctld", *(f"slurmd-n{n}" for n in range(1, self.nodes + 1))])

    def _topology(self) -> str:
        """With switches: topology.conf (leaf switch s1 over the first block of nodes, ...)
        and the slurm.conf line that loads it; nothing for the shared lab."""
        if not self.switches:
            return ""
        per = self.nodes // self.switches
        lines = [f"SwitchName=s{k + 1} Nodes=n[{k * per + 1}-{(k + 1) * per}]" for k in range(self.switches)]
        lines.append(f"SwitchName=top Switches=s[1-{self.switches}]")
        (self.lab / "etc/topology.conf").write_text("\n".join(lines) + "\n")
        return "TopologyPlugin=topology/tree\n"

    def _daemon_failed(self, names: list[str]) -> None:
        """PortClash when one of these daemons (pid file and log named after it) is gone
        after a bind failure; RuntimeError when it is gone otherwise."""
        for name in names:
            pid = self._pid(name)
            state = None
            if pid is not None:
                try:  # alive unless gone or a zombie (this machine's init may not reap them)
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    state = "gone"
                if state not in ("Z", "X", "gone"):
                    continue
            log = self.lab / "log" / f"{name}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if CLASH in text:
                raise PortClash(f"{name}: {CLASH}")
            if pid is not None:
                raise DaemonDied(f"Slurm lab: {name} died (pid {pid} from its pid file: "
                                 f"{'a zombie' if state in ('Z', 'X') else 'no such process'}); logs in "
                                 f"{self.lab / 'log'}:\n" + self.logs(), fatal=" fatal:" in text)

    def _pid(self, name: str) -> int | None:
        """The pid in the daemon's pid file; None while there is none: not made yet, or made
        and still empty. Slurm's create_pidfile() opens the file with O_CREAT|O_TRUNC and
        writes the pid after; slurmd makes it late in its start, after it bound its port, and
        long after the `slurmd` command returned (it daemonizes first): on a loaded machine the
        first check of the last slurmd started read that empty file (reproduced: 1 of 20 lab
        starts with three busy loops beside them; tests/test_slurm_lab_start.py)."""
        try:
            text = (self.lab / "run" / f"{name}.pid").read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def _stop_slurm(self) -> None:
        """Kill this lab's slurmctld and slurmds (munged stays) and clear what they left, so
        that the next try starts clean."""
        for pidfile in (self.lab / "run").glob("slurm*.pid"):
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ValueError, OSError):
                pass
            pidfile.unlink(missing_ok=True)
        # and one whose pid file was not written yet (_pid): a daemon of this conf, by its command line
        for pid in _lab_processes(self.lab):
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
                if os.path.basename(argv0) in (b"slurmctld", b"slurmd"):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)
        for d in [self.lab / "state/ctld", *self.lab.glob("state/slurmd-*")]:
            shutil.rmtree(d, ignore_errors=True)
        (self.lab / "state/ctld").mkdir(parents=True, exist_ok=True)
        for log in (self.lab / "log").glob("slurm*.log"):
            log.unlink()

    def job_ports(self, n: int) -> int:
        """The first of n ports of the lab's block that no other job of this lab used (a
        rendezvous: torchrun's agent joins whatever store listens on its port, so one of
        another lab's or an earlier job's would mix the runs)."""
        first = self._next_job_port
        if first + n > self.port_base + BLOCK:
            raise RuntimeError(f"Slurm lab: its port block has no {n} ports left for jobs")
        self._next_job_port += n
        return first

    def write_plugstack(self, text: str) -> None:
        (self.lab / "etc/plugstack.conf").write_text(text + ("\n" if text and not text.endswith("\n") else ""))

    def _wait(self, ok, timeout, what, daemons=()):
        t0 = time.time()
        while time.time() - t0 < timeout:
            self._daemon_failed(list(daemons))
            try:
                if ok():
                    return
            except (OSError, subprocess.TimeoutExpired):
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
    def job_processes(self, job_id: str, node: str | None = None) -> list[tuple[int, int]]:
        """(pid, parent pid) of every process of this lab's job `job_id` (on `node`, or any):
        found by the SLURM_JOB_ID, SLURMD_NODENAME and SLURM_CONF in their environment (all
        "nodes" share this machine, and so may other labs, whose job ids are the same
        numbers: SLURM_CONF tells them apart)."""
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                raw = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
                env = dict(kv.split(b"=", 1) for kv in raw if b"=" in kv)
                if (env.get(b"SLURM_JOB_ID") != job_id.encode() or env.get(b"SLURM_CONF") != bytes(self.conf)
                        or (node is not None and env.get(b"SLURMD_NODENAME") != node.encode())):
                    continue
                out.append((int(p), int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile, or not ours to read
        return out

    def kill_node(self, node: str, job_id: str, mark_down: bool = True) -> None:
        """What losing node `node` does to job `job_id`: its slurmd, the job's slurmstepd
        there and every process of the job on it die at once (SIGKILL): the processes
        job_processes finds, and slurmstepd as their parent. mark_down: also tell slurmctld,
        which would otherwise notice after SlurmdTimeout (30 s) and its next ping."""
        tasks, steps = [], set()
        for pid, ppid in self.job_processes(job_id, node):
            tasks.append(pid)
            try:
                if Path(f"/proc/{ppid}/cmdline").read_bytes().startswith(b"slurmstepd"):
                    steps.add(ppid)
            except OSError:
                continue
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
        """Everything of this lab ended: jobs cancelled and the daemons shut down, then
        whatever is left killed (reap). Safe after a start() that failed anywhere."""
        if self.procs_started:
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
        reap(self.lab, spare={self._watch[0].pid} if self._watch else set())
        if self._watch:  # stopped: the watchdog has nothing left to do
            proc, fd = self._watch
            self._watch = None
            try:
                os.write(fd, b"s")
            finally:
                os.close(fd)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def _start_watchdog(self) -> None:
        """A process of its own session that ends the lab when the test run ends without
        stop(): a SIGKILL, a crash, a worker killed by xdist. It waits on a pipe whose only
        write end this process holds (close-on-exec, so no daemon inherits it); end of file
        without stop()'s byte means the run is gone: it reaps the lab and removes its
        directory. Ctrl-C and a timeout's SIGTERM end the run through the fixtures' teardown
        (tests/conftest.py) instead, which calls stop()."""
        r, w = os.pipe()
        try:
            proc = subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), "--watch", str(self.lab),
                                     str(r)], pass_fds=(r,), start_new_session=True, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._watch = (proc, w)


# Lines that name an error in every job's output, passing or not, and so say nothing of a
# failure (issue 52: the first was read as the cause of a failed TorchTitan job, whose real
# cause the tail had cut off). torchrun's agents: after the exit barrier the agent that hosts
# the c10d store may exit before another agent closes the rendezvous, whose close then fails;
# torch catches that (DynamicRendezvousHandler.shutdown) and the job ends 0. TorchTitan: no lspci.
BENIGN = (re.compile(r"has failed to shutdown the rendezvous .* RendezvousConnectionError"),
          re.compile(r"Error running lspci"))


def failure_excerpt(text: str, lines: int = 40, tail: int = 3000, path: Path | None = None) -> str:
    """What a failed job's output says first and last: the lines that name an error (the
    first rank's cause comes before the others' reports of it, which fill the tail), less
    BENIGN's, then the tail; and where the whole output is (pytest keeps its tmp_path)."""
    first = [ln for ln in text.splitlines() if re.search(r"Error|error:|Traceback|exit code|Exception|Signal", ln)
             and not any(b.search(ln) for b in BENIGN)]
    where = f"the whole output: {path}\n" if path else ""
    return where + "\n".join(first[:lines]) + "\n...\n" + text[-tail:]


def _lab_processes(lab: Path, spare: set[int] = frozenset()) -> set[int]:
    """Every process of the lab at `lab`: the ones whose command line names its directory
    (munged, slurmctld, the slurmds) or whose SLURM_CONF lies in it (slurmstepd and the
    jobs, which inherit it from slurmd or sbatch), and all their descendants; not this
    process, its ancestors or `spare`."""
    prefix = str(lab).rstrip("/") + "/"
    mine = {os.getpid(), *spare}
    p = os.getpid()
    while p > 1:
        try:
            p = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        mine.add(p)
    seeds, parent = set(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] in "ZX":  # already dead (a zombie holds no port or CPU)
                continue
            parent[pid] = int(stat[1])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        conf = next((kv[len(b"SLURM_CONF="):] for kv in env if kv.startswith(b"SLURM_CONF=")), b"")
        if prefix.encode() in cmdline or conf.startswith(prefix.encode()):
            seeds.add(pid)
    found, grew = set(seeds), True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in found and pid not in found}
        found |= more
        grew = bool(more)
    return found


def reap(lab: Path, spare: set[int] = frozenset(), rounds: int = 20) -> None:
    """SIGKILL every process of the lab (_lab_processes) until none is left (a job may fork
    while it is killed)."""
    for _ in range(rounds):
        left = _lab_processes(lab, spare)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def _watch(lab: Path, fd: int) -> None:
    """The watchdog's body (SlurmLab._start_watchdog)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # not ended before the lab it guards
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    data = os.read(fd, 1)
    reap(lab)
    if not data:  # the run is gone without stop(): its directory goes too
        shutil.rmtree(lab, ignore_errors=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    _watch(Path(sys.argv[2]), int(sys.argv[3]))
