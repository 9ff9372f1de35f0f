"""The `beam-agents` operator command.

    beam-agents demo [--bus=kafka --kafka_bootstrap HOST:PORT --expansion_service HOST:PORT]
        [BEAM PIPELINE OPTIONS]
    beam-agents new NAME [--dir DIR]
    beam-agents inspect FILE [--type NAME] [--max-bytes N]
    beam-agents dry-run DIR [--max-bytes N]
    beam-agents export-traces FILE [--endpoint URL]
    beam-agents replay SNAPSHOT ENVELOPE --agent MODULE:NAME [--recorded-intents FILE]
        [--recorded-traces FILE]
    beam-agents backtest RECORDS --agent MODULE:NAME [--config MODULE:NAME] [--report FILE]
        [--max-keys N]
        [--continue-with MODULE:NAME --max-tokens N] [--price-per-million IN OUT]
        [BEAM PIPELINE OPTIONS]
    beam-agents update-check OLD NEW
    beam-agents update-check --manifest GRAPH
    beam-agents effector-service --bootstrap-servers HOST:PORT --topic-prefix PREFIX
        --store FILE --tools MODULE:NAME [--keyring MODULE:NAME] [--result-keyring MODULE:NAME]
        [--approval-keyring MODULE:NAME] [--inquiry-keyring MODULE:NAME] [--mode MODE]
        [--instance-id ID] [--session-timeout-ms MS] [--lease-ms MS]
    beam-agents console --bus=kafka --config FILE
    beam-agents console hash-password

`demo` runs the support-triage agent end to end on local Beam pipelines (RunAgent,
ExecuteIntents, a scripted approver), with no network and no keys, and prints an account of
the conversation; with `--bus=kafka`, the same conversation as one streaming job reading Kafka,
with the effector as its own process (`bash tools/engines.sh flink-demo` runs it on Flink).
Exit codes: 0 the agent completed; 1 it did not (a dead letter, named); 2 usage error.

`new` writes a small project to start an agent from (beam_agents.ops.scaffold): the agent, its
test on the DirectRunner, which passes as written, and a launcher for Flink or Dataflow. Exit
codes: 0 written; 2 usage error (no project name, or the folder exists).

`inspect` decodes one serialized beam_agents message, guessing its type unless --type names
it, and prints it as protobuf text, then lists any fields this binary's schema does not know.
For a state blob or a StateSnapshot it also says what this binary's migrate_to_current makes
of it, and prints the migrated message when it differs. A guess it cannot make with
certainty is refused, naming the candidate types. Exit codes: 0 decoded (whatever the migration
verdict); 1 input rejected (not a regular file, over --max-bytes, unreadable, not a beam_agents
message, or ambiguous without --type); 2 usage error.

`export-traces` sends a file of TraceEvents (length-delimited, beam_agents.integrations.telemetry's
format) to an OTLP/HTTP endpoint as OpenTelemetry spans (needs the beam-agents[otel] extra). Exit
codes: 0 exported; 1 not a trace file, or the endpoint refused; 2 usage error.

`replay` re-runs one activation offline from an exported StateSnapshot, with a model client
that refuses every call, and compares it with what was recorded (beam_agents.ops.replay). Exit
codes: 0 reproduced; 1 diverged (with a diff); 3 could not be reproduced (a cache miss, a
digest-only entry, state this binary cannot read); 2 usage error.

`backtest` runs a candidate agent over a recorded history (ActivationRecords, length-delimited, as
RunAgent's RECORDS output holds them) in a batch pipeline, each key's model answers, tool
results and approvals taken from the recording, no tool ever run (beam_agents.ops.backtest). It
prints a Markdown report (divergences by kind, the tools now or no longer called per key, tokens
and, with --price-per-million, their cost) and, with --report, writes each key's
BacktestKeyReport (length-delimited). --continue-with names a model client that answers, within
--max-tokens per key, the requests the recording lacks, so a key's run goes on past its first
divergence. --config names the live job's RuntimeConfig (its budgets, TTLs and limits: a
candidate run under other limits fails, or does not, where the live agent did not). Exit codes:
0 no key diverged; 1 some did; 3 none did, but some histories could not
be backtested (dead letters, counted in the report); 2 usage error, said before any pipeline
runs (a recording whose framing is truncated, an agent that is none or whose module fails to
import, a --continue-with that is no model client or --max-tokens without one, a negative
price, a --report or --html folder that does not exist).

`update-check` compares two builds' pipeline graphs (beam_agents.ops.update_check) and names every
difference that would make Dataflow refuse an --update or lose state; with --manifest, one
graph with the committed state manifest (beam_agents/ops/state_manifest.json), on the
composites of it the graph applies. Exit codes: 0 compatible; 1 not; 2 usage error.

`effector-service` runs the effector of beam_agents.intents.effector on a Kafka loop's intents topic
(beam_agents.bus.EffectorService), with its records in the SQLite store FILE, until
SIGTERM or SIGINT; --tools names a dict of tool name to callable, --keyring a function returning
the Keyring that verifies intents (required unless --mode off), --result-keyring one whose active
key signs every result (and inquiry, unless --inquiry-keyring names a ring of their own: the
console verifies inquiries with it), --approval-keyring one that verifies people's answers to
inquiries about calls whose outcome was unknown (a tool is a callable or a ToolSpec). --instance-id
makes it a static member of its consumer group, so a restart under the same id serves at once;
--session-timeout-ms (default 10000) bounds how long a crashed member holds the intents.
--lease-ms (default 30000) is how long a claim on a call stays the service's unless renewed (it
is renewed while the tool runs): a call whose service died is a lost call, answered by its
ToolSpec or a person, this long after its last renewal; services sharing a store, in whatever
containers, judge each other's calls by it. It
prints one line to stderr when it serves, and one per retried broker error (backoff up to 10 s).
On SIGTERM it leaves the group at once. Exit codes: 0 stopped by a signal; 1 stopped by a fatal
or permanent failure (the broker error named, or the store), with the intent it was serving
left uncommitted; 2 usage error.

`console` serves the approvals inbox and agent viewer of a Kafka loop in the browser
(beam_agents.ops.console; the beam-agents[console] extra), configured by a TOML file of the loop's
topics, its keys and its users; `console hash-password` prints the argon2id hash of a password
read from standard input. Exit codes: 0 stopped; 2 a configuration error, named.

`dry-run` is the pre-deploy check: it reads every regular file under DIR (dot-named ones
included) as one exported StateSnapshot and reports, for the envelope and each blob inside, its
version and whether this binary reads it (current, or migrating through registered steps) or
not (from the future, missing or failing step). Anything else under DIR is a named failure: a
file that decodes as another message, special files, unreadable files, names that are not
UTF-8. Exit codes: 0 every file decodes and every blob reads; 1 something would not read (each
named); 2 usage error (DIR is not a folder or holds nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import text_format

from beam_agents.errors import BeamAgentsError, ExecutionStoreError
from beam_agents.ops.preflight import (
    DEFAULT_MAX_BYTES,
    BlobReport,
    Outcome,
    dry_run,
    printable,
    read_input,
    report,
)
from beam_agents.wire.decoding import MESSAGE_TYPES, decode, describe, unknown_fields

__all__ = ["EXIT_OK", "EXIT_REJECTED", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
#: `backtest`: no key diverged, but some histories could not be backtested.
EXIT_UNREPRODUCIBLE = 3


def _verdict_line(blob: BlobReport) -> str:
    where = f"{blob.where}: " if blob.where else ""
    return f"{where}{blob.type_name} state_schema_version {blob.found_version}: {blob.detail}"


def _inspect(args: argparse.Namespace) -> int:
    try:
        data = read_input(args.file, max_bytes=args.max_bytes)
        decoded = decode(data, args.type)
    except BeamAgentsError as e:
        print(f"beam-agents inspect: {printable(args.file)}: {_reason(e)}", file=sys.stderr)
        return EXIT_REJECTED
    message = decoded.message
    how = "guessed" if decoded.guessed else "given"
    print(f"# {message.DESCRIPTOR.full_name} ({how}), {len(data)} bytes")
    unknown = unknown_fields(message)
    if unknown:
        print(f"# {len(unknown)} unknown field(s), kept as they are (from a newer schema?):")
        for field in unknown:
            print(f"#   {describe(field)}")
    verdicts = report(message)
    for blob in verdicts:
        print(f"# {_verdict_line(blob)}")
    sys.stdout.write(text_format.MessageToString(message))
    if len(verdicts) == 1 and verdicts[0].outcome is Outcome.MIGRATES:
        print(f"# after migrate_to_current:\n{text_format.MessageToString(verdicts[0].migrated)}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    # Deferred: the demo imports Beam pipelines, which inspect and dry-run do not need.
    from beam_agents.ops.demo import main as demo_main

    return demo_main(args.pipeline_args)


def _console(args: argparse.Namespace) -> int:
    # Deferred: the console needs the beam-agents[console] extra, which nothing else needs.
    from beam_agents.ops.console.service import main as console_main

    return console_main(args.pipeline_args)


def _effector_service(args: argparse.Namespace) -> int:
    # Deferred: the service needs the beam-agents[kafka] extra, which nothing else needs.
    import signal
    import threading

    from beam_agents.bus import EffectorService, Topics
    from beam_agents.intents.effector import Effector, VerifyMode
    from beam_agents.ops.loading import load_object

    try:
        mode = VerifyMode[args.mode.upper()]
        tools = load_object(args.tools)
        if not isinstance(tools, dict):
            raise ValueError(f"{args.tools} is not a dict of tool name to callable")
        if args.keyring is None and mode is not VerifyMode.OFF:
            raise ValueError(f"--mode {args.mode} verifies signatures: name a --keyring")
        topics = Topics(args.topic_prefix)
        effector = Effector(
            tools,
            mode=mode,
            store=args.store,
            keyring=_keyring(args.keyring),
            result_keyring=_keyring(args.result_keyring),
            approval_keyring=_keyring(args.approval_keyring),
            **({} if args.lease_ms is None else {"lease_ms": args.lease_ms}),
            inquiry_keyring=_keyring(args.inquiry_keyring),
        )
    except ExecutionStoreError as e:  # it names the store's path
        print(f"beam-agents effector-service: {e}", file=sys.stderr)
        return EXIT_REJECTED
    except (KeyError, ValueError, BeamAgentsError) as e:
        print(f"beam-agents effector-service: {e}", file=sys.stderr)
        return EXIT_USAGE
    service = EffectorService(
        effector,
        bootstrap_servers=args.bootstrap_servers,
        topics=topics,
        group_id=args.group_id,
        instance_id=args.instance_id,
        session_timeout_ms=args.session_timeout_ms,
    )
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    print(
        f"beam-agents effector-service: serving {topics.intents} as {effector.instance_id}",
        file=sys.stderr,
        flush=True,
    )
    try:
        service.run(stop)
    except Exception as e:
        # The intent being served stays uncommitted: a restarted service gets it again, and
        # the store answers it without running its tool twice.
        print(f"beam-agents effector-service: stopped: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_REJECTED
    return EXIT_OK


def _new(args: argparse.Namespace) -> int:
    from beam_agents.ops.scaffold import new_project

    try:
        folder = new_project(args.name, args.dir)
    except (ValueError, OSError) as e:
        print(f"beam-agents new: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {folder}: its agent, its test and a launcher. Next:")
    print(f"  cd {folder} && python -m pytest")
    return EXIT_OK


def _keyring(spec: str | None):
    """The Keyring the loader named MODULE:NAME returns, or None. Raises ValueError when the
    name is no loader, BeamAgentsError (KeyringError) when the loader refuses."""
    from beam_agents.ops.loading import load_object

    if spec is None:
        return None
    loader = load_object(spec)
    if not callable(loader):
        raise ValueError(f"{spec} is not a function returning a Keyring")
    return loader()


def _export_traces(args: argparse.Namespace) -> int:
    # Deferred: OpenTelemetry is an optional extra that the other commands do not need.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from beam_agents.integrations.telemetry import export_file

    exporter = OTLPSpanExporter(endpoint=args.endpoint, timeout=30)
    try:
        count = export_file(args.file, exporter)
    except ValueError as e:
        print(
            f"beam-agents export-traces: {printable(args.file)}: not a trace file: {e}",
            file=sys.stderr,
        )
        return EXIT_REJECTED
    except OSError as e:
        print(f"beam-agents export-traces: {printable(args.file)}: {e}", file=sys.stderr)
        return EXIT_REJECTED
    finally:
        exporter.shutdown()
    print(f"exported {count} spans to {args.endpoint}")
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    # Deferred: the replay runs a Beam pipeline, which the other commands do not need.
    from beam_agents._protos import ToolIntent, TraceEvent
    from beam_agents.ops.replay import check_inputs, load_agent, read_messages, replay

    try:
        agent = load_agent(args.agent)
        snapshot = decode(read_input(args.snapshot), "StateSnapshot").message
        envelope = decode(read_input(args.envelope), "AgentEnvelope").message
        check_inputs(snapshot, envelope)
        recorded = {
            name: None if path is None else read_messages(read_input(path), message_type)
            for name, path, message_type in (
                ("recorded_intents", args.recorded_intents, ToolIntent),
                ("recorded_traces", args.recorded_traces, TraceEvent),
            )
        }
    except (ValueError, BeamAgentsError) as e:
        print(f"beam-agents replay: {e}", file=sys.stderr)
        return EXIT_USAGE
    result = replay(snapshot, envelope, agent, **recorded)
    print(result.report)
    return result.verdict


def _backtest(args: argparse.Namespace) -> int:
    # Deferred: the backtest runs a Beam pipeline, which the other commands do not need.
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_agents.ops.backtest import (
        BacktestOptions,
        backtest_html,
        backtest_markdown,
        backtest_summary,
        run_backtest,
    )
    from beam_agents.ops.loading import load_object
    from beam_agents.ops.replay import load_agent
    from beam_agents.runtime.budget import Price
    from beam_agents.runtime.config import RuntimeConfig
    from beam_agents.wire.fields import join_delimited, split_delimited

    try:
        agent = load_agent(args.agent)
        records = list(split_delimited(read_input(args.records)))
        config = RuntimeConfig() if args.config is None else load_object(args.config)
        if not isinstance(config, RuntimeConfig):
            raise ValueError(
                f"--config {args.config} is a {type(config).__name__}, not a RuntimeConfig"
            )
        client = None if args.continue_with is None else load_object(args.continue_with)
        complete = getattr(client, "complete", None)
        if client is not None and (isinstance(client, type) or not callable(complete)):
            raise ValueError(
                f"--continue-with {args.continue_with} is not a model client (an object with "
                "complete(request)), but a " + type(client).__name__
            )
        if args.max_tokens and client is None:
            raise ValueError("--max-tokens needs --continue-with: the model that spends them")
        price = None if args.price_per_million is None else Price(*args.price_per_million)
        if price is not None and min(args.price_per_million) < 0:
            raise ValueError(f"--price-per-million {args.price_per_million} is below 0")
        for flag, path in (("--report", args.report), ("--html", args.html)):
            # Checked before the pipeline runs, not after, when its work would be lost.
            if path and not Path(path).resolve().parent.is_dir():
                raise ValueError(f"{flag} {path}: its folder does not exist")
        options = BacktestOptions(
            stop_at_divergence=client is None,
            continue_with=client,
            max_tokens=args.max_tokens,
            config=config,
        )
    except (ValueError, BeamAgentsError) as e:
        print(f"beam-agents backtest: {e}", file=sys.stderr)
        return EXIT_USAGE
    pipeline_options = PipelineOptions(args.pipeline_args) if args.pipeline_args else None
    reports, letters = run_backtest(records, agent, options, pipeline_options=pipeline_options)
    summary = backtest_summary(reports, letters, price=price)
    sys.stdout.write(backtest_markdown(summary, max_keys=args.max_keys))
    if args.report:
        Path(args.report).write_bytes(join_delimited(reports))
    if args.html:
        Path(args.html).write_text(backtest_html(summary, max_keys=args.max_keys))
    if summary.diverged:
        return EXIT_REJECTED
    return EXIT_UNREPRODUCIBLE if letters else EXIT_OK


def _update_check(args: argparse.Namespace) -> int:
    # Deferred: reading graphs imports Beam's runner API, which the other commands do not need.
    from google.protobuf.message import DecodeError

    from beam_agents.ops.state_manifest import MANIFEST
    from beam_agents.ops.update_check import (
        against_manifest,
        describe_graph,
        differences,
        read_graph,
    )

    if args.manifest == (args.new is not None):
        print(
            "beam-agents update-check: give two graphs (OLD NEW), or one with --manifest",
            file=sys.stderr,
        )
        return EXIT_USAGE
    graphs = []
    for path in (args.old, args.new) if args.new is not None else (args.old,):
        try:
            graphs.append(describe_graph(read_graph(read_input(path))))
        except (BeamAgentsError, DecodeError) as e:
            print(
                f"beam-agents update-check: {printable(path)}: not a pipeline graph: "
                f"{_reason(e) if isinstance(e, BeamAgentsError) else e}",
                file=sys.stderr,
            )
            return EXIT_USAGE
    if args.manifest:
        manifest = json.loads(MANIFEST.read_text())
        cut = against_manifest(graphs[0], manifest)
        if cut is None:
            print(
                f"beam-agents update-check: {printable(args.old)} applies none of the "
                f"manifest's composites ({', '.join(manifest['transform_names'])})",
                file=sys.stderr,
            )
            return EXIT_USAGE
        graphs = list(cut)
    found = differences(*graphs)
    for difference in found:
        print(difference)
    print(
        "compatible: --update keeps every step and its state"
        if not found
        else f"NOT compatible: {len(found)} difference(s)"
    )
    return EXIT_REJECTED if found else EXIT_OK


def _reason(error: BeamAgentsError) -> str:
    return getattr(error, "reason", None) or str(error)


def _dry_run(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if not directory.is_dir():
        print(f"beam-agents dry-run: {printable(directory)} is not a folder", file=sys.stderr)
        return EXIT_USAGE
    files = dry_run(directory, max_bytes=args.max_bytes)
    if not files:
        print(f"beam-agents dry-run: {printable(directory)} holds no files", file=sys.stderr)
        return EXIT_USAGE
    for file in files:
        name = file.name
        if file.error:
            print(f"{name}: REJECTED: {file.error}")
            continue
        snapshot = file.snapshot
        print(
            f"{name}: {'ready' if file.ready else 'NOT READY'}: entity_key "
            f"{snapshot.entity_key!r}, seq {snapshot.seq}"
        )
        for blob in file.blobs:
            mark = "ok  " if blob.outcome.readable else "FAIL"
            print(f"  {mark} {_verdict_line(blob)}")
    blobs = [b for f in files for b in f.blobs]
    counts = {o: sum(b.outcome is o for b in blobs) for o in Outcome}
    undecodable = sum(f.error is not None for f in files)
    ready = sum(f.ready for f in files)
    print(
        f"summary: {len(files)} files, {ready} ready, {len(files) - ready} not; "
        f"{len(blobs)} blobs: {counts[Outcome.CURRENT]} current, {counts[Outcome.MIGRATES]} "
        f"migrate, {counts[Outcome.FROM_THE_FUTURE]} from the future, "
        f"{counts[Outcome.MISSING_STEP]} missing a step, {counts[Outcome.STEP_FAILED]} with a "
        f"failing step; {undecodable} files undecodable"
    )
    return EXIT_OK if ready == len(files) else EXIT_REJECTED


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beam-agents",
        description="The beam_agents command: start a project (new), run the demo, inspect and "
        "check keyed state before an update, and serve the effector and the approvals console.",
        epilog="Exit codes: 0 success, 1 input rejected or not ready, 2 usage error. "
        "`beam-agents COMMAND --help` describes each command.",
    )
    parser.add_argument("--version", action="version", version=f"beam-agents {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run the support-triage agent end to end on local Beam pipelines",
        add_help=False,
    )
    # Its options, Beam pipeline options among them, are whatever else follows `demo`
    # (beam_agents.ops.demo.command.main parses them, and answers --help).
    demo.set_defaults(run=_demo, takes_pipeline_options=True)
    new = commands.add_parser(
        "new",
        help="write a small project to start an agent from (its agent, test and launcher)",
        description="Writes NAME/: NAME's agent module (a model call, a tool call, an "
        "approval, memory across events), its test on the DirectRunner with a scripted model "
        "(`python -m pytest` in NAME/ passes as written) and launch.py, the same agent as a "
        "streaming job on Flink (Kafka) or Dataflow (Pub/Sub). Exit codes: 0 written; 2 the "
        "name is no project name or the folder exists (nothing is overwritten).",
    )
    new.add_argument("name", help="the project's name (letters, digits, '_' and '-')")
    new.add_argument("--dir", default=".", help="where to write it (default: here)")
    new.set_defaults(run=_new)
    inspect = commands.add_parser(
        "inspect", help="decode one serialized beam_agents message and print it as text"
    )
    inspect.add_argument("file", help="a file holding one serialized message")
    inspect.add_argument(
        "--type",
        choices=sorted(MESSAGE_TYPES),
        help="the message type; guessed from the bytes when omitted",
    )
    _max_bytes_option(inspect)
    inspect.set_defaults(run=_inspect)
    check = commands.add_parser(
        "dry-run", help="check that this binary reads every exported StateSnapshot under DIR"
    )
    check.add_argument("dir", help="a folder of exported StateSnapshot files, one per file")
    _max_bytes_option(check)
    check.set_defaults(run=_dry_run)
    export = commands.add_parser(
        "export-traces", help="send a file of TraceEvents to an OTLP/HTTP endpoint as spans"
    )
    export.add_argument(
        "file", help="a file beam_agents.integrations.telemetry.write_trace_file wrote"
    )
    export.add_argument(
        "--endpoint",
        default="http://localhost:4318/v1/traces",
        help="the OTLP/HTTP traces endpoint (default: a local collector)",
    )
    export.set_defaults(run=_export_traces)
    again = commands.add_parser(
        "replay", help="re-run one activation offline and compare it with what was recorded"
    )
    again.add_argument("snapshot", help="the key's StateSnapshot, exported before it")
    again.add_argument("envelope", help="the AgentEnvelope that started or resumed it")
    again.add_argument("--agent", required=True, help="the agent, as MODULE:NAME")
    again.add_argument("--recorded-intents", help="the ToolIntents it emitted (length-delimited)")
    again.add_argument("--recorded-traces", help="the TraceEvents it emitted (length-delimited)")
    again.set_defaults(run=_replay)
    backtest = commands.add_parser(
        "backtest", help="run a changed agent over a recorded history; report what it changes"
    )
    backtest.add_argument("records", help="the ActivationRecords (length-delimited)")
    backtest.add_argument("--agent", required=True, help="the candidate agent, as MODULE:NAME")
    backtest.add_argument("--report", help="write each key's BacktestKeyReport here")
    backtest.add_argument("--html", help="write the report as an HTML page with its charts here")
    backtest.add_argument(
        "--max-keys", type=int, default=20, help="diverged keys listed in the table (20)"
    )
    backtest.add_argument(
        "--config",
        help="the live job's RuntimeConfig, as MODULE:NAME (budgets, TTLs, limits; default: "
        "RuntimeConfig())",
    )
    backtest.add_argument(
        "--continue-with",
        help="a model client, as MODULE:NAME, answering what the recording lacks",
    )
    backtest.add_argument(
        "--max-tokens", type=int, default=0, help="tokens --continue-with may spend per key"
    )
    backtest.add_argument(
        "--price-per-million",
        type=int,
        nargs=2,
        metavar=("IN", "OUT"),
        help="the price of a million input and output tokens, in micros, for the cost rows",
    )
    backtest.set_defaults(run=_backtest, takes_pipeline_options=True)
    update = commands.add_parser(
        "update-check", help="would Dataflow --update take NEW over a job running OLD?"
    )
    update.add_argument("old", help="the running build's pipeline graph (update_check.write_graph)")
    update.add_argument("new", nargs="?", help="the new build's pipeline graph")
    update.add_argument(
        "--manifest",
        action="store_true",
        help="compare the one graph given with the committed state manifest",
    )
    update.set_defaults(run=_update_check)
    service = commands.add_parser(
        "effector-service", help="execute a Kafka agent loop's intents, each at most once"
    )
    service.add_argument("--bootstrap-servers", required=True, help="the Kafka brokers")
    service.add_argument("--topic-prefix", required=True, help="the loop's topic prefix")
    service.add_argument("--store", required=True, help="the SQLite file of execution records")
    service.add_argument("--tools", required=True, help="a dict of tools, as MODULE:NAME")
    service.add_argument("--keyring", help="a function returning the Keyring, as MODULE:NAME")
    service.add_argument(
        "--result-keyring",
        help="a function returning the Keyring whose active key signs results, as MODULE:NAME",
    )
    service.add_argument(
        "--mode",
        choices=["off", "permissive", "require"],
        default="require",
        help="signature verification (default require)",
    )
    service.add_argument(
        "--approval-keyring",
        help="a function returning the Keyring that verifies answers to inquiries, MODULE:NAME",
    )
    service.add_argument(
        "--inquiry-keyring",
        help="a function returning the Keyring whose active key signs inquiries about lost "
        "calls (default: the result keyring), for the console to verify, MODULE:NAME",
    )
    service.add_argument(
        "--group-id", default="beam-agents-effector", help="the Kafka consumer group"
    )
    service.add_argument(
        "--instance-id", help="a static group member id, the same across restarts of one service"
    )
    service.add_argument(
        "--session-timeout-ms",
        type=int,
        default=10_000,
        help="how long the group waits for a member that stopped heartbeating",
    )
    service.add_argument(
        "--lease-ms",
        type=int,
        help="how long a claim on a call stays this service's unless renewed (default 30000)",
    )
    service.set_defaults(run=_effector_service)
    console = commands.add_parser(
        "console", help="serve the approvals inbox and agent viewer of a Kafka loop", add_help=False
    )
    # Its own options and commands (beam_agents.ops.console.service.main, which answers
    # --help) are whatever follows `console`.
    console.set_defaults(run=_console, takes_pipeline_options=True)
    return parser


def _max_bytes_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--max-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help=f"refuse input files larger than N bytes (default {DEFAULT_MAX_BYTES})",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("beam-agents")
    except PackageNotFoundError:  # a source tree that was never installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "takes_pipeline_options", False):
        args.pipeline_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
