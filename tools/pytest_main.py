"""The main of every Bazel py_test (tools/pytest.bzl): runs pytest on the files in argv."""

import sys

import pytest

if __name__ == "__main__":
    # The cache provider would write into the read-only runfiles tree.
    sys.exit(pytest.main(["-p", "no:cacheprovider", *sys.argv[1:]]))
