"""A Kafka broker for the engines tests: `kafka_bootstrap()` starts it through tools/engines.sh
unless it runs already (and stops it after only then), `fresh_topics` makes a loop's topics of
a test's own, and `now_ms` stamps records with a time the broker keeps."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from beam_agents.bus import Topics, create_topics
from beam_agents.testing.engines import Engines

__all__ = ["fresh_topics", "kafka_bootstrap", "now_ms"]


@contextlib.contextmanager
def kafka_bootstrap() -> Iterator[str]:
    """The broker's bootstrap servers while the block runs."""
    engines = Engines()
    try:
        yield engines.up(["kafka"]).endpoints["KAFKA_BOOTSTRAP"]
    finally:
        engines.down()


def fresh_topics(bootstrap: str) -> Topics:
    topics = Topics(f"fx-{time.time_ns()}")
    create_topics(bootstrap, topics)
    return topics


def now_ms() -> int:
    """A record's timestamp: the broker's time-based retention deletes records stamped
    longer ago than its retention.ms (7 days) at its next check, before anything reads them."""
    return int(time.time() * 1000)
