"""Where the source tree is, for tests that read it (BUILD files, the whole workspace)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_root", "source_root"]


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
