"""Runs a suite's steps: lanes side by side on their GPUs, lane-less steps alone; each
step's output into {out}/NAME.log, its exit status and time into the run's manifest."""

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.harness.suites import Step, Suite

ROOT = Path(__file__).resolve().parents[2]


def groups(steps) -> list[list[Step]]:
    """Consecutive lane steps form one group (their lanes run side by side); a step without
    a lane is a group of its own."""
    out = []
    for s in steps:
        if s.lane is not None and out and out[-1][0].lane is not None:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def lanes(group, gpus: int) -> list[tuple[int | None, list[Step]]]:
    """(GPU index, steps in order) per lane of a group; with one GPU every lane is GPU 0's,
    one after the other."""
    if group[0].lane is None:
        return [(None, group)]
    by = {}
    for s in group:
        by.setdefault(s.lane if gpus >= 2 else 0, []).append(s)
    return sorted(by.items())


def cores(gpu: int | None, n_lanes: int) -> set | None:
    """Half the host's cores to each of two lanes, so that the CPU-side optimizers of one
    lane do not steal the other's launch threads; None: every core."""
    if gpu is None or n_lanes < 2:
        return None
    n = os.cpu_count() or 2
    half = max(1, n // n_lanes)
    return set(range(gpu * half, min(n, (gpu + 1) * half)))


def fill(values: dict, text: str) -> str:
    return text.format(**values)


def step_env(env: dict, step: Step, gpu: int | None, values: dict) -> dict:
    e = dict(env, **{k: fill(values, v) for k, v in step.env.items()})
    if gpu is not None:
        e["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return e


def describe(step: Step, gpu: int | None, values: dict) -> str:
    where = f"GPU {gpu}" if gpu is not None else ("CPU" if step.gpus == 0 else "every GPU")
    env = " ".join(f"{k}={shlex.quote(fill(values, v))}" for k, v in step.env.items())
    return (f"[{step.name}] ({where}, {step.timeout} s) " + (env + " " if env else "") +
            shlex.join(fill(values, a) for a in step.argv))


def run_step(step: Step, gpu: int | None, n_lanes: int, env: dict, values: dict, out: Path, lock) -> dict:
    argv = [fill(values, a) for a in step.argv]
    if argv[0] == "python3":
        argv[0] = sys.executable
    pin = cores(gpu, n_lanes)
    log = out / f"{step.name}.log"
    with lock:
        print("==", describe(step, gpu, values), flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        # the lane's cores set from here, not by a preexec_fn: the lanes start their steps from two
        # threads, and Python code run between fork and exec can wait forever on a lock another
        # thread held at the fork (a CI run hung so)
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=step_env(env, step, gpu, values), start_new_session=True)
        if pin:
            try:
                os.sched_setaffinity(proc.pid, pin)
            except OSError:  # the step already ended
                pass
        try:
            rc = proc.wait(timeout=step.timeout)
        except subprocess.TimeoutExpired:  # the whole group: torchrun's and transit-launch run's children too
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    wall = round(time.monotonic() - t0, 1)
    tail = log.read_text(errors="replace").splitlines()[-6:]
    with lock:
        print(f"-- {step.name}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {wall} s; {log.relative_to(out)}:")
        for line in tail:
            print("   ", line[:300])
    return {"step": step.name, "rc": rc, "wall_s": wall, "gpu": gpu}


def derive(suite: Suite, env: dict, values: dict, dry_run: bool) -> dict | None:
    """The values the suite computes before its steps (e.g. the planner's emulated GPU)."""
    for name, argv in suite.derive.items():
        cmd = [fill(values, a) for a in argv]
        if dry_run:
            values[name] = f"$({shlex.join(cmd)})"
            continue
        res = subprocess.run([sys.executable if cmd[0] == "python3" else cmd[0], *cmd[1:]], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        if res.returncode != 0 or not res.stdout.strip():
            print(f"bench: {name}: {shlex.join(cmd)} failed: {res.stderr.strip()[-300:]}", file=sys.stderr)
            return None
        values[name] = res.stdout.strip()
    return values


def run(suite: Suite, steps, gpus: int, env: dict, out: Path, dry_run: bool) -> list[dict] | None:
    values = {"out": str(out), "gpus": gpus, "half": gpus // 2, "twice": 2 * gpus, "gpu": "{gpu}"}
    if derive(suite, env, values, dry_run) is None:
        return None
    results, lock = [], threading.Lock()
    for group in groups(steps):
        ls = lanes(group, gpus)
        if dry_run:
            for gpu, seq in ls:
                for s in seq:
                    print(describe(s, gpu, dict(values, gpu=gpu if gpu is not None else 0)))
            continue
        found = [[] for _ in ls]

        def lane(i, gpu, seq, found=found, ls=ls):  # this iteration's lists (joined below)
            for s in seq:
                found[i].append(run_step(s, gpu, len(ls), env, dict(values, gpu=gpu if gpu is not None else 0),
                                         out, lock))
        threads = [threading.Thread(target=lane, args=(i, gpu, seq)) for i, (gpu, seq) in enumerate(ls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results += [r for f in found for r in f]
    return results
