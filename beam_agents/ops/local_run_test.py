"""`run_locally`: an agent end to end on local pipelines, its tool calls executed by the
effector, its approval requests answered, memory carried across events."""

from __future__ import annotations

import json

import pytest

from beam_agents import ScriptedLlmClient, agent, run_locally


@agent(name="local_run_test/v1")
def _counter(ctx, event: bytes) -> bytes:
    seen = int(ctx.memory.get("seen", b"0")) + 1
    ctx.memory.put("seen", str(seen).encode())
    word = ctx.llm([{"role": "user", "content": event.decode()}], model="m").text
    looked = ctx.call_tool("dictionary.lookup", {"word": word})
    answer = ctx.request_approval(f"Define {word}?", word=word)
    return json.dumps(
        {"seen": seen, "ok": looked.ok, "definition": looked.payload.decode(), "yes": answer.ok}
    ).encode()


def _lookup(args: dict, intent) -> bytes:
    return f"a word: {args['word']}".encode()


def _upper(request) -> str:
    return request.messages[-1]["content"].upper()


def test_two_events_run_to_completion_with_tools_approvals_and_memory(tmp_path):
    asked = []

    def approver(intent):
        asked.append(json.loads(intent.args_json))
        return intent.args_json.find("PEN") >= 0

    run = run_locally(
        _counter,
        [b"pen", b"pad"],
        tools={"dictionary.lookup": _lookup},
        approver=approver,
        llm_client=ScriptedLlmClient(_upper),
        workdir=tmp_path,
    )
    assert run.dead_letters == []
    assert [json.loads(c) for c in run.completions] == [
        {"seen": 1, "ok": True, "definition": "a word: PEN", "yes": True},
        {"seen": 2, "ok": True, "definition": "a word: PAD", "yes": False},
    ]
    assert asked == [
        {"question": "Define PEN?", "word": "PEN"},
        {"question": "Define PAD?", "word": "PAD"},
    ]
    assert [i.tool_name for i in run.intents] == ["dictionary.lookup", "human.approval"] * 2
    assert all(i.signature for i in run.intents)  # signed with the run's own key
    assert run.snapshots.keys() == {b"local"}
    assert "completion: " in run.transcript() and "approval: declined" in run.transcript()


def test_without_an_approver_the_request_waits_and_a_failing_tool_is_an_answer(tmp_path):
    def broken(args, intent):
        raise RuntimeError("the dictionary is down")

    run = run_locally(
        _counter,
        [(b"k-1", b"ink")],
        tools={"dictionary.lookup": broken},
        llm_client=ScriptedLlmClient(_upper),
        workdir=tmp_path,
    )
    assert run.completions == [] and run.dead_letters == []
    (waiting,) = run.pending
    assert waiting.entity_key == b"k-1" and json.loads(waiting.args_json)["word"] == "INK"
    assert run.transcript().splitlines()[-1] == (
        f"waiting: human.approval {waiting.intent_id} of b'k-1', no approver answered it"
        " (run_locally(approver=...))"
    )
    (result,) = [s.message for s in run.conversation if s.kind == "result"]
    assert "the dictionary is down" in result.tool_result.error_message
    assert run.rounds == 2


def test_a_model_call_without_a_client_is_a_dead_letter_naming_llm_client(tmp_path):
    run = run_locally(_counter, [b"pen"], tools={"dictionary.lookup": _lookup}, workdir=tmp_path)
    (letter,) = run.dead_letters
    assert letter.reason == "llm_failed"
    assert "llm_client=" in letter.detail and "\n" not in letter.detail, letter.detail


def test_the_transcript_shows_each_model_call_and_each_completion_its_key(tmp_path):
    """What the model was asked and answered, and whether from the key's replay cache; and
    which key each completion is for."""
    run = run_locally(
        _counter,
        [(b"k-1", b"pen"), (b"k-2", b"ink")],
        tools={"dictionary.lookup": _lookup},
        approver=lambda intent: True,
        llm_client=ScriptedLlmClient(_upper),
        workdir=tmp_path,
    )
    assert sorted((c.entity_key, json.loads(c)["definition"]) for c in run.completions) == [
        (b"k-1", "a word: PEN"),
        (b"k-2", "a word: INK"),
    ]
    calls = [(s.entity_key, s.message) for s in run.conversation if s.kind == "model"]
    # Each key asks once (paid), then its reruns after each answer replay the cached answer.
    for key, word in ((b"k-1", "pen"), (b"k-2", "ink")):
        mine = [call for k, call in calls if k == key]
        assert [(c.model, c.asked, c.answered) for c in mine] == [("m", word, word.upper())] * 3
        assert [c.cached for c in mine] == [False, True, True]
    transcript = run.transcript()
    assert 'k-1  model: m asked "pen", answered "PEN"\n' in transcript
    assert 'k-1  model: m asked "pen", answered "PEN" (cached)\n' in transcript


def test_an_approver_that_answers_no_bool_is_refused_not_taken_for_a_yes(tmp_path):
    with pytest.raises(TypeError, match=r"approver answered 'no'.*True or False"):
        run_locally(
            _counter,
            [b"ink"],
            tools={"dictionary.lookup": _lookup},
            approver=lambda intent: "no",
            llm_client=ScriptedLlmClient(_upper),
            workdir=tmp_path,
        )


def test_tools_given_as_a_list_are_refused_naming_the_mapping_wanted():
    with pytest.raises(TypeError, match=r"tools maps each tool's name.*not list"):
        run_locally(_counter, [b"ink"], tools=[_lookup])
