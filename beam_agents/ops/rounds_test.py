"""A scripted round does not invent time: nothing runs after its clock (no deadline fires, no
model is called, no tool intent is emitted), and each key's state at the clock is carried to
the next round, which takes up the conversation where it stopped."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beam_agents._protos import AgentEnvelope
from beam_agents.ops.rounds import Advance, _batches, run_round
from beam_agents.runtime import LlmResponse, RunAgent, agent
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


@agent(name="rounds_test.order/v1")
def _remember_order(ctx, event: bytes) -> bytes:
    seen = ctx.memory.get("seen", b"") + event + b";"
    ctx.memory.put("seen", seen)
    return seen


def test_many_keys_inputs_interleaved_in_one_round_reach_each_key_in_the_scripts_order(
    tmp_path,
):
    # Runs of inputs for distinct keys go to the runner as one bundle; a key's second input
    # must still come after its first, on whichever runner the suite runs.
    rng = random.Random(7)
    script = [(b"k%d" % key, n) for key in range(30) for n in range(3)]
    rng.shuffle(script)
    firsts = {}
    ordered = []
    for key, _ in script:  # each key's events numbered in the order the script sends them
        firsts[key] = firsts.get(key, -1) + 1
        ordered.append((key, firsts[key]))
    inputs = [
        AgentEnvelope(entity_key=key, event_time_ms=T0 + i, external_event=b"%d" % n)
        for i, (key, n) in enumerate(ordered)
    ]
    outputs = run_round(RunAgent(_remember_order), inputs, tmp_path)
    last = {}
    for _, key, completion in outputs.completions:
        last[key] = completion
    assert last == {b"k%d" % key: b"0;1;2;" for key in range(30)}
    assert outputs.values("errors") == []


_inputs = st.lists(
    st.one_of(
        st.builds(Advance, st.integers(0, 5)),
        st.builds(AgentEnvelope, entity_key=st.sampled_from([b"", b"a", b"b", b"c"])),
    ),
    max_size=30,
)


@given(_inputs)
def test_a_scripts_events_keep_its_order_and_never_hold_one_key_twice(items):
    batches = _batches(items)
    flat = [x for b in batches for x in ([b] if isinstance(b, Advance) else b)]
    assert flat == items
    for batch in batches:
        if not isinstance(batch, Advance):
            keys = [item.entity_key for item in batch]
            assert batch and len(set(keys)) == len(keys)
    # Only a repeated key or an Advance starts a new event: runs stay as long as they can.
    for before, after in itertools.pairwise(batches):
        if not isinstance(before, Advance) and not isinstance(after, Advance):
            assert after[0].entity_key in {item.entity_key for item in before}


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
