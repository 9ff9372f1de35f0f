"""Cost of signing and verifying one ToolIntent, as a ratio to serializing it once.

Each intent is serialized deterministically at least once on its way to the outbox, so that
is the baseline: the ratio says how many serializations' worth of work the signature envelope
adds. Loops run interleaved in one process and the median per-round ratio is printed; absolute
times on these machines are noise. Goal: sign + verify <= 3 x one deterministic serialization.

    python benchmarks/signing_benchmark.py [--rounds N] [--seconds S]
"""

from __future__ import annotations

import argparse
import statistics
import time

from beam_agents.core.signing import Keyring, Verification, sign, verify
from beam_agents.testing.samples import intent

GOAL = 3.0


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

    ring = Keyring({"k1": bytes(range(32))}, active="k1")
    cases = {
        "typical intent": intent(),
        "64 KiB args_json": intent(args_json='{"text":"' + "x" * 65536 + '"}'),
    }
    print(f"(sign + verify) / one deterministic serialization, goal <= {GOAL}")
    for name, message in cases.items():

        def serialize(message=message):
            message.SerializeToString(deterministic=True)

        def sign_and_verify(message=message):
            if verify(sign(message, ring), ring) is not Verification.VALID:
                raise AssertionError("signature did not verify")

        loops = max(100, int(args.seconds / (_time(sign_and_verify, 200) / 200)))
        ratios = []
        for _ in range(args.rounds):
            baseline = _time(serialize, loops)
            ratios.append(_time(sign_and_verify, loops) / baseline)
        ratio = statistics.median(ratios)
        verdict = "meets goal" if ratio <= GOAL else "ABOVE GOAL"
        print(f"  {name:18} ratio {ratio:6.2f}  {verdict}")


if __name__ == "__main__":
    main()
