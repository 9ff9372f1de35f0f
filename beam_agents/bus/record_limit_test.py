"""The records AgentLoop writes, none over its max_record_bytes: a key near its memory and cache
caps exports a StateSnapshot over Kafka's default limit of about 1 MiB, which would fail the
write's bundle for good; it is a `record_too_large` dead letter instead and the key goes on.
RunAgent with the loop's limit (`max_output_bytes`) and the loop's own write step
(`topic_records`) in a real pipeline, and its records on a broker of Kafka's default limits
(`-m engines`)."""

from __future__ import annotations

import hashlib

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_agents._protos import AgentEnvelope, StateSnapshot
from beam_agents.bus import AgentLoop, KafkaBusError, TopicReader, Topics, decode_dead_letter
from beam_agents.bus.loop import MAX_RECORD_BYTES, topic_records
from beam_agents.bus.records import record_value, send
from beam_agents.ops.rounds import env_options, run_round
from beam_agents.runtime import (
    ERRORS,
    SNAPSHOTS,
    RunAgent,
    RuntimeConfig,
    ScriptedLlmClient,
    agent,
)
from beam_agents.testing.broker import fresh_topics, kafka_bootstrap, now_ms

KEY = b"c-1"
T0 = 1_764_460_800_000


def _event(at: int, data: bytes) -> AgentEnvelope:
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, external_event=data)


def _export(at: int, request_id: str) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    envelope.export_request.request_id = request_id
    return envelope


@agent(name="tests.hoard/v1")
def _hoard(ctx, event: bytes) -> bytes:
    """A key of a large memory (its budget raised to 2 MiB, `_BIG_MEMORY`): 1.1 MB of notes
    and 340 KB of a model answer (a completed activation keeps its answers in memory only), a
    snapshot over both the loop's 1 MB and the broker's default 1 MiB; "forget" deletes both."""
    if event == b"forget":
        ctx.memory.delete("notes")
        ctx.memory.delete("answer")
        return b"forgot"
    ctx.memory.put("notes", b"n" * 1_100_000)
    answer = ctx.llm([{"role": "user", "content": "long answer"}], model="m").text
    ctx.memory.put("answer", answer[:340_000].encode())
    return answer[:4].encode()


#: A completed key's snapshot is its memory and little else (the replay cache drops the
#: completed activation's answers): over Kafka's default 1 MiB only with a budget above it.
_BIG_MEMORY = RuntimeConfig(memory_budget_bytes=2 * 1024 * 1024)


class _LoopsRecords(beam.PTransform):
    """RunAgent as the loop runs it and the loop's write step: {output tag: the records the
    loop writes for it, "raw_snapshots": the snapshots of a RunAgent without the limit}."""

    def expand(self, envelopes):
        llm = ScriptedLlmClient(lambda request: "a" * 700_000)
        limited = envelopes | "Limited" >> RunAgent(
            _hoard, llm_client=llm, config=_BIG_MEMORY, max_output_bytes=MAX_RECORD_BYTES
        )
        raw = envelopes | "Raw" >> RunAgent(_hoard, llm_client=llm, config=_BIG_MEMORY)
        records = topic_records(limited, Topics("fx"))
        return {**records, "raw_snapshots": raw[SNAPSHOTS]}


_INPUTS = [
    _event(T0, b"remember"),
    _export(T0 + 1, "near the caps"),
    _event(T0 + 2, b"forget"),
    _export(T0 + 3, "after forgetting"),
]


def test_a_snapshot_over_the_loops_record_limit_is_a_dead_letter_and_the_key_goes_on(tmp_path):
    outputs = run_round(_LoopsRecords(), _INPUTS, tmp_path)
    big, small = sorted(outputs.values("raw_snapshots"), key=lambda s: -s.ByteSize())
    assert big.request_id == "near the caps" and big.ByteSize() > MAX_RECORD_BYTES
    # Only the snapshot under the limit is a record; the key went on after the refusal. (The
    # round's own hand-off export, `run_round:end`, goes through the write step too.)
    written = [StateSnapshot.FromString(v).request_id for v in outputs.values("snapshots")]
    assert [r for r in written if r != "run_round:end"] == ["after forgetting"]
    assert outputs.values("completions") == [b"aaaa", b"forgot"]
    (letter,) = [decode_dead_letter(v) for v in outputs.values(ERRORS)]
    size = len(KEY) + len(record_value(big))
    assert letter.reason == "record_too_large" and letter.entity_key == KEY
    assert f"StateSnapshot record of {size} bytes on the snapshots output" in letter.detail
    assert f"max_output_bytes of {MAX_RECORD_BYTES}" in letter.detail
    assert hashlib.sha256(record_value(big)).hexdigest() in letter.detail
    assert not small.memory.entries and not small.llm_cache.entries


@agent(name="tests.answer/v1")
def _answer(ctx, event: bytes) -> bytes:
    return b"c" * int(event)


@pytest.mark.parametrize("over", [0, 1])
def test_a_record_at_the_limit_is_written_and_one_byte_over_is_refused(over):
    length = 100_000
    with beam.Pipeline(options=env_options()) as pipeline:
        outputs = (
            pipeline
            | beam.Create([_event(T0, str(length).encode())])
            | RunAgent(_answer, max_output_bytes=len(KEY) + length - over)
        )
        records = topic_records(outputs, Topics("fx"))
        assert_that(
            records["completions"], equal_to([] if over else [(KEY, b"c" * length)]), "Written"
        )
        # The detail names what was refused, so an operator knows which output to look at.
        assert_that(
            records[ERRORS] | beam.Map(_refused),
            equal_to(
                [("record_too_large", f"a completion record of {len(KEY) + length}")]
                if over
                else []
            ),
            "Refused",
        )


def _refused(record) -> tuple[str, str]:
    letter = decode_dead_letter(record[1])
    return letter.reason, letter.detail.split(" bytes", 1)[0]


@pytest.mark.parametrize("limit", [0, 1000, True, 2.5e6])
def test_a_limit_no_dead_letter_fits_under_is_refused_when_the_loop_is_built(limit):
    with pytest.raises(ValueError, match="max_output_bytes"):
        AgentLoop(
            None,
            bootstrap_servers="127.0.0.1:9",
            topics=Topics("fx"),
            expansion_service="127.0.0.1:9",
            consumer_group="g",
            max_record_bytes=limit,
        )


@pytest.fixture(scope="module")
def bootstrap():
    with kafka_bootstrap() as servers:
        yield servers


@pytest.mark.engines
def test_on_the_broker_the_loops_records_go_through_and_the_snapshot_it_refused_would_not(
    bootstrap, tmp_path
):
    """Every record the loop writes for a key near its caps is taken by a broker of Kafka's
    default limits (a client whose own limit is far above lets the broker judge); the
    snapshot it refused is refused by the broker too, and a record of the default limit is
    not."""
    from confluent_kafka import Producer

    outputs = run_round(_LoopsRecords(), _INPUTS, tmp_path)
    topics = fresh_topics(bootstrap)
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 10_000_000})
    names = topics.for_outputs()
    send(
        producer,
        [
            (names[tag], key, value, now_ms())
            for tag in names
            for _, key, value in outputs.rows.get(tag, [])
        ],
    )
    send(producer, [(topics.completions, b"k", b"x" * (MAX_RECORD_BYTES - 1), now_ms())])
    # By its request id, not its place: the two snapshots come back in either order.
    (big,) = [s for s in outputs.values("raw_snapshots") if s.request_id == "near the caps"]
    assert big.ByteSize() > MAX_RECORD_BYTES
    with pytest.raises(KafkaBusError, match="MSG_SIZE_TOO_LARGE"):
        send(producer, [(topics.snapshots, KEY, record_value(big), now_ms())])
    read = [topics.snapshots, topics.dead_letters, topics.completions]
    reader = TopicReader(bootstrap, read)
    try:
        # Two completions and the record of the default limit.
        got = reader.read(lambda r: r[read[0]] and r[read[1]] and len(r[read[2]]) == 3, 60)
    finally:
        reader.close()
    written = [StateSnapshot.FromString(v).request_id for _, v in got[topics.snapshots]]
    assert [r for r in written if r != "run_round:end"] == ["after forgetting"]
    (letter,) = [decode_dead_letter(v) for _, v in got[topics.dead_letters]]
    assert letter.reason == "record_too_large" and str(MAX_RECORD_BYTES) in letter.detail
