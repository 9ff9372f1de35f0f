"""A loop's topic names are checked before any broker sees them."""

from __future__ import annotations

import pytest

from beam_agents.bus import Topics


@pytest.mark.parametrize("prefix", ["", "has space", "slash/", "x" * 201, "ünï"])
def test_a_topic_prefix_kafka_would_refuse_is_refused_before_any_broker_sees_it(prefix):
    with pytest.raises(ValueError, match="no topic prefix"):
        Topics(prefix)
