"""`transit-launch _node-loss next|watch`: what an sbatch script rendered with
--on-node-loss scale-in runs around each attempt (not for people: the template calls it).

next (before every attempt): attempt 0 writes the layout of the whole allocation; after a
failed step it reads which nodes the job lost (scontrol), re-plans on the survivors
(slurm/nodeloss.py decides), says so in one line, writes the transition record and the
environment of the next attempt (nodes, rendezvous, the shim's TRANSIT_* for the new
policy), or, when no layout fits the survivors, requeues the job. Exit 0: run the attempt;
otherwise the script exits with that code. The environment goes to stdout, which the
script evaluates (nothing is sourced from a file); what people read goes to stderr.
watch (the attempt's output piped through it): passes every line on and notes the first
and last step the trainer printed; the first step after a scale-in completes the
transition record with the downtime."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from transit_launch.errors import UsageError
from transit_launch.slurm import nodeloss
from transit_launch.slurm.jobdir import JobDir
from transit_launch.slurm.nodeloss import Layout, Transition


def _scontrol(*args: str) -> str:
    res = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise UsageError(f"scontrol {' '.join(args)} failed: {res.stderr.strip() or res.returncode}")
    return res.stdout


def hostnames(nodelist: str) -> list[str]:
    return _scontrol("show", "hostnames", nodelist).split() if nodelist and nodelist != "(null)" else []


def _tag(restart: int, attempt: int) -> str:
    return f"{restart}-{attempt}"


def _read_json(d: JobDir, name: str) -> dict | None:
    try:
        return json.loads(d.read(name) or "")
    except ValueError:
        return None


def _restart() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def _request(a):
    from transit_launch.planning.cli import request
    return request(a)


def _shim_exports(a, policy: str) -> list[str]:
    """The shim's environment for this attempt's policy (inject.job_env), from what the job
    started with (the script saves it), so attempts do not stack."""
    from transit_launch.preload import inject
    shim = a.shim if policy != "off" and a.shim else None
    return inject.job_env(policy, a.gpu_budget, a.stats, a.log, a.overlap, shim=shim,
                          adapter=a.adapter or None).attempt_lines()


def _port(a, attempt: int) -> int:
    """The attempt's rendezvous port (script.rdzv_port): a new one each attempt, since the
    last attempt's store may still hold its port."""
    from transit_launch.slurm.script import rdzv_port
    job = os.environ.get("SLURM_JOB_ID", "")
    if a.port is None and not job.isdigit():
        raise UsageError("_node-loss next: SLURM_JOB_ID is not a job id (the rendezvous port comes from it); "
                         "give --port")
    return rdzv_port(int(job) if job.isdigit() else 0, attempt, a.port)


def _attempt_env(lay: Layout, attempt: int, a) -> str:
    """The next attempt's shell environment (the script evaluates it)."""
    head = lay.nodes[0]
    states = _scontrol("show", "node", "-o", head)
    addr = next((nodeloss.fields(ln).get("NodeAddr") for ln in states.splitlines() if ln.strip()), None) or head
    lines = [f"nodes_now={len(lay.nodes)}", f"nodelist_now={shlex.quote(','.join(lay.nodes))}",
             f"head_node={shlex.quote(addr)}", f"rdzv_port={_port(a, attempt)}",
             *_shim_exports(a, lay.policy)]
    return "\n".join(lines) + "\n"


def _checkpoint_step(ckpt: str | None) -> int | None:
    if not ckpt:
        return None
    root = Path(ckpt)
    try:
        names = os.listdir(root)
    except OSError:
        return 0  # nothing saved yet: the trainer starts from the beginning
    steps = nodeloss.checkpoint_steps(names, lambda n: (root / n / ".metadata").is_file())
    return steps[-1] if steps else 0


def _append(d: JobDir, t: Transition) -> None:
    d.write(nodeloss.RECORDS, (d.read(nodeloss.RECORDS) or "") + json.dumps(t.record()) + "\n")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_next(a) -> int:
    from transit_launch.planning.plan import plan
    if not a.model:
        raise UsageError("_node-loss next needs the job's plan options (--model ...)")
    restart, k = _restart(), a.attempt
    job_id = os.environ.get("SLURM_JOB_ID", "")
    p = plan(_request(a))
    # the job's first attempt makes its directory; a later attempt, or a requeued run of a job
    # that made one, finds its own (checked: owner, mode)
    first = k == 0 and (restart == 0 or not os.path.lexists(a.job_dir))
    try:
        d = JobDir(a.job_dir, create=first, job=job_id)
    except FileNotFoundError:
        raise UsageError(f"job directory {a.job_dir} is gone; the job ends") from None
    with d:
        env = _next(a, p, d, restart, k, job_id)
    if isinstance(env, int):
        return env
    sys.stdout.write(env)
    return 0


def _next(a, p, d: JobDir, restart: int, k: int, job_id: str) -> str | int:
    """The next attempt's environment, or the exit code that ends the script."""
    if k == 0:
        nodes = hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
        c = p.at(len(nodes)) if nodes else None
        if c is None:  # render refuses a node count without a layout; outside a job there are no nodes
            raise UsageError(f"_node-loss next: {len(nodes)} node(s) in SLURM_JOB_NODELIST give no layout to run")
        lay = nodeloss.layout_of(p, c, nodes, a.policy)  # the first attempt runs what render chose, served or not
        d.write(f"attempt-{_tag(restart, 0)}.json", json.dumps(lay.summary()))
        return _attempt_env(lay, 0, a)
    seen = time.time()
    prev = _read_json(d, f"attempt-{_tag(restart, k - 1)}.json")
    if prev is None:
        _say(f"transit-launch: the step failed (exit {a.rc}) and attempt {k - 1}'s layout is missing; the job ends")
        return a.rc or 1
    old = Layout.of(prev)
    job = nodeloss.fields(_scontrol("show", "job", "-o", job_id))
    gone, left = nodeloss.lost(old.nodes, hostnames(job.get("NodeList", "")),
                               nodeloss.node_states(_scontrol("show", "node", "-o", ",".join(old.nodes))))
    if not gone:
        _say(f"transit-launch: the step failed (exit {a.rc}) with every node up: not a node loss; the job ends")
        return a.rc or 1
    progress = _read_json(d, f"progress-{_tag(restart, k - 1)}.json") or {}
    new, why = nodeloss.best_layout(p, left, a.policy)
    t = Transition("scale-in" if new else "requeue", restart, k, seen, gone, old.summary(),
                   new.summary() if new else None, _checkpoint_step(a.checkpoint_dir), progress.get("last_step"),
                   why if not new else "")
    if new is None:
        t.reason = f"no layout fits {len(left)} node(s) even with offloading ({why})"
        _say(nodeloss.line(t))
        _append(d, t)
        res = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            _say(f"transit-launch: scontrol requeue {job_id} failed: {res.stderr.strip()}; the job ends")
            return a.rc or 1
        return 3  # requeued: Slurm ends this run of the script and starts it again on a full allocation
    _say(nodeloss.line(t))
    _append(d, t)
    d.write(f"attempt-{_tag(restart, k)}.json", json.dumps(new.summary()))
    return _attempt_env(new, k, a)


def cmd_watch(a) -> int:
    """Copy stdin to stdout line by line; never the reason the attempt dies (errors in the
    bookkeeping are reported once and the copying goes on)."""
    restart, k = _restart(), a.attempt
    out = sys.stdout.buffer
    first = last = None
    broken = False
    try:
        d = JobDir(a.job_dir, job=os.environ.get("SLURM_JOB_ID", ""))
    except (OSError, UsageError) as e:  # the output still passes; nothing is recorded
        print(f"transit-launch: no records for this attempt: {e}", flush=True)
        d = None
    for raw in sys.stdin.buffer:
        out.write(raw)
        out.flush()
        step = nodeloss.step_of(raw.decode(errors="replace"))
        if step is None:
            continue
        last = step
        if first is None:
            first = step
            try:
                if d is not None:
                    _first_step(d, restart, k, step, time.time())
            except Exception as e:  # noqa: BLE001 - the record must not stop the job's output
                if not broken:
                    print(f"transit-launch: could not complete the transition record: {e}", flush=True)
                broken = True
    if d is None:
        return 0
    try:
        d.write(f"progress-{_tag(restart, k)}.json", json.dumps({"first_step": first, "last_step": last}))
    except UsageError as e:
        print(f"transit-launch: {e}", flush=True)
    d.close()
    return 0


def _first_step(d: JobDir, restart: int, k: int, step: int, now: float) -> None:
    text = d.read(nodeloss.RECORDS)
    if k == 0 or text is None:
        return
    recs = nodeloss.records(text)
    for r in recs:
        if r["restart"] == restart and r["attempt"] == k and r["action"] == "scale-in" and r["downtime_s"] is None:
            r["downtime_s"] = round(now - r["loss_seen_epoch"], 2)
            r["first_step"] = step
            print(f"transit-launch: first step on the survivors (step {step}) {r['downtime_s']:.1f} s after the "
                  f"node loss", flush=True)
    d.write(nodeloss.RECORDS, "".join(json.dumps(r) + "\n" for r in recs))


def transitions(work_dir: str, job_id: str, uid: int) -> list[dict]:
    """The job's transition records (status --json), or [] when it has none; a directory
    or file that is not the job's user's alone is refused (UsageError)."""
    try:
        with JobDir(Path(work_dir) / nodeloss.job_dir_name(job_id), uid=uid, job=job_id) as d:
            return nodeloss.records(d.read(nodeloss.RECORDS) or "")
    except FileNotFoundError:
        return []


def add_node_loss_args(sp):
    g = sp.add_argument_group("node loss")
    g.add_argument("--on-node-loss", choices=nodeloss.MODES, default="off",
                   help="scale-in: when a node is lost the job keeps its allocation (--no-kill), re-plans on the "
                        "survivors (the global batch kept through gradient accumulation) and relaunches the "
                        "trainer, which resumes from its last checkpoint; requeues when no layout fits them "
                        "(default off: the job ends, as Slurm does)")
    g.add_argument("--checkpoint-dir",
                   help="with --on-node-loss scale-in: where the trainer writes its step-N checkpoints (TorchTitan's "
                        "layout), for the record of the step resumed and the steps lost (default: not recorded)")


def options(a) -> nodeloss.NodeLossOptions:
    return nodeloss.NodeLossOptions(a.on_node_loss, a.checkpoint_dir, a.model, a.gpu, a.gpu_mem)


def cmd_node_loss(a, command):
    return cmd_next(a) if a.action == "next" else cmd_watch(a)


def register(sub):
    from transit_launch.argtypes import tcp_port
    from transit_launch.planning.cli import add_plan_args
    from transit_launch.preload.cli import add_shim_args
    sp = sub.add_parser("_node-loss")  # no help: not listed (cli.build_parser leaves _ names out of the usage)
    sp.add_argument("action", choices=("next", "watch"),
                    help="next: before an attempt (re-plan after a loss); watch: the attempt's output piped through")
    sp.add_argument("--job-dir", required=True, help="the job's transit-JOBID directory (records, attempt files)")
    sp.add_argument("--attempt", type=int, required=True, help="this attempt's number, from 0")
    sp.add_argument("--rc", type=int, default=0, help="the last step's exit code (default 0)")
    sp.add_argument("--checkpoint-dir", help="the trainer's step-N checkpoints (default: not recorded)")
    sp.add_argument("--port", type=tcp_port,
                    help="rendezvous port of attempt 0; attempt k uses port + k (default: from the job id, as "
                         "render's --port)")
    sp.add_argument("--shim", help="libtransit.so for layouts that offload (default: none)")
    sp.add_argument("--adapter", help="the hint adapter's directory (default: none)")
    add_plan_args(sp, model_required=False)
    add_shim_args(sp)
    sp.set_defaults(func=cmd_node_loss)
