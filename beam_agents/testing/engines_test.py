"""The pipeline options a test or benchmark sets over the engines' own."""

from __future__ import annotations

from beam_agents.testing.engines import overridden

ENGINES = ["--runner=PortableRunner", "--streaming", "--checkpointing_interval=10000"]


def test_an_override_replaces_the_option_of_its_name_and_the_rest_follow_in_order():
    options = overridden(ENGINES, ["--checkpointing_interval=1000", "--parallelism=2"])
    assert options == [
        "--runner=PortableRunner",
        "--streaming",
        "--checkpointing_interval=1000",
        "--parallelism=2",
    ]


def test_a_flag_without_a_value_is_replaced_by_name_too():
    assert overridden(ENGINES, ["--streaming=false"]) == [
        "--runner=PortableRunner",
        "--checkpointing_interval=10000",
        "--streaming=false",
    ]


def test_no_overrides_leave_the_engines_options_as_they_are():
    assert overridden(ENGINES, []) == ENGINES
