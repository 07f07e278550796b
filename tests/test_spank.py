"""The SPANK plugin's parsers without a cluster: the plugin and its tools build clean under
-Wall -Wextra -Werror; the installer's check (spank/tools/check.c, the plugin's own
args.c) refuses every plugstack line the plugin must refuse, with one line, including the
path tricks an attacker would try on shim= and adapter=; `spank install` refuses before it
writes anything; and a fuzz harness drives the parsers under ASan/UBSan (libFuzzer where
clang has it, else a seeded random generator)."""

import os
import shutil
import subprocess

import pytest

from tests.conftest import C_SOURCES, build_once, have_cc, spank_include

SPANK = C_SOURCES / "spank"
NOBODY = 65534


def _need_build():
    if not have_cc():
        pytest.skip("needs a C compiler")
    if spank_include() is None:
        pytest.skip("needs Slurm's spank.h (apt install libslurm-dev)")


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root (files owned by root and by others)")


def _cc(out, sources, *flags, cc="cc"):
    inc = spank_include().parent
    res = subprocess.run([cc, "-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{inc}", *flags, "-o",
                          str(out), *map(str, sources)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out


SAN = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all"]
LIB = [SPANK / "args.c", SPANK / "env.c"]


@pytest.fixture(scope="module")
def check_tool(tmp_path_factory):
    """The installer's check, built with ASan/UBSan: every case below also runs sanitized."""
    _need_build()
    d = build_once(tmp_path_factory, "spankcheck", [SPANK], SAN,
                   lambda out: _cc(out / "check", [SPANK / "tools" / "check.c", *LIB], *SAN))
    return d / "check"


def test_plugin_builds_clean_with_werror(tmp_path):
    _need_build()
    _cc(tmp_path / "plugin.so", sorted(SPANK.glob("*.c")), "-fPIC", "-shared", "-D_FORTIFY_SOURCE=2", "-O2",
        f"-Wl,--version-script={SPANK / 'transit_spank.map'}")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Files and directories an admin might point at, and the ones an attacker would plant."""
    _need_root()
    base = tmp_path_factory.mktemp("spanktree")
    os.chmod(base, 0o755)
    good = base / "good"
    (good / "adapter").mkdir(parents=True)
    (good / "libtransit.so").write_bytes(b"\x7fELF")
    (good / "adapter" / "sitecustomize.py").write_text("")
    user = base / "user"  # a directory a user owns
    user.mkdir()
    (user / "libtransit.so").write_bytes(b"")
    os.chown(user, NOBODY, NOBODY)
    (user / "link.so").symlink_to(good / "libtransit.so")  # root's link, in the user's directory
    gw = base / "gw"
    gw.mkdir()
    (gw / "libtransit.so").write_bytes(b"")
    os.chmod(gw, 0o775)
    sticky = base / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "root").mkdir()
    (sticky / "root" / "libtransit.so").write_bytes(b"")
    (sticky / "theirs").mkdir()
    (sticky / "theirs" / "libtransit.so").write_bytes(b"")
    os.chown(sticky / "theirs", NOBODY, NOBODY)
    (good / "writable.so").write_bytes(b"")
    os.chmod(good / "writable.so", 0o666)
    (good / "theirs.so").write_bytes(b"")
    os.chown(good / "theirs.so", NOBODY, NOBODY)
    (base / "via-user").symlink_to(user)  # a root link into a user's directory
    (base / "chain").symlink_to("via-user/link.so")
    bad_adapter = base / "bad_adapter"
    bad_adapter.mkdir()
    (bad_adapter / "sitecustomize.py").write_text("")
    os.chown(bad_adapter / "sitecustomize.py", NOBODY, NOBODY)
    link_adapter = base / "link_adapter"
    link_adapter.mkdir()
    (link_adapter / "sitecustomize.py").symlink_to(user / "libtransit.so")
    sticky_adapter = base / "sticky_adapter"
    sticky_adapter.mkdir()
    os.chmod(sticky_adapter, 0o1777)  # users could add a sitecustomize.py of their own
    (base / "with space").mkdir()
    (base / "with space" / "libtransit.so").write_bytes(b"")
    (base / "a:b.so").write_bytes(b"")
    return base


def _check(exe, *args):
    res = subprocess.run([str(exe), *args], capture_output=True, text=True)
    assert "runtime error" not in res.stderr and "AddressSanitizer" not in res.stderr, res.stderr
    return res.returncode, res.stderr


REFUSALS = [  # (arguments after shim=GOOD, the plugin's message)
    (["oversubscribe=deny", "oversubscribe=allow"], "plugstack argument oversubscribe= is given twice"),
    (["default=off", "default=advise"], "plugstack argument default= is given twice"),
    (["allowed=advise,bogus"], "allowed=advise,bogus: 'bogus' is not one of off,base,prefetch,advise"),
    (["default=advise", "allowed=off,base"], "default=advise is not an allowed policy (off,base)"),
    (["allowed=advise,"], "allowed=advise, ends with a comma"),
    (["allowed="], "argument allowed= is empty or too long"),
    (["oversubscribe=yes"], "oversubscribe=yes: expected allow or deny"),
    (["turbo=1"], "unknown plugstack argument 'turbo'"),
    (["noequals"], "plugstack argument 'noequals' is not key=value"),
    (["default=off\nadvise"], "plugstack argument 2 holds a control character"),
]


@pytest.mark.parametrize("extra,needle", REFUSALS)
def test_check_refuses_what_the_plugin_refuses(check_tool, tree, extra, needle):
    rc, err = _check(check_tool, f"shim={tree}/good/libtransit.so", *extra)
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err


PATHS = [  # shim= or adapter= an attacker would like, and why each is refused
    ("shim=good/libtransit.so", "not an absolute path"),
    ("shim={t}/good/missing.so", "{t}/good/missing.so does not exist"),
    ("shim={t}/good", "{t}/good is not a regular file"),
    ("shim={t}/user/libtransit.so", "{t}/user is not owned by root"),
    ("shim={t}/user/link.so", "{t}/user is not owned by root"),  # the user can replace the link
    ("shim={t}/chain", "{t}/user is not owned by root"),  # link -> link -> a user's directory
    ("shim={t}/gw/libtransit.so", "{t}/gw is writable by group or others"),
    ("shim={t}/good/writable.so", "{t}/good/writable.so is writable by group or others"),
    ("shim={t}/good/theirs.so", "{t}/good/theirs.so is not owned by root"),
    ("shim={t}/sticky/theirs/libtransit.so", "{t}/sticky/theirs is not owned by root"),
    ("shim={t}/with space/libtransit.so", "a path with ':', '$' or a space cannot go on LD_PRELOAD"),
    ("shim={t}/a:b.so", "a path with ':', '$' or a space cannot go on LD_PRELOAD"),
    # ld.so expands $LIB, $PLATFORM and $ORIGIN: the file loaded would not be the one checked
    ("shim={t}/$LIB/libtransit.so", "a path with ':', '$' or a space cannot go on LD_PRELOAD"),
    ("adapter={t}/$ORIGIN", "a path with ':', '$' or a space cannot go on PYTHONPATH"),
    ("shim={t}/good/../user/libtransit.so", "{t}/user is not owned by root"),
    ("adapter={t}/good/libtransit.so", "is not a directory"),
    ("adapter={t}/bad_adapter", "{t}/bad_adapter/sitecustomize.py is not owned by root"),
    ("adapter={t}/link_adapter", "{t}/link_adapter/sitecustomize.py is neither a file nor a directory"),
    ("adapter={t}/sticky_adapter", "{t}/sticky_adapter is writable by group or others"),
    ("adapter={t}/sticky", "{t}/sticky is writable by group or others"),
]


@pytest.mark.parametrize("arg,needle", PATHS)
def test_check_refuses_paths_others_can_change(check_tool, tree, arg, needle):
    arg, needle = arg.format(t=tree), needle.format(t=tree)
    args = [arg] if arg.startswith("shim=") else [f"shim={tree}/good/libtransit.so", arg]
    rc, err = _check(check_tool, *args)
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err
    assert "(it must exist and be changeable by root only)" in err or "absolute" in err or "cannot go on" in err


def test_check_accepts_root_only_paths(check_tool, tree):
    """Root's files through root's links, and under a root-owned sticky directory (/tmp),
    pass; so does the line `spank install` writes by default."""
    if not (tree / "good-link").exists():
        (tree / "good-link").symlink_to("good/libtransit.so")
    for args in ([f"shim={tree}/good/libtransit.so", f"adapter={tree}/good/adapter"],
                 [f"shim={tree}/good-link"], [f"shim={tree}/sticky/root/libtransit.so"],
                 [f"shim={tree}/good/./libtransit.so", "default=advise", "allowed=off,advise", "oversubscribe=allow"]):
        rc, err = _check(check_tool, *args)
        assert rc == 0 and err == "", (args, err)


PARITY = [arg for arg, _ in PATHS if not any(c in arg for c in " :$") and "={t}/" in arg] + [
    "shim={t}/good/libtransit.so", "shim={t}/good-link", "shim={t}/sticky/root/libtransit.so",
    "shim={t}/good/./libtransit.so", "adapter={t}/good/adapter"]


@pytest.mark.parametrize("arg", PARITY)
def test_installer_walk_agrees_with_the_plugins(check_tool, tree, arg):
    """One rule: the installer's check of its sources and destinations (trust.py, on
    descriptors) and the plugin's check at load (args.c) give the same verdict on the same
    path, and name the same entry and reason."""
    from transit_launch.slurm import trust
    if not (tree / "good-link").exists():
        (tree / "good-link").symlink_to("good/libtransit.so")
    key, path = arg.format(t=tree).split("=", 1)
    want_dir = key == "adapter"
    args = [f"shim={path}"] if not want_dir else [f"shim={tree}/good/libtransit.so", f"adapter={path}"]
    rc, err = _check(check_tool, *args)
    try:
        trust.walk(key, path, want_dir=want_dir).close()
        ours = None
    except trust.Untrusted as e:
        ours = str(e)
    if want_dir and rc != 0 and ours is None:  # the plugin also checks what the directory holds
        assert "sitecustomize.py" in err or "is writable" in err, err
        return
    assert (rc == 0) == (ours is None), (err, ours)
    if ours:
        c_reason = err.split(": ", 2)[2].split(" (it must")[0]
        assert ours.split(": ", 1)[1].split(" (it must")[0] == c_reason, (err, ours)


# --- spank install refuses before it writes --------------------------------------------


@pytest.mark.parametrize("args,needle", [
    (["--allowed", "advise,bogus"], "'bogus' is not one of off,base,prefetch,advise"),
    (["--default", "advise", "--allowed", "off,base"], "default=advise is not an allowed policy (off,base)"),
    (["--allowed", "off advise"], "--allowed 'off advise': not a plugstack value"),
])
def test_install_refuses_what_the_plugin_would(cli, built, tmp_path, args, needle):
    _need_build()
    _need_root()
    env = dict(os.environ, TRANSIT_SHIM=str(built["shim"]))
    rc, out, err = cli("spank", "install", "--prefix", str(tmp_path / "p"), "--plugstack-dir",
                       str(tmp_path / "conf"), *args, env=env)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "conf" / "transit.conf").exists()
    assert not (tmp_path / "p" / "lib" / "slurm" / "transit_spank.so").exists()


def test_install_refuses_a_prefix_others_can_write(cli, built, tmp_path):
    """Attacks on --prefix: under a directory anyone can write (the copies could be
    swapped), a user's directory, a path with a space (Slurm splits the line there)."""
    _need_build()
    _need_root()
    env = dict(os.environ, TRANSIT_SHIM=str(built["shim"]))
    ww = tmp_path / "ww"
    ww.mkdir()
    os.chmod(ww, 0o777)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    for prefix, needle in ((ww / "p", f"{ww} is writable by group or others"),
                           (theirs / "p", f"{theirs} is not owned by root"),
                           (tmp_path / "a b", "cannot hold a path with spaces")):
        rc, out, err = cli("spank", "install", "--prefix", str(prefix), "--plugstack-dir", str(tmp_path / "conf"),
                           env=env)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, (prefix, err)
        assert not (tmp_path / "conf" / "transit.conf").exists()
    # the include directory: whoever can write it can rewrite the line
    rc, out, err = cli("spank", "install", "--prefix", str(tmp_path / "p"), "--plugstack-dir", str(ww / "conf"),
                       env=env)
    assert rc == 2 and f"--plugstack-dir {ww}/conf: {ww} is writable by group or others" in err, err
    assert not (ww / "conf" / "transit.conf").exists()
    assert not (tmp_path / "p" / "lib" / "slurm" / "transit_spank.so").exists()
    # the plugin's own directory, there already and a user's: they could swap the plugin
    # and run code as root in every slurmstepd (found by an attacker's review)
    slurm_dir = tmp_path / "q" / "lib" / "slurm"
    slurm_dir.mkdir(parents=True)
    os.chown(slurm_dir, NOBODY, NOBODY)
    rc, out, err = cli("spank", "install", "--prefix", str(tmp_path / "q"), "--plugstack-dir", str(tmp_path / "conf"),
                       env=env)
    assert rc == 2 and f"--prefix {slurm_dir}: {slurm_dir} is not owned by root" in err, err
    assert not (tmp_path / "conf" / "transit.conf").exists()
    rc, out, err = cli("spank", "install", "--prefix", str(tmp_path / "$LIB"), "--plugstack-dir",
                       str(tmp_path / "conf"), env=env)
    assert rc == 2 and "'$'" in err and not (tmp_path / "conf" / "transit.conf").exists(), err


# --- the fuzz harness ------------------------------------------------------------------


def test_fuzz_parsers_seeded_under_asan_ubsan(tmp_path):
    """spank/tools/fuzz.c under ASan/UBSan with gcc: seeded random plugstack lines, option
    values and LD_PRELOAD/PYTHONPATH lists, built from the grammar's words, long runs and
    random bytes; every invariant (the entry first and once, the old entries kept in order,
    one log line, accepted values valid) is checked on each input."""
    _need_build()
    exe = _cc(tmp_path / "fuzz", [SPANK / "tools" / "fuzz.c", *LIB], *SAN)
    for seed in (1, 2):
        res = subprocess.run([str(exe), str(seed), "25000"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "no invariant broken" in res.stdout and res.stderr == ""


def _libfuzzer():
    clang = shutil.which("clang") or shutil.which("clang-14")
    if not clang:
        return None
    probe = subprocess.run([clang, "-fsanitize=fuzzer", "-x", "c", "-o", os.devnull, "-"],
                           input="int LLVMFuzzerTestOneInput(const char *d, long n){return 0;}", capture_output=True,
                           text=True)
    return clang if probe.returncode == 0 else None


def test_fuzz_parsers_with_libfuzzer(tmp_path):
    clang = _libfuzzer()
    if clang is None:
        pytest.skip("needs clang with libFuzzer (apt install clang libclang-rt-dev); the seeded run covers gcc")
    _need_build()
    exe = _cc(tmp_path / "lf", [SPANK / "tools" / "fuzz.c", *LIB], "-DTR_LIBFUZZER", "-fsanitize=fuzzer", *SAN,
              cc=clang)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "line").write_text("shim=/bin/sh\nadapter=/usr/include/slurm\ndefault=off\nallowed=off,advise\n"
                                 "oversubscribe=deny")
    (corpus / "lists").write_text("/a.so /b.so::/c.so\n/bin/sh")
    res = subprocess.run([str(exe), "-runs=150000", "-max_len=4096", "-seed=1", f"-artifact_prefix={tmp_path}/",
                          str(corpus)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Done 150000 runs" in res.stderr
