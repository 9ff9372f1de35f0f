"""The agent runtime: RunAgent gives each entity key a durable agent inside a stateful DoFn.

Design
------
`RunAgent(agent)` keys AgentEnvelopes by entity_key, re-windows them into the global window
(keyed state is per window, and an agent's life is not) and hands each to `_AgentDoFn`, whose
keyed state is the agent:

=============== ======================================= =========================================
state spec id   kind and coder                          holds
=============== ======================================= =========================================
``memory``      ReadModifyWrite, DeterministicProtoCoder MemoryBlob (Memory)
``continuation``ReadModifyWrite, DeterministicProtoCoder Continuation, while suspended
``llm_cache``   ReadModifyWrite, DeterministicProtoCoder LlmCacheBlob (ReplayCache)
``seq``         ReadModifyWrite, VarIntCoder             the key's activation counter
``pending``     Bag, DeterministicProtoCoder             the ToolIntents a suspension waits on
``deadline``    timer, event time (WATERMARK)            the suspension's deadline
``ttl``         timer, event time (WATERMARK)            when an idle key's state is cleared
=============== ======================================= =========================================

These are frozen: `state_manifest.json` lists them and a test compares the DoFn with it,
because Dataflow `--update` restores state by spec id and coder. Only portable features are
used, so the same pipeline runs on the DirectRunner, Prism, Flink and Dataflow: ReadModifyWrite
and Bag state, and event-time timers only. A processing-time timer would keep a bounded
streaming job on Flink from finishing, and combining state is not on every runner. Event-time
timers fire when the watermark passes them, so a source must advance its watermark when idle
(Pub/Sub does on Dataflow; Kafka needs an idle-partition policy), or deadlines and TTLs of
quiet keys wait for the next event.

Activations. An external_event starts an activation (`agent.start`); answers (ToolResults, or
Approvals for APPROVAL intents) to a suspension are checked (pending, in time, of the right
kind, signed and bound to the intent's content when an answer keyring is configured) and
recorded in its Continuation, and when every pending intent of the agent has one the agent
resumes once with all of them in intent order (`agent.resume`). A resume that fails keeps its
answers and is tried again on the deadline timer with backoff, then dead-lettered with them.
At the deadline the unanswered ones resume as EXPIRED (or the policy escalates to a human, or
dead-letters the suspension). Events that arrive while the key is suspended wait in the
Continuation's mailbox and run in event-time order when it ends; a copy of an event already
accepted (same time and bytes, or same transport idempotency key) does nothing. An
export_request emits a StateSnapshot of the committed blobs, verbatim, and changes nothing,
unless it asks to `release` the key: then the snapshot is handed off and the key cleared here
but for its seq, timers included (a scripted round's end, `ops.rounds`); a StateSnapshot input
restores an empty key. An idle key's state is cleared `ttl_ms` after its
latest activity (after its deadline, when suspended); its seq survives, so it never re-issues
an intent_id.

Time and determinism. Inside an activation "now" is the envelope's event_time_ms (a timer's
firing time in a timer), never the wall clock, taken on the key's clock: at most `ttl_ms` past
the key's activity mark (a key idle that long is wiped, so only a wrong clock is further
ahead), and, for an event that waited in a mailbox, no earlier than the time it is drained.
The time the key's dedupe marks are stamped at moves by at most `max_clock_skew_ms` an input,
and an input beyond that bound cuts no mark (see `machine_events`): neither one event stamped
far ahead nor a first event stamped 0 lets a copy of an earlier event run again. Intent, trace
and span ids and replay-cache keys are pure functions of the
key, seq, step and call content. A key's first seq is its first event's own time in
microsecond steps, so a key that starts over in a new job does not re-issue ids either. A
resume continues its suspended activation's seq and trace.

Read path and commit. Every read of the three blobs, in the element path and in both timers,
goes through `migrate_to_current` before any field is used; a blob from a newer binary raises
StateSchemaFromFutureError, which is never caught: the bundle fails and the key waits,
untouched, for that binary. Every decision is the per-key state machine's (`machine`), which
never changes what it read (a portable harness hands back the stored object) and returns the
whole new state; the DoFn writes the blobs it replaced (each stamped with the current version,
so a migrated view reaches state with a change of its own) and the timers that state implies,
and only then emits. A failing agent, a refused answer or a stale timer writes nothing but its
durable inputs and emits its dead letter (and, for a failing agent, one ERROR trace event).

Layer. The runtime owns RunAgent and every decision it makes; it may import the layers below
it: `beam_agents.intents` (the intents it emits and the answers it checks against them),
`beam_agents.state` (what it reads and commits), `beam_agents.wire`, `beam_agents.errors` and
the bindings. The loop on a bus, the integrations, the examples and the operator tools sit
above it (`beam_agents/layout_test.py` enforces it).
"""

from beam_agents.runtime.budget import Budget, OnBudget, Price
from beam_agents.runtime.config import AtDeadline, DeadlinePolicy, RuntimeConfig
from beam_agents.runtime.context import (
    APPROVAL_TOOL,
    ActivationContext,
    Agent,
    Answer,
    Completion,
    LlmClient,
    LlmRequest,
    LlmResponse,
    RefusingLlmClient,
    ScriptedLlmClient,
    Suspension,
)
from beam_agents.runtime.function_agent import FunctionAgent, agent
from beam_agents.runtime.react import react_agent
from beam_agents.runtime.recording import Recording
from beam_agents.runtime.run_agent import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    RECORDS,
    SNAPSHOTS,
    TRACES,
    RunAgent,
)
from beam_agents.runtime.tool_calling import ToolCall, ToolDefinition

# Exported here before the state package owned them.
from beam_agents.state.memory import Memory, ReplayCache

__all__ = [
    "APPROVAL_TOOL",
    "COMPLETIONS",
    "ERRORS",
    "INTENTS",
    "RECORDS",
    "SNAPSHOTS",
    "TRACES",
    "ActivationContext",
    "Agent",
    "Answer",
    "AtDeadline",
    "Budget",
    "Completion",
    "DeadlinePolicy",
    "FunctionAgent",
    "LlmClient",
    "LlmRequest",
    "LlmResponse",
    "Memory",
    "OnBudget",
    "Price",
    "Recording",
    "RefusingLlmClient",
    "ReplayCache",
    "RunAgent",
    "RuntimeConfig",
    "ScriptedLlmClient",
    "Suspension",
    "ToolCall",
    "ToolDefinition",
    "agent",
    "react_agent",
]
