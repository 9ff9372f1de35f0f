"""py_test that runs one test file under pytest, as the pip path's `pytest` does."""

load("@rules_python//python:py_test.bzl", _py_test = "py_test")

def py_test(name, srcs, deps = [], args = [], **kwargs):
    """A rules_python py_test whose main is //tools:pytest_main.py.

    Args:
      name: target name; by convention the test file's name without `.py`.
      srcs: the test file (first) and any helper modules.
      deps: libraries the test imports; pytest itself is added.
      args: extra pytest arguments.
      **kwargs: passed to py_test (data, env, size, tags, ...).
    """
    _py_test(
        name = name,
        srcs = srcs + ["//tools:pytest_main.py"],
        main = "//tools:pytest_main.py",
        args = ["$(rootpath %s)" % srcs[0]] + args,
        deps = deps + ["@pypi//pytest"],
        **kwargs
    )
