"""Launch the support-triage agent as a streaming job: Dataflow in production, the DirectRunner
here, from the same code and the same options object.

Inputs and outputs are Pub/Sub topics of serialized protobuf messages (AgentEnvelopes in;
ToolIntents to the effector, completions, dead letters as AgentEnvelopes, traces, snapshots
out), or, for a local run, a file of length-delimited AgentEnvelopes in and one file per
output in --output_dir. The intents topic is the effector's input; its results topic feeds
back into --input_subscription, which is how the loop closes in production.

Launch on Dataflow, shipping this project's wheel to the workers:

    pip wheel --no-deps -w dist .          # or: bazel build //:wheel
    python examples/dataflow_launch.py \\
        --runner=DataflowRunner --project=PROJECT --region=REGION --streaming \\
        --temp_location=gs://BUCKET/tmp --job_name=support-triage \\
        --extra_package=dist/beam_agents-0.1.0-py3-none-any.whl \\
        --input_subscription=projects/PROJECT/subscriptions/agent-envelopes \\
        --intents_topic=projects/PROJECT/topics/tool-intents \\
        --completions_topic=projects/PROJECT/topics/completions \\
        --errors_topic=projects/PROJECT/topics/agent-errors

Update the running job in place (keyed state kept), with a new binary:

1. Export StateSnapshots from the running job (export_request envelopes, one per key to
   check) and run the new binary's `beam-agents dry-run DIR` on them: every blob must read.
2. Write both builds' graphs (`--graph_out=FILE` with each binary, same options) and run
   `beam-agents update-check OLD NEW`: transform names, state spec ids, coders and timer
   domains are what `--update` matches on, and it names every difference.
3. Relaunch with the same --job_name and `--update` (and the same --extra_package name with
   the new wheel). Never roll back across a state schema bump: roll forward.
"""

from __future__ import annotations

import os
import sys

# isort: off
# beam_agents first: importing it drops the one warning Beam logs on import (apitools).
import beam_agents  # noqa: F401

# isort: on
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_agents.errors import PrismNotFoundError
from beam_agents.examples.support_triage import scripted_model, triage
from beam_agents.ops.prism import with_local_prism
from beam_agents.ops.update_check import write_graph
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, SNAPSHOTS, TRACES, RunAgent
from beam_agents.runtime.dead_letters import to_envelope
from beam_agents.wire.beam_support import HexLinesCoder
from beam_agents.wire.fields import split_delimited

#: Output tag -> (option naming its topic, file name for local runs).
OUTPUTS = {
    INTENTS: "intents_topic",
    COMPLETIONS: "completions_topic",
    ERRORS: "errors_topic",
    TRACES: "traces_topic",
    SNAPSHOTS: "snapshots_topic",
}


class TriageOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--input_subscription", help="Pub/Sub subscription of envelopes")
        parser.add_argument("--input_file", help="local run: length-delimited AgentEnvelopes")
        parser.add_argument("--output_dir", help="local run: one file per output")
        parser.add_argument(
            "--graph_out",
            help="write the pipeline graph here for `beam-agents update-check`; do not run",
        )
        for option in OUTPUTS.values():
            parser.add_argument(f"--{option}", help="Pub/Sub topic of serialized messages")


def _serialized(kv) -> bytes:
    _, value = kv
    if isinstance(value, bytes):
        return value
    if value.DESCRIPTOR.name == "ActivationErrorRecord":
        value = to_envelope(value)  # dead letters travel as envelopes on a topic
    return value.SerializeToString(deterministic=True)


def build(pipeline: beam.Pipeline, options: PipelineOptions) -> None:
    """Applies the job to `pipeline`: the same graph on every runner."""
    triage_options = options.view_as(TriageOptions)
    if triage_options.input_subscription:
        from apache_beam.io.gcp.pubsub import ReadFromPubSub  # needs apache-beam[gcp]

        envelopes = pipeline | "ReadEnvelopes" >> ReadFromPubSub(
            subscription=triage_options.input_subscription
        )
    else:
        with open(triage_options.input_file, "rb") as source:
            data = list(split_delimited(source.read()))
        envelopes = pipeline | "ReadEnvelopes" >> beam.Create(data, reshuffle=False)
    outputs = envelopes | "RunAgent" >> RunAgent(triage, llm_client=scripted_model())
    for tag, option in OUTPUTS.items():
        serialized = outputs[tag] | f"Serialize{tag}" >> beam.Map(_serialized).with_output_types(
            bytes
        )
        topic = getattr(triage_options, option)
        if topic:
            from apache_beam.io.gcp.pubsub import WriteToPubSub

            _ = serialized | f"Publish{tag}" >> WriteToPubSub(topic)
        elif triage_options.output_dir:
            path = os.path.join(triage_options.output_dir, tag)
            _ = serialized | f"Write{tag}" >> beam.io.WriteToText(
                path, coder=HexLinesCoder(), shard_name_template=""
            )


def main(argv: list[str] | None = None) -> int:
    try:
        # --runner=PrismRunner without --prism_location: the Prism tools/engines.sh built.
        options = with_local_prism(PipelineOptions(argv if argv is not None else sys.argv[1:]))
    except PrismNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    return run(options)


def run(options: PipelineOptions) -> int:
    """Builds the job from `options` and runs it on the runner they name."""
    triage_options = options.view_as(TriageOptions)
    if not (triage_options.input_subscription or triage_options.input_file):
        print("give --input_subscription (Pub/Sub) or --input_file (a local run)", file=sys.stderr)
        return 2
    if triage_options.input_subscription:
        options.view_as(StandardOptions).streaming = True
    if triage_options.graph_out:
        pipeline = beam.Pipeline(options=options)
        build(pipeline, options)
        write_graph(pipeline, triage_options.graph_out)
        return 0
    with beam.Pipeline(options=options) as pipeline:
        build(pipeline, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
