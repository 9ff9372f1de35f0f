"""Keeps *_test.py modules out of the wheel, matching the Bazel wheel (py_wheel packs only
py_library sources). Everything else is in pyproject.toml."""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithoutTests(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [(pkg, mod, path) for pkg, mod, path in modules if not mod.endswith("_test")]


setup(cmdclass={"build_py": BuildPyWithoutTests})
