"""End-to-end throughput of the agent loop on Flink, against a bare Beam pipeline on the same
cluster (issue 18 point 5).

Three jobs run on the engines of tools/engines.sh (started here unless they run already), at
parallelism 1 unless `--parallelism` says otherwise, each reading its own events topic from
Kafka:

* the agents: the support-triage loop (beam_agents.testing.triage_loop: AgentLoop, RunAgent,
  the scripted model) with `beam-agents effector-service` answering its tool intents. Each
  key gets one question: two activations (the ticket, which asks the CRM, and the tool's
  result, which answers and completes);
* the bare pipeline: the same Kafka read, a stateful DoFn keyed by the record key that reads
  and writes one value state, and a Kafka write: one activation per record;
* the bare pipeline with the triage's state work: the same read and write, and a DoFn that
  makes, in RunAgent's own five state cells and two timers, the reads, writes and clears
  RunAgent makes for a key's two activations (`_AsTriage`); a key's first record goes back to
  the events topic as its second. It tells what the runtime's code costs from what its state
  layout costs: each cell read is a round trip to the task manager, and each cell written a
  wait at the bundle's commit.

For each: activations per second (and per core of this machine) over a backlog of `--keys`
records produced at once, from the first record produced to the last output read; then the
latency from an event to the job's first output for it (an intent for the agents; for the
triage-shaped bare pipeline its output after both activations), p50 and p99, over `--paced`
records produced `--rate` per second. The ratios are agents over each bare
pipeline; issue 18's goal is against the first.

    python benchmarks/flink_throughput.py [--keys 10000] [--paced 200] [--rate 20]
        [--parallelism 1] [--option=--NAME=VALUE ...]

`--parallelism` and each `--option` (a pipeline option, in the `--option=--NAME=VALUE` form)
apply to every job alike, so a setting is compared at the same ratio it is measured by; an
option named in tools/engines.sh's Flink options takes its value from here.

Figures: tools/engines/RESULTS.md. Absolute figures on a shared 2-core machine are noisy;
the ratio, measured in one run, is the figure to compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
from apache_beam.io.kafka import ReadFromKafka, WriteToKafka
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.typehints import Tuple
from apache_beam.utils.timestamp import Timestamp

from beam_agents._protos import AgentEnvelope, Continuation, LlmCacheBlob, MemoryBlob, ToolIntent
from beam_agents.bus import Topics, create_topics, produce
from beam_agents.bus.flink import FlinkRest
from beam_agents.ops.processes import Launched
from beam_agents.runtime import RuntimeConfig
from beam_agents.runtime.run_agent import _AgentDoFn
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.engines import Engines
from beam_agents.testing.flink_loop import Loop
from beam_agents.wire.beam_support import typed

GOAL = 0.7
#: Beam's own hint: the Kafka transforms need a KvCoder across the language boundary.
_KV = Tuple[bytes, bytes]


class _Touch(beam.DoFn):
    """A stateful activation with no agent: read the key's value, write the new one, emit."""

    VALUE = ReadModifyWriteStateSpec("value", beam.coders.BytesCoder())

    def process(self, element, value=beam.DoFn.StateParam(VALUE)):
        key, record = element
        value.read()
        value.write(record)
        yield key, record


_CONFIG = RuntimeConfig()
#: The tag of `_AsTriage`'s starts, which go back to the events topic.
_AGAIN = "again"


class _AsTriage(beam.DoFn):
    """The state work of the triage loop's two activations of a key, with no agent, in
    RunAgent's own cells (the same specs and coders) and timers, read and written as
    `run_agent._read` and `_write` do for the ticket and then for the tool's result:

    * a key with no continuation: a start. It reads the continuation, seq, memory and cache;
      writes seq, memory, a Continuation and one pending intent; sets both timers; and its
      record goes back to the events topic (tag `_AGAIN`);
    * a suspended key: the resume. It reads the five cells; writes memory and the cache (the
      triage's LLM call comes after the tool); clears the continuation, the pending intents
      and the deadline; sets the TTL; and its record goes out.
    """

    SEQ = _AgentDoFn.SEQ
    MEMORY = _AgentDoFn.MEMORY
    LLM_CACHE = _AgentDoFn.LLM_CACHE
    CONTINUATION = _AgentDoFn.CONTINUATION
    PENDING = _AgentDoFn.PENDING
    # Timer specs carry their callback: this DoFn's own, with the runtime's names and domain.
    DEADLINE = TimerSpec("deadline", _AgentDoFn.DEADLINE.time_domain)
    TTL = TimerSpec("ttl", _AgentDoFn.TTL.time_domain)

    def process(
        self,
        element,
        timestamp=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ):
        key, record = element
        now = timestamp.micros // 1000
        suspended = continuation.read()
        seq.read()
        memory.read()
        cache.read()
        blob = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, last_activity_ms=now)
        blob.entries.add(key="ticket", value=record, last_access_ms=now)
        memory.write(blob)
        # Neither timer fires while the benchmark runs, as neither of RunAgent's does.
        ttl.set(Timestamp(micros=(now + _CONFIG.ttl_ms) * 1000))
        if suspended is None:
            intent_id = f"{key.hex()}-1"
            seq.write(now * 1000)
            continuation.write(
                Continuation(
                    state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
                    seq=now * 1000,
                    pending_intent_ids=[intent_id],
                    suspended_at_ms=now,
                    deadline_ms=now + _CONFIG.suspend_deadline_ms,
                )
            )
            pending.clear()
            pending.add(ToolIntent(intent_id=intent_id, entity_key=key, tool_name="crm.lookup"))
            deadline.set(Timestamp(micros=(now + _CONFIG.suspend_deadline_ms) * 1000))
            yield beam.pvalue.TaggedOutput(_AGAIN, (key, record))
        else:
            list(pending.read())
            answer = LlmCacheBlob(
                state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_response_bytes=len(record)
            )
            answer.entries.add(cache_key="triage", response=record, created_at_ms=now)
            cache.write(answer)
            continuation.clear()
            pending.clear()
            deadline.clear()
            yield key, record

    @on_timer(DEADLINE)
    def at_deadline(self):
        pass

    @on_timer(TTL)
    def at_ttl(self):
        pass


def bare_job(argv: list[str]) -> int:
    """The bare pipeline, run by this script in a child process: events topic to out topic."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--kafka_bootstrap", required=True)
    parser.add_argument("--topic_prefix", required=True)
    parser.add_argument("--expansion_service", required=True)
    parser.add_argument("--state", choices=sorted(_BARE), required=True)
    args, pipeline_args = parser.parse_known_args(argv)
    topics = Topics(args.topic_prefix)
    pipeline = beam.Pipeline(options=PipelineOptions(pipeline_args))
    records = pipeline | "ReadEvents" >> ReadFromKafka(
        consumer_config={
            "bootstrap.servers": args.kafka_bootstrap,
            "group.id": f"{topics.prefix}.bare",
            "auto.offset.reset": "earliest",
        },
        topics=[topics.events],
        expansion_service=args.expansion_service,
    )
    bare = _BARE[args.state]
    touched = typed(records, _KV) | "Touch" >> beam.ParDo(bare.dofn()).with_outputs(
        _AGAIN, main="out"
    )
    outputs = {"WriteOut": (touched.out, topics.completions)}
    if bare.activations > 1:
        outputs["WriteAgain"] = (touched[_AGAIN], topics.events)
    for name, (output, topic) in outputs.items():
        _ = typed(output, _KV) | name >> WriteToKafka(
            producer_config={"bootstrap.servers": args.kafka_bootstrap},
            topic=topic,
            expansion_service=args.expansion_service,
        )
    pipeline.run().wait_until_finish()
    return 0


class _Timestamps:
    """The Kafka create times of every record on `topic`, by record key (the first of each)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{time.time_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._consumer.subscribe([topic])
        self.first: dict[bytes, int] = {}

    def read_until(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.first) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.first)} of {count} records in {timeout_s} s")
            for message in self._consumer.consume(1000, timeout=1.0):
                if message.error() is None:
                    self.first.setdefault(message.key(), message.timestamp()[1])

    def close(self) -> None:
        self._consumer.close()


def _ticket(key: bytes, now_ms: int) -> bytes:
    from beam_agents.examples.support_triage import ticket

    return AgentEnvelope(
        entity_key=key,
        event_time_ms=now_ms,
        external_event=ticket(f"t-{key.decode()}", "c-2", "how do I export my invoices?"),
    ).SerializeToString()


@dataclasses.dataclass(frozen=True)
class _Bare:
    """A bare pipeline: its DoFn; the activations a key's record makes (a second comes back
    through the events topic); and the record the benchmark sends for a key."""

    dofn: type
    activations: int
    value: Callable[[bytes, int], bytes]


_BARE = {
    "one": _Bare(_Touch, 1, lambda key, now_ms: b"x" * 200),
    # The triage-shaped one stores the ticket the agents get.
    "triage": _Bare(_AsTriage, 2, _ticket),
}


def _measure(bootstrap, events, *, done, first, keys, paced, rate, value) -> dict:
    """Throughput: a backlog of `keys` records, from the first produced to the last output on
    `done` (a key's last output). Latency: `paced` records, one producer sending them `rate`
    per second, each from its create time to its first output's on `first`."""
    from confluent_kafka import Producer

    finished = _Timestamps(bootstrap, done)
    answered = finished if first == done else _Timestamps(bootstrap, first)
    try:
        started = time.monotonic()
        now = int(time.time() * 1000)
        produce(bootstrap, [(events, k, value(k, now), now) for k in _keys("b", keys)])
        finished.read_until(keys, timeout_s=1800)
        elapsed = time.monotonic() - started
        sent = {}
        producer = Producer({"bootstrap.servers": bootstrap})
        for key in _keys("p", paced):
            sent[key] = now = int(time.time() * 1000)
            producer.produce(events, value(key, now), key, timestamp=now)
            producer.poll(0)
            time.sleep(1 / rate)
        if producer.flush(30):
            raise TimeoutError("the paced records were not acknowledged in 30 s")
        answered.read_until(keys + paced, timeout_s=600)
        latencies = sorted(answered.first[k] - t for k, t in sent.items())
    finally:
        finished.close()
        if answered is not finished:
            answered.close()
    return {
        "elapsed_s": round(elapsed, 1),
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[math.ceil(0.99 * len(latencies)) - 1],
    }


def _keys(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def _agents(engines: Engines, work: Path, args) -> dict:
    loop = Loop(engines, work)
    try:
        loop.start_job(parallelism=args.parallelism, options=args.option)
        figures = _measure(
            loop.bootstrap,
            loop.topics.events,
            done=loop.topics.completions,
            first=loop.topics.intents,
            keys=args.keys,
            paced=args.paced,
            rate=args.rate,
            value=_ticket,
        )
    finally:
        loop.close()
    figures["activations"] = 2 * args.keys
    return figures


def _bare(engines: Engines, work: Path, args, state: str) -> dict:
    bootstrap = engines.endpoints["KAFKA_BOOTSTRAP"]
    topics = Topics(f"bare-{time.time_ns()}")
    create_topics(bootstrap, topics)
    rest = FlinkRest(engines.endpoints["FLINK_REST"])
    known = set(rest.jobs())
    command = [
        sys.executable, __file__, "--bare-job",
        "--kafka_bootstrap", bootstrap,
        "--topic_prefix", topics.prefix,
        "--expansion_service", engines.endpoints["EXPANSION_SERVICE"],
        "--state", state,
        *engines.flink_options((f"--parallelism={args.parallelism}", *args.option)),
    ]  # fmt: skip
    job, jid = Launched(command, work / "bare.log"), None
    try:
        jid = rest.wait_for_new_job(known, job.check_alive)
        figures = _measure(
            bootstrap,
            topics.events,
            done=topics.completions,
            first=topics.completions,
            keys=args.keys,
            paced=args.paced,
            rate=args.rate,
            value=_BARE[state].value,
        )
    finally:
        if jid is not None:  # a LOOPBACK job outlives its launcher
            rest.cancel(jid)
        job.stop()
    figures["activations"] = _BARE[state].activations * args.keys
    return figures


def main(argv: list[str]) -> int:
    if argv[:1] == ["--bare-job"]:
        return bare_job(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--paced", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument(
        "--option", action="append", default=[], help="a pipeline option for every job"
    )
    args = parser.parse_args(argv)
    engines = Engines().up(["kafka", "java", "flink"])
    cores = len(os.sched_getaffinity(0))  # the cores this process, and so the engines, may use
    try:
        with tempfile.TemporaryDirectory() as work:
            results = {}
            runs = (
                ("bare", functools.partial(_bare, state="one")),
                ("bare with the triage's state work", functools.partial(_bare, state="triage")),
                ("agents", _agents),
            )
            for number, (name, run) in enumerate(runs):
                (Path(work) / str(number)).mkdir()
                figures = run(engines, Path(work) / str(number), args)
                rate = figures["activations"] / figures["elapsed_s"]
                figures["activations_per_s"] = round(rate, 1)
                figures["activations_per_s_per_core"] = round(rate / cores, 1)
                results[name] = figures
                print(name, json.dumps(figures), flush=True)
    finally:
        engines.down()
    agents = results["agents"]["activations_per_s"]
    print(
        f"agents / bare activations per second: {agents / results['bare']['activations_per_s']:.2f}"
        f" (goal at least {GOAL})"
    )
    ratio = agents / results["bare with the triage's state work"]["activations_per_s"]
    print(f"agents / bare with the triage's state work: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
