"""pip install . : builds the op library with Bazel (offline) and packages it with the Python code.

Needs Debian's bazel-bootstrap on PATH (scripts/setup.sh installs it). The op library is compiled
against the TensorFlow in the build environment (pinned in pyproject.toml) and records that version;
tfcomp refuses to load it under another TensorFlow.

The build leaves nothing in the source tree and no Bazel server behind: Bazel runs in batch mode
with an output root in a temporary directory and no convenience links (--symlink_prefix=/), and
setuptools' build and egg-info directories are temporary too.

Horovod is a dependency (`import tfcomp` imports it), but it must be built against the installed
TensorFlow, so install it first (README, "Installing tfcomp as a library"); pip then finds it there.
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "_tfcomp_ops.so"


SCRATCH = os.path.join(tempfile.gettempdir(), f"tfcomp-setup-{os.getuid()}")
os.makedirs(SCRATCH, exist_ok=True)


def _remove_tree(path):
    """Removes `path`, also Bazel's read-only files."""
    def make_writable_and_retry(function, name, _):
        os.chmod(os.path.dirname(name), stat.S_IRWXU)
        os.chmod(name, stat.S_IRWXU)
        function(name)

    shutil.rmtree(path, onerror=make_writable_and_retry)


class BuildPyWithOps(build_py):
    """Builds the op library with Bazel for this interpreter's TensorFlow, in a temporary output
    root (batch mode: no server stays), and copies it into the package."""

    def run(self):
        bazel = os.path.join(HERE, "scripts", "bazel.sh")
        output_root = tempfile.mkdtemp(prefix="tfcomp-bazel-")
        env = dict(os.environ, PYTHON_BIN_PATH=sys.executable,
                   TFCOMP_BAZEL_STARTUP=f"--batch --output_user_root={output_root}")
        try:
            subprocess.check_call([bazel, "build", "--symlink_prefix=/", "//ops:_tfcomp_ops.so"], cwd=HERE, env=env)
            bazel_bin = subprocess.check_output([bazel, "info", "bazel-bin"], cwd=HERE, env=env, text=True).strip()
            super().run()
            target = os.path.join(self.build_lib, "tfcomp")
            os.makedirs(target, exist_ok=True)
            shutil.copy2(os.path.join(bazel_bin, "ops", LIBRARY), os.path.join(target, LIBRARY))
        finally:
            _remove_tree(output_root)


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
    install_requires=["tensorflow-cpu==2.15.1", "horovod==0.28.1", "numpy<2", "absl-py"],
    cmdclass={"build_py": BuildPyWithOps},
    distclass=BinaryDistribution,
    # Build and egg-info directories out of the source tree.
    options={"build": {"build_base": os.path.join(SCRATCH, "build")}, "egg_info": {"egg_base": SCRATCH}},
    zip_safe=False,
)
