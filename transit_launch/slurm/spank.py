"""`transit-launch spank build|install`: compile the SPANK plugin (spank/) against the
site's spank.h, install it with the shim and the adapter under a prefix, and write a
plugstack include file that points at them.

The installer refuses what the plugin would refuse at load: before it writes the line
it runs the plugin's own parser on it (spank/tools/check.c links spank/args.c), so a
line that would fail every sbatch on the cluster is never written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from transit_launch import csrc
from transit_launch.shim import inject
from transit_launch.errors import UsageError

SRC = csrc.spank()
# Hardened like pyxis: stack protector, fortify, full RELRO; exports limited by the map.
CFLAGS = ["-std=c11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"]
LDFLAGS = ["-shared", "-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack"]
PLUGIN = "transit_spank.so"
CHECK = "transit_spank_check"
LIBSRC = ("args.c", "env.c")  # what the check tool and the fuzz harness link from the plugin

SPANK_H_DIRS = ("/usr/include/slurm", "/usr/local/include/slurm")


def locate_spank_h() -> Path | None:
    """The directory of the installed spank.h: $SLURM_HOME or $SLURM_PREFIX first, then
    the usual system places; None when there is none."""
    dirs = [os.path.join(os.environ[v], "include", "slurm") for v in ("SLURM_HOME", "SLURM_PREFIX")
            if os.environ.get(v)]
    return next((Path(d) for d in [*dirs, *SPANK_H_DIRS] if Path(d, "spank.h").is_file()), None)


def find_spank_h(include: str | None = None) -> Path:
    if include:  # an explicit directory is not second-guessed
        if Path(include, "spank.h").is_file():
            return Path(include)
        raise UsageError(f"--include {include}: no spank.h there")
    found = locate_spank_h()
    if found is None:
        raise UsageError("spank.h not found (Debian/Ubuntu: apt install libslurm-dev; RHEL: slurm-devel; "
                         "or give --include DIR)")
    return found


def _compile(target: Path, sources: list[Path], include: str | None, cc: str | None, flags: list[str]) -> Path:
    inc = find_spank_h(include)
    cc = cc or os.environ.get("CC") or "cc"
    if not shutil.which(cc) and not shutil.which("gcc" if cc == "cc" else cc):
        raise UsageError(f"no C compiler ({cc}) found: install gcc (or set CC) to build the SPANK plugin")
    cc = shutil.which(cc) or shutil.which("gcc")
    if not (SRC / "plugin.c").is_file():
        raise UsageError(f"the SPANK plugin sources are not at {SRC} (install transit-launch from its source tree)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # spank.h includes <slurm/spank.h>-relative headers: add the directory above slurm/.
    cmd = [cc, *CFLAGS, f"-I{inc.parent}", *flags, "-o", str(target), *map(str, sources)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise UsageError(f"compiling the SPANK plugin failed: {last}")
    return target


def build(out_dir: str | Path, include: str | None = None, cc: str | None = None) -> Path:
    """The plugin, out_dir/transit_spank.so."""
    return _compile(Path(out_dir) / PLUGIN, sorted(SRC.glob("*.c")), include, cc,
                    [*LDFLAGS, f"-Wl,--version-script={SRC / 'transit_spank.map'}"])


def build_check(out_dir: str | Path, include: str | None = None, cc: str | None = None) -> Path:
    """out_dir/transit_spank_check: the plugin's plugstack parser as a program."""
    return _compile(Path(out_dir) / CHECK, [SRC / "tools" / "check.c", *(SRC / s for s in LIBSRC)], include, cc, [])


def check_args(args: list[str], include: str | None = None, conf_dir: Path | None = None,
               plugin: Path | None = None) -> None:
    """Refuse, with the plugin's own message, the arguments the plugin would refuse at load
    (and an include directory, or an installed plugin, that others could change)."""
    checks = [(args, "the plugin would refuse this line")] if args else []
    if conf_dir:
        checks.append((["--dir", str(conf_dir)], "the plugstack include directory is not safe"))
    if plugin:
        checks.append((["--file", str(plugin)], "the installed plugin is not safe"))
    with tempfile.TemporaryDirectory() as d:
        exe = build_check(d, include)
        for argv, what in checks:
            res = subprocess.run([str(exe), *argv], capture_output=True, text=True)
            if res.returncode != 0:
                lines = res.stderr.strip().splitlines()
                raise UsageError(f"{what}: {lines[-1] if lines else f'exit {res.returncode}'}")


# Slurm splits a plugstack line at spaces, tabs and newlines and cuts it at '#', with no
# quoting; LD_PRELOAD splits at ':' too.
_UNSAFE = re.compile(r"[\s#:$\x00-\x1f\x7f-\uffff]")


def _line_path(what: str, path: Path | str) -> str:
    text = str(path)
    if _UNSAFE.search(text):
        raise UsageError(f"{what} {text!r}: a plugstack line cannot hold a path with spaces, '#', ':', '$' or "
                         "control characters (Slurm splits it there, ld.so expands '$'); choose another --prefix")
    if not os.path.isabs(text):
        raise UsageError(f"{what} {text!r} is not an absolute path")
    return text


def plugstack_line(plugin: Path, shim: Path | None, adapter: Path | None, default: str = "off",
                   allowed: str = "off,base,prefetch,advise", oversubscribe: str = "deny") -> str:
    args = plugstack_args(shim, adapter, default, allowed, oversubscribe)
    return f"required {_line_path('plugin', plugin)} {' '.join(args)}"


def plugstack_args(shim: Path | None, adapter: Path | None, default: str = "off",
                   allowed: str = "off,base,prefetch,advise", oversubscribe: str = "deny") -> list[str]:
    args = [f"shim={_line_path('shim', shim)}"] if shim else []
    if adapter:
        args.append(f"adapter={_line_path('adapter', adapter)}")
    for key, val in (("default", default), ("allowed", allowed), ("oversubscribe", oversubscribe)):
        if _UNSAFE.search(val) or "=" in val:
            raise UsageError(f"--{key} {val!r}: not a plugstack value")
        args.append(f"{key}={val}")
    return args


def _put(src: Path, dst: Path, mode: int) -> None:
    """Copy src to dst by rename (a running job that maps the old file keeps it intact),
    owned by root when we are root, mode as given."""
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.")
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out)
            os.fchmod(out.fileno(), mode)
            if os.geteuid() == 0:
                os.fchown(out.fileno(), 0, 0)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mkdir(d: Path) -> None:
    """d and the directories above it that we create: 0755, root's when we are root."""
    missing = [p for p in [d, *d.parents] if not p.exists()]
    d.mkdir(parents=True, exist_ok=True)
    for p in missing:
        os.chmod(p, 0o755)
        if os.geteuid() == 0:
            os.chown(p, 0, 0)


def install(prefix: str, plugstack_dir: str, include: str | None = None, default: str = "off",
            allowed: str = "off,base,prefetch,advise", oversubscribe: str = "deny") -> tuple[Path, Path]:
    """PREFIX/lib/slurm/transit_spank.so, PREFIX/lib/transit-launch/{libtransit.so,adapter/}
    and PLUGSTACK_DIR/transit.conf pointing at them; refused before anything is written
    when the plugin would refuse the line."""
    shim = inject.shim_path()
    if shim is None or not shim.is_file():
        raise UsageError("libtransit.so is not built in this installation (see `transit-launch doctor`); "
                         "the plugin would have nothing to inject")
    adapter = inject.adapter_dir()
    if adapter is not None and not (adapter / "sitecustomize.py").is_file():
        raise UsageError(f"the hint adapter is not at {adapter} (no sitecustomize.py there)")
    prefix_p = Path(os.path.abspath(prefix))
    lib = prefix_p / "lib" / "transit-launch"
    dest_shim, dest_adapter = lib / "libtransit.so", lib / "adapter" if adapter else None
    plugin_dst = prefix_p / "lib" / "slurm" / PLUGIN
    conf_dir = Path(os.path.abspath(plugstack_dir))
    args = plugstack_args(dest_shim, dest_adapter, default, allowed, oversubscribe)  # refuses bad paths first
    _line_path("plugin", plugin_dst)
    _line_path("--plugstack-dir", conf_dir)
    with tempfile.TemporaryDirectory() as tmp:
        built = build(tmp, include)
        for d in (lib, plugin_dst.parent, conf_dir, *([dest_adapter] if dest_adapter else [])):
            _mkdir(d)
        _put(shim, dest_shim, 0o755)
        if adapter and dest_adapter:
            for f in sorted(adapter.glob("*.py")):
                _put(f, dest_adapter / f.name, 0o644)
        check_args(args, include, conf_dir)  # the plugin's parser, on the files as installed
        _put(built, plugin_dst, 0o755)
        # whoever can change the plugin (or a directory above it) runs code in every
        # slurmstepd as root: checked as installed, before the line points at it
        check_args([], include, plugin=plugin_dst)
    conf = conf_dir / "transit.conf"
    text = ("# transit-launch SPANK plugin: sbatch --transit=advise job.sh\n"
            f"# include it from plugstack.conf: include {conf_dir}/*.conf\n"
            f"required {plugin_dst} {' '.join(args)}\n")
    fd, tmpconf = tempfile.mkstemp(dir=conf_dir, prefix=".transit.conf.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        os.fchmod(f.fileno(), 0o644)
    os.replace(tmpconf, conf)
    return plugin_dst, conf
