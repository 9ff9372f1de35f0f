"""The `beam-agents` operator command.

    beam-agents inspect FILE [--type NAME]

`inspect` decodes one serialized beam_agents message, guessing its type unless --type names
it, and prints it as protobuf text format.

Exit codes: 0 success; 1 the input was rejected (unreadable, not a beam_agents message, or
ambiguous without --type), with the reason on stderr; 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import text_format

from beam_agents.decoding import MESSAGE_TYPES, decode
from beam_agents.errors import BeamAgentsError

__all__ = ["EXIT_OK", "EXIT_REJECTED", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2


def _inspect(args: argparse.Namespace) -> int:
    try:
        data = Path(args.file).read_bytes()
    except OSError as e:
        print(f"beam-agents inspect: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return EXIT_REJECTED
    try:
        decoded = decode(data, args.type)
    except BeamAgentsError as e:
        print(f"beam-agents inspect: {args.file}: {e}", file=sys.stderr)
        return EXIT_REJECTED
    message = decoded.message
    how = "guessed" if decoded.guessed else "given"
    print(f"# {message.DESCRIPTOR.full_name} ({how}), {len(data)} bytes")
    sys.stdout.write(text_format.MessageToString(message))
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beam-agents",
        description="Operator tools for beam_agents state and wire messages.",
        epilog="Exit codes: 0 success, 1 input rejected (reason on stderr), 2 usage error.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="decode one serialized beam_agents message and print it as text"
    )
    inspect.add_argument("file", help="a file holding one serialized message")
    inspect.add_argument(
        "--type",
        choices=sorted(MESSAGE_TYPES),
        help="the message type; guessed from the bytes when omitted",
    )
    inspect.set_defaults(run=_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
