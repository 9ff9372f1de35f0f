"""RuntimeConfig (config): its defaults are the ones the operations guide lists."""

from __future__ import annotations

import dataclasses

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
