"""Backtest a candidate agent over a recorded history as a batch job: Dataflow in production,
the DirectRunner, Prism or Flink here, from the same code and options.

The history is files of length-delimited ActivationRecords (RunAgent's RECORDS output, as
`beam_agents.join_delimited` writes them), named by a file pattern Beam's file systems read
(local, gs://). The candidate is MODULE:NAME, as `beam-agents backtest` names it. Out, under
--output PREFIX: PREFIX-reports (text files of BacktestKeyReports, one serialized report per
line as hex, one line per key), PREFIX-errors (the same of the dead letters of histories that
could not be run),
PREFIX-summary.md and PREFIX-summary.html (the run's counts, tool changes and tokens as
tables, and as a page with its charts). Nothing reaches a tool: the graph has no effector.

On Dataflow, ship beam_agents' wheel and the wheel of the project that holds the candidate, in
that order (the workers install them in the order given):

    pip wheel --no-deps -w dist .          # in the beam_agents checkout, and in your project
    python examples/backtest_launch.py \\
        --runner=DataflowRunner --project=PROJECT --region=REGION \\
        --temp_location=gs://BUCKET/tmp --job_name=backtest-refunds-v2 \\
        --extra_package=dist/beam_agents-0.1.0-py3-none-any.whl \\
        --extra_package=dist/my_agents-0.1.0-py3-none-any.whl \\
        --records='gs://BUCKET/records/*.binpb' --agent=my_agents:refunds_v2 \\
        --output=gs://BUCKET/backtests/refunds-v2

The summary gathers every key's report on one worker (it lists the diverged keys); a history
of millions of keys wants the reports alone (--no_summary).
"""

from __future__ import annotations

import sys

# isort: off
# beam_agents first: importing it drops the one warning Beam logs on import (apitools).
import beam_agents  # noqa: F401

# isort: on
import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.errors import PrismNotFoundError
from beam_agents.ops.backtest import (
    REPORTS,
    Backtest,
    backtest_html,
    backtest_markdown,
    backtest_summary,
)
from beam_agents.ops.prism import with_local_prism
from beam_agents.ops.replay import load_agent
from beam_agents.runtime import ERRORS
from beam_agents.wire.beam_support import HexLinesCoder
from beam_agents.wire.fields import split_delimited


class BacktestLaunchOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument("--records", help="file pattern of length-delimited records")
        parser.add_argument("--agent", help="the candidate agent, as MODULE:NAME")
        parser.add_argument("--output", help="prefix of the output files")
        parser.add_argument(
            "--no_summary", action="store_true", help="write the reports only, no summary"
        )


def _serialized(kv) -> bytes:
    _, message = kv
    return message.SerializeToString(deterministic=True)


def build(pipeline: beam.Pipeline, options: PipelineOptions) -> None:
    """Applies the job to `pipeline`: the same graph on every runner."""
    launch = options.view_as(BacktestLaunchOptions)
    records = (
        pipeline
        | "Match" >> fileio.MatchFiles(launch.records)
        | "Open" >> fileio.ReadMatches()
        # A file a writer left cut mid-record: its tail goes on, to be an undecodable record.
        | "Split" >> beam.FlatMap(lambda file: split_delimited(file.read(), strict=False))
    )
    outputs = records | "Backtest" >> Backtest(load_agent(launch.agent))
    for tag in (REPORTS, ERRORS):
        _ = (
            outputs[tag]
            | f"Serialize{tag}" >> beam.Map(_serialized).with_output_types(bytes)
            | f"Write{tag}" >> beam.io.WriteToText(f"{launch.output}-{tag}", coder=HexLinesCoder())
        )
    if launch.no_summary:
        return
    reports = outputs[REPORTS] | "Reports" >> beam.Values() | beam.combiners.ToList()
    letters = outputs[ERRORS] | "Letters" >> beam.Values() | "AllLetters" >> beam.combiners.ToList()
    summary = reports | "Summary" >> beam.Map(
        backtest_summary, dead_letters=beam.pvalue.AsSingleton(letters)
    )
    for name, render in (("md", backtest_markdown), ("html", backtest_html)):
        _ = (
            summary
            | f"Render{name}" >> beam.Map(render)
            | f"Write{name}"
            >> beam.io.WriteToText(
                f"{launch.output}-summary.{name}",
                shard_name_template="",
                append_trailing_newlines=False,
            )
        )


def main(argv: list[str] | None = None) -> int:
    try:
        # --runner=PrismRunner without --prism_location: the Prism tools/engines.sh built.
        options = with_local_prism(PipelineOptions(argv if argv is not None else sys.argv[1:]))
    except PrismNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    launch = options.view_as(BacktestLaunchOptions)
    if not (launch.records and launch.agent and launch.output):
        print("give --records PATTERN, --agent MODULE:NAME and --output PREFIX", file=sys.stderr)
        return 2
    try:
        load_agent(launch.agent)
    except ValueError as e:
        print(f"--agent: {e}", file=sys.stderr)
        return 2
    with beam.Pipeline(options=options) as pipeline:
        build(pipeline, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
