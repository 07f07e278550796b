"""One builder of the job's environment (issue 53): preload/inject.py:job_env gives `run`,
`render` (sbatch and --local) and the scale-in attempts their LD_PRELOAD, PYTHONPATH and
TRANSIT_* variables, and the SPANK plugin reads the same names from the generated header.
A second builder (an export line in a template, an env["LD_PRELOAD"] in Python, a name
spelled out in the plugin's C) fails here."""

import re
from pathlib import Path

import transit_launch
from transit_launch import csrc, rules
from transit_launch.preload import inject

PKG = Path(transit_launch.__file__).resolve().parent
BUILDER = PKG / "preload" / "inject.py"
# the names the builder sets: a line elsewhere that assigns or exports one builds the environment again
BUILT = ("LD_PRELOAD", "PYTHONPATH", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
         *(rules.ENV[k] for k in ("POLICY", "GPU_BUDGET", "STATS", "LOG", "OVERLAP_STEP", "PLAN")))
NAMES = "|".join(BUILT)
KEYS = "|".join((*rules.JOB_ENV, "POLICY", "GPU_BUDGET", "STATS", "LOG", "OVERLAP_STEP", "PLAN"))
SECOND_BUILDER = (re.compile(rf"\b({NAMES})="),                   # a shell assignment, in a template or a string
                  re.compile(r"\bexport [A-Za-z_{$]"),              # a shell export of anything
                  re.compile(rf"\[[\"']({NAMES})[\"']\]\s*="),     # env["LD_PRELOAD"] = ... in Python
                  re.compile(r"\[(rules\.)?(ENV|JOB_ENV)\[[^\]]+\]\]\s*="),  # env[ENV["POLICY"]] = ..., the tables' names
                  re.compile(rf"\.(update|setdefault)\(\s*\{{?\s*([\"']({NAMES})[\"']|(rules\.)?(ENV|JOB_ENV)\[)"),
                  # a dict literal's key: {**os.environ, "LD_PRELOAD": shim}, {ENV["POLICY"]: policy}
                  re.compile(rf"[{{,]\s*([\"']({NAMES})[\"']|(rules\.)?(ENV|JOB_ENV)\[[\"']({KEYS})[\"']\])\s*:"))


def second_builders(files):
    return [f"{f.name}:{i}: {line.strip()}" for f in files
            for i, line in enumerate(f.read_text().splitlines(), 1) if any(p.search(line) for p in SECOND_BUILDER)]


def test_no_second_builder_of_the_job_environment():
    files = [f for f in [*PKG.rglob("*.py"), *PKG.rglob("*.j2")]
             if f != BUILDER and "adapter" not in f.relative_to(PKG).parts]  # the adapter reads it, in the job
    assert files and not second_builders(files)


def test_the_scan_finds_the_builders_this_issue_removed(tmp_path):
    """The old template's export lines, run's env["LD_PRELOAD"] and scale-in's own export
    lines: each is found (the scan is not vacuous)."""
    old = {"sbatch.j2": "{% if shim %}export LD_PRELOAD={{ shim | shq }}${LD_PRELOAD:+:$LD_PRELOAD}\n",
           "local.j2": "{% if shim %}LD_PRELOAD={{ shim | shq }} {% endif %}torchrun\n",
           "run.py": '        env["LD_PRELOAD"] = inject.prepend("LD_PRELOAD", str(shim), env)\n',
           "scalein.py": '    out += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]\n',
           # the same builder in the package's own idioms: through the tables' names, update, setdefault
           "tables.py": '    env[ENV["POLICY"]] = policy\n',
           "update.py": '    env.update({"LD_PRELOAD": shim})\n',
           "setdefault.py": '    env.setdefault(rules.JOB_ENV["PRELOAD"], shim)\n',
           # a dict literal, by the name or by the table's
           "literal.py": '    return {**env, "LD_PRELOAD": "", "TRANSIT_POLICY": "off"}\n',
           "tables_literal.py": '    env = dict(os.environ, **{ENV["POLICY"]: policy})\n'}
    for name, text in old.items():
        (tmp_path / name).write_text(text)
    found = second_builders(sorted(tmp_path.iterdir()))
    assert [f.split(":")[0] for f in found] == ["literal.py", "local.j2", "run.py", "sbatch.j2", "scalein.py",
                                                "setdefault.py", "tables.py", "tables_literal.py", "update.py"], found


def test_the_plugin_reads_the_tables_names_from_the_generated_header():
    """TR_JOB_* and TR_OPT_* come from rules.py (tests/test_rules.py checks the committed
    header is what rules.py writes); the plugin's C spells none of them itself."""
    header = (csrc.root() / "shim" / "transit_rules.h").read_text()
    assert header == rules.c_header()
    for k, v in rules.JOB_ENV.items():
        assert f'#define TR_JOB_{k} "{v}"\n' in header
    for k, v in rules.PLUGIN_OPTIONS.items():
        assert f'#define TR_OPT_{k} "{v}"\n' in header
    literals = [f'"{v}"' for v in (*rules.JOB_ENV.values(), *rules.PLUGIN_OPTIONS.values())]
    found = [(f.name, lit) for f in sorted((csrc.root() / "spank").glob("*.c")) for lit in literals
             if lit in f.read_text()]
    assert not found, found


def test_the_forms_of_one_environment():
    """Derived by hand from the shell each form must be: the shim first in LD_PRELOAD and
    the adapter first in PYTHONPATH, the job's own entries kept after them."""
    env = inject.job_env("advise", 40 * 10**9, "/s t", None, "stream", shim="/opt/t/libtransit.so",
                         adapter="/opt/t/adapter", environ={})
    alloc = "backend:native,expandable_segments:False"
    assert env.apply({"LD_PRELOAD": "libm.so.6", "KEEP": "1"}) == {
        "LD_PRELOAD": "/opt/t/libtransit.so:libm.so.6", "PYTHONPATH": "/opt/t/adapter", "KEEP": "1",
        "TRANSIT_POLICY": "advise", "TRANSIT_OVERLAP_STEP": "stream", "TRANSIT_GPU_BUDGET": "40GB",
        "TRANSIT_STATS": "/s t", "PYTORCH_ALLOC_CONF": alloc, "PYTORCH_CUDA_ALLOC_CONF": alloc}
    assert env.exports() == [
        "export LD_PRELOAD=/opt/t/libtransit.so${LD_PRELOAD:+:$LD_PRELOAD}",
        "export PYTHONPATH=/opt/t/adapter${PYTHONPATH:+:$PYTHONPATH}",
        "export TRANSIT_POLICY=advise", "export TRANSIT_OVERLAP_STEP=stream", "export TRANSIT_GPU_BUDGET=40GB",
        "export TRANSIT_STATS='/s t'", f"export PYTORCH_ALLOC_CONF={alloc}", f"export PYTORCH_CUDA_ALLOC_CONF={alloc}"]
    assert env.prefix().startswith("LD_PRELOAD=/opt/t/libtransit.so${LD_PRELOAD:+:$LD_PRELOAD} PYTHONPATH=")
    # a scale-in attempt under off: no shim, the job's own lists back, the options it drops unset
    off = inject.job_env("off", environ={})
    assert off.attempt_lines() == [
        "unset TRANSIT_GPU_BUDGET", "unset TRANSIT_STATS", "unset TRANSIT_LOG", "unset TRANSIT_OVERLAP_STEP",
        "unset TRANSIT_PLAN", "export TRANSIT_POLICY=off", f"export PYTORCH_ALLOC_CONF={alloc}", f"export PYTORCH_CUDA_ALLOC_CONF={alloc}",
        'if [ -n "$base_preload" ]; then export LD_PRELOAD="$base_preload"; else unset LD_PRELOAD; fi',
        'if [ -n "$base_pythonpath" ]; then export PYTHONPATH="$base_pythonpath"; else unset PYTHONPATH; fi']
    assert inject.JobEnv.save_lines() == ["base_preload=${LD_PRELOAD:-}", "base_pythonpath=${PYTHONPATH:-}"]


def test_the_plugin_route_leaves_the_plugin_what_it_sets():
    """Under the plugin the script names no shim: the policy, budget and stats become the
    plugin's options, the allocator settings are the plugin's (spank/remote.c), and only
    what the plugin has no option for is exported."""
    env = inject.job_env("advise", 40 * 10**9, "/stats", "info", "stream", shim="/opt/t/libtransit.so",
                         adapter="/opt/t/adapter", environ={"NCCL_NVLS_ENABLE": "0"}, plugin=True)
    assert env.sbatch == ("--transit=advise", "--transit-budget=40GB", "--transit-stats=/stats")
    assert env.first == {}
    assert env.exports() == ["export TRANSIT_OVERLAP_STEP=stream", "export TRANSIT_LOG=info",
                             "export NCCL_NVLS_ENABLE=0"]


def test_the_adapter_comes_only_with_the_shim():
    assert inject.job_env("advise", shim=None, adapter="/opt/t/adapter", environ={}).first == {}


def test_the_jobs_values_win_over_the_callers():
    """run's process gets the job's policy and allocator settings even where the caller's
    environment has others (expandable segments would bypass the shim's cudaMalloc)."""
    env = inject.job_env("advise", shim="/opt/t/libtransit.so", environ={})
    got = env.apply({"TRANSIT_POLICY": "base", "PYTORCH_ALLOC_CONF": "expandable_segments:True", "KEEP": "1"})
    assert got["TRANSIT_POLICY"] == "advise" and got["PYTORCH_ALLOC_CONF"] == inject.ALLOC_CONF and got["KEEP"] == "1"


def test_scale_in_attempts_with_the_shim_do_not_stack(tmp_path):
    """Two attempts in a row, as the scale-in script runs them after save_lines: LD_PRELOAD
    and PYTHONPATH hold the shim and the adapter once, the job's own entries after them, and
    the second attempt's plan (none here) replaces the first's."""
    import subprocess

    first = inject.job_env("advise", shim="/opt/t/libtransit.so", adapter="/opt/t/adapter", environ={},
                           plan={"nodes": 4, "offload_gb_per_gpu": 1.0})
    second = inject.job_env("advise", shim="/opt/t/libtransit.so", adapter="/opt/t/adapter", environ={})
    script = "\n".join([*inject.JobEnv.save_lines(), *first.attempt_lines(), *second.attempt_lines(),
                        'printf "%s|%s|%s" "$LD_PRELOAD" "$PYTHONPATH" "${TRANSIT_PLAN-unset}"'])
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": "libm.so.6", "PYTHONPATH": "/mine"})
    assert res.returncode == 0, res.stderr
    assert res.stdout == "/opt/t/libtransit.so:libm.so.6|/opt/t/adapter:/mine|unset", res.stdout
