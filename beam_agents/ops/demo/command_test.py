"""`beam-agents demo`'s command line: Beam pipeline options pass on to the demo (and no other
command takes them), and the Kafka demo's and the console's options are refused without what
they need."""

from __future__ import annotations

import pytest

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
