"""`transit-launch spank build|install`: compile the SPANK plugin (spank/) against the
site's spank.h, install it with the shim and the adapter under a prefix, and write a
plugstack include file that points at them.

Root runs this, and slurmstepd loads what it installs: every input (the shim, the
adapter, the plugin's sources, spank.h, the compiler) must be root's and changeable by
root only, checked on open descriptors (trust.py), and the compiler runs in a private
tree with none of the caller's environment. The installer refuses what the plugin would
refuse at load: it runs the plugin's own parser (spank/tools/check.c links
spank/args.c) on the line before it writes anything, so a line that would fail every
sbatch on the cluster is never written."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import transit_launch
from transit_launch import csrc
from transit_launch.errors import UsageError
from transit_launch.rules import ENV
from transit_launch.preload import inject
from transit_launch.slurm import toolchain, trust

SRC = csrc.spank()
# Hardened like pyxis: stack protector, fortify, full RELRO; exports limited by the map.
CFLAGS = ["-std=c11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"]
LDFLAGS = ["-shared", "-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack"]
PLUGIN = "transit_spank.so"
CHECK = "transit_spank_check"
LIBSRC = ("args.c", "env.c")  # what the check tool and the fuzz harness link from the plugin

SPANK_H_DIRS = ("/usr/include/slurm", "/usr/local/include/slurm")
# Where the compiler is looked up. Its environment is a PATH and LC_ALL alone: CPATH,
# C_INCLUDE_PATH, GCC_EXEC_PREFIX, COMPILER_PATH, LD_PRELOAD and the like would add
# headers or programs that nobody checked.
SYSTEM_PATH = toolchain.SYSTEM_PATH
# What the plugin's sources include beside themselves (transit_spank.h, args.c).
SHIM_HEADERS = ("transit_rules.h", "transit_size.h")


def locate_spank_h() -> Path | None:
    """The directory of the installed spank.h: $SLURM_HOME or $SLURM_PREFIX first, then
    the usual system places; None when there is none."""
    return next((Path(d) for _, d in _spank_h_candidates() if Path(d, "spank.h").is_file()), None)


def _spank_h_candidates() -> list[tuple[str, str]]:
    return [*((f"${v}", os.path.join(os.environ[v], "include", "slurm")) for v in ("SLURM_HOME", "SLURM_PREFIX")
              if os.environ.get(v)), *(("spank.h", d) for d in SPANK_H_DIRS)]


def find_spank_h(include: str | None = None) -> tuple[str, Path]:
    """(where the directory came from, the directory holding spank.h)."""
    if include:  # an explicit directory is not second-guessed, only checked
        if Path(include, "spank.h").is_file():
            return "--include", Path(os.path.abspath(include))
        raise UsageError(f"--include {include}: no spank.h there")
    for source, d in _spank_h_candidates():
        if Path(d, "spank.h").is_file():
            return source, Path(d)
    raise UsageError("spank.h not found (Debian/Ubuntu: apt install libslurm-dev; RHEL: slurm-devel; "
                     "or give --include DIR)")


def find_cc(cc: str | None = None) -> tuple[str, str]:
    """(where the name came from, the compiler's path): --cc, else $CC, else cc or gcc on
    the system's PATH (not the caller's)."""
    source, name = ("--cc", cc) if cc else ("$CC", os.environ["CC"]) if os.environ.get("CC") else ("cc", "cc")
    if "/" in name:
        path = os.path.abspath(name)
        if os.path.isfile(path):
            return source, path
    else:
        for prog in (name, "gcc") if name == "cc" else (name,):
            if (path := toolchain.which(prog, SYSTEM_PATH)):
                return source, path
    raise UsageError(f"no C compiler ({source} {name}) found in {':'.join(SYSTEM_PATH)}: install gcc "
                     "(or give --cc PATH) to build the SPANK plugin")


class _Build:
    """A private build tree (0700, under a directory only root can change when we are
    root) holding copies of the plugin's sources and Slurm's headers, each read from a
    descriptor that passed trust.walk; the compiler and its toolchain are checked the same
    way (toolchain.py) and run with a PATH and LC_ALL only. check=False (a build by a
    user, for that user) copies without checking."""

    def __init__(self, tmp: str, include: str | None, cc: str | None, check: bool):
        self.dir, self.check = Path(tmp), check
        if check:  # the tree itself: an attacker who can rename it could swap what is compiled
            trust.walk("the build directory", str(self.dir), want_dir=True).close()
        if not (SRC / "plugin.c").is_file():
            raise UsageError(f"the SPANK plugin sources are not at {SRC} (install transit-launch from its source tree)")
        self.src = self.dir / "src"
        what = "the plugin's sources"
        self._copy_dir(what, str(SRC), self.src / "spank", (".c", ".h", ".map"))
        self._copy_dir(what, str(SRC / "tools"), self.src / "spank" / "tools", (".c",))
        self._copy_dir(what, str(SRC.parent / "shim"), self.src / "shim", SHIM_HEADERS)
        source, inc = find_spank_h(include)
        self._copy_dir(f"spank.h's directory ({source})", str(inc), self.dir / "include" / "slurm", (".h",))
        source, path = find_cc(cc)
        opened = trust.walk(f"the C compiler ({source})", path, want_dir=False, check=check)
        opened.close()
        if not os.access(opened.path, os.X_OK):
            raise UsageError(f"the C compiler ({source}) {opened.path} is not executable")
        self.cc = opened.path
        self.env = {"PATH": toolchain.safe_path() if check else ":".join(SYSTEM_PATH), "LC_ALL": "C"}
        if check:  # its programs, libraries and header directories, not only its own file
            toolchain.check(self.cc, self.env)

    def _copy_dir(self, what: str, src: str, dst: Path, suffixes: tuple[str, ...]) -> None:
        d = trust.walk(what, src, want_dir=True, check=self.check)
        try:
            files = trust.entries(d, what, suffixes, check=self.check)
            dst.mkdir(parents=True, exist_ok=True)
            for name, f in files.items():
                (dst / name).write_bytes(trust.read_all(f.fd))
                f.close()
        finally:
            d.close()

    def compile(self, target: Path, sources: list[str], flags: list[str]) -> Path:
        paths = [str(self.src / "spank" / s) for s in sources]
        base = [*CFLAGS, f"-I{self.dir / 'include'}"]
        try:
            if self.check:  # what the compile will read, first; a listing that fails refuses the build
                self._failed(toolchain.check_headers(self.cc, self.env, base, paths))
            self._failed(subprocess.run([self.cc, *base, *flags, "-o", str(target), *paths], capture_output=True,
                                        text=True, env=self.env, timeout=toolchain.TIMEOUT))
        except subprocess.TimeoutExpired:
            raise UsageError(f"compiling the SPANK plugin took over {toolchain.TIMEOUT} s (a header that blocks?)") \
                from None
        if not target.is_file():  # a "compiler" that succeeds without output (--cc /usr/bin/true)
            raise UsageError(f"the C compiler {self.cc} exited 0 but wrote no {target.name}")
        return target

    @staticmethod
    def _failed(res: subprocess.CompletedProcess) -> None:
        """One line with the compiler's first error and where its whole output is."""
        if res.returncode == 0:
            return
        fd, log = tempfile.mkstemp(prefix="transit-spank-build-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(" ".join(res.args) + "\n" + res.stdout + res.stderr)
        raise UsageError(f"compiling the SPANK plugin failed: {csrc.first_error(res.stderr, res.returncode)} "
                         f"(the compiler's output: {log})")

    def plugin(self, out_dir: Path) -> Path:
        names = sorted(p.name for p in (self.src / "spank").glob("*.c"))
        return self.compile(out_dir / PLUGIN, names,
                            [*LDFLAGS, f"-Wl,--version-script={self.src / 'spank' / 'transit_spank.map'}"])

    def check_tool(self, out_dir: Path) -> Path:
        return self.compile(out_dir / CHECK, ["tools/check.c", *LIBSRC], [])


def _trusted() -> bool:
    """Root builds what root loads: then every input is checked."""
    return os.geteuid() == 0


def build(out_dir: str | Path, include: str | None = None, cc: str | None = None) -> Path:
    """The plugin, out_dir/transit_spank.so (from checked inputs when we are root)."""
    out = Path(os.path.abspath(out_dir))
    check = _trusted()
    if check:  # root writes only where no one else can redirect it (a link on the way, a swapped directory)
        trust.check_dir_to_make("--out", str(out))
    with tempfile.TemporaryDirectory(prefix="transit-spank-") as tmp:
        data = _Build(tmp, include, cc, check=check).plugin(Path(tmp)).read_bytes()
    # through the directory's descriptor, a new O_EXCL file under a random name, renamed
    # into place: no name in it is followed or reused
    d = trust.walk("--out", str(out), want_dir=True, create=True, check=check)
    try:
        trust.put(d.fd, PLUGIN, data, 0o755)
    finally:
        d.close()
    return out / PLUGIN


def _run_check(exe: Path, argv: list[str], what: str) -> None:
    res = subprocess.run([str(exe), *argv], capture_output=True, text=True, env={"LC_ALL": "C"})
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




def _read_shim() -> tuple[bytes, str]:
    """libtransit.so as it will be installed: ($TRANSIT_SHIM or this installation's),
    read from a descriptor that passed the check."""
    shim = inject.shim_path()
    source = f"${ENV['SHIM']}" if os.environ.get(ENV["SHIM"]) else "this installation's libtransit.so"
    if shim is None or not shim.is_file():
        raise UsageError("libtransit.so is not built in this installation (see `transit-launch doctor`); "
                         "the plugin would have nothing to inject")
    f = trust.walk(f"the shim to install ({source})", os.path.abspath(shim), want_dir=False)
    try:
        return trust.read_all(f.fd), f.path
    finally:
        f.close()


def _read_adapter() -> dict[str, bytes] | None:
    """The hint adapter's modules ($TRANSIT_ADAPTER_DIR or this installation's), each read
    from a checked descriptor; None when there is no adapter."""
    adapter = inject.adapter_dir()
    if adapter is None:
        return None
    source = f"${ENV['ADAPTER_DIR']}" if os.environ.get(ENV["ADAPTER_DIR"]) else "this installation's adapter"
    what = f"the adapter to install ({source})"
    d = trust.walk(what, os.path.abspath(adapter), want_dir=True)
    try:
        files = trust.entries(d, what, (".py",))
    finally:
        d.close()
    try:
        if "sitecustomize.py" not in files:
            raise UsageError(f"the hint adapter is not at {adapter} (no sitecustomize.py there)")
        return {name: trust.read_all(f.fd) for name, f in files.items()}
    finally:
        for f in files.values():
            f.close()


def install(prefix: str, plugstack_dir: str, include: str | None = None, default: str = "off",
            allowed: str = "off,base,prefetch,advise", oversubscribe: str = "deny",
            cc: str | None = None) -> tuple[Path, Path]:
    """PREFIX/lib/slurm/transit_spank.so, PREFIX/lib/transit-launch/{libtransit.so,adapter/}
    and PLUGSTACK_DIR/transit.conf pointing at them.

    Everything is checked before anything is written: the values, every source (the shim,
    the adapter, the plugin's sources, spank.h, the compiler: root's and changeable by root
    only, read from checked descriptors), every destination directory that exists, and the
    line, by the plugin's own parser on staged copies. Then the files go in through
    descriptors, the plugin's parser checks the line again on the files as installed, and
    the include file that makes Slurm load the plugin is written last."""
    try:
        return _install(prefix, plugstack_dir, include, default, allowed, oversubscribe, cc)
    except OSError as e:  # a race with another process on the way: refused, not a traceback
        raise UsageError(f"spank install: {e.filename or ''}: {e.strerror or e} (nothing was activated: "
                         "transit.conf is written last)") from None


def _pycs(adapter: dict[str, bytes], tmp: Path) -> dict[str, bytes]:
    """The adapter's modules compiled for this Python, checked by their sources' hash (not
    their mtime, which the copy changes): with __pycache__ made by root, a job never makes
    it itself (with a root job's umask 000 it was 0777, which users could fill and which
    the plugin then refused for every job)."""
    import importlib.util
    import py_compile
    out = {}
    tmp.mkdir(exist_ok=True)
    for name, data in adapter.items():
        src = tmp / name
        src.write_bytes(data)
        cfile = Path(importlib.util.cache_from_source(str(src)))
        py_compile.compile(str(src), cfile=str(cfile), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        out[cfile.name] = cfile.read_bytes()
    return out


def _install(prefix, plugstack_dir, include, default, allowed, oversubscribe, cc):
    pkg = str(Path(transit_launch.__file__).resolve().parent)
    try:
        trust.walk("transit-launch itself", pkg, want_dir=True).close()
    except trust.Untrusted as e:
        raise UsageError(f"{e}; its code has already run as root: install transit-launch where only root can "
                         "change it, then install the plugin from there") from None
    prefix_p = Path(os.path.abspath(prefix))
    lib = prefix_p / "lib" / "transit-launch"
    plugin_dst = prefix_p / "lib" / "slurm" / PLUGIN
    conf_dir = Path(os.path.abspath(plugstack_dir))
    shim_bytes, shim_src = _read_shim()
    adapter = _read_adapter()
    dest_shim, dest_adapter = lib / "libtransit.so", lib / "adapter" if adapter is not None else None
    args = plugstack_args(dest_shim, dest_adapter, default, allowed, oversubscribe)  # refuses bad paths first
    _line_path("plugin", plugin_dst)
    _line_path("--plugstack-dir", conf_dir)
    dirs = {"--prefix": [lib, *([dest_adapter] if dest_adapter else []), plugin_dst.parent],
            "--plugstack-dir": [conf_dir]}
    for opt, ds in dirs.items():
        for d in ds:
            trust.check_dir_to_make(opt, str(d))
    with tempfile.TemporaryDirectory(prefix="transit-spank-") as tmp:
        b = _Build(tmp, include, cc, check=True)
        out = Path(tmp) / "out"
        out.mkdir()
        plugin_bytes = b.plugin(out).read_bytes()
        checker = b.check_tool(out)
        stage = Path(tmp) / "stage"  # the line as it will be, on root-only copies
        stage.mkdir()
        (stage / "libtransit.so").write_bytes(shim_bytes)
        staged_args = plugstack_args(stage / "libtransit.so", stage / "adapter" if adapter is not None else None,
                                     default, allowed, oversubscribe)
        pycs = _pycs(adapter, Path(tmp) / "compile") if adapter is not None else {}
        if adapter is not None:
            (stage / "adapter" / "__pycache__").mkdir(parents=True)
            for name, data in adapter.items():
                (stage / "adapter" / name).write_bytes(data)
            for name, data in pycs.items():
                (stage / "adapter" / "__pycache__" / name).write_bytes(data)
        _run_check(checker, staged_args, "the plugin would refuse this line")
        # --- nothing was written before this point -------------------------------------
        opened = {}
        try:
            for opt, ds in dirs.items():
                for d in ds:
                    opened[d] = trust.walk(opt, str(d), want_dir=True, create=True)
            trust.put(opened[lib].fd, "libtransit.so", shim_bytes, 0o755)
            for name, data in (adapter or {}).items():
                trust.put(opened[dest_adapter].fd, name, data, 0o644)
            if adapter is not None:
                cache = trust.walk("--prefix", str(dest_adapter / "__pycache__"), want_dir=True, create=True)
                try:
                    for name, data in pycs.items():
                        trust.put(cache.fd, name, data, 0o644)
                finally:
                    cache.close()
            trust.put(opened[plugin_dst.parent].fd, PLUGIN, plugin_bytes, 0o755)
            # whoever can change the plugin (or a directory above it) runs code in every
            # slurmstepd as root: the plugin's parser on what was installed, before the
            # line that loads it exists
            _run_check(checker, args, "the plugin would refuse this line")
            _run_check(checker, ["--dir", str(conf_dir)], "the plugstack include directory is not safe")
            _run_check(checker, ["--file", str(plugin_dst)], "the installed plugin is not safe")
            text = ("# transit-launch SPANK plugin: sbatch --transit=advise job.sh\n"
                    f"# include it from plugstack.conf: include {conf_dir}/*.conf\n"
                    f"# shim installed from {shim_src}\n"
                    f"required {plugin_dst} {' '.join(args)}\n")
            trust.put(opened[conf_dir].fd, "transit.conf", text.encode(), 0o644)
        finally:
            for o in opened.values():
                o.close()
    return plugin_dst, conf_dir / "transit.conf"
