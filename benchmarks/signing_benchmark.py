"""Cost of signing and verifying one ToolIntent, against the physical floor of the scheme.

The scheme is HMAC-SHA256 over the deterministic serialization with the signature fields
cleared, so sign + verify cannot cost less than one such serialization plus two HMAC-SHA256 of
its bytes. That is the baseline here, computed with the standard library (`hmac.digest`), and
the ratio says how much the implementation adds on top: copying the message, clearing and
setting the envelope, reading the signing input back off the wire. Goal: at most 1.2.

The "from bytes" rows are the effector's path: the signed intent is serialized, parsed and
verified from the bytes as received; their floor adds the one parse any receiver does.
The last column, against one serialization alone, is the cost of the envelope to a producer
that serializes each intent once anyway (no goal: two MACs over the bytes are the scheme).
Loops run interleaved in one process and the median per-round ratio is printed; absolute times
on these machines are noise.

    python benchmarks/signing_benchmark.py [--rounds N] [--seconds S]
"""

from __future__ import annotations

import argparse
import hmac
import statistics
import time

from beam_agents._protos import ToolIntent
from beam_agents.intents.signing import Keyring, Verification, sign, verify
from beam_agents.testing.samples import intent

GOAL = 1.2
SECRET = bytes(range(32))


def _time(function, loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.05, help="per timed loop")
    args = parser.parse_args()

    ring = Keyring({"k1": SECRET}, active="k1")
    cases = {
        "typical intent": intent(),
        "64 KiB args_json": intent(args_json='{"text":"' + "x" * 65536 + '"}'),
    }
    print(
        "(sign + verify) / (one deterministic serialization + two stdlib HMAC-SHA256), "
        f"goal <= {GOAL}; and / (one serialization)"
    )
    for name, message in cases.items():

        def serialize(message=message):
            message.SerializeToString(deterministic=True)

        def floor(message=message):
            data = message.SerializeToString(deterministic=True)
            hmac.digest(SECRET, data, "sha256")
            hmac.digest(SECRET, data, "sha256")

        def floor_received(message=message):
            data = message.SerializeToString(deterministic=True)
            hmac.digest(SECRET, data, "sha256")
            ToolIntent.FromString(data)
            hmac.digest(SECRET, data, "sha256")

        def sign_and_verify(message=message):
            if verify(sign(message, ring), ring) is not Verification.VALID:
                raise AssertionError("signature did not verify")

        def sign_and_verify_received(message=message):
            # The effector's path: the signed intent arrives as bytes and is verified from them.
            data = sign(message, ring).SerializeToString(deterministic=True)
            if verify(ToolIntent.FromString(data), ring, wire=data) is not Verification.VALID:
                raise AssertionError("signature did not verify")

        rows = (
            ("message", sign_and_verify, floor),
            ("from bytes", sign_and_verify_received, floor_received),
        )
        for label, work, baseline in rows:
            loops = max(100, int(args.seconds / (_time(work, 200) / 200)))
            to_floor, to_serialization = [], []
            for _ in range(args.rounds):
                cost = _time(work, loops)
                to_floor.append(cost / _time(baseline, loops))
                to_serialization.append(cost / _time(serialize, loops))
            ratio = statistics.median(to_floor)
            verdict = "meets goal" if ratio <= GOAL else "ABOVE GOAL"
            print(
                f"  {name:18} {label:11} ratio {ratio:5.2f}  {verdict}   "
                f"(/ serialization {statistics.median(to_serialization):5.2f})"
            )


if __name__ == "__main__":
    main()
