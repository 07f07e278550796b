"""Run many CLI invocations fast: one server process imports transit_launch once, then
forks a child per invocation that runs `transit_launch.cli.main(argv)` exactly as
`python -m transit_launch` does (an uncaught exception prints its traceback and exits 1),
with its own stdout, stderr, working directory, environment and timeout; or, given "code",
that program as `python -c CODE ARGV...` runs it (tests/test_torchtitan_config.py: its
server imported TorchTitan once, which a fresh interpreter takes seconds of CPU for).

Why: on the 2-core CI machine a bare Python start costs about 0.2 s of CPU, so the table
of bad inputs (over a hundred rows) took 45 s as separate interpreters; forked children
take milliseconds each. tests/test_bad_input.py still runs some rows through a real
`python -m transit_launch` so that path stays covered."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SERVER = r'''
import json, os, select, signal, sys, time, traceback
import transit_launch.cli as cli
# what the subcommands import when they run: imported once here, not in every child
import transit_launch.planning.plan, transit_launch.planning.report, transit_launch.sim.run  # noqa: E401

def child(req, out_w, err_w):
    rc = 1
    try:  # whatever happens, this child never returns into the server's loop
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        try:
            if "code" in req:  # a program, run as `python -c CODE ARGV...` runs it
                sys.argv = ["-c", *req["argv"]]
                exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
                rc = 0
            else:
                rc = cli.main(req["argv"])
        except SystemExit as e:
            rc = e.code
        except BaseException:
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(rc if isinstance(rc, int) else (0 if rc is None else 1))

for line in sys.stdin:
    req = json.loads(line)
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    sys.stdout.flush()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(req, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    bufs, open_fds, timed_out = {out_r: b"", err_r: b""}, [out_r, err_r], False
    while open_fds:
        left = req["timeout"] - (time.monotonic() - t0)
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            timed_out = True
            break
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                bufs[fd] += chunk
            else:
                open_fds.remove(fd)
    _, status = os.waitpid(pid, 0)
    os.close(out_r)
    os.close(err_r)
    rc = "timeout" if timed_out else os.waitstatus_to_exitcode(status)
    print(json.dumps({"rc": rc, "out": bufs[out_r].decode(errors="replace"), "err": bufs[err_r].decode(errors="replace"),
                      "elapsed": time.monotonic() - t0}), flush=True)
'''


class ForkCLI:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=dict(os.environ))

    def run(self, *argv, env=None, cwd=None, timeout=20.0):
        """(exit code or 'timeout', stdout, stderr, seconds) of one invocation."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        req = {"argv": list(argv), "env": full_env, "cwd": str(cwd or os.getcwd()), "timeout": timeout}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        res = json.loads(line)
        return res["rc"], res["out"], res["err"], res["elapsed"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
