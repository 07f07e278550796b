"""What the C compiler reads and runs when root builds the SPANK plugin, checked with
trust.py's rule: not only the compiler's own file, but the directories it takes programs
(cc1, as, ld, collect2), libraries and headers from, and every header a build includes.

A directory on the search paths that another user can write lets them add an `as` or a
`string.h` that the compiler would prefer (GCC looks in /usr/local/bin and
/usr/local/include first); the PATH the compiler gets holds only the system directories
that pass, and any other directory it searches must pass, or the build is refused."""

from __future__ import annotations

import os
import re
import subprocess

from transit_launch.slurm import trust

SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
TIMEOUT = 300  # seconds a compiler query or build may take (a FIFO among the headers blocks it)
# where GNU ld loads plugins from by itself (LTO), besides its SEARCH_DIRs
LD_PLUGIN_DIRS = ("/usr/lib/bfd-plugins", "/usr/local/lib/bfd-plugins")


def safe_path() -> str:
    """The system directories of SYSTEM_PATH that exist and only root can change."""
    keep = []
    for d in SYSTEM_PATH:
        try:
            trust.walk("PATH", d, want_dir=True).close()
            keep.append(d)
        except (trust.Untrusted, OSError):
            continue  # left out of the compiler's PATH: it cannot find a program there
    return ":".join(keep)


def which(name: str, dirs) -> str:
    """The first dirs/name that is a file, or ''."""
    return next((os.path.join(d, name) for d in dirs if os.path.isfile(os.path.join(d, name))), "")


def prog_path(cc: str, prog: str, env: dict) -> str:
    """A program the compiler runs (cc1, as, ld, ...) as it resolves it: absolute, or found
    on env's PATH; '' when it has none."""
    name = (_run([cc, f"-print-prog-name={prog}"], env).strip().splitlines() or [""])[-1]
    path = name if "/" in name else which(name, env["PATH"].split(":")) if name else ""
    return path if path and os.path.isfile(path) else ""


def _run(cmd: list[str], env: dict) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout + res.stderr


def search_dirs(cc: str, env: dict) -> list[str]:
    """The directories the compiler takes programs, libraries and <headers> from."""
    dirs = []
    for line in _run([cc, "-print-search-dirs"], env).splitlines():
        key, _, value = line.partition(": ")
        if key in ("install", "programs", "libraries"):
            dirs += value.lstrip("=").split(":")
    lines = _run([cc, "-E", "-v", "-x", "c", "/dev/null", "-o", "/dev/null"], env).splitlines()
    if "#include <...> search starts here:" in lines:
        start = lines.index("#include <...> search starts here:") + 1
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("End of search list")), len(lines))
        dirs += [ln.strip().split(" (")[0] for ln in lines[start:end]]
    ld_path = prog_path(cc, "ld", env)
    if ld_path:  # the linker's own library directories (SEARCH_DIR in its script) and plugins
        script = _run([ld_path, "--verbose"], env)
        dirs += [m.lstrip("=") for m in re.findall(r'SEARCH_DIR\("([^"]+)"\)', script)]
        dirs += list(LD_PLUGIN_DIRS)
    out = []
    for d in dirs:
        d = os.path.normpath(d) if d else ""
        if d and os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def programs(cc: str, env: dict) -> list[str]:
    """The programs the compiler runs, as it resolves them."""
    return list(dict.fromkeys(p for p in (prog_path(cc, prog, env) for prog in ("cc1", "as", "ld", "collect2",
                                                                               "lto-wrapper")) if p))


def check(cc: str, env: dict) -> None:
    """Refuse (trust.Untrusted, one line) a toolchain with any part another user can change."""
    for d in search_dirs(cc, env):
        trust.walk("the compiler's search directory", d, want_dir=True).close()
    for p in programs(cc, env):
        trust.walk("a program the compiler runs", p, want_dir=False).close()


def check_headers(cc: str, env: dict, flags: list[str], sources: list[str]) -> subprocess.CompletedProcess:
    """Every file the build reads (the compiler's own list, -M: sources and headers) passes
    the check. Returns the -M run; one that failed is the caller's to refuse (it fails
    closed: a header that fails only under -M would otherwise go unchecked)."""
    res = subprocess.run([cc, *flags, "-M", *sources], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if res.returncode != 0:
        return res
    deps = res.stdout.replace("\\\n", " ").split()
    for dep in deps:
        if dep.endswith(":"):
            continue
        trust.walk("a file the plugin's build reads", os.path.abspath(dep), want_dir=False).close()
    return res

