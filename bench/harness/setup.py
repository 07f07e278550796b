"""What every run needs before its steps, on a bare GPU machine: the carried wheels
(.whl, bench/fetch_wheels.sh) installed into /tmp/site, the TorchTitan release whose
imports this torch has, iproute2 from .net/bin (bench/fetch_iproute2.sh), DeepSpeed's
JIT-built ops from .ext, NVLink multicast off, and the shim built from this tree."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

from transit_launch.preload.inject import MULTICAST_OFF

ROOT = Path(__file__).resolve().parents[2]
SITE = "/tmp/site"
TORCH_EXT = "/tmp/torch_ext"


def base_env() -> dict:
    return dict(os.environ, **MULTICAST_OFF, PYTHONUNBUFFERED="1", CUDA_DEVICE_ORDER="PCI_BUS_ID",
                TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", TORCH_EXT))


def commands(build_shim: bool) -> list[tuple[str, list]]:
    """(what, argv) in order; what the dry run prints and prepare runs."""
    whl = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".whl").glob("*.whl")) if (ROOT / ".whl").is_dir() else []
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", SITE]
    out = []
    if whl:
        out.append(("wheels", pip + [w for w in whl if "/torchtitan-" not in w]))
    if (ROOT / ".ext" / "torch_ext.tar").is_file():
        out.append(("torch extensions", ["tar", "xf", ".ext/torch_ext.tar", "-C", TORCH_EXT]))
    if build_shim:
        out.append(("GPUs", ["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total",
                             "--format=csv,noheader"]))
        out.append(("shim", [sys.executable, "-c", "from transit_launch.preload import build as s; "
                             "p, w = s.build('transit_launch/preload/lib'); print('shim:', p, w or '')"]))
    return out


def titan_wheel(env: dict) -> str | None:
    """TorchTitan 0.3.0 needs a newer torch.distributed.fsdp than torch 2.11 has; 0.2.2 runs there."""
    ok = subprocess.run([sys.executable, "-c", "from torch.distributed.fsdp import DataParallelMeshDims"],
                        env=env, capture_output=True).returncode == 0
    found = sorted((ROOT / ".whl").glob(f"torchtitan-{'0.3.0' if ok else '0.2.2'}-*.whl"))
    return str(found[0]) if found else None


def prepare(build_shim: bool, dry_run: bool) -> dict | None:
    """The environment of every step (None when a setup command failed, said on stderr)."""
    env = base_env()
    if (ROOT / ".whl").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE, os.environ.get("PYTHONPATH")]))
    if (ROOT / ".net" / "bin").is_dir():
        env["PATH"] = f"{ROOT / '.net' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if not dry_run:
        os.makedirs(env["TORCH_EXTENSIONS_DIR"], exist_ok=True)
    for what, argv in commands(build_shim):
        if dry_run:
            print(f"setup ({what}): {shlex.join(argv)}")
            continue
        if subprocess.run(argv, cwd=ROOT, env=env).returncode != 0:
            print(f"bench: setup failed ({what}): {shlex.join(argv)}", file=sys.stderr)
            return None
    if (ROOT / ".whl").is_dir():
        titan = None if dry_run else titan_wheel(env)
        if dry_run:
            print("setup (torchtitan): the release whose imports this torch has (0.3.0, else 0.2.2) into " + SITE)
        elif titan:
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--no-cache-dir", "--upgrade", "--target", SITE, titan]
            if subprocess.run(pip, cwd=ROOT, env=env).returncode != 0:
                print(f"bench: setup failed (torchtitan): {shlex.join(pip)}", file=sys.stderr)
                return None
            print("torchtitan", Path(titan).name.split("-")[1])
    return env


def missing_modules(modules, env) -> list:
    return [m for m in modules
            if subprocess.run([sys.executable, "-c", f"import {m}"], env=env, capture_output=True).returncode]
