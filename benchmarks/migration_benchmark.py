"""Cost of migrate_to_current on a current-version blob, as a ratio to parsing that blob.

Every state read in the runtime is `migrate_to_current(Blob.FromString(data))`, so the fast
path's cost is what it adds to the parse. Both loops run interleaved in one process, round after
round, and the median per-round ratio is printed; absolute times on these machines are noise.
Goal: parse + migrate_to_current <= 1.02 x parse.

The fast path is a Python call, one field read and one type test, a fixed few tens of
nanoseconds; the upb parse grows with the blob. So the ratio falls with size: the goal holds
for blobs of working-memory size and is out of reach for a blob of a few bytes, whose whole
parse costs about as much as ten attribute reads.

    python benchmarks/migration_benchmark.py [--rounds N] [--seconds S]
"""

from __future__ import annotations

import argparse
import statistics
import time

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob
from beam_agents.core.migration import migrate_to_current, new_state_blob

GOAL = 1.02


def _blobs() -> dict[str, tuple[type, bytes]]:
    small = new_state_blob(MemoryBlob)
    small.entries.add(key="user:name", value=b"Ada", last_access_ms=1)
    typical = new_state_blob(MemoryBlob)
    for i in range(32):
        typical.entries.add(key=f"fact:{i}", value=b"x" * 96, last_access_ms=i)
    history = new_state_blob(MemoryBlob)
    for i in range(512):
        history.entries.add(key=f"turn:{i}", value=b"y" * 240, last_access_ms=i)
    cache = new_state_blob(LlmCacheBlob)
    for i in range(16):
        cache.entries.add(cache_key=f"k{i}", response=b"r" * 512, response_digest=bytes(32))
    continuation = new_state_blob(
        Continuation, seq=9, pending_intent_ids=["a", "b"], snapshot=b"s" * 256
    )
    return {
        "MemoryBlob, 1 entry": (MemoryBlob, small.SerializeToString()),
        "MemoryBlob, 32 entries": (MemoryBlob, typical.SerializeToString()),
        "MemoryBlob, 512 entries": (MemoryBlob, history.SerializeToString()),
        "LlmCacheBlob, 16 entries": (LlmCacheBlob, cache.SerializeToString()),
        "Continuation": (Continuation, continuation.SerializeToString()),
    }


def _time(function, loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        function()
    return time.perf_counter() - start


def measure(cls: type, data: bytes, rounds: int, loops: int) -> tuple[float, float]:
    """(median ratio, median added nanoseconds per read)."""

    def parse():
        cls.FromString(data)

    def parse_and_migrate():
        migrate_to_current(cls.FromString(data))

    parse_and_migrate()  # builds nothing lazily on the fast path, but warm everything anyway
    ratios, added = [], []
    for _ in range(rounds):
        baseline = _time(parse, loops)
        with_migrate = _time(parse_and_migrate, loops)
        ratios.append(with_migrate / baseline)
        added.append((with_migrate - baseline) / loops * 1e9)
    return statistics.median(ratios), statistics.median(added)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.02, help="per timed loop")
    args = parser.parse_args()
    print(f"(parse + migrate_to_current) / parse, current-version blobs, goal <= {GOAL}")
    for name, (cls, data) in _blobs().items():
        # About the same wall time per measurement whatever the blob's size.
        per_parse = _time(lambda: cls.FromString(data), 1000) / 1000  # noqa: B023
        loops = max(100, int(args.seconds / per_parse))
        ratio, added = measure(cls, data, args.rounds, loops)
        verdict = "meets goal" if ratio <= GOAL else "ABOVE GOAL"
        print(f"  {name:26} {len(data):7} bytes  ratio {ratio:.3f}  (+{added:.0f} ns)  {verdict}")


if __name__ == "__main__":
    main()
