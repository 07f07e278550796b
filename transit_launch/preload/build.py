"""Builds shim/ into libtransit.so with the C compiler, no nvcc: only the CUDA runtime
and CUPTI headers are needed (from CUDA_HOME, /usr/local/cuda, or the nvidia-cuda-runtime
and nvidia-cuda-cupti wheels). Used by the package build (setup.py) and by the tests.
Without headers or a compiler it writes BUILD_SKIPPED with the reason, which
`transit-launch doctor` shows; installation still succeeds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from transit_launch import csrc

SRC = csrc.shim()
CFLAGS = ["-std=c11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-fvisibility=hidden",
          "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"]
LDFLAGS = ["-shared", "-Wl,-z,relro,-z,now", "-Wl,-z,noexecstack"]


def _roots() -> list[Path]:
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots.append(Path("/usr/local/cuda"))
    for entry in sys.path:  # pip wheels: site-packages/nvidia/{cu13,cuda_runtime,cuda_cupti}
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            roots += [base / "cu13", base / "cuda_runtime", base / "cuda_cupti"]
    return roots


def find_header(name: str, extra: tuple[str, ...] = ()) -> Path | None:
    for root in _roots():
        for sub in ("include", *extra):
            if (root / sub / name).is_file():
                return root / sub
    return None


def build(out_dir: Path, cc: str | None = None, src: Path = SRC, extra_cflags: list[str] | None = None) -> tuple[Path | None, str]:
    """Compile into out_dir/libtransit.so. Returns (path, '') or (None, reason)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = cc or os.environ.get("CC") or "cc"
    cc = shutil.which(cc) or (shutil.which("gcc") if cc == "cc" else None)
    cuda_inc = find_header("cuda_runtime_api.h")
    reason = ""
    if not (src / "transit.h").is_file():
        reason = f"shim sources not found at {src}"
    elif not cc:
        reason = "no C compiler found (cc, gcc or $CC)"
    elif not cuda_inc:
        reason = ("CUDA runtime headers (cuda_runtime_api.h) not found in CUDA_HOME, /usr/local/cuda or the "
                  "nvidia-cuda-runtime wheel; install one and reinstall transit-launch")
    if reason:
        (out_dir / "BUILD_SKIPPED").write_text(reason + "\n")
        return None, reason
    cupti_inc = find_header("cupti.h", ("extras/CUPTI/include",))
    flags = [*CFLAGS, *(extra_cflags or []), f"-I{cuda_inc}"]
    flags += [f"-I{cupti_inc}"] if cupti_inc else ["-DTRANSIT_NO_CUPTI"]
    out = out_dir / "libtransit.so"
    cmd = [cc, *flags, *LDFLAGS, f"-Wl,--version-script={src / 'exports.map'}", "-o", str(out),
           *sorted(str(p) for p in src.glob("*.c")), "-ldl", "-lpthread"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        log = out_dir / "build.log"
        log.write_text(" ".join(cmd) + "\n" + res.stdout + res.stderr)
        reason = f"compiling the shim failed: {csrc.first_error(res.stderr, res.returncode)} (the compiler's output: {log})"
        (out_dir / "BUILD_SKIPPED").write_text(reason + "\n")
        return None, reason
    (out_dir / "BUILD_SKIPPED").unlink(missing_ok=True)
    for header in ("transit_api.h", "transit_rules.h"):  # the API's header includes the rules'
        shutil.copy(src / header, out_dir / header)
    if not cupti_inc:
        (out_dir / "NO_CUPTI").write_text("built without CUPTI headers: no warm-up recording\n")
    else:
        (out_dir / "NO_CUPTI").unlink(missing_ok=True)
    return out, res.stderr
