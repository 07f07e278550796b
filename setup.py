"""The package build copies the C sources (shim/, spank/) into the package and builds the
shim (transit_launch/preload/build.py). A machine without CUDA headers still installs; then
the wheel stays pure and `transit-launch doctor` says why the shim is missing. A wheel
that carries libtransit.so is tagged for this platform (py3-none-linux_x86_64): the
library does not depend on the Python ABI, only on the machine."""

import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class BuildPyWithShim(build_py):
    def run(self):
        super().run()
        from transit_launch.preload import build as shimbuild

        editable = getattr(self, "editable_mode", False)
        pkg = HERE / "transit_launch" if editable else Path(self.build_lib) / "transit_launch"
        if not editable:  # a checkout finds its sources beside the package (transit_launch/csrc.py)
            for part in ("shim", "spank"):
                shutil.copytree(HERE / part, pkg / "_csrc" / part, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.o", "*.so"))
            # the README's examples run from the wheel: python3 -m transit_launch.examples.train_llama
            (pkg / "examples").mkdir(exist_ok=True)
            for name in ("train_llama.py", "model-card.toml"):
                shutil.copy2(HERE / "examples" / name, pkg / "examples" / name)
        path, reason = shimbuild.build(pkg / "preload" / "lib", src=HERE / "shim")
        self.distribution.shim_built = path is not None
        print(f"transit-launch: shim {'built: ' + str(path) if path else 'not built: ' + reason}")


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False  # decided again in get_tag, once the build has run

    def get_tag(self):
        if not getattr(self.distribution, "shim_built", False):
            return "py3", "none", "any"
        return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")


setup(cmdclass={"build_py": BuildPyWithShim, "bdist_wheel": PlatformWheel})
