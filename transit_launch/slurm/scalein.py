"""`transit-launch _node-loss next|watch`: what an sbatch script rendered with
--on-node-loss scale-in runs around each attempt (not for people: the template calls it).

next (before every attempt): attempt 0 writes the layout of the whole allocation; after a
failed step it reads which nodes the job lost (scontrol), re-plans on the survivors
(slurm/nodeloss.py decides), says so in one line, writes the transition record and the
environment of the next attempt (nodes, rendezvous, the shim's TRANSIT_* for the new
policy), or, when no layout fits the survivors, requeues the job. Exit 0: run the attempt;
otherwise the script exits with that code.
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

from transit_launch.argtypes import write_text_atomically
from transit_launch.errors import UsageError
from transit_launch.slurm import nodeloss
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


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _restart() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def _request(a):
    from transit_launch.planning.cli import request
    return request(a)


def _shim_exports(a, policy: str) -> list[str]:
    """The shim's environment for this attempt's policy, from what the job started with
    (base_preload, base_pythonpath: the script saves them), so attempts do not stack."""
    from transit_launch.shim import inject
    env = inject.shim_env(policy, a.gpu_budget, a.stats, a.log, overlap=a.overlap)
    out = [f"unset {k}" for k in ("TRANSIT_POLICY", "TRANSIT_GPU_BUDGET", "TRANSIT_STATS", "TRANSIT_LOG",
                                  "TRANSIT_OVERLAP_STEP") if k not in env]
    out += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    for var, base, path in (("LD_PRELOAD", "base_preload", a.shim), ("PYTHONPATH", "base_pythonpath", a.adapter)):
        if policy != "off" and path:
            out.append(f'export {var}={shlex.quote(path)}"${{{base}:+:${base}}}"')
        else:
            out.append(f'if [ -n "${base}" ]; then export {var}="${base}"; else unset {var}; fi')
    return out


def _write_env(job_dir: Path, lay: Layout, attempt: int, a) -> None:
    head = lay.nodes[0]
    states = _scontrol("show", "node", "-o", head)
    addr = next((nodeloss.fields(ln).get("NodeAddr") for ln in states.splitlines() if ln.strip()), None) or head
    lines = [f"nodes_now={len(lay.nodes)}", f"nodelist_now={shlex.quote(','.join(lay.nodes))}",
             f"head_node={shlex.quote(addr)}", f"rdzv_port={a.port + attempt}",
             *_shim_exports(a, lay.policy)]
    write_text_atomically(str(job_dir / "attempt.env"), "\n".join(lines) + "\n")


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


def _append(job_dir: Path, t: Transition) -> None:
    path = job_dir / nodeloss.RECORDS
    old = path.read_text() if path.exists() else ""
    write_text_atomically(str(path), old + json.dumps(t.record()) + "\n")


def cmd_next(a) -> int:
    from transit_launch.planning.plan import plan
    if not a.model:
        raise UsageError("_node-loss next needs the job's plan options (--model ...)")
    job_dir, restart, k = Path(a.job_dir), _restart(), a.attempt
    job_id = os.environ.get("SLURM_JOB_ID", "")
    p = plan(_request(a))
    if k == 0:
        nodes = hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))
        c = p.at(len(nodes)) if nodes else None
        if c is None:  # render refuses a node count without a layout; outside a job there are no nodes
            raise UsageError(f"_node-loss next: {len(nodes)} node(s) in SLURM_JOB_NODELIST give no layout to run")
        lay = nodeloss.layout_of(p, c, nodes, a.policy)  # the first attempt runs what render chose, served or not
        write_text_atomically(str(job_dir / f"attempt-{_tag(restart, 0)}.json"), json.dumps(lay.summary()))
        _write_env(job_dir, lay, 0, a)
        return 0
    seen = time.time()
    prev = _read_json(job_dir / f"attempt-{_tag(restart, k - 1)}.json")
    if prev is None:
        print(f"transit-launch: the step failed (exit {a.rc}) and attempt {k - 1}'s layout is missing; the job ends")
        return a.rc or 1
    old = Layout.of(prev)
    job = nodeloss.fields(_scontrol("show", "job", "-o", job_id))
    gone, left = nodeloss.lost(old.nodes, hostnames(job.get("NodeList", "")),
                               nodeloss.node_states(_scontrol("show", "node", "-o", ",".join(old.nodes))))
    if not gone:
        print(f"transit-launch: the step failed (exit {a.rc}) with every node up: not a node loss; the job ends")
        return a.rc or 1
    progress = _read_json(job_dir / f"progress-{_tag(restart, k - 1)}.json") or {}
    new, why = nodeloss.best_layout(p, left, a.policy)
    t = Transition("scale-in" if new else "requeue", restart, k, seen, gone, old.summary(),
                   new.summary() if new else None, _checkpoint_step(a.checkpoint_dir), progress.get("last_step"),
                   why if not new else "")
    if new is None:
        t.reason = f"no layout fits {len(left)} node(s) even with offloading ({why})"
        print(nodeloss.line(t), flush=True)
        _append(job_dir, t)
        res = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            print(f"transit-launch: scontrol requeue {job_id} failed: {res.stderr.strip()}; the job ends")
            return a.rc or 1
        return 3  # requeued: Slurm ends this run of the script and starts it again on a full allocation
    print(nodeloss.line(t), flush=True)
    _append(job_dir, t)
    write_text_atomically(str(job_dir / f"attempt-{_tag(restart, k)}.json"), json.dumps(new.summary()))
    _write_env(job_dir, new, k, a)
    return 0


def cmd_watch(a) -> int:
    """Copy stdin to stdout line by line; never the reason the attempt dies (errors in the
    bookkeeping are reported once and the copying goes on)."""
    job_dir, restart, k = Path(a.job_dir), _restart(), a.attempt
    out = sys.stdout.buffer
    first = last = None
    broken = False
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
                _first_step(job_dir, restart, k, step, time.time())
            except Exception as e:  # noqa: BLE001 - the record must not stop the job's output
                if not broken:
                    print(f"transit-launch: could not complete the transition record: {e}", flush=True)
                broken = True
    try:
        write_text_atomically(str(job_dir / f"progress-{_tag(restart, k)}.json"),
                              json.dumps({"first_step": first, "last_step": last}))
    except UsageError as e:
        print(f"transit-launch: {e}", flush=True)
    return 0


def _first_step(job_dir: Path, restart: int, k: int, step: int, now: float) -> None:
    path = job_dir / nodeloss.RECORDS
    if k == 0 or not path.exists():
        return
    recs = nodeloss.records(path.read_text())
    for r in recs:
        if r["restart"] == restart and r["attempt"] == k and r["action"] == "scale-in" and r["downtime_s"] is None:
            r["downtime_s"] = round(now - r["loss_seen_epoch"], 2)
            r["first_step"] = step
            print(f"transit-launch: first step on the survivors (step {step}) {r['downtime_s']:.1f} s after the "
                  f"node loss", flush=True)
    write_text_atomically(str(path), "".join(json.dumps(r) + "\n" for r in recs))


def transitions(work_dir: str, job_id: str) -> list[dict]:
    """The job's transition records (status --json), or [] when it has none."""
    path = Path(work_dir) / nodeloss.job_dir_name(job_id) / nodeloss.RECORDS
    try:
        return nodeloss.records(path.read_text())
    except OSError:
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
    from transit_launch.argtypes import positive_int
    from transit_launch.planning.cli import add_plan_args
    from transit_launch.shim.cli import add_shim_args
    sp = sub.add_parser("_node-loss")  # no help: not listed (cli.build_parser leaves _ names out of the usage)
    sp.add_argument("action", choices=("next", "watch"),
                    help="next: before an attempt (re-plan after a loss); watch: the attempt's output piped through")
    sp.add_argument("--job-dir", required=True, help="the job's transit-JOBID directory (records, attempt files)")
    sp.add_argument("--attempt", type=int, required=True, help="this attempt's number, from 0")
    sp.add_argument("--rc", type=int, default=0, help="the last step's exit code (default 0)")
    sp.add_argument("--checkpoint-dir", help="the trainer's step-N checkpoints (default: not recorded)")
    sp.add_argument("--port", type=positive_int(), default=29500,
                    help="rendezvous port of attempt 0; attempt k uses port + k (default 29500)")
    sp.add_argument("--shim", help="libtransit.so for layouts that offload (default: none)")
    sp.add_argument("--adapter", help="the hint adapter's directory (default: none)")
    add_plan_args(sp, model_required=False)
    add_shim_args(sp)
    sp.set_defaults(func=cmd_node_loss)
