"""What root installs and what the shim writes, attacked the way an unprivileged user
would (an outside review found each of these open):

1. a spank.h (or a compiler) in a directory a user owns, reached through $SLURM_HOME,
   --include or $CC: its code ran as root during the install and then in slurmstepd;
2. a user's libtransit.so or adapter given as $TRANSIT_SHIM / $TRANSIT_ADAPTER_DIR became
   the site's shim;
3. a --prefix through a user-writable directory with a link inside: root's files at the
   link's target were replaced before the refusal; a directory swapped for a link while it
   was being made had its chmod go to a root-only file;
4. a link planted in a shared directory under the stats writer's temporary name: another
   user's job wrote its stats through it into a file of its owner's;
5. a value the plugin refuses on the node, forged through --export-file: Slurm logged it
   raw, so a newline in it forged a line of slurmd's log.

Users: root installs; `nobody` attacks; a second unprivileged account (made once,
transit-victim) is the user whose job is attacked. The jobs run on the real lab cluster
(tests/slurm_lab.py)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import spank_include

NOBODY = 65534
VICTIM = "transit-victim"


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root: the installer's checks are root's, and the attacks need other users")


def _need_build():
    if not shutil.which("cc") or spank_include() is None:
        pytest.skip("needs a C compiler and spank.h (libslurm-dev) to build the plugin")


def _own(path: Path, uid: int = NOBODY) -> None:
    """What a user made: path and everything under it theirs."""
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)


def _tree(path: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under path: mode and content (what the attack must not change)."""
    return {str(p.relative_to(path)): (p.lstat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(path.rglob("*"))}


def _install(cli, tmp_path, env, *extra, prefix=None):
    prefix = prefix or tmp_path / "site"
    return (*cli("spank", "install", "--prefix", str(prefix), "--plugstack-dir", str(tmp_path / "conf"), *extra,
                 env=env), prefix)


def _nothing_written(tmp_path, prefix):
    assert not (tmp_path / "conf").exists(), "the plugstack include directory was made"
    assert not Path(prefix).exists(), f"{prefix} was made"


def _app_stats(built, stats, rank="0"):
    """The fake CUDA program under the shim (advise), as this process's user, writing its
    stats to `stats` at exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSIT_", "FAKE_"))}
    env.update(LD_PRELOAD=str(built["shim"]), TRANSIT_POLICY="advise", RANK=rank, TRANSIT_STATS=str(stats))
    return subprocess.run([str(built["app"]), "alloc", "1048576"], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def shim_env(built):
    return {"TRANSIT_SHIM": str(built["shim"]), "TRANSIT_ADAPTER_DIR": None, "SLURM_HOME": None,
            "SLURM_PREFIX": None, "CC": None}


# --- 1. headers and compilers -----------------------------------------------------------


def _evil_headers(d: Path, marker: Path) -> Path:
    """Slurm's headers, spank.h with a constructor that leaves marker (as whoever runs it)."""
    inc = d / "include" / "slurm"
    inc.mkdir(parents=True)
    for h in Path(spank_include()).glob("*.h"):
        shutil.copy(h, inc / h.name)
    with open(inc / "spank.h", "a") as f:
        f.write('\n#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) '
                f'{{ FILE *f = fopen("{marker}", "a"); if (f) {{ fputs("ran\\n", f); fclose(f); }} }}\n')
    return inc


@pytest.mark.parametrize("how", ["SLURM_HOME", "SLURM_PREFIX", "--include"])
def test_install_takes_no_header_a_user_owns(cli, shim_env, tmp_path, how):
    _need_root()
    _need_build()
    marker = tmp_path / "ran-as-root"
    home = tmp_path / "theirs"
    inc = _evil_headers(home, marker)
    _own(home)
    env = dict(shim_env)
    extra = ["--include", str(inc)] if how == "--include" else []
    if how != "--include":
        env[how] = str(home)
    rc, out, err, prefix = _install(cli, tmp_path, env, *extra)
    source = "--include" if how == "--include" else f"${how}"
    assert rc == 2 and f"spank.h's directory ({source})" in err and "is not owned by root" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not marker.exists(), "the user's header ran as root"
    _nothing_written(tmp_path, prefix)


def test_build_as_root_takes_no_header_a_user_owns(cli, tmp_path):
    """`spank build` as root checks the same (its output is what a site installs)."""
    _need_root()
    _need_build()
    marker = tmp_path / "ran-as-root"
    home = tmp_path / "theirs"
    _evil_headers(home, marker)
    _own(home)
    rc, out, err = cli("spank", "build", "--out", str(tmp_path / "out"), env={"SLURM_HOME": str(home)})
    assert rc == 2 and "($SLURM_HOME)" in err and "is not owned by root" in err, err
    assert not (tmp_path / "out" / "transit_spank.so").exists() and not marker.exists()


@pytest.mark.parametrize("how", ["CC", "--cc"])
def test_install_runs_no_compiler_a_user_owns(cli, shim_env, tmp_path, how):
    _need_root()
    _need_build()
    marker = tmp_path / "ran-as-root"
    bin_dir = tmp_path / "theirs"
    bin_dir.mkdir()
    cc = bin_dir / "cc"
    cc.write_text(f"#!/bin/sh\ntouch {marker}\nexec /usr/bin/gcc \"$@\"\n")
    cc.chmod(0o755)
    _own(bin_dir)
    env = dict(shim_env, **({"CC": str(cc)} if how == "CC" else {}))
    rc, out, err, prefix = _install(cli, tmp_path, env, *(["--cc", str(cc)] if how == "--cc" else []))
    assert rc == 2 and f"the C compiler (${how})" if how == "CC" else "the C compiler (--cc)" in err, err
    assert "is not owned by root" in err and len(err.strip().splitlines()) == 1, err
    assert not marker.exists()
    _nothing_written(tmp_path, prefix)


def test_install_gives_the_compiler_none_of_the_callers_environment(cli, shim_env, tmp_path):
    """A root-owned compiler wrapper records the environment it was run with: the system's
    PATH and LC_ALL only, whatever the caller had (CPATH, GCC_EXEC_PREFIX and LD_PRELOAD
    would add headers, programs or libraries nobody checked)."""
    _need_root()
    _need_build()
    tools = tmp_path / "tools"
    tools.mkdir()
    log = tmp_path / "env.log"
    wrapper = tools / "cc"
    wrapper.write_text(f"#!/bin/sh\nenv >> {log}\nexec /usr/bin/gcc \"$@\"\n")
    wrapper.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _own(theirs)
    env = dict(shim_env, CPATH=str(theirs), C_INCLUDE_PATH=str(theirs), GCC_EXEC_PREFIX=f"{theirs}/",
               COMPILER_PATH=str(theirs), LIBRARY_PATH=str(theirs), PATH=f"{theirs}:{os.environ['PATH']}")
    rc, out, err, prefix = _install(cli, tmp_path, env, "--cc", str(wrapper))
    assert rc == 0, err
    runs = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            for block in log.read_text().split("LC_ALL=C")]
    seen = set().union(*(r.keys() for r in runs))
    assert {"CPATH", "C_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH"}.isdisjoint(seen), seen
    paths = {r["PATH"] for r in runs if "PATH" in r}
    assert paths == {"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, paths


def test_compile_error_names_the_first_error_and_the_log(cli, tmp_path):
    """A header that does not compile: the compiler's first error line and where the whole
    output is, not its last line (a caret)."""
    _need_build()
    inc = tmp_path / "inc" / "slurm"
    inc.mkdir(parents=True)
    for h in Path(spank_include()).glob("*.h"):
        shutil.copy(h, inc / h.name)
    with open(inc / "spank.h", "a") as f:
        f.write("\nthis is not C;\n")
    rc, out, err = cli("spank", "build", "--out", str(tmp_path / "out"), "--include", str(inc))
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "error:" in err and "spank.h" in err and "^" not in err.split("failed:")[1].split("(the")[0], err
    log = Path(err.split("the compiler's output: ")[1].rstrip(")\n"))
    assert log.is_file() and "this is not C" in log.read_text()
    log.unlink()


# --- 2. what is copied into the prefix --------------------------------------------------


def test_install_copies_no_shim_or_adapter_a_user_controls(cli, built, shim_env, tmp_path):
    _need_root()
    _need_build()
    from transit_launch.preload import inject
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shutil.copy(built["shim"], theirs / "libtransit.so")
    shutil.copytree(inject.adapter_dir(), theirs / "adapter", ignore=shutil.ignore_patterns("__pycache__"))
    _own(theirs)
    # a root-owned adapter directory holding one module of the user's, and one holding a link
    mixed = tmp_path / "mixed"
    shutil.copytree(inject.adapter_dir(), mixed, ignore=shutil.ignore_patterns("__pycache__"))
    os.chown(mixed / "transit_api.py", NOBODY, NOBODY)
    linked = tmp_path / "linked"
    shutil.copytree(inject.adapter_dir(), linked, ignore=shutil.ignore_patterns("__pycache__"))
    (linked / "transit_api.py").unlink()
    (linked / "transit_api.py").symlink_to(theirs / "adapter" / "transit_api.py")
    for env, needle in (
            ({"TRANSIT_SHIM": str(theirs / "libtransit.so")},
             f"the shim to install ($TRANSIT_SHIM) {theirs}/libtransit.so: {theirs} is not owned by root"),
            ({"TRANSIT_ADAPTER_DIR": str(theirs / "adapter")}, f"($TRANSIT_ADAPTER_DIR) {theirs}/adapter: {theirs} "
                                                               "is not owned by root"),
            ({"TRANSIT_ADAPTER_DIR": str(mixed)}, f"{mixed}/transit_api.py is not owned by root"),
            ({"TRANSIT_ADAPTER_DIR": str(linked)}, f"{linked}/transit_api.py: cannot be opened as a file")):
        rc, out, err, prefix = _install(cli, tmp_path, dict(shim_env, **env))
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (env, err)
        _nothing_written(tmp_path, prefix)


def test_installed_files_are_the_checked_ones(cli, built, shim_env, tmp_path):
    """The good case: root's shim and adapter go in byte for byte, root's, 0755/0644, in
    directories the installer made 0755; the include line names where the shim came from."""
    _need_root()
    _need_build()
    from transit_launch.preload import inject
    rc, out, err, prefix = _install(cli, tmp_path, dict(shim_env, TRANSIT_ADAPTER_DIR=str(inject.adapter_dir())))
    assert rc == 0, err
    lib = prefix / "lib" / "transit-launch"
    assert (lib / "libtransit.so").read_bytes() == Path(built["shim"]).read_bytes()
    for p in (prefix, prefix / "lib", lib, lib / "adapter", prefix / "lib" / "slurm"):
        st = p.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), p
    for f, mode in ((lib / "libtransit.so", 0o755), (lib / "adapter" / "sitecustomize.py", 0o644),
                    (prefix / "lib" / "slurm" / "transit_spank.so", 0o755)):
        assert (f.stat().st_uid, stat.S_IMODE(f.stat().st_mode)) == (0, mode), f
    assert f"# shim installed from {built['shim']}" in (tmp_path / "conf" / "transit.conf").read_text()
    assert not list(lib.glob(".*")), "a temporary file was left behind"


# --- 3. the prefix: refused before anything is written, directories made by descriptor ---


def test_prefix_through_a_users_link_is_refused_before_writing(cli, shim_env, tmp_path):
    _need_root()
    _need_build()
    target = tmp_path / "roots"  # root's files the link points at
    (target / "lib" / "slurm").mkdir(parents=True)
    (target / "lib" / "transit-launch").mkdir(parents=True)
    (target / "lib" / "slurm" / "transit_spank.so").write_bytes(b"root's plugin")
    (target / "lib" / "transit-launch" / "libtransit.so").write_bytes(b"root's shim")
    before = _tree(target)
    ww = tmp_path / "ww"
    ww.mkdir()
    ww.chmod(0o777)
    (ww / "p").symlink_to(target)
    os.lchown(ww / "p", NOBODY, NOBODY)
    rc, out, err, _ = _install(cli, tmp_path, shim_env, prefix=ww / "p")
    assert rc == 2 and f"{ww} is writable by group or others" in err, err
    assert _tree(target) == before, "root's files behind the link were changed"
    assert not (tmp_path / "conf").exists()


def test_plugstack_dir_and_plugin_dir_a_user_can_change(cli, shim_env, tmp_path):
    """The include directory (whoever writes it rewrites the line) and an existing plugin
    directory of a user's (they could swap the plugin): refused, nothing written."""
    _need_root()
    _need_build()
    ww = tmp_path / "ww"
    ww.mkdir()
    ww.chmod(0o777)
    rc, out, err = cli("spank", "install", "--prefix", str(tmp_path / "p"), "--plugstack-dir", str(ww / "conf"),
                       env=shim_env)
    assert rc == 2 and f"--plugstack-dir {ww}/conf: {ww} is writable by group or others" in err, err
    assert not (tmp_path / "p").exists() and not (ww / "conf").exists()
    slurm_dir = tmp_path / "q" / "lib" / "slurm"
    slurm_dir.mkdir(parents=True)
    os.chown(slurm_dir, NOBODY, NOBODY)
    rc, out, err = cli("spank", "install", "--prefix", str(tmp_path / "q"), "--plugstack-dir",
                       str(tmp_path / "conf"), env=shim_env)
    assert rc == 2 and f"--prefix {slurm_dir}: {slurm_dir} is not owned by root" in err, err
    assert not (tmp_path / "q" / "lib" / "transit-launch").exists() and not (tmp_path / "conf").exists()


def test_a_directory_swapped_while_it_is_made_is_refused(tmp_path, monkeypatch):
    """The race: right after mkdir, the new directory is replaced by a link to a root-only
    file. The walk opens what it made with O_NOFOLLOW and sets the mode through that
    descriptor, so it refuses and the file keeps its mode."""
    _need_root()
    from transit_launch.slurm import trust
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    real_mkdir = os.mkdir

    def racing_mkdir(name, mode=0o777, *, dir_fd=None):
        real_mkdir(name, mode, dir_fd=dir_fd)
        os.rmdir(name, dir_fd=dir_fd)
        os.symlink(str(secret), name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    with pytest.raises(trust.Untrusted, match="changed while it was checked"):
        trust.walk("--prefix", str(tmp_path / "new" / "lib"), want_dir=True, create=True)
    monkeypatch.undo()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


# --- 4 and 5: jobs of an unprivileged user on the lab cluster ------------------------------


@pytest.fixture(scope="module")
def victim():
    """A second unprivileged account (the attacked user); made once if this machine has none."""
    _need_root()
    try:
        return pwd.getpwnam(VICTIM)
    except KeyError:
        res = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", VICTIM],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot make the second user {VICTIM}: {res.stderr.strip()}")
        return pwd.getpwnam(VICTIM)


@pytest.fixture(scope="module")
def shared(built):
    """A directory every user can reach (the session's tmp is root's 0700), with the fake
    CUDA program and libtransit.so copied in, and a shared group directory anyone can write."""
    _need_root()
    d = Path(tempfile.mkdtemp(prefix="transit-trust-"))
    d.chmod(0o755)
    for f in ("app", "libcudart.so.13"):
        shutil.copy(built["dir"] / f, d / f)
    shutil.copy(built["shim"], d / "libtransit.so")
    (d / "group").mkdir()
    (d / "group").chmod(0o777)  # shared, not sticky: anyone can add and remove entries
    (d / "jobs").mkdir()
    (d / "jobs").chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as(uid, gid, *cmd, env, **kw):
    return subprocess.run(cmd, user=uid, group=gid, extra_groups=[], env=env, capture_output=True, text=True,
                          timeout=60, **kw)


def test_stats_are_not_written_through_a_planted_link(lab, victim, shared):
    """The victim's job writes its stats into a shared directory; the attacker has planted
    links under the names the writer would use (old scheme: <file>.tmp<pid>.<n>, for the
    job's pid) and at the stats file itself, pointing at the victim's private file."""
    from tests.test_spank_lab import site_line
    home = shared / "victim-home"
    home.mkdir()
    private = home / "private.txt"
    private.write_text("the victim's own data\n")
    private.chmod(0o600)
    os.chown(home, victim.pw_uid, victim.pw_gid)
    os.chown(private, victim.pw_uid, victim.pw_gid)
    home.chmod(0o755)
    group, jobs = shared / "group", shared / "jobs"
    pid_file, go = jobs / "pid", jobs / "go"
    script = jobs / "stats.sh"
    # the job waits until the attacker has planted the links for its pid, then becomes the
    # CUDA program (exec keeps the pid)
    script.write_text(f"#!/bin/bash\necho $$ > {pid_file}\nwhile [ ! -e {go} ]; do sleep 0.1; done\n"
                      f"export LD_LIBRARY_PATH={shared}\nexec {shared}/app alloc 1048576\n")
    script.chmod(0o755)
    env = dict(lab.env, PATH="/usr/bin:/bin")
    with site_line(lab, f"required {lab.plugin} shim={shared}/libtransit.so"):
        res = _as(victim.pw_uid, victim.pw_gid, "sbatch", "--parsable", "--transit=advise",
                  f"--transit-stats={group}", "-o", f"{jobs}/out-%j.txt", f"--chdir={jobs}", str(script), env=env)
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip()
        t0 = time.time()
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.time() - t0 < 60:
            time.sleep(0.1)
        pid = pid_file.read_text().strip()
        final = group / f"transit-{pid}.json"
        for name in [f"{final.name}.tmp{pid}.{n}" for n in range(4)] + [final.name]:
            r = _as(NOBODY, NOBODY, "ln", "-s", str(private), str(group / name), env={"PATH": "/usr/bin:/bin"})
            assert r.returncode == 0, r.stderr
        go.touch()
        info = lab.wait_job(job, timeout=120)
    out = (jobs / f"out-{job}.txt").read_text()
    assert info["JobState"] == "COMPLETED", out
    assert private.read_text() == "the victim's own data\n", "the job wrote through the attacker's link"
    assert not final.is_symlink() and final.is_file(), out
    assert json.loads(final.read_text())["policy"] == "advise"
    assert final.stat().st_uid == victim.pw_uid
    assert not [p for p in group.iterdir() if not p.is_symlink() and ".tmp" in p.name], "a temporary file was left"


def test_a_value_refused_on_the_node_forges_no_log_line(lab, shared):
    """An unprivileged user forges the plugin's option values through --export-file (NUL-
    separated, so a value can hold a newline): the values are ignored on the node, the job
    runs with what it asked for at submission, and no line of slurmd's log is the forged one
    or holds the 100 KB value."""
    jobs = shared / "jobs"
    forged = "FORGED: slurmd: error: root logged in"
    big = "/" + "A" * 100_000
    export = jobs / "export.env"
    export.write_bytes(b"\0".join(s.encode() for s in (
        f"_SLURM_SPANK_OPTION_transit_transit_stats=/tmp/x\n{forged}",
        f"_SLURM_SPANK_OPTION_transit_transit_budget=40GB\n{forged}",
        f"_SLURM_SPANK_OPTION_transit_transit=advise\n{forged}",
        f"_SLURM_SPANK_OPTION_transit_transit_budget={'9' * 100_000}GB",
        f"SLURM_SPANK_TRANSIT_STATS={big}",
        "PATH=/usr/bin:/bin")) + b"\0")
    export.chmod(0o644)
    script = jobs / "probe.sh"
    script.write_text('#!/bin/bash\necho "ROW|$TRANSIT_POLICY|$TRANSIT_GPU_BUDGET|$TRANSIT_STATS"\n'
                      '/usr/bin/srun -N1 /bin/bash -c \'echo "ROW|$TRANSIT_POLICY|$TRANSIT_GPU_BUDGET|$TRANSIT_STATS"\'\n')
    script.chmod(0o755)
    logs = sorted((lab.lab / "log").glob("slurmd-*.log"))
    sizes = {p: p.stat().st_size for p in logs}
    from tests.test_spank_lab import site_line
    with site_line(lab, f"required {lab.plugin} shim={shared}/libtransit.so"):
        res = _as(NOBODY, NOBODY, "sbatch", "--parsable", "--transit=prefetch", "--transit-budget=20GB",
                  f"--export-file={export}", "-o", f"{jobs}/forge-%j.txt", f"--chdir={jobs}", str(script),
                  env=dict(lab.env, PATH="/usr/bin:/bin"))
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip()
        info = lab.wait_job(job, timeout=120)
    out = (jobs / f"forge-{job}.txt").read_text()
    assert info["JobState"] == "COMPLETED", out
    rows = [line for line in out.splitlines() if line.startswith("ROW|")]
    assert rows == ["ROW|prefetch|20GB|"] * 2, out
    def new_lines():
        return "".join(p.read_text(errors="replace")[sizes[p]:] for p in logs)
    deadline = time.monotonic() + 30  # slurmd's log is written after the step ends: wait for the plugin's line
    while "transit:" not in new_lines() and time.monotonic() < deadline:
        time.sleep(0.2)
    new = new_lines()
    lines = new.splitlines()
    assert not [ln for ln in lines if ln.startswith("FORGED")], new[-3000:]
    assert not [ln for ln in lines if len(ln) > 2000], "a log line holds the 100 KB value"
    assert "transit:" in new, "the plugin said nothing of the values it ignored"


def test_files_the_cli_writes_go_through_no_planted_link(tmp_path):
    """`render -o` and the plots write through a temporary file and a rename: a link
    planted under the old predictable temporary name (.NAME.tmp<pid>.SUFFIX) or at the
    file itself is neither written through nor followed."""
    from transit_launch.output_files import write_text_atomically
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "job.sh"
    (shared / f".job.tmp{os.getpid()}.sh").symlink_to(victim)
    write_text_atomically(str(target), "#!/bin/bash\n")
    assert victim.read_text() == "keep\n" and target.read_text() == "#!/bin/bash\n"
    target.unlink()
    target.symlink_to(victim)
    write_text_atomically(str(target), "second\n")
    assert victim.read_text() == "keep\n" and not target.is_symlink() and target.read_text() == "second\n"
    assert sorted(p.name for p in shared.iterdir()) == [f".job.tmp{os.getpid()}.sh", "job.sh"]
    mode = stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


# --- found by the second attack review ------------------------------------------------------


def _wrapper(tmp_path, name, body):
    """A root-owned compiler wrapper in a root-only directory (it passes the compiler's own
    check) that answers some questions itself and hands the rest to gcc."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    w = tools / name
    w.write_text("#!/bin/sh\n" + body + 'exec /usr/bin/gcc "$@"\n')
    w.chmod(0o755)
    return w


def test_install_refuses_a_toolchain_directory_a_user_can_write(cli, shim_env, tmp_path):
    """GCC takes as/ld from its program directories and headers from its include list
    (/usr/local/bin and /usr/local/include first): a compiler whose search directories
    include one a user can write is refused, before it compiles anything."""
    _need_root()
    _need_build()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    _own(theirs)
    calls = tmp_path / "calls"
    progs = _wrapper(tmp_path, "cc-progs", f'echo "$*" >> {calls}\n'
                                           f'[ "$1" = -print-search-dirs ] && {{ echo "programs: ={theirs}/"; exit 0; }}\n')
    rc, out, err, prefix = _install(cli, tmp_path, shim_env, "--cc", str(progs))
    assert rc == 2 and f"the compiler's search directory {theirs}: {theirs} is not owned by root" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not [c for c in calls.read_text().splitlines() if "-shared" in c], "it compiled before refusing"
    _nothing_written(tmp_path, prefix)
    incs = _wrapper(tmp_path, "cc-incs", f'case "$*" in *"-E -v"*) printf "#include <...> search starts here:\\n '
                                          f'{theirs}\\nEnd of search list.\\n" >&2; exit 0;; esac\n')
    rc, out, err, prefix = _install(cli, tmp_path, shim_env, "--cc", str(incs))
    assert rc == 2 and f"the compiler's search directory {theirs}" in err, err


def test_the_compilers_path_keeps_only_directories_root_alone_can_change(tmp_path, monkeypatch):
    from transit_launch.slurm import toolchain
    _need_root()
    ww = tmp_path / "ww"
    ww.mkdir()
    ww.chmod(0o777)
    ok = tmp_path / "ok"
    ok.mkdir()
    ok.chmod(0o755)
    monkeypatch.setattr(toolchain, "SYSTEM_PATH", (str(ww), str(ok), str(tmp_path / "missing")))
    assert toolchain.safe_path() == str(ok)


def test_every_header_the_build_includes_is_checked(tmp_path):
    """The compiler's own dependency list (-M) names the headers a build reads; one another
    user owns is refused, wherever it lies."""
    from transit_launch.slurm import toolchain, trust
    _need_root()
    _need_build()
    d = tmp_path / "src"
    d.mkdir()
    (d / "theirs.h").write_text("#define X 1\n")
    os.chown(d / "theirs.h", NOBODY, NOBODY)
    (d / "a.c").write_text('#include <stdio.h>\n#include "theirs.h"\nint x = X;\n')
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
    with pytest.raises(trust.Untrusted, match=f"a file the plugin.s build reads {d}/theirs.h: {d}/theirs.h is not owned"):
        toolchain.check_headers("/usr/bin/gcc", env, [], [str(d / "a.c")])
    os.chown(d / "theirs.h", 0, 0)
    toolchain.check_headers("/usr/bin/gcc", env, [], [str(d / "a.c")])  # stdio.h and the rest pass


def test_build_out_writes_through_no_planted_link(cli, tmp_path):
    """`spank build --out DIR` as root: into a directory a user owns (links planted under
    the names a temporary file could have had, and at the plugin's own name), or through
    a link a user made, it is refused before anything is written; into root's directory
    the plugin goes in through the descriptor, replacing a link at its name."""
    _need_root()
    _need_build()
    rootfile = tmp_path / "rootfile"
    rootfile.write_text("root's\n")
    rootfile.chmod(0o600)
    rootonly = tmp_path / "rootonly"
    rootonly.mkdir(mode=0o700)
    out = tmp_path / "ubuild"
    out.mkdir()
    pid = int(Path("/proc/sys/kernel/ns_last_pid").read_text()) if Path("/proc/sys/kernel/ns_last_pid").exists() else 0
    for n in range(pid, pid + 200):
        (out / f".transit_spank.so.{n}").symlink_to(rootfile)
    (out / "transit_spank.so").symlink_to(rootfile)
    (out / "link").symlink_to(rootonly)
    _own(out)
    for target, needle in ((out, f"--out {out}: {out} is not owned by root"),
                           (out / "link", f"--out {out}/link: {out} is not owned by root"),
                           (out / "link" / "new", f"{out} is not owned by root")):  # made in an existing parent
        rc, o, err = cli("spank", "build", "--out", str(target))
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert rootfile.read_text() == "root's\n" and stat.S_IMODE(rootfile.stat().st_mode) == 0o600
    assert list(rootonly.iterdir()) == []
    (rootonly / "transit_spank.so").symlink_to(rootfile)
    rc, o, err = cli("spank", "build", "--out", str(rootonly))
    assert rc == 0, err
    plugin = rootonly / "transit_spank.so"
    assert not plugin.is_symlink() and plugin.read_bytes()[:4] == b"\x7fELF" and rootfile.read_text() == "root's\n"


def test_a_header_that_fails_only_when_listed_is_refused(cli, shim_env, tmp_path):
    """The header check fails closed: a compiler run that cannot list what the build reads
    (-M) refuses the build, instead of compiling unchecked headers (a header served one
    way to -M and another to the compile ran its constructor as root)."""
    _need_root()
    _need_build()
    calls = tmp_path / "calls"
    cc = _wrapper(tmp_path, "cc-nolist", f'echo "$*" >> {calls}\ncase " $* " in *" -M "*) '
                                         'echo "spank.h:1:2: error: #error served to -M" >&2; exit 1;; esac\n')
    rc, out, err, prefix = _install(cli, tmp_path, shim_env, "--cc", str(cc))
    assert rc == 2 and "compiling the SPANK plugin failed: spank.h:1:2: error: #error served to -M" in err, err
    assert not [c for c in calls.read_text().splitlines() if "-shared" in c or " -o " in f" {c} " and "-M" not in c
                and "-E" not in c], "it compiled after the listing failed"
    _nothing_written(tmp_path, prefix)


def test_the_linkers_own_directories_are_checked():
    """GNU ld searches its script's SEARCH_DIRs and loads LTO plugins from bfd-plugins by
    itself: those are among the directories the toolchain check walks."""
    from transit_launch.slurm import toolchain
    _need_build()
    env = {"PATH": toolchain.safe_path(), "LC_ALL": "C"}
    script = subprocess.run(["ld", "--verbose"], capture_output=True, text=True, env=env).stdout
    wanted = {d.split('"')[1].lstrip("=") for d in script.split("SEARCH_DIR(")[1:]}
    wanted = {os.path.normpath(d) for d in wanted if os.path.isdir(d)}
    dirs = set(toolchain.search_dirs("/usr/bin/gcc", env))
    assert wanted and wanted <= dirs, wanted - dirs
    assert all(d in dirs for d in toolchain.LD_PLUGIN_DIRS if os.path.isdir(d))


def test_stats_follow_no_link_in_another_users_sticky_directory(built, tmp_path):
    """The owner of a sticky directory can move any entry in it: a root-owned link in a
    sticky directory that another user owns is not followed by a root job."""
    _need_root()
    base = Path(tempfile.mkdtemp(prefix="transit-stats-"))
    try:
        base.chmod(0o755)
        theirs = base / "theirs"
        theirs.mkdir()
        rootonly = base / "rootonly"
        rootonly.mkdir(mode=0o700)
        (theirs / "link").symlink_to(rootonly)
        os.chown(theirs, NOBODY, NOBODY)
        theirs.chmod(0o1755)
        res = _app_stats(built, theirs / "link")
        assert res.returncode == 0 and not list(rootonly.iterdir()), res.stderr
        assert "a link that another user could have made" in res.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_rank_with_a_slash_names_no_other_directory(built, tmp_path):
    """RANK fills the file's name (%r, or transit-rank<RANK>.json in a directory): a '/' in it
    would reach another directory, so nothing is written and the shim says why."""
    d = tmp_path / "stats"
    d.mkdir()
    (tmp_path / "other").mkdir()
    for stats in (d, d / "s-%r.json"):
        res = _app_stats(built, stats, rank="../other/x")
        assert res.returncode == 0 and "RANK holds a '/'" in res.stderr, res.stderr
    assert list((tmp_path / "other").iterdir()) == [] and list(d.iterdir()) == []


def test_root_stats_follow_no_link_another_user_made(built, tmp_path):
    """A root job's TRANSIT_STATS names a directory through a link that another user made
    in a sticky, world-writable directory (/tmp): not followed (the kernel's
    protected_symlinks rule, applied by the shim itself); root's own link there is."""
    _need_root()
    base = Path(tempfile.mkdtemp(prefix="transit-stats-"))
    try:
        base.chmod(0o755)
        sticky = base / "tmp"
        sticky.mkdir()
        sticky.chmod(0o1777)
        rootonly = base / "rootonly"
        rootonly.mkdir()
        rootonly.chmod(0o700)
        (sticky / "teamstats").symlink_to(rootonly)
        os.lchown(sticky / "teamstats", NOBODY, NOBODY)
        (sticky / "mine").symlink_to(rootonly)  # root's own link: followed
        for link, followed in (("teamstats", False), ("mine", True)):
            res = _app_stats(built, sticky / link)
            assert res.returncode == 0, res.stderr
            written = (rootonly / "transit-rank0.json").exists()
            assert written == followed, (link, res.stderr)
            if not followed:
                assert "a link that another user could have made" in res.stderr, res.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_installed_adapter_has_roots_own_bytecode(cli, built, shim_env, tmp_path):
    """The installer compiles the adapter into a __pycache__ of root's: a root job with
    umask 000 importing it makes no directory or file others can write (it made a 0777
    __pycache__, after which the plugin refused every job)."""
    _need_root()
    _need_build()
    from transit_launch.preload import inject
    rc, out, err, prefix = _install(cli, tmp_path, dict(shim_env, TRANSIT_ADAPTER_DIR=str(inject.adapter_dir())))
    assert rc == 0, err
    adapter = prefix / "lib" / "transit-launch" / "adapter"
    cache = adapter / "__pycache__"
    assert (cache.stat().st_uid, stat.S_IMODE(cache.stat().st_mode)) == (0, 0o755)
    assert any(p.name.startswith("sitecustomize.") for p in cache.iterdir())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    res = subprocess.run(["/bin/sh", "-c", f"umask 000; exec python3 -c 'import sys; sys.path.insert(0, \"{adapter}\"); "
                          "import transit_api, transit_step, transit_staging, transit_state_pool, "
                          "transit_streamed, transit_sparse, transit_host, transit_split'"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loose = [str(p) for p in [adapter, *adapter.rglob("*")] if p.stat().st_mode & 0o022]
    assert loose == [], loose


def test_a_race_while_a_directory_is_made_is_one_line(tmp_path, monkeypatch):
    """Someone makes the directory between the walk's look and its mkdir: a refusal, not
    a FileExistsError traceback."""
    _need_root()
    from transit_launch.slurm import trust
    real_mkdir = os.mkdir

    def raced(name, mode=0o777, *, dir_fd=None):
        real_mkdir(name, mode, dir_fd=dir_fd)
        real_mkdir(name, mode, dir_fd=dir_fd)  # the second one loses the race
    monkeypatch.setattr(os, "mkdir", raced)
    with pytest.raises(trust.Untrusted, match="changed while it was checked"):
        trust.walk("--prefix", str(tmp_path / "new"), want_dir=True, create=True)


def test_a_compiler_that_writes_nothing_is_one_line(cli, tmp_path):
    """--cc naming a program that exits 0 without compiling (true): one line, not a
    traceback from reading the plugin it never wrote."""
    _need_build()
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    rc, o, err = cli("spank", "build", "--out", str(out), "--cc", "/bin/true")
    assert rc == 2 and "exited 0 but wrote no transit_spank.so" in err and len(err.strip().splitlines()) == 1, err
    assert list(out.iterdir()) == []
