"""Where the source tree is, for tests that read it (BUILD files, the whole workspace), and
the wheel `pip wheel` builds from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["build_wheel", "data_root", "source_root"]


def source_root() -> Path:
    """The workspace's source folder.

    Under `bazel test` the runfiles hold a symlink to the source tree's MODULE.bazel (the test
    must depend on //:MODULE.bazel and be tagged "local" so no sandbox hides the tree); under
    pytest this module sits in the tree itself.
    """
    runfiles = os.environ.get("RUNFILES_DIR")
    if runfiles:
        return Path(os.path.realpath(Path(runfiles) / "_main" / "MODULE.bazel")).parent
    return Path(__file__).resolve().parent.parent


def data_root() -> Path:
    """Where a test finds the files it declares as Bazel `data` (golden/, protos/): the main
    repository's runfiles under `bazel test`, the source tree under pytest. Unlike
    source_root, it needs no "local" tag: the files are in the sandbox."""
    runfiles = os.environ.get("RUNFILES_DIR")
    if runfiles:
        return Path(runfiles) / "_main"
    return Path(__file__).resolve().parent.parent


def build_wheel(tree: Path, scratch: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the source tree `tree` (setuptools builds in the source
    folder; the copy keeps build/ out of the work tree and leaves out what is not the
    project's: dot folders, node_modules, earlier builds). The wheel lands in scratch/dist.
    Any project's tree builds: a user's project beside beam_agents' (its dependencies are
    not built, so the one wheel in scratch/dist is the project's)."""
    source = scratch / "source"
    shutil.copytree(
        tree,
        source,
        ignore=shutil.ignore_patterns(".*", "node_modules", "build", "dist", "*.egg-info"),
    )
    out = scratch / "dist"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    subprocess.run(
        [*pip_wheel, "--no-build-isolation", "--wheel-dir", str(out), str(source)], check=True
    )
    (built,) = out.glob("*.whl")
    return built
