"""Keeps *_test.py modules out of the wheel, matching the Bazel wheel (py_wheel packs only
py_library sources), and builds it from the source tree alone. Everything else is in
pyproject.toml."""

import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithoutTests(build_py):
    def run(self):
        # `pip wheel .` in a checkout builds in its build/ folder, and the wheel takes all of
        # build/lib: a module an earlier build left there (since removed or moved, or test
        # support) would ship to the workers. Each build starts from an empty one.
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [(pkg, mod, path) for pkg, mod, path in modules if not mod.endswith("_test")]


setup(cmdclass={"build_py": BuildPyWithoutTests})
