"""`beam-agents demo`'s command line: Beam pipeline options pass on to the demo (and no other
command takes them), and the Kafka demo's and the console's options are refused without what
they need."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions, PrismRunnerOptions

from beam_agents.ops.cli import main


def test_the_demo_passes_pipeline_options_on_and_other_commands_refuse_them(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["inspect", "f", "--runner=DirectRunner"])
    assert raised.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    assert main(["demo", "--runner=NoSuchRunner"]) == 2  # Beam refuses the runner
    assert "NoSuchRunner" in capsys.readouterr().err


def test_the_kafka_demo_needs_its_broker_and_expansion_service(capsys):
    assert main(["demo", "--bus=kafka"]) == 2
    assert "--kafka_bootstrap and --expansion_service" in capsys.readouterr().err


def test_the_console_is_for_the_kafka_demo(capsys):
    assert main(["demo", "--console"]) == 2
    assert "--console needs --bus kafka" in capsys.readouterr().err


def test_demo_help_lists_every_option_it_takes_and_its_prerequisites(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["demo", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--bus",
        "--kafka_bootstrap",
        "--expansion_service",
        "--console",
        "--console_port",
        "--flink_rest",
        "--runner",
        "--prism_location",
        "--help-beam-options",
    ):
        assert option in out, option
    assert "Go" in out and "tools/engines.sh prism" in out


def test_demo_help_beam_options_lists_every_beam_pipeline_option(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["demo", "--help-beam-options"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert "--flink_master" in out and "--direct_num_workers" in out and "--project" in out


def test_an_unknown_demo_option_is_a_usage_error_not_a_run(capsys):
    for unknown in (["--no_such_option"], ["--runner=DirectRunner", "--bsu=kafka"], ["extra"]):
        with pytest.raises(SystemExit) as raised:
            main(["demo", *unknown])
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert f"unrecognized arguments: {unknown[-1]}" in err


def test_prism_without_its_location_uses_the_engines_build_or_says_how_to_get_it(
    tmp_path, monkeypatch, capsys
):
    from beam_agents.ops import prism

    monkeypatch.setattr(prism, "ENGINES", tmp_path)
    assert main(["demo", "--runner=PrismRunner"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "bash tools/engines.sh prism" in err and "--prism_location" in err
    built = tmp_path / f"prism-{prism.beam_version()}" / "prism"
    built.parent.mkdir()
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    # Every spelling of the runner Beam takes for Prism, not only "PrismRunner".
    for runner in (
        "PrismRunner",
        "Prism",
        "prismrunner",
        "apache_beam.runners.portability.prism_runner.PrismRunner",
    ):
        options = prism.with_local_prism(PipelineOptions([f"--runner={runner}"]))
        assert options.view_as(PrismRunnerOptions).prism_location == str(built), runner
    direct = prism.with_local_prism(PipelineOptions(["--runner=DirectRunner"]))
    assert direct.view_as(PrismRunnerOptions).prism_location is None
    elsewhere = tmp_path / "elsewhere-prism"
    elsewhere.write_text("#!/bin/sh\n")
    given = prism.with_local_prism(
        PipelineOptions(["--runner=PrismRunner", f"--prism_location={elsewhere}"])
    )
    assert given.view_as(PrismRunnerOptions).prism_location == str(elsewhere)


def test_an_unknown_option_is_a_usage_error_without_beams_discarding_warning():
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "beam_agents.ops.cli", "demo", "--no_such_option"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "Discarding" not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1].endswith("unrecognized arguments: --no_such_option")


def test_a_prism_location_that_is_no_file_is_one_line_before_anything_runs(tmp_path, capsys):
    missing = tmp_path / "no" / "prism"
    assert main(["demo", "--runner=PrismRunner", f"--prism_location={missing}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert str(missing) in err and "bash tools/engines.sh prism" in err
