"""A scripted round does not invent time: nothing runs after its clock (no deadline fires, no
model is called, no tool intent is emitted), and each key's state at the clock is carried to
the next round, which takes up the conversation where it stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import LlmResponse, RunAgent
from beam_agents.testing.probe import DAY, KEY, PROBE_CONFIG, T0, Probe, command, result


class _CountingModel:
    """A model that writes a line per call to a file: DoFns run on copies, so only a file
    tells the test how many calls were made."""

    def __init__(self, path: Path) -> None:
        self._path = str(path)

    def complete(self, request):
        with open(self._path, "a") as calls:
            calls.write(request.messages[-1]["content"] + "\n")
        return LlmResponse("answered", request.model)


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_round_ends_at_its_clock_and_carries_the_keys_state_to_the_next(tmp_path):
    calls = tmp_path / "calls"

    def agent():
        return RunAgent(Probe(), llm_client=_CountingModel(calls), config=PROBE_CONFIG)

    waiting = command(
        T0, calls=["a.tool"], llm="first", llm_on_resume="again", deadline_ms=T0 + DAY
    )
    first = run_round(agent(), [waiting, Advance(T0 + 10)], tmp_path)
    # The deadline is a day after the round's clock: it must not fire, so the agent is not
    # resumed with EXPIRED and the model is not called again (it was, at the end of input).
    assert _calls(calls) == ["first"]
    assert first.values("completions") == [] and first.values("errors") == []
    assert len(first.values("intents")) == 1 and first.values("snapshots") == []
    (intent,) = first.values("intents")
    carried = first.carried[KEY]
    assert list(carried.continuation.pending_intent_ids) == [intent.intent_id]
    # The next round restores the key and its answer resumes it, at a time it reached.
    second = run_round(
        agent(), [carried, Advance(T0 + 10), result(T0 + 20, intent.intent_id)], tmp_path
    )
    assert _calls(calls) == ["first", "again"]
    assert [json.loads(c) for c in second.values("completions")] == [
        [["a.tool", "OK"], ["escalations", 0]]
    ]
    assert second.values("errors") == []
    assert not second.carried[KEY].HasField("continuation")


def test_the_environments_prism_runner_uses_the_engines_build_or_says_how_to_get_it(
    tmp_path, monkeypatch
):
    """$BEAM_AGENTS_PIPELINE_OPTIONS=--runner=PrismRunner never lets Beam download Prism."""
    from apache_beam.options.pipeline_options import PrismRunnerOptions

    from beam_agents.errors import PrismNotFoundError
    from beam_agents.ops import prism
    from beam_agents.ops.rounds import OPTIONS_ENV, env_options

    monkeypatch.setattr(prism, "ENGINES", tmp_path)
    monkeypatch.setenv(OPTIONS_ENV, "--runner=PrismRunner")
    with pytest.raises(PrismNotFoundError, match=r"bash tools/engines\.sh prism"):
        env_options()
    built = tmp_path / f"prism-{prism.beam_version()}" / "prism"
    built.parent.mkdir()
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert env_options().view_as(PrismRunnerOptions).prism_location == str(built)
