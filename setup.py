"""The package build also builds the shim (transit_launch/shimbuild.py); a machine
without CUDA headers still installs, and `transit-launch doctor` says why the shim is
missing."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent))


class BuildPyWithShim(build_py):
    def run(self):
        super().run()
        from transit_launch import shimbuild

        here = Path(__file__).resolve().parent
        target = (here / "transit_launch" / "lib" if getattr(self, "editable_mode", False)
                  else Path(self.build_lib) / "transit_launch" / "lib")
        path, reason = shimbuild.build(target)
        print(f"transit-launch: shim {'built: ' + str(path) if path else 'not built: ' + reason}")


setup(cmdclass={"build_py": BuildPyWithShim})
