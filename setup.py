# SPDX-License-Identifier: Apache-2.0
"""The build step of `pip install .`: make builds libnccl-net-reshard.so (in build/, as a plain
`make` does, so an up-to-date tree builds nothing) and the library is copied into the package.
The wheel is platform-specific: it carries a shared object. Everything else is in
pyproject.toml."""
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = "libnccl-net-reshard.so"
M2N_LIB = "libreshard-m2n.so"  # NCCL M2N's API (reshard.m2n loads it)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        build = os.environ.get("RESHARD_BUILD", "build")
        target = os.path.join(build, LIB)
        m2n_target = os.path.join(build, M2N_LIB)
        cmd = ["make", "-C", ROOT, "--no-print-directory", "BUILD=" + build, target, m2n_target]
        print("reshard: " + " ".join(cmd), flush=True)
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit("reshard: building the C library failed (%s): make, a C compiler and "
                     "libjansson-dev are needed (make deps installs them)" % e)
        dest = os.path.join(self.build_lib, "reshard", LIB)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, target), dest)
        shutil.copy2(os.path.join(ROOT, m2n_target), os.path.join(os.path.dirname(dest), M2N_LIB))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: the package holds a shared object


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution,
      options={"build": {"build_base": "build/python"}, "egg_info": {"egg_base": "build"}})
