"""The effector: the one place where ToolIntents act on the world, each at most once.

Every intent goes through the same gate, and every step before the last decides without a side
effect:

1. Decode and signature. Bytes that are no ToolIntent become a dead letter
   (`undecodable_intent`). The signature is checked by `VerifyMode` (OFF checks nothing;
   PERMISSIVE, for rolling signing out, admits valid and unsigned intents; REQUIRE admits only
   valid ones), from the bytes as received, so fields this binary does not know stay covered.
   A refused intent becomes a dead letter (`signature_<outcome>`) and gets no result; it is not
   remembered, so a correctly signed copy may still come.
2. Identity. Executions are remembered by intent_id, with the entity_key and a digest of the
   intent's content (its signing input without the delivery fields attempt, created_at_ms,
   expires_at_ms and trace_id, `content_digest`). A copy with the same entity and content is a
   duplicate: nothing runs and it gets the first decision again (`Route.DUPLICATE`); its expiry
   extends the record's retention. Another entity or other content under a known id is never
   run and never given the first content's result: it gets a REJECTED result naming the
   conflict (`intent_id_conflict`) and bound to its own content, so whoever waits on it is
   answered. (A failed bundle's retry whose model answered differently emits such a copy.)
3. Expiry. expires_at_ms at or before now gives EXPIRED; no expiry (0) too: fail closed.
4. Kind. An APPROVAL intent goes to the approvals output for a human, once. An unknown (newer)
   kind is REJECTED, never executed. TOOL_KIND_UNSPECIFIED reads as TOOL.
5. Tool. An unknown tool, or args_json that `parse_args_json` refuses (not an object, numbers
   beyond I-JSON's range, nesting deeper than MAX_ARGS_DEPTH, duplicate keys), gives REJECTED.
6. Execution. The record is claimed (RUNNING) in the store before the tool runs and finished
   with its result after: OK with the tool's bytes, ERROR with its exception. Bytes over
   `max_result_bytes` (default 512 KiB) are not kept: the result is OK, since the call took
   effect, with no payload and an error_message saying what was dropped (every copy would
   send them again, and past the bus's record limit none could be sent).

Every decision of steps 3 to 6 is remembered: an intent_id has one result, whatever arrives
later. A record is kept for `retention_ms` (default 24 h) after the later of the latest
expires_at_ms seen for its id and the last time it was decided, then forgotten; only a copy
arriving after that, still unexpired, could run again. A claim (RUNNING), and an inquiry about a
lost call, are kept until the call's result replaces them, however long the tool or the person
takes.

Two faces share the gate:

* `Effector`, a plain callable for a service reading intents from a topic, keeps its records in
  an `ExecutionStore`: `SqliteExecutionStore` (standard library sqlite3, WAL, fsync on commit)
  by default. A claim naming the effector instance, with its lease (`lease_ms`, default 30 s),
  is committed before the tool runs, and the lease is renewed while the tool runs (`leases`).
  A copy that finds the claim's lease unexpired is in flight (`Route.IN_FLIGHT`, no result
  yet: deliver it again later), whatever process or PID namespace holds it; one that finds it
  expired (an effector killed or frozen mid-call, or a call that raised, whose result could
  not be recorded) has an unknown outcome, settled by the tool's `ToolSpec`: run again if
  idempotent, its reconciler, or a person asked through an APPROVAL intent (`resolve` records
  their answer). The agent is never told a call failed that may have acted.
* `ExecuteIntents`, a Beam transform, re-windows intents into the global window (the same
  intent in two windows is still one intent) and keeps each record in keyed state under its
  intent_id, cleared by an event-time timer at the end of retention. Beam commits state with
  the bundle's outputs, so a worker that dies after a tool ran but before its bundle committed
  runs the tool again on retry: tools with effects outside the pipeline should pass the
  intent_id to the system they call as its idempotency key.

Results are AgentEnvelopes carrying the ToolResult, keyed by entity_key. Every ToolResult
carries `intent_digest`, the content digest of the intent it answers, and is signed when the
effector has a result key, so RunAgent can refuse a forged result or one computed for other
content. Signing keys are loaded
where the effector runs (`keyring_loader`), never carried in a pipeline's serialized graph.

The package, in the order an intent meets it: `spec` (what a caller gives the effector and gets
back: tools and their `ToolSpec`, `VerifyMode`, `Route`, `EffectorOutput`, the output tags and
dead-letter reasons), `stores` (`ExecutionStore` and `SqliteExecutionStore`), `leases` (a claim's
lease, its renewal and the reading of claims written before leases), `gate` (steps 1 to 6 over
any store, and `Effector`) and `transform` (`ExecuteIntents`, the gate over Beam keyed
state). It may import the intents' `identity` and `signing` and the layers below the intents
(it uses `beam_agents.wire`, among it `beam_support`, `beam_agents.errors` and the bindings);
nothing of the runtime (`beam_agents/layout_test.py` enforces it). The names below are the
documented `beam_agents.intents.effector` API, re-exported from the modules that own them.
"""

from __future__ import annotations

from beam_agents.intents.effector.gate import Effector
from beam_agents.intents.effector.spec import (
    APPROVALS,
    DEAD_LETTERS,
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_RETENTION_MS,
    INQUIRY_SUFFIX,
    INQUIRY_TOOL,
    REASON_CONFLICT,
    REASON_UNDECODABLE,
    RESULTS,
    EffectorOutput,
    Route,
    Tool,
    ToolSpec,
    VerifyMode,
    wall_clock_ms,
)
from beam_agents.intents.effector.stores import ExecutionStore, SqliteExecutionStore
from beam_agents.intents.effector.transform import ExecuteIntents
from beam_agents.intents.identity import DELIVERY_FIELDS, content_digest

__all__ = [
    "APPROVALS",
    "DEAD_LETTERS",
    "DEFAULT_LEASE_MS",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_RETENTION_MS",
    "DELIVERY_FIELDS",
    "INQUIRY_SUFFIX",
    "INQUIRY_TOOL",
    "REASON_CONFLICT",
    "REASON_UNDECODABLE",
    "RESULTS",
    "Effector",
    "EffectorOutput",
    "ExecuteIntents",
    "ExecutionStore",
    "Route",
    "SqliteExecutionStore",
    "Tool",
    "ToolSpec",
    "VerifyMode",
    "content_digest",
    "wall_clock_ms",
]
