"""Writes the golden corpus of the current state schema version: golden/v<CURRENT>/.

    bazel run //tools:gen_golden            # or: python tools/gen_golden.py
    python tools/gen_golden.py --check      # write nothing; exit 1 and list what differs

Only the newest version's folder is ever written, from its own builders.py; older versions are
frozen and refused. For a bump from n to n + 1: copy golden/v<n>/builders.py to
golden/v<n+1>/builders.py, stamp it with the new version and adapt it to the new schema (same
fixture names), then run this tool.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    # Run as a script (python tools/gen_golden.py): make `tools` importable like under Bazel.
    sys.path.insert(0, str(_REPO))

from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION  # noqa: E402
from tools import golden  # noqa: E402

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; report differences")
    parser.add_argument(
        "--version",
        type=int,
        default=CURRENT_STATE_SCHEMA_VERSION,
        help=f"the version to write; only the current one ({CURRENT_STATE_SCHEMA_VERSION})",
    )
    parser.add_argument("--repo", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    repo = args.repo or (Path(workspace) if workspace else _REPO)
    folder = repo / "golden" / f"v{args.version}"

    if args.version != CURRENT_STATE_SCHEMA_VERSION:
        state = "frozen" if args.version < CURRENT_STATE_SCHEMA_VERSION else "not a version yet"
        print(
            f"gen_golden: golden/v{args.version}/ is {state}; this tool writes only "
            f"golden/v{CURRENT_STATE_SCHEMA_VERSION}/",
            file=sys.stderr,
        )
        return 2
    if not (folder / golden.BUILDERS).exists():
        print(
            f"gen_golden: write golden/v{args.version}/{golden.BUILDERS} first (start from a "
            f"copy of the previous version's, with the same fixture names)",
            file=sys.stderr,
        )
        return 2

    if args.check:
        problems = golden.check_current(folder)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    for change in golden.write_version(folder):
        print(f"golden/v{args.version}/: {change}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
