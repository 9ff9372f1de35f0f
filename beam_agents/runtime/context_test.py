"""The agent contract's process-wide parts (context): calls to one model are capped per worker."""

from __future__ import annotations


def test_calls_to_one_model_are_capped_per_worker():
    import threading
    import time

    from beam_agents.runtime.context import model_slot

    running, peak, lock = [0], [0], threading.Lock()

    def call():
        with model_slot("capped-model", 2):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 2


def _tool_answer(**result):
    from beam_agents._protos import ToolIntent, ToolResult
    from beam_agents.runtime.context import Answer

    return Answer(ToolIntent(intent_id="i-1", kind=ToolIntent.TOOL), result=ToolResult(**result))


def test_an_answer_says_when_a_call_took_effect_with_its_payload_unknown():
    from beam_agents._protos import ToolResult

    ok = ToolResult.OK
    settled = _tool_answer(
        status=ok, error_message="the tool took effect, as ops confirmed; its result is unknown"
    )
    # What an effector before this rule recorded for a person's confirmation, sent again
    # from its store: a confirmation in place of the tool's payload.
    legacy = _tool_answer(status=ok, payload=b'{"confirmed_by":"ops","took_effect":true}')
    for answer in (settled, legacy):
        assert answer.ok and answer.payload_unknown and answer.payload == b""
    paid = _tool_answer(status=ok, payload=b'{"receipt":"r-1"}')
    empty = _tool_answer(status=ok)  # a tool that answered nothing answered that
    failed = _tool_answer(status=ToolResult.ERROR, error_message="not done: ...")
    assert not any(a.payload_unknown for a in (paid, empty, failed))
    assert paid.payload == b'{"receipt":"r-1"}'
