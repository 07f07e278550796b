"""A C compiler driver for the mutants' shim builds (tests/test_mutations.py): called with the
one command line transit_launch.preload.build runs (flags, -o the library, every .c file,
libraries), it compiles each .c file on its own (`cc FLAGS -c`, the same flags) into a
directory of objects kept for the whole run, keyed by the bytes of that file, of every header
beside it and of the flags, and links them as the command would have. A mutant changes one
file: its shim costs that file's compile and the link, not the 16 files' (2.5-4.6 s each, 19
mutants). The compiler's warnings of an object are kept with it and printed again whenever it is
used, as the one command would have printed them.

Usage: python3 cached_cc.py OBJECT_DIR REAL_CC ARGS...
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path


def _link_only(arg: str) -> bool:
    return arg == "-shared" or arg.startswith(("-Wl,", "-l"))


def main(argv: list[str]) -> int:
    objects, cc, args = Path(argv[0]), argv[1], argv[2:]
    sources = [a for a in args if a.endswith(".c")]
    out = args.index("-o")
    flags = [a for i, a in enumerate(args) if a not in sources and i not in (out, out + 1) and not _link_only(a)]
    objects.mkdir(parents=True, exist_ok=True)
    said, linked = [], []
    for src in map(Path, sources):
        h = hashlib.sha256("\0".join([os.path.realpath(cc), *flags]).encode())
        for f in [src, *sorted(src.parent.glob("*.h"))]:
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        obj = objects / f"{src.stem}-{h.hexdigest()[:20]}.o"
        if not obj.exists():
            tmp = obj.with_suffix(f".{os.getpid()}.tmp")
            res = subprocess.run([cc, *flags, "-c", str(src), "-o", str(tmp)], capture_output=True, text=True)
            if res.returncode != 0:
                sys.stderr.write(res.stdout + res.stderr)
                return res.returncode
            obj.with_suffix(".warnings").write_text(res.stdout + res.stderr)
            tmp.rename(obj)  # whole or absent: the warnings are written first
        said.append(obj.with_suffix(".warnings").read_text())
        linked.append(str(obj))
    cmd, it = [], iter(linked)
    for a in args:
        cmd.append(next(it) if a in sources else a)
    res = subprocess.run([cc, *cmd], capture_output=True, text=True)
    sys.stderr.write("".join(said) + res.stdout + res.stderr)
    return res.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
