"""Golden corpus builders for state schema version 2.

FROZEN once CURRENT_STATE_SCHEMA_VERSION moves past 2: this file and every fixture beside it
stay byte-for-byte as they are, forever (golden/v2/SHA256SUMS is checked). The next version's
corpus starts from a copy of this file in golden/v<N+1>/ with the same fixture names, and
`bazel run //tools:gen_golden` (without Bazel: python tools/gen_golden.py) writes it.

Each function builds one fixture; its docstring is the fixture's description. Additive schema
changes add fixtures to the current version's builders (never edit a frozen one), so the old
fixtures keep proving that bytes written before a field existed still decode.

Version 2 added the entry index of MemoryBlob and LlmCacheBlob (entry_stamps, key_hashes,
key_stamps). The fixtures of v1's names build their blobs by hand with no index, as the v1
fixtures migrate (the v1 -> v2 steps clear the index): a version-2 blob without an index is
valid, and its reader builds one. memory_blob_indexed and llm_cache_blob_indexed come from the
runtime's writers (Memory.to_blob, ReplayCache.to_blob), so they hold whatever index those
write: when the writers change, regenerating the corpus is all that is needed, until it is
frozen.
"""

import hashlib
import hmac

from beam_agents._protos import (
    ActivationErrorRecord,
    ActivationRecord,
    AgentEnvelope,
    BacktestKeyReport,
    Continuation,
    ExecutionRecord,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.state.memory import Memory, ReplayCache

#: The regime these builders were frozen at; versioned blobs are stamped with it.
STATE_SCHEMA_VERSION = 2

#: A published test key (never a production secret) so readers in any language can verify
#: tool_intent_signed.
GOLDEN_SIGNING_KEY_ID = "golden-2026-11"
GOLDEN_SIGNING_SECRET = b"beam_agents golden corpus test key, not a secret"

_TRACE_ID = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
_SPAN_ID = bytes.fromhex("00f067aa0ba902b7")
_PARENT_SPAN_ID = bytes.fromhex("53995c3f42cd8ad8")


def memory_blob():
    """Working memory with three entries in LRU order (least recent first)."""
    blob = MemoryBlob(state_schema_version=STATE_SCHEMA_VERSION)
    blob.entries.add(key="user:name", value=b"Ada Lovelace", last_access_ms=1_764_460_800_000)
    blob.entries.add(key="user:tier", value=b"gold", last_access_ms=1_764_460_801_000)
    blob.entries.add(key="order:last", value=b"\x00\x01\xfe\xff", last_access_ms=1_764_460_802_500)
    blob.total_value_bytes = sum(len(e.value) for e in blob.entries)
    return blob


def memory_blob_indexed():
    """Working memory as Memory.to_blob writes it over two activations, the second reading the
    first's bytes: it reads one entry (making it the most recent), deletes one and adds one, so
    entries left and right of the removed one keep their stamps (with the index the writer
    keeps)."""
    memory = Memory(now_ms=1_764_460_800_000)
    memory.put("user:name", b"Ada Lovelace")
    memory.now_ms += 1_000
    memory.put("user:tier", b"gold")
    memory.now_ms += 1_500
    memory.put("order:last", b"\x00\x01\xfe\xff")
    memory.now_ms += 500
    memory.put("order:count", b"3")
    stored = MemoryBlob.FromString(memory.to_blob().SerializeToString())
    later = Memory.from_blob(stored, now_ms=1_764_547_200_000)
    later.get("user:name")
    later.delete("user:tier")
    later.now_ms += 250
    later.put("session:lang", b"en-GB")
    return later.to_blob()


def memory_blob_unversioned():
    """A MemoryBlob with state_schema_version 0: pre-versioned bytes, read as version 1."""
    blob = MemoryBlob()
    blob.entries.add(key="legacy", value=b"kept", last_access_ms=1_700_000_000_000)
    blob.total_value_bytes = 4
    return blob


def continuation():
    """A suspended agent waiting on two intents, with an opaque adapter snapshot."""
    return Continuation(
        state_schema_version=STATE_SCHEMA_VERSION,
        seq=42,
        step_index=3,
        pending_intent_ids=[
            "0d8b7e0a-7f5c-5d3e-9a51-3c2f0b1d9e11",
            "6f1c2a9b-4e3d-5b7a-8c21-9d0e1f2a3b4c",
        ],
        adapter="langgraph",
        snapshot=b"\x89opaque adapter state\x00\xff",
        suspended_at_ms=1_764_460_800_000,
        deadline_ms=1_764_464_400_000,
    )


def continuation_escalated():
    """A suspension whose deadline has already been escalated twice."""
    blob = continuation()
    blob.escalations = 2
    blob.deadline_ms = 1_764_471_600_000
    return blob


def continuation_partly_answered():
    """A suspension on two intents, one of them answered already (the answers field)."""
    blob = continuation()
    answer = blob.answers.add(entity_key=b"customer-42", event_time_ms=1_764_460_805_000)
    answer.tool_result.CopyFrom(tool_result_ok())
    answer.tool_result.intent_id = blob.pending_intent_ids[0]
    return blob


def continuation_retrying_after_expired():
    """A suspension resumed at its deadline with the EXPIRED the runtime made for its second
    intent, failed there and on a retry since (attempted_at_ms), awaiting its next retry."""
    blob = continuation_partly_answered()
    expired = blob.answers.add(entity_key=b"customer-42", event_time_ms=blob.deadline_ms)
    expired.tool_result.intent_id = blob.pending_intent_ids[1]
    expired.tool_result.entity_key = b"customer-42"
    expired.tool_result.status = ToolResult.EXPIRED
    blob.resume_failures = 2
    blob.attempted_at_ms = blob.deadline_ms + 60_000
    blob.retry_at_ms = blob.attempted_at_ms + 120_000
    return blob


def continuation_budget_held():
    """A start held up by its key's budget (OnBudget.ASK) on a recording runtime: its event
    first in the mailbox, the raise it was granted among its answers, the model call its
    attempt paid for before asking again (held_calls)."""
    blob = continuation()
    del blob.pending_intent_ids[1:]
    blob.mailbox.add().CopyFrom(agent_envelope_external_event())
    granted = blob.answers.add(entity_key=b"customer-42", event_time_ms=1_764_460_805_000)
    granted.approval.intent_id = "9a0b1c2d-3e4f-5a6b-8c7d-0e1f2a3b4c5d"
    granted.approval.approved = True
    granted.approval.approver = "ops@example.com"
    blob.held_calls.extend(activation_record().model_calls)
    return blob


def continuation_budget_held_twice():
    """The start of continuation_budget_held asking again: the model failed a call in each of
    the two attempts its budget questions held up (held_failures, numbered by attempt, each
    with the error's text as the agent saw it), and answered one in the second (held_calls)."""
    blob = continuation_budget_held()
    blob.held_attempts = 2
    for call in blob.held_calls:
        call.held_attempt = 2
    for attempt, failure in enumerate(activation_record_model_failed().model_failures, 1):
        held = blob.held_failures.add()
        held.CopyFrom(failure)
        held.held_attempt = attempt
        held.text = f"LLM call to {failure.model!r} failed: {failure.error}"
    return blob


def llm_cache_blob():
    """A replay cache with three entries in LRU order."""
    blob = LlmCacheBlob(state_schema_version=STATE_SCHEMA_VERSION)
    for i, key in enumerate(["a", "b", "c"]):
        response = f'{{"text":"response {key}"}}'.encode()
        blob.entries.add(
            cache_key=key,
            response=response,
            response_digest=hashlib.sha256(response).digest(),
            created_at_ms=1_764_460_800_000 + i,
            last_access_ms=1_764_460_900_000 + i,
        )
    blob.total_response_bytes = sum(len(e.response) for e in blob.entries)
    return blob


def llm_cache_blob_digest_only():
    """A replay cache whose evicted entry keeps only its 32-byte digest."""
    blob = LlmCacheBlob(state_schema_version=STATE_SCHEMA_VERSION)
    blob.entries.add(
        cache_key="evicted",
        response_digest=hashlib.sha256(b"a long evicted response").digest(),
        created_at_ms=1_764_460_800_000,
        last_access_ms=1_764_460_800_000,
        digest_only=True,
    )
    kept = b'{"text":"kept"}'
    blob.entries.add(
        cache_key="kept",
        response=kept,
        response_digest=hashlib.sha256(kept).digest(),
        created_at_ms=1_764_460_800_001,
        last_access_ms=1_764_460_800_002,
    )
    blob.total_response_bytes = len(kept)
    return blob


def llm_cache_blob_indexed():
    """A replay cache as ReplayCache.to_blob writes it over two activations, the second reading
    the first's bytes: it replays one response (making it the most recent) and records a new
    one; a response over max_response_bytes is kept as its digest only (with the index the
    writer keeps)."""
    cache = ReplayCache(max_response_bytes=64, now_ms=1_764_460_800_000)
    for key in ["a", "b", "c"]:
        cache.put(key, f'{{"text":"response {key}"}}'.encode())
        cache.now_ms += 1_000
    cache.put("long", b'{"text":"' + b"x" * 80 + b'"}')
    stored = LlmCacheBlob.FromString(cache.to_blob().SerializeToString())
    later = ReplayCache.from_blob(stored, max_response_bytes=64, now_ms=1_764_460_900_000)
    later.get("b")
    later.now_ms += 1
    later.put("d", b'{"text":"response d"}')
    return later.to_blob()


def tool_intent_before_kind():
    """A tool call written before kind, trace_id and the signature fields existed."""
    return ToolIntent(
        intent_id="0d8b7e0a-7f5c-5d3e-9a51-3c2f0b1d9e11",
        entity_key=b"customer-42",
        seq=41,
        step_index=2,
        tool_name="crm.lookup",
        args_json='{"fields":["name","tier"],"id":42}',
        created_at_ms=1_764_460_800_000,
        expires_at_ms=1_764_460_860_000,
        attempt=1,
    )


def tool_intent_before_trace_id():
    """A tool call with kind but written before trace_id and the signature fields existed."""
    intent = tool_intent_before_kind()
    intent.kind = ToolIntent.TOOL
    return intent


def tool_intent_traced():
    """A tool call carrying its activation's 16-byte trace id."""
    intent = tool_intent_before_trace_id()
    intent.trace_id = _TRACE_ID
    return intent


def tool_intent_approval():
    """A human approval request: kind APPROVAL."""
    intent = tool_intent_traced()
    intent.intent_id = "6f1c2a9b-4e3d-5b7a-8c21-9d0e1f2a3b4c"
    intent.step_index = 3
    intent.tool_name = "payments.refund"
    intent.args_json = '{"amount_cents":1999,"order":"A-17"}'
    intent.kind = ToolIntent.APPROVAL
    return intent


def tool_intent_signed():
    """A traced tool call signed with HMAC-SHA256 under the published golden test key."""
    intent = tool_intent_traced()
    intent.signature_scheme = ToolIntent.HMAC_SHA256
    intent.signing_key_id = GOLDEN_SIGNING_KEY_ID
    unsigned = ToolIntent()
    unsigned.CopyFrom(intent)
    unsigned.ClearField("signature_scheme")
    unsigned.ClearField("signing_key_id")
    signing_input = unsigned.SerializeToString(deterministic=True)
    intent.signature = hmac.new(GOLDEN_SIGNING_SECRET, signing_input, hashlib.sha256).digest()
    return intent


def tool_intent_future_field():
    """A tool call from a newer writer: it carries unknown field 20 (bytes "route=eu")."""
    unknown_field_20 = b"\xa2\x01\x08route=eu"
    return ToolIntent.FromString(tool_intent_traced().SerializeToString() + unknown_field_20)


def tool_result_ok():
    """A successful tool result with a payload."""
    return ToolResult(
        intent_id="0d8b7e0a-7f5c-5d3e-9a51-3c2f0b1d9e11",
        entity_key=b"customer-42",
        seq=41,
        status=ToolResult.OK,
        payload=b'{"name":"Ada Lovelace","tier":"gold"}',
        completed_at_ms=1_764_460_801_000,
    )


def tool_result_error():
    """A failed tool call with its error message."""
    result = tool_result_ok()
    result.status = ToolResult.ERROR
    result.ClearField("payload")
    result.error_message = "crm.lookup: upstream timed out after 30s"
    return result


def tool_result_expired():
    """An intent refused because it expired before execution."""
    result = tool_result_error()
    result.status = ToolResult.EXPIRED
    result.error_message = "expired at 1764460860000"
    return result


def tool_result_rejected():
    """An intent refused because its tool is unknown."""
    result = tool_result_error()
    result.status = ToolResult.REJECTED
    result.error_message = "unknown tool crm.lookup"
    return result


def trace_event_llm_call():
    """An LLM call span with OTel GenAI attributes and W3C-width ids."""
    return TraceEvent(
        trace_id=_TRACE_ID,
        span_id=_SPAN_ID,
        parent_span_id=_PARENT_SPAN_ID,
        entity_key=b"customer-42",
        seq=41,
        step_index=1,
        event_type=TraceEvent.LLM_CALL,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "gcp.vertex_ai",
            "gen_ai.request.model": "gemini-2.5-pro",
            "gen_ai.usage.input_tokens": "1234",
            "gen_ai.usage.output_tokens": "56",
        },
        start_ms=1_764_460_800_000,
        end_ms=1_764_460_801_250,
    )


def trace_event_suspended():
    """The SUSPENDED event type (7), added without a bump."""
    event = trace_event_llm_call()
    event.event_type = TraceEvent.SUSPENDED
    event.attributes.clear()
    event.span_id = bytes.fromhex("b7ad6b7169203331")
    return event


def agent_envelope_external_event():
    """An envelope carrying opaque external-event bytes."""
    return AgentEnvelope(
        entity_key=b"customer-42",
        event_time_ms=1_764_460_800_000,
        external_event=b'{"type":"message","text":"where is my order?"}',
    )


def agent_envelope_tool_result():
    """An envelope carrying a tool result back to its agent."""
    return AgentEnvelope(
        entity_key=b"customer-42",
        event_time_ms=1_764_460_801_000,
        tool_result=tool_result_ok(),
    )


def agent_envelope_approval():
    """An envelope carrying a human approval decision (bytes as before export_request)."""
    return AgentEnvelope(
        entity_key=b"customer-42",
        event_time_ms=1_764_460_900_000,
        approval=AgentEnvelope.Approval(
            intent_id="6f1c2a9b-4e3d-5b7a-8c21-9d0e1f2a3b4c",
            approved=True,
            approver="ops@example.com",
            decided_at_ms=1_764_460_899_000,
        ),
    )


def agent_envelope_export_request():
    """An envelope asking the agent to export its state."""
    return AgentEnvelope(
        entity_key=b"customer-42",
        event_time_ms=1_764_461_000_000,
        export_request=AgentEnvelope.StateExportRequest(request_id="export-2026-11-30-001"),
    )


def activation_error_record():
    """A dead letter of the .errors output."""
    return ActivationErrorRecord(
        entity_key=b"customer-42",
        reason="llm_call_failed",
        detail="gemini-2.5-pro: 429 resource exhausted after 5 attempts",
        event_time_ms=1_764_460_800_000,
    )


def agent_envelope_error_record():
    """An errors-sink envelope carrying a deterministically serialized ActivationErrorRecord."""
    return AgentEnvelope(
        entity_key=b"customer-42",
        event_time_ms=1_764_460_800_000,
        external_event=activation_error_record().SerializeToString(deterministic=True),
    )


def state_snapshot():
    """A suspended key's exported state: memory, cache, continuation and two pending intents."""
    return StateSnapshot(
        state_schema_version=STATE_SCHEMA_VERSION,
        entity_key=b"customer-42",
        seq=42,
        snapshot_at_ms=1_764_461_000_000,
        memory=memory_blob(),
        llm_cache=llm_cache_blob_digest_only(),
        continuation=continuation(),
        pending=[tool_intent_signed(), tool_intent_approval()],
        request_id="export-2026-11-30-001",
    )


def state_snapshot_running():
    """A running key's exported state: no continuation, no pending intents."""
    return StateSnapshot(
        state_schema_version=STATE_SCHEMA_VERSION,
        entity_key=b"customer-7",
        seq=3,
        snapshot_at_ms=1_764_461_000_000,
        memory=memory_blob_unversioned(),
        llm_cache=llm_cache_blob(),
        request_id="export-2026-11-30-002",
    )


def execution_record():
    """The effector's record of an executed intent: its one result, kept for later copies."""
    return ExecutionRecord(
        intent_id=tool_result_ok().intent_id,
        entity_key=b"customer-42",
        content_digest=hashlib.sha256(b"golden execution record content").digest(),
        outcome=ExecutionRecord.OUTCOME_RESULT,
        result=tool_result_ok(),
        latest_expires_at_ms=1_764_460_860_000,
    )


def execution_record_running():
    """A record claimed by an effector instance before its tool ran."""
    record = execution_record()
    record.outcome = ExecutionRecord.OUTCOME_RUNNING
    record.ClearField("result")
    record.claimed_by = "7f9c2ba4-e88f-4d1a-9c3e-2b8a4f6d1e05"
    return record


def activation_record():
    """A recorded resume: the answer it ran with, a model call with its answer, the approval
    it asked for, suspended."""
    response = b'{"finish_reason":"stop","input_tokens":12,"model":"triage-model",' + (
        b'"output_tokens":8,"text":"{\\"category\\":\\"refund\\"}"}'
    )
    return ActivationRecord(
        entity_key=b"customer-42",
        seq=1_764_460_800_000_000,
        first_step=1,
        now_ms=1_764_460_801_000,
        adapter="examples.support_triage/v1",
        answers=[agent_envelope_tool_result()],
        model_calls=[
            ActivationRecord.ModelCall(
                cache_key=hashlib.sha256(b"golden cache key").hexdigest(),
                request_digest=hashlib.sha256(b"golden request").digest(),
                response=response,
                response_digest=hashlib.sha256(response).digest(),
                model="triage-model",
                input_tokens=12,
                output_tokens=8,
            )
        ],
        intents=[tool_intent_approval()],
        outcome=ActivationRecord.OUTCOME_SUSPENDED,
    )


def activation_record_digest_only():
    """A recorded start that completed, its model answer over the size limit kept as a digest,
    and a failed one's reason."""
    record = activation_record()
    record.ClearField("answers")
    record.first_step = 0
    record.event.CopyFrom(agent_envelope_external_event())
    call = record.model_calls[0]
    call.ClearField("response")
    call.digest_only = True
    del record.intents[:]
    record.outcome = ActivationRecord.OUTCOME_COMPLETED
    record.output = b'{"outcome":"answered"}'
    return record


def activation_record_model_failed():
    """A recorded resume's third attempt, failed (`llm_failed`) after one answered call: its
    agent caught a busy model's failure, then the model, down, failed a request again and the
    attempt."""
    record = activation_record()
    del record.intents[:]
    record.outcome = ActivationRecord.OUTCOME_FAILED
    record.reason = "llm_failed"
    record.attempt = 2
    record.model_failures.add(
        after_calls=0,
        cache_key=hashlib.sha256(b"golden busy cache key").hexdigest(),
        request_digest=hashlib.sha256(b"golden request").digest(),
        model="triage-model",
        retryable=True,
        error="HTTP 429: rate limited",
    )
    record.model_failures.add(
        after_calls=1,
        cache_key=hashlib.sha256(b"golden down cache key").hexdigest(),
        request_digest=hashlib.sha256(b"golden second request").digest(),
        model="triage-model",
        input_tokens=30,
        output_tokens=2,
        error="the answer was not valid JSON",
    )
    return record


def activation_record_budget_declined():
    """A recorded start a person declined to raise the budget of: the raise it was granted
    first, the model call its held attempt paid for, when its last question was asked."""
    record = activation_record_digest_only()
    call = record.model_calls[0]
    call.response = activation_record().model_calls[0].response
    call.digest_only = False
    record.answers.add().CopyFrom(continuation_budget_held().answers[0])
    record.outcome = ActivationRecord.OUTCOME_FAILED
    record.output = b""
    record.reason = "budget_exceeded"
    record.now_ms = 1_764_547_205_000
    record.asked_at_ms = 1_764_460_805_000
    return record


def activation_record_held_failures():
    """A recorded start that suspended on its third attempt, after two raises: the calls the
    two attempts the budget questions held up made (held_calls, held_failures)."""
    record = activation_record()
    held = continuation_budget_held_twice()
    record.first_step = 0
    record.event.CopyFrom(agent_envelope_external_event())
    del record.answers[:]
    record.answers.extend(held.answers)
    record.answers.add().CopyFrom(held.answers[0])
    record.answers[1].approval.intent_id = "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e"
    record.held_attempts = held.held_attempts
    record.held_calls.extend(held.held_calls)
    record.held_failures.extend(held.held_failures)
    return record


def backtest_key_report():
    """A key whose candidate no longer asks for a refund's approval: its first divergence,
    the tool counts and tokens of both runs."""
    return BacktestKeyReport(
        entity_key=b"customer-42",
        baseline_activations=4,
        candidate_activations=2,
        divergence=BacktestKeyReport.Divergence(
            kind=BacktestKeyReport.Divergence.KIND_APPROVAL,
            activation=1,
            seq=1_764_460_800_000_000,
            now_ms=1_764_460_801_000,
            detail="human.approval no longer asked",
            baseline_intents=[tool_intent_approval()],
            baseline_outcome=ActivationRecord.OUTCOME_SUSPENDED,
            candidate_outcome=ActivationRecord.OUTCOME_COMPLETED,
            candidate_output=b'{"outcome":"answered"}',
        ),
        tool_calls=[
            BacktestKeyReport.ToolCalls(tool_name="payments.refund", baseline=1, candidate=0)
        ],
        baseline_input_tokens=12,
        baseline_output_tokens=8,
        candidate_input_tokens=12,
        candidate_output_tokens=8,
    )


FIXTURES = {
    builder.__name__: builder
    for builder in (
        memory_blob,
        memory_blob_indexed,
        memory_blob_unversioned,
        continuation,
        continuation_escalated,
        continuation_partly_answered,
        continuation_retrying_after_expired,
        continuation_budget_held,
        continuation_budget_held_twice,
        llm_cache_blob,
        llm_cache_blob_digest_only,
        llm_cache_blob_indexed,
        tool_intent_before_kind,
        tool_intent_before_trace_id,
        tool_intent_traced,
        tool_intent_approval,
        tool_intent_signed,
        tool_intent_future_field,
        tool_result_ok,
        tool_result_error,
        tool_result_expired,
        tool_result_rejected,
        trace_event_llm_call,
        trace_event_suspended,
        agent_envelope_external_event,
        agent_envelope_tool_result,
        agent_envelope_approval,
        agent_envelope_export_request,
        activation_error_record,
        agent_envelope_error_record,
        state_snapshot,
        state_snapshot_running,
        execution_record,
        execution_record_running,
        activation_record,
        activation_record_digest_only,
        activation_record_model_failed,
        activation_record_budget_declined,
        activation_record_held_failures,
        backtest_key_report,
    )
}
