"""The bus: the agent loop over Kafka, RunAgent in a streaming pipeline and the effector as its
own service.

A pipeline cannot feed its outputs back to its input; a message bus closes the loop. One loop
uses one set of topics, named by a prefix (`Topics`), every record keyed by its entity_key:

    events        AgentEnvelope   what RunAgent reads: external events, tool results,
                                  approvals, export requests
    intents       ToolIntent      what the agents ask the world to do; the effector reads it
    approvals     ToolIntent      approval intents the effector routes to people
    completions   bytes           each completed activation's output
    traces        TraceEvent
    snapshots     StateSnapshot   answers to export requests
    dead_letters  AgentEnvelope   an ActivationErrorRecord in external_event (the wire
                                  convention of an errors sink), from RunAgent and from the
                                  effector alike; `decode_dead_letter` reads one

`AgentLoop` is the pipeline half: Beam's own cross-language Kafka IO (ReadFromKafka and
WriteToKafka, expanded by a Java expansion service) around RunAgent. Record timestamps are the
records' create times, which producers set to the envelope's event time. On a runner that
checkpoints (Flink), the read positions live in the pipeline's checkpoints and savepoints with
the agents' state, so a job restored from a savepoint reads on from where its state was taken. No
record over `max_record_bytes` (1,000,000 by default, under Kafka's default limits) is written:
a `record_too_large` dead letter takes its place, and the key goes on (`loop`'s docstring).

`EffectorService` is the other half: an `Effector` with its durable store reading the intents
topic, a poll's batch at a time. It commits an intent's offset only after every record it
produced for that intent was acknowledged by the broker (a batch's records together, then its
offsets together), so a crash anywhere redelivers the intent; the effector's store
then answers the copy with the first result (the tool does not run again) and the result
reaches the events topic at least once. RunAgent refuses a second copy of an answer with a
dead letter (`unknown_intent`): nothing resumes twice.

The service needs the `kafka` extra (confluent-kafka); the pipeline half needs only Beam, and a
Java expansion service and workers (`bash tools/engines.sh start java`).

The package: `topics` (the loop's topic names, `create_topics`, `KafkaBusError`), `records`
(record values and ids, `produce`, `TopicReader`), `loop` (`AgentLoop`, the pipeline half) and
`service` (`EffectorService`); confluent_kafka only inside the functions that need it, so the
pipeline half runs without the extra. The names below are the documented `beam_agents.bus` API.

It may import the layers below it: `beam_agents.runtime`, `beam_agents.intents` (the effector),
`beam_agents.state`, `beam_agents.wire`, `beam_agents.errors` and the bindings; not
`beam_agents.integrations`, its sibling (`beam_agents/layout_test.py` enforces it).
"""

from __future__ import annotations

from beam_agents.bus.loop import AgentLoop, FlinkCheckpointOptions
from beam_agents.bus.records import (
    RECORD_ID_HEADER,
    TopicReader,
    decode_dead_letter,
    produce,
    record_id,
    record_id_of,
    record_value,
)
from beam_agents.bus.service import EffectorService
from beam_agents.bus.topics import KafkaBusError, Topics, create_topics

__all__ = [
    "RECORD_ID_HEADER",
    "AgentLoop",
    "EffectorService",
    "FlinkCheckpointOptions",
    "KafkaBusError",
    "TopicReader",
    "Topics",
    "create_topics",
    "decode_dead_letter",
    "produce",
    "record_id",
    "record_id_of",
    "record_value",
]
