"""RuntimeConfig (config): its defaults are the ones the operations guide lists, and a time or
count out of range is refused when the config is made, naming its field."""

from __future__ import annotations

import dataclasses

import pytest

from beam_agents.errors import RuntimeConfigError
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig


def test_the_defaults_are_the_ones_the_operations_guide_lists():
    # docs/operations.md, "Settings that matter in production": a deployment sized by the guide
    # runs with these; a default changed here must change there.
    minute, hour, day, mib = 60 * 1000, 60 * 60 * 1000, 24 * 60 * 60 * 1000, 1024 * 1024
    config = RuntimeConfig()
    assert {f.name: getattr(config, f.name) for f in dataclasses.fields(config)} == {
        "memory_budget_bytes": mib,
        "cache_max_entries": 256,
        "cache_max_bytes": 4 * mib,
        "cache_max_response_bytes": mib,
        "intent_ttl_ms": hour,
        "suspend_deadline_ms": day,
        "ttl_ms": 30 * day,
        "deadline_policy": DeadlinePolicy(AtDeadline.EXPIRE, max_escalations=1, extension_ms=day),
        "resume_retries": 3,
        "retryable_resume_retries": 10,
        "llm_concurrency": None,
        "budget": None,
        "resume_backoff_ms": minute,
        "resume_backoff_max_ms": hour,
        "dedupe_window_ms": day,
        "dedupe_max_events": 1024,
        "max_clock_skew_ms": hour,
        "mailbox_max_events": 100,
        "mailbox_max_bytes": mib,
    }


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        # A TTL of 0 ties the TTL timer with a suspension's deadline timer; below it, the TTL
        # would fire before a suspension is due.
        ({"ttl_ms": 0}, "ttl_ms"),
        ({"ttl_ms": -1}, "ttl_ms"),
        ({"ttl_ms": 1.5}, "ttl_ms"),
        ({"ttl_ms": None}, "ttl_ms"),
        ({"cache_max_entries": None}, "cache_max_entries"),
        ({"memory_budget_bytes": -1}, "memory_budget_bytes"),
        ({"cache_max_entries": -1}, "cache_max_entries"),
        ({"cache_max_bytes": -1}, "cache_max_bytes"),
        ({"cache_max_response_bytes": -1}, "cache_max_response_bytes"),
        ({"intent_ttl_ms": -1, "suspend_deadline_ms": 0}, "intent_ttl_ms"),
        ({"intent_ttl_ms": -2, "suspend_deadline_ms": -1}, "intent_ttl_ms"),
        ({"deadline_policy": DeadlinePolicy(extension_ms=-1)}, "deadline_policy.extension_ms"),
        (
            {"deadline_policy": DeadlinePolicy(max_escalations=-1)},
            "deadline_policy.max_escalations",
        ),
        (
            {"deadline_policy": DeadlinePolicy(max_escalations=True)},
            "deadline_policy.max_escalations",
        ),
        # A resume's failures are counted in a uint32 of its Continuation.
        ({"resume_retries": -1}, "resume_retries"),
        ({"resume_retries": 2**32}, "resume_retries"),
        ({"retryable_resume_retries": 2**32}, "retryable_resume_retries"),
    ],
)
def test_a_time_or_count_out_of_range_is_refused_naming_its_field(fields, named):
    with pytest.raises(RuntimeConfigError) as refused:
        RuntimeConfig(**fields)
    assert refused.value.field == named and named in str(refused.value)


def test_the_least_times_in_range_are_taken():
    config = RuntimeConfig(
        memory_budget_bytes=None,
        cache_max_entries=0,
        ttl_ms=1,
        intent_ttl_ms=0,
        suspend_deadline_ms=0,
        deadline_policy=DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=0, extension_ms=0),
    )
    assert (config.ttl_ms, config.intent_ttl_ms, config.deadline_policy.extension_ms) == (1, 0, 0)


@pytest.mark.parametrize(
    ("fields", "bound"),
    [
        ({"ttl_ms": 0}, "must be an int >= 1, not 0"),
        ({"cache_max_entries": -1}, "must be a non-negative int, not -1"),
        ({"resume_retries": 2**32}, "must be a non-negative int of at most 4294967295"),
        ({"llm_concurrency": 0}, "must be None or an int >= 1, not 0"),
    ],
)
def test_a_refusal_says_the_range_the_field_takes(fields, bound):
    with pytest.raises(RuntimeConfigError, match=bound):
        RuntimeConfig(**fields)
