"""What this machine has for transit-launch: GPU, driver, managed memory, host memory,
the shim, Slurm and spank.h. Every probe degrades to "missing, because ...", or for Slurm
installed without a controller that answers, to "no answer" and which one did not."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib import util

from transit_launch.isolated import SRUN_CHDIR, transit_launch_argv
from transit_launch.preload import inject
from transit_launch.table import table

SLURM_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "sacct", "scancel")


def _item(check: str, ok: bool, detail: str, **extra) -> dict:
    return {"check": check, "ok": ok, "detail": detail, **extra}


def gpus_cuda_python() -> list[dict] | None:
    """Device list through cuda-python's runtime bindings, or None when unavailable."""
    try:
        from cuda.bindings import runtime as rt  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart as rt  # older cuda-python
        except ImportError:
            return None
    err, count = rt.cudaGetDeviceCount()
    if int(err) != 0:
        return []
    out = []
    for d in range(count):
        _, prop = rt.cudaGetDeviceProperties(d)
        _, managed = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrManagedMemory, d)
        _, concurrent = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrConcurrentManagedAccess, d)
        out.append({"index": d, "name": prop.name.decode(errors="replace").strip("\0"),
                    "memory": int(prop.totalGlobalMem), "managed": bool(managed),
                    "concurrent_managed": bool(concurrent)})
    _, drv = rt.cudaDriverGetVersion()
    for g in out:
        g["driver_cuda"] = f"{drv // 1000}.{drv % 1000 // 10}"
    return out


def gpus_nvidia_smi() -> list[dict] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, "--query-gpu=index,name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            out.append({"index": int(parts[0]), "name": parts[1], "memory": int(float(parts[2])) * 2**20,
                        "driver": parts[3]})
    return out


def check_gpu() -> list[dict]:
    gpus, via = gpus_cuda_python(), "cuda-python"
    if gpus is None:
        gpus, via = gpus_nvidia_smi(), "nvidia-smi"
    if gpus is None:
        return [_item("gpu", False, "no GPU found: neither cuda-python nor nvidia-smi is available")]
    if not gpus:
        return [_item("gpu", False, f"{via} found no usable GPU")]
    items = []
    for g in gpus:
        detail = f"{g['name']}, {g['memory'] / 1e9:.1f} GB"
        if "driver" in g:
            detail += f", driver {g['driver']}"
        if "driver_cuda" in g:
            detail += f", driver CUDA {g['driver_cuda']}"
        items.append(_item(f"gpu{g['index']}", True, detail + f" (via {via})", **g))
        if "managed" in g:
            ok = g["managed"] and g["concurrent_managed"]
            items.append(_item(f"gpu{g['index']} managed memory", ok,
                               "managed memory with concurrent access" if ok else
                               "no concurrent managed access: the shim will pass through"))
    return items


def check_host() -> dict:
    try:
        import psutil
    except ImportError:
        return _item("host memory", False, "psutil is not installed")
    vm = psutil.virtual_memory()
    return _item("host memory", True, f"{vm.total / 1e9:.1f} GB total, {vm.available / 1e9:.1f} GB available",
                 total=vm.total, available=vm.available)


def check_torch() -> dict:
    if util.find_spec("torch") is None:
        return _item("torch", False, "PyTorch is not installed in this Python")
    from importlib import metadata  # here: every CLI command imports this module

    return _item("torch", True, f"torch {metadata.version('torch')}")


def check_shim() -> dict:
    path = inject.shim_path()
    if path and path.is_file():
        return _item("shim", True, f"libtransit.so at {path}", path=str(path))
    if path:
        return _item("shim", False, f"TRANSIT_SHIM points to {path}, which does not exist")
    return _item("shim", False, "libtransit.so is not built in this installation: "
                 + inject.shim_missing_reason())


def status(c: dict) -> str:
    """The status column: ok, missing (not installed, not found), or the check's own word
    for a third state (slurm's "no answer": installed, but no controller answers)."""
    return c.get("status") or ("ok" if c["ok"] else "missing")


def text(checks: list[dict]) -> str:
    """The checks as the table people read."""
    return table(["check", "status", "detail"], [[c["check"], status(c), c["detail"]] for c in checks], "lll")


def check_slurm() -> list[dict]:
    """Slurm is usable when its commands are here and a controller answers: `sinfo`
    printing the partitions is what submit itself needs (commands on PATH with no
    controller, or a broken slurm.conf, are not "ok", and not "missing" either: they are
    installed, and the row says which controller did not answer)."""
    found = {c: shutil.which(c) for c in SLURM_COMMANDS}
    present = [c for c, p in found.items() if p]
    if not present:
        return [_item("slurm", False, "no Slurm commands on PATH")]
    missing = [c for c in SLURM_COMMANDS if not found[c]]
    have = ", ".join(present) + (f" (missing: {', '.join(missing)})" if missing else "")
    if not found["sinfo"]:
        return [_item("slurm", False, f"{have}: no sinfo to ask the controller", commands=found)]
    silent = "Slurm's commands are installed" + (f" (missing: {', '.join(missing)})" if missing else "") + ", but "
    if found["scontrol"]:  # first: it names the controller, and a refused connection fails at once
        answered, why = _ping(found["scontrol"])
        if not answered:
            return [_item("slurm", False, silent + why, status=NO_ANSWER, commands=found)]
    answered, why = _controller_answers(found["sinfo"])
    if not answered:
        return [_item("slurm", False, f"{silent}the controller does not answer: {why}", status=NO_ANSWER,
                      commands=found)]
    ok = "sbatch" in present
    return [_item("slurm", ok, f"{why}: {have}" if ok else f"{why}, but no sbatch: {have}", commands=found)]


NO_ANSWER = "no answer"  # slurm's status when its commands are installed but no controller answers
_PING = re.compile(r"^Slurmctld\((\w+)\) at (\S+) is (UP|DOWN)", re.M)


def _ping(scontrol: str, timeout: float = 10) -> tuple[bool, str]:
    """(True, '') when `scontrol ping` finds a slurmctld UP, else (False, why): which
    controllers (slurm.conf's SlurmctldHost) did not answer and Slurm's last word on it, or
    why none could be asked (no slurm.conf, no DNS SRV record)."""
    try:
        res = subprocess.run([scontrol, "ping"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:  # e.g. a SLURM_CONF that does not exist: it retries for a minute
        return False, f"scontrol ping did not finish in {timeout:.0f} s" + _last_words(e.stderr)
    except OSError as e:
        return False, f"scontrol cannot run ({e.strerror})"
    states = _PING.findall(res.stdout)
    if any(state == "UP" for _, _, state in states):
        return True, ""
    if not states:
        return False, "no controller is configured for them" + (_last_words(res.stderr)
                                                                  or f": scontrol ping exit code {res.returncode}")
    hosts = " and ".join(host for _, host, _ in states)
    return False, f"slurmctld at {hosts} did not answer" + _last_words(res.stderr)


def _last_words(stderr) -> str:
    """': ' and the last line a command that was stopped had written to stderr, or ''."""
    if isinstance(stderr, bytes):  # what TimeoutExpired holds, whatever text= said
        stderr = stderr.decode(errors="replace")
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    return f": {lines[-1]}" if lines else ""


def _controller_answers(sinfo: str, timeout: float = 10) -> tuple[bool, str]:
    """(True, 'Slurm 22.05.8, partitions debug') when sinfo reaches a controller, else
    (False, why). A misconfigured client can hang for a minute: doctor waits `timeout`."""
    try:
        res = subprocess.run([sinfo, "-h", "-o", "%P"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return False, f"sinfo did not answer in {timeout:.0f} s" + _last_words(e.stderr)
    except OSError as e:
        return False, f"sinfo cannot run ({e.strerror})"
    if res.returncode != 0:
        lines = res.stderr.strip().splitlines()
        return False, lines[-1] if lines else f"sinfo exit code {res.returncode}"
    parts = ", ".join(sorted({p.strip() for p in res.stdout.split()})) or "none"
    try:
        version = subprocess.run([sinfo, "--version"], capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    return True, f"{version or 'Slurm'}, partitions {parts}"


def check_spank() -> dict:
    from transit_launch.slurm.spank import locate_spank_h
    found = locate_spank_h()
    if found:
        return _item("spank.h", True, str(found / "spank.h"))
    return _item("spank.h", False, "not found (Debian/Ubuntu: libslurm-dev; RHEL: slurm-devel)")


def check_compiler() -> dict:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return _item("c compiler", bool(cc), cc or "no cc/gcc on PATH: the shim and SPANK plugin cannot be built")


def run_checks() -> list[dict]:
    return [*check_gpu(), check_host(), check_torch(), check_shim(), *check_slurm(), check_spank(),
            check_compiler()]


def on_node(partition: str | None = None, account: str | None = None, timeout: float = 300) -> list[dict]:
    """The checks run on one compute node by srun, with this installation's Python and the
    shim path a job rendered here would name (TRANSIT_SHIM): what a job will find there.
    The node's answer comes back as doctor's JSON. When none comes back (Slurm refused the
    step, or this Python or transit-launch does not run on the node) nothing was checked:
    a UsageError, one line saying why."""
    import json
    import sys

    from transit_launch.errors import UsageError
    srun = shutil.which("srun")
    if not srun:
        raise UsageError("doctor --on-node needs Slurm's srun on PATH")
    shim = inject.shim_path()
    env = dict(os.environ, **({inject.ENV["SHIM"]: str(shim)} if shim else {}))
    # one step: the node's name, then doctor's JSON from this installation's Python, isolated
    # from the working directory (root runs this; see isolated.py) and run from /
    prelude = ("import os, socket; print(os.environ.get('SLURMD_NODENAME') or socket.gethostname(), "
               "flush=True); ")
    cmd = [srun, "--nodes=1", "--ntasks=1", "--export=ALL", SRUN_CHDIR, f"--time={max(1, int(timeout // 60))}",
           *([f"--partition={partition}"] if partition else []), *([f"--account={account}"] if account else []),
           "--", *transit_launch_argv("doctor", "--json", prelude=prelude)]
    failed = "doctor --on-node checked no node: "
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{failed}srun did not finish in {timeout:.0f} s (is the partition busy?)") from None
    node, _, body = res.stdout.partition("\n")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if not node:  # nothing ran there: Slurm refused the step, or this Python is not on the node
        why = (lines or [f"exit code {res.returncode}"])[-1]
        if not any(ln.startswith("slurmstepd") for ln in lines) and why.startswith("srun:"):
            raise UsageError(f"{failed}srun could not start a step: {why}")
        why = next((ln for ln in lines if ln.startswith("slurmstepd")), why)
        raise UsageError(f"{failed}{sys.executable} does not run there through srun: {why}")
    try:
        checks = json.loads(body)
    except ValueError:  # the program's own last line says more than srun's "exited with exit code"
        why = ([ln for ln in lines if not ln.startswith("srun:")] or lines or [f"exit code {res.returncode}"])[-1]
        raise UsageError(f"{failed}transit-launch does not run on {node}: {why}") from None
    return [_item("on a compute node", True, f"{node}, through srun with {sys.executable}", node=node),
            *[dict(c, check=f"{node}: {c['check']}") for c in checks]]


def cmd_doctor(a, command):
    import json

    from transit_launch.errors import UsageError
    if not a.on_node and (a.partition or a.account):
        raise UsageError("--partition and --account say where --on-node runs; without --on-node doctor checks "
                         "this machine")
    checks = on_node(a.partition, a.account) if a.on_node else run_checks()
    print(json.dumps(checks, indent=2, default=str) if a.json else text(checks))
    return 0


def register(sub):
    sp = sub.add_parser("doctor", help="what this machine has: GPU, managed memory, host memory, shim, Slurm")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--on-node", action="store_true",
                    help="run the checks on one compute node through srun, with the shim path a job rendered "
                         "here names (default: this machine)")
    sp.add_argument("--partition", help="with --on-node: the partition to run on (default: Slurm's default)")
    sp.add_argument("--account", help="with --on-node: the account to charge (default: Slurm's default)")
    sp.set_defaults(func=cmd_doctor)
