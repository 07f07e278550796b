"""What a budget promises a site (issue 33): while a budgeted job runs, how much device
memory can another process still get? The job runs under `transit-launch run --policy
POLICY --gpu-budget BUDGET`; once it has printed --after-steps step records (the
example trainer's and TorchTitan's step lines both count), this process (no shim)
allocates plain device memory with torch.empty in --step-mib pieces until the allocator
refuses (never managed memory: nothing here oversubscribes), reads nvidia-smi's used
memory at that point, frees everything and lets the job finish. One JSON object out.

    python3 bench/probes/second_process.py --gpu-budget 45GB --out /tmp/sp/second_process.json \\
        -- python examples/train_llama.py --steps 60 --dim 4096 --layers 16
    python3 -m bench --file-in /tmp/sp   # into bench/results/<date>/, indexed

Filling the card to the allocator's refusal can make the driver take back the UVM chunks
the job's managed memory holds, and evict resident pages of the job (that is the question
asked); on a GPU others share, cap it with --max-gib.

The budget held for the site when the card's total less what this process got (less its
own CUDA context, measured before it allocates) is at most the budget plus the job's
unmanaged memory (CUDA context, NCCL, cuBLAS workspaces): the report gives each number
and leaves that judgment to bench/RESULTS.md.
"""

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r'^\{"step"|\bstep:\s*\d+')  # examples/train_llama.py's JSON, TorchTitan's log


def nvidia_smi() -> dict:
    """The card's used and total memory as the driver reports them (MiB), or why not."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    if out.returncode != 0:
        return {"error": out.stderr.strip()}
    used, total = (int(x) for x in out.stdout.split(",")[:2])
    return {"used_mib": used, "total_mib": total}


def grab(step_bytes: int, max_bytes: int | None = None) -> dict:
    """Plain allocations until the allocator refuses (or max_bytes); what was had, then all freed."""
    import torch
    free0, total = torch.cuda.mem_get_info()
    held, got = [], 0
    try:
        while max_bytes is None or got + step_bytes <= max_bytes:
            held.append(torch.empty(step_bytes, dtype=torch.uint8, device="cuda"))
            got += step_bytes
    except torch.cuda.OutOfMemoryError:
        pass
    smi = nvidia_smi()  # while everything is still held
    free_at_peak, _ = torch.cuda.mem_get_info()
    del held
    torch.cuda.empty_cache()
    return {"allocated_bytes": got, "step_bytes": step_bytes, "max_bytes": max_bytes, "refused": max_bytes is None
            or got + step_bytes <= max_bytes, "free_before_bytes": free0, "total_bytes": total,
            "free_at_peak_bytes": free_at_peak, "nvidia_smi_at_peak": smi}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, like the CLI
        self.exit(2, f"second_process: {message}\n")


def main(argv=None) -> int:
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-budget", required=True, help="the job's TRANSIT_GPU_BUDGET, with its unit (e.g. 45GB)")
    ap.add_argument("--policy", default="advise", choices=("base", "prefetch", "advise"), help="the job's policy (advise)")
    ap.add_argument("--after-steps", type=int, default=5, help="job step lines to wait for before measuring (5)")
    ap.add_argument("--step-mib", type=int, default=256, help="size of each allocation of the second process (256)")
    ap.add_argument("--max-gib", type=float, default=None, help="stop allocating at this many GiB (default: "
                    "until the allocator refuses)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds the job may take in all (3600)")
    ap.add_argument("--out", default="", help="JSON file to write (default: stdout only)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("the job's command is missing (after --)")
    if a.after_steps < 1 or a.step_mib < 1:
        ap.error("--after-steps and --step-mib must be positive")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("second_process: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.cuda.init()  # this process's own context, before the job's memory is counted
    idle = {"free_bytes": torch.cuda.mem_get_info()[0], "nvidia_smi": nvidia_smi()}
    run = [sys.executable, "-m", "transit_launch", "run", "--policy", a.policy, "--gpu-budget", a.gpu_budget,
           "--json", "--", *cmd]
    job = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           start_new_session=True)
    out_lines, err_lines, steps, ready, lock = [], [], [0], threading.Event(), threading.Lock()

    def read(stream, keep):  # the job's output, counting step lines on either stream
        for line in stream:
            keep.append(line)
            if STEP_LINE.search(line):
                with lock:
                    steps[0] += 1
                    if steps[0] >= a.after_steps:
                        ready.set()
    readers = [threading.Thread(target=read, args=(job.stdout, out_lines), daemon=True),
               threading.Thread(target=read, args=(job.stderr, err_lines), daemon=True)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + a.timeout
    while not ready.wait(1.0) and job.poll() is None and time.monotonic() < deadline:
        pass
    measured_at_step = steps[0]
    job_running = job.poll() is None
    cap = int(a.max_gib * (1 << 30)) if a.max_gib is not None else None
    during = grab(a.step_mib << 20, cap) if job_running else None
    try:
        rc = job.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        job.kill()
        rc = "timeout"
    for t in readers:
        t.join(timeout=30)
    text = "".join(out_lines)
    at = text.rfind("\n{\n") + 1 if "\n{\n" in text else (0 if text.startswith("{\n") else -1)
    try:  # `transit-launch run --json`'s summary: the last JSON object on its stdout
        summary = json.loads(text[at:]) if at >= 0 else None
    except ValueError:
        summary = None
    report = {"command": cmd, "policy": a.policy, "gpu_budget": a.gpu_budget, "idle": idle,
              "measured_at_step": measured_at_step, "job_running_when_measured": job_running,
              "second_process": during, "job_returncode": rc, "job_summary": summary,
              "job_stderr_tail": "".join(err_lines)[-4000:], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if during:
        # what the card had left for another process, and so what the job held (less this
        # process's own context, which `idle` had already taken)
        report["job_held_bytes"] = idle["free_bytes"] - during["allocated_bytes"]
    out = json.dumps(report, indent=1)
    if a.out:
        Path(a.out).write_text(out + "\n")
    print(out)
    return 0 if during and rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
