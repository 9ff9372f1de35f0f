"""RunAgent's DoFn over state doubles that hand back the very objects they stored, as Beam's
portable worker does: a blob a newer binary wrote fails the element or timer (the bundle, on a
runner) instead of being caught, read or dead-lettered, and the DoFn writes no cell, sets no
timer and yields nothing before it fails."""

from __future__ import annotations

import pytest
from apache_beam.utils.timestamp import Timestamp

from beam_agents._protos import AgentEnvelope, Continuation, LlmCacheBlob, MemoryBlob, StateSnapshot
from beam_agents.runtime import RuntimeConfig
from beam_agents.runtime.dead_letters import to_envelope
from beam_agents.runtime.machine_state import COUNTERS
from beam_agents.runtime.run_agent import _ENVELOPE, _SNAPSHOT, ERRORS, MIN_OUTPUT_BYTES, _AgentDoFn
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION, StateSchemaFromFutureError
from beam_agents.testing.machine_harness import KEY, T0, Bag, Cell, Timer, echo, event

_SNAPSHOT_BYTES = StateSnapshot(entity_key=KEY, snapshot_at_ms=T0).SerializeToString()


def _dofn() -> _AgentDoFn:
    dofn = _AgentDoFn(
        echo, None, {"intent": None, "result": None, "approval": None}, RuntimeConfig(), None
    )
    dofn.setup()
    return dofn


@pytest.mark.parametrize(
    ("cell", "blob_type"), [(1, MemoryBlob), (2, LlmCacheBlob), (3, Continuation)]
)
@pytest.mark.parametrize(
    "entry",
    [
        lambda dofn, cells: dofn.process(
            (KEY, _ENVELOPE + event(T0, b"a").SerializeToString()),
            timestamp=Timestamp.of(T0 / 1000),
            **cells,
        ),
        lambda dofn, cells: dofn.process(
            (KEY, _SNAPSHOT + _SNAPSHOT_BYTES), timestamp=Timestamp.of(T0 / 1000), **cells
        ),
        lambda dofn, cells: dofn.at_deadline(key=KEY, fired=Timestamp.of(T0 / 1000), **cells),
        lambda dofn, cells: dofn.at_ttl(key=KEY, fired=Timestamp.of(T0 / 1000), **cells),
    ],
    ids=["envelope", "snapshot", "deadline", "ttl"],
)
def test_a_blob_from_a_newer_binary_fails_the_dofn_before_it_writes_or_yields(
    cell, blob_type, entry
):
    states = [Cell(), Cell(), Cell(), Cell(), Bag()]
    states[1].value = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION)
    states[2].value = LlmCacheBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION)
    states[cell].value = blob_type(state_schema_version=CURRENT_STATE_SCHEMA_VERSION + 1)
    timers = [Timer(), Timer()]
    names = ("seq", "memory", "cache", "continuation", "pending", "deadline", "ttl")
    yielded = []
    with pytest.raises(StateSchemaFromFutureError):
        yielded.extend(entry(_dofn(), dict(zip(names, [*states, *timers], strict=True))))
    assert yielded == []
    assert [state.writes for state in states] == [0] * 5
    assert [timer.at_ms for timer in timers] == [None, None]


def test_a_dead_letter_over_max_output_bytes_leaves_as_a_small_one_naming_it():
    # An answer for a key that waits for nothing is a no_suspension dead letter holding the
    # answer: 100 KB of it would be a record the sink refuses, failing its bundle for good.
    dofn = _AgentDoFn(
        echo,
        None,
        {"intent": None, "result": None, "approval": None},
        RuntimeConfig(),
        None,
        max_output_bytes=MIN_OUTPUT_BYTES,
    )
    dofn.setup()
    big = AgentEnvelope(entity_key=KEY, event_time_ms=T0)
    big.tool_result.intent_id = "i-1"
    big.tool_result.payload = b"p" * 100_000
    cells = dict(
        zip(
            ("seq", "memory", "cache", "continuation", "pending", "deadline", "ttl"),
            [Cell(), Cell(), Cell(), Cell(), Bag(), Timer(), Timer()],
            strict=True,
        )
    )
    (output,) = dofn.process(
        (KEY, _ENVELOPE + big.SerializeToString()), timestamp=Timestamp.of(T0 / 1000), **cells
    )
    assert output.tag == ERRORS
    key, letter = output.value
    assert key == KEY and letter.reason == "record_too_large"
    assert (
        "dead letter (no_suspension)" in letter.detail and "on the errors output" in letter.detail
    )
    assert to_envelope(letter).ByteSize() < MIN_OUTPUT_BYTES


def test_the_dofns_counters_are_reported_under_the_runtimes_namespace():
    names = {(c.metric_name.namespace, c.metric_name.name) for c in _dofn()._counters.values()}
    assert names == {("beam_agents.runtime", name) for name in COUNTERS}


@pytest.mark.parametrize("limit", [float(MIN_OUTPUT_BYTES), str(MIN_OUTPUT_BYTES), True, 10])
def test_max_output_bytes_is_refused_when_the_pipeline_is_built_unless_an_int_past_the_minimum(
    limit,
):
    from beam_agents.runtime import RunAgent

    with pytest.raises(ValueError, match="max_output_bytes"):
        RunAgent(echo, max_output_bytes=limit)
    assert RunAgent(echo, max_output_bytes=MIN_OUTPUT_BYTES)


def test_the_dofns_state_cells_and_timers_keep_the_names_the_committed_manifest_freezes():
    # A renamed cell or timer loses every key's state at a Dataflow --update; the manifest
    # (beam_agents/ops/state_manifest.json) is the frozen list, read here without a pipeline.
    import json

    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.transforms.timeutil import TimeDomain
    from apache_beam.transforms.userstate import StateSpec, TimerSpec

    from beam_agents.ops.state_manifest import MANIFEST

    frozen = json.loads(MANIFEST.read_text())["RunAgent/Activate/ParDo(_AgentDoFn)"]
    specs = list(vars(_AgentDoFn).values())
    assert sorted(s.name for s in specs if isinstance(s, StateSpec)) == sorted(frozen["state"])
    domains = beam_runner_api_pb2.TimeDomain.Enum
    timers = {
        s.name.removeprefix(TimerSpec.prefix): domains.Name(TimeDomain.to_runner_api(s.time_domain))
        for s in specs
        if isinstance(s, TimerSpec)
    }
    assert timers == {name: timer["domain"] for name, timer in frozen["timers"].items()}
