"""`transit-launch spank build|install`: compile the SPANK plugin (spank/) against the
site's spank.h, install it, and write a plugstack include file that points at the
installed shim and adapter."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from transit_launch import csrc
from transit_launch.shim import inject
from transit_launch.errors import UsageError

SRC = csrc.spank()
# Hardened like pyxis: stack protector, fortify, full RELRO; exports limited by the map.
CFLAGS = ["-std=c11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"]
LDFLAGS = ["-shared", "-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack"]
PLUGIN = "transit_spank.so"


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


def build(out_dir: str | Path, include: str | None = None, cc: str | None = None) -> Path:
    inc = find_spank_h(include)
    cc = cc or os.environ.get("CC") or "cc"
    if not shutil.which(cc) and not shutil.which("gcc" if cc == "cc" else cc):
        raise UsageError(f"no C compiler ({cc}) found: install gcc (or set CC) to build the SPANK plugin")
    cc = shutil.which(cc) or shutil.which("gcc")
    if not (SRC / "plugin.c").is_file():
        raise UsageError(f"the SPANK plugin sources are not at {SRC} (install transit-launch from its source tree)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / PLUGIN
    # spank.h includes <slurm/spank.h>-relative headers: add the directory above slurm/.
    cmd = [cc, *CFLAGS, f"-I{inc.parent}", *LDFLAGS, f"-Wl,--version-script={SRC / 'transit_spank.map'}",
           "-o", str(target), *sorted(str(p) for p in SRC.glob("*.c"))]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise UsageError(f"compiling the SPANK plugin failed: {last}")
    return target


def plugstack_line(plugin: Path, shim: Path | None, adapter: Path | None, default: str = "off",
                   allowed: str = "off,base,prefetch,advise", oversubscribe: str = "deny") -> str:
    args = [f"default={default}", f"allowed={allowed}", f"oversubscribe={oversubscribe}"]
    if shim:
        args.insert(0, f"shim={shim}")
    if adapter:
        args.insert(1 if shim else 0, f"adapter={adapter}")
    return f"required {plugin} {' '.join(args)}"


def install(prefix: str, plugstack_dir: str, include: str | None = None, default: str = "off",
            allowed: str = "off,base,prefetch,advise", oversubscribe: str = "deny") -> tuple[Path, Path]:
    shim = inject.shim_path()
    if shim is None or not shim.is_file():
        raise UsageError("libtransit.so is not built in this installation (see `transit-launch doctor`); "
                         "the plugin would have nothing to inject")
    plugin = build(Path(prefix) / "lib" / "slurm", include)
    conf_dir = Path(plugstack_dir)
    conf_dir.mkdir(parents=True, exist_ok=True)
    conf = conf_dir / "transit.conf"
    conf.write_text("# transit-launch SPANK plugin: sbatch --transit=advise job.sh\n"
                    "# include it from plugstack.conf: include " + str(conf_dir) + "/*.conf\n"
                    + plugstack_line(plugin, shim, inject.adapter_dir(), default, allowed, oversubscribe) + "\n")
    return plugin, conf
