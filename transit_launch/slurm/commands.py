"""Slurm through its commands (sbatch, squeue, scontrol, sinfo, sacct, scancel) with
parsable output, the way submitit does. pyslurm is only an optional adapter for sites
whose Slurm matches the pyslurm release (PyPI has 25.11 only; see pyslurm_backend)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from transit_launch.errors import UsageError


class NoSlurm(UsageError):
    """Slurm cannot be used from here: its commands are missing or no controller answers
    (a dry run may go on without it; an unknown partition is a different error)."""


def _call(args: list[str], input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = shutil.which(args[0])
    if not exe:
        raise NoSlurm(f"{args[0]} not found: is this a Slurm login node? (transit-launch doctor)")
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):  # Slurm's commands wait 60 s for it to appear, then fail
        raise NoSlurm(f"SLURM_CONF={conf}: no such file ({args[0]} would wait a minute for it); point it at the "
                      "cluster's slurm.conf or unset it")
    try:
        return subprocess.run([exe, *args[1:]], capture_output=True, text=True, input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{args[0]} did not answer in {timeout:.0f} s") from None


def _failure(args: list[str], res: subprocess.CompletedProcess) -> UsageError:
    msg = res.stderr.strip().splitlines()
    return UsageError(f"{args[0]} failed: {msg[-1] if msg else f'exit code {res.returncode}'}")


def _run(args: list[str], input: str | None = None, timeout: float = 60) -> str:
    res = _call(args, input, timeout)
    if res.returncode != 0:
        raise _failure(args, res)
    return res.stdout


# What scontrol and scancel say about a job id the controller does not know.
# (scontrol 22.05 answers an array task that is not there with "Job 123_4 not found", on stdout)
_NO_JOB = re.compile(r"Invalid job id specified|Invalid job id|Job \S+ not found", re.I)


@dataclass
class Partition:
    name: str
    nodes: int
    gpus_per_node: int
    real_memory_mb: int
    default: bool = False
    cpus_per_node: int = 0  # the fewest CPUs a node of it has (0: not reported)
    gpu_types: tuple = ()   # the GRES types of its GPUs ('a100' of gpu:a100:8); () when untyped


_GRES_GPU = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


_GRES_TYPE = re.compile(r"gpu:([^:,()]+):\d+")


def gpu_types_from_gres(gres: str) -> set:
    """'gpu:a100:8(S:0-1),gpu:h100:4' -> {'a100', 'h100'}; 'gpu:4' -> set() (untyped)."""
    return set(_GRES_TYPE.findall(gres or ""))


def gpus_from_gres(gres: str) -> int:
    """'gpu:4', 'gpu:h100:8(S:0-1)', 'gpu:a100:4,shard:8' -> GPUs per node (0 if none)."""
    return sum(int(m.group(1)) for m in _GRES_GPU.finditer(gres or ""))


def partitions() -> list[Partition]:
    """One row per partition and node configuration; the smallest GPU count and memory
    per partition win (a job must fit on every node it may get)."""
    args = ["sinfo", "-h", "-N", "-o", "%P|%N|%G|%m|%c"]
    res = _call(args)
    if res.returncode != 0:
        raise NoSlurm(str(_failure(args, res)))
    out = res.stdout
    parts: dict[str, Partition] = {}
    seen: dict[str, set] = {}
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4:  # a sinfo that does not know %c
            fields.append("0")
        if len(fields) != 5:
            continue
        pname, node, gres, mem, cpus = fields
        cpus_n = int(cpus.rstrip("+")) if cpus.rstrip("+").isdigit() else 0
        default = pname.endswith("*")
        pname = pname.rstrip("*")
        try:
            mem_mb = int(mem.rstrip("+"))
        except ValueError:
            mem_mb = 0
        g = gpus_from_gres(gres)
        if pname not in parts:
            parts[pname] = Partition(pname, 0, g, mem_mb, default)
            seen[pname] = set()
        p = parts[pname]
        if node not in seen[pname]:
            seen[pname].add(node)
            p.nodes += 1
            p.gpus_per_node = min(p.gpus_per_node, g) if p.nodes > 1 else g
            p.real_memory_mb = min(p.real_memory_mb, mem_mb) if p.nodes > 1 else mem_mb
            p.cpus_per_node = min(p.cpus_per_node, cpus_n) if p.nodes > 1 else cpus_n
            p.gpu_types = tuple(sorted(set(p.gpu_types) | gpu_types_from_gres(gres)))
    return list(parts.values())


def partition(name: str | None) -> Partition:
    parts = partitions()
    if not parts:
        raise UsageError("sinfo reports no partitions")
    if name:
        for p in parts:
            if p.name == name:
                return p
        raise UsageError(f"no partition {name!r}; known: {', '.join(p.name for p in parts)}")
    return next((p for p in parts if p.default), parts[0])


def submit(script: str, extra: list[str] | None = None) -> str:
    """sbatch the script text from stdin; returns the job id."""
    out = _run(["sbatch", "--parsable", *(extra or [])], input=script)
    return out.strip().split(";")[0]


def check_job_id(job_id: str) -> None:
    """A job id (or array task 123_4) before it reaches a command line: ASCII digits only
    (re's \\d takes any script's digits), and no id 0 or leading zero (Slurm's start at 1)."""
    if not re.fullmatch(r"[1-9][0-9]*(_[0-9]+)?", job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (a positive integer, or an array task such as 123_4)")


def parse_scontrol_job(text: str) -> dict:
    """`scontrol show job -o` -> its key=value fields."""
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Elapsed")


def parse_sacct_job(text: str) -> dict | None:
    """The first row of `sacct -X -n --parsable2 -o SACCT_FIELDS` in scontrol's names, or None."""
    line = next((l for l in text.splitlines() if l.strip()), "")
    if not line:
        return None
    jid, name, state, code, nodes, elapsed = (line.split("|") + [""] * 6)[:6]
    return {"JobId": jid, "JobName": name, "JobState": state.split()[0] if state.split() else "",
            "ExitCode": code, "NodeList": nodes, "RunTime": elapsed}


def job_owner(job_id: str) -> dict | None:
    """The fields others act on (JobId, UserId, JobState, WorkDir) from squeue's fixed
    columns, the free-form work directory last; None when squeue does not know the job.
    scontrol's Key=Value line cannot be trusted for them: a job's name or comment may hold
    ' UserId=... WorkDir=...' of its owner's choosing."""
    import pwd
    if not shutil.which("squeue"):
        return None
    res = _call(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i %U %T %Z"])
    line = next((ln for ln in res.stdout.splitlines() if ln.strip()), "") if res.returncode == 0 else ""
    parts = line.split(" ", 3)
    if len(parts) != 4 or parts[0] != job_id or not parts[1].isdigit():
        return None
    uid = int(parts[1])
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"JobId": parts[0], "UserId": f"{name}({uid})", "JobState": parts[2], "WorkDir": parts[3]}


def job_info(job_id: str) -> dict:
    """scontrol's view of the job (key=value) with squeue's JobId, UserId, JobState and
    WorkDir over it (job_owner), or sacct's once it has left the controller; "no such job"
    when neither knows it."""
    check_job_id(job_id)
    args = ["scontrol", "show", "job", "-o", job_id]
    res = _call(args)
    if res.returncode == 0 and parse_scontrol_job(res.stdout):
        info = parse_scontrol_job(res.stdout)
        owner = job_owner(job_id)
        if owner is None:  # nothing of the free-form fields is taken for the job's owner or place
            for k in ("UserId", "WorkDir"):
                info.pop(k, None)
        return {**info, **(owner or {})}
    if res.returncode != 0 and not _NO_JOB.search(res.stderr + res.stdout):
        raise _failure(args, res)  # the controller is down, not the job unknown
    if shutil.which("sacct"):  # a job that ended before MinJobAge is gone from scontrol
        acct = _call(["sacct", "-j", job_id, "-X", "-n", "--parsable2", "-o", ",".join(SACCT_FIELDS)])
        row = parse_sacct_job(acct.stdout) if acct.returncode == 0 else None
        if row:
            return row
    raise UsageError(f"no such job {job_id}")


def job_uid(info: dict) -> int:
    """The job's user as a uid, from scontrol's UserId=NAME(UID)."""
    m = re.fullmatch(r".*\((\d+)\)", info.get("UserId", ""))
    if not m:
        raise UsageError(f"scontrol gave no user id for job {info.get('JobId', '?')} (UserId={info.get('UserId')!r})")
    return int(m.group(1))


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")


def cancel(job_id: str) -> None:
    """scancel, after asking whether there is such a job: scancel exits 0, silently, for a
    job id the controller does not know."""
    state = job_info(job_id).get("JobState", "")
    if state in ENDED:
        raise UsageError(f"job {job_id} has already ended ({state})")
    args = ["scancel", job_id]
    res = _call(args)
    if _NO_JOB.search(res.stderr):
        raise UsageError(f"no such job {job_id}")
    if res.returncode != 0 or "error" in res.stderr.lower():
        raise _failure(args, res)


def pyslurm_backend():
    """pyslurm, when it imports and was built for the running Slurm; else None. PyPI only
    ships 25.11, which no Slurm installable on our test machines matches, so this path is
    not tested here: it only reads partitions, everything else goes through commands."""
    try:
        import pyslurm  # noqa: F401
    except ImportError:
        return None
    try:
        version = _run(["sinfo", "--version"]).split()[-1]
    except UsageError:
        return None
    if not getattr(pyslurm, "__version__", "").startswith(".".join(version.split(".")[:2])):
        return None
    return pyslurm
