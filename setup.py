"""pip install . : builds the op library with Bazel (offline) and packages it with the Python code.

Needs Debian's bazel-bootstrap on PATH (scripts/setup.sh installs it). The op library is compiled
against the TensorFlow in the build environment (pinned in pyproject.toml) and records that version;
tfcomp refuses to load it under another TensorFlow.
"""

import os
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "_tfcomp_ops.so"


class BuildPyWithOps(build_py):
    """Runs scripts/build_ops.sh with this interpreter and copies the library into the package."""

    def run(self):
        env = dict(os.environ, PYTHON_BIN_PATH=sys.executable)
        subprocess.check_call([os.path.join(HERE, "scripts", "build_ops.sh")], cwd=HERE, env=env)
        super().run()
        target = os.path.join(self.build_lib, "tfcomp")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(os.path.join(HERE, "bazel-bin", "ops", LIBRARY), os.path.join(target, LIBRARY))


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


def read_version():
    scope = {}
    with open(os.path.join(HERE, "tfcomp", "version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


setup(
    name="tfcomp",
    version=read_version(),
    description="Gradient compression that pays in Horovod/Keras data-parallel training (DRAGONN, DGC, top-k)",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfcomp", "tfcomp.*"]),
    python_requires=">=3.9,<3.12",
    install_requires=["tensorflow-cpu==2.15.1", "numpy<2", "absl-py"],
    extras_require={"horovod": ["horovod==0.28.1"]},
    cmdclass={"build_py": BuildPyWithOps},
    distclass=BinaryDistribution,
    zip_safe=False,
)
