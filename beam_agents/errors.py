"""Every error beam_agents raises on purpose, under one root.

Catch `BeamAgentsError` to handle any of them. Each error carries the facts of the failure as
keyword-only attributes, so handlers and dead-letter records never parse message strings.
`error_text` is how a record quotes any exception, one of a tool's or an agent's included.
"""

from __future__ import annotations

__all__ = [
    "AgentContractError",
    "ApprovalEditError",
    "BeamAgentsError",
    "BudgetExceededError",
    "CanonicalJsonError",
    "CheckpointRejectedError",
    "DuplicateMigrationError",
    "ExecutionStoreError",
    "FlinkRestError",
    "InputFileError",
    "InvalidMigrationStepError",
    "KeyringError",
    "LlmCallError",
    "MemoryBudgetError",
    "MessageDecodeError",
    "MigrationStepError",
    "MissingMigrationError",
    "PrismNotFoundError",
    "ReadStalledError",
    "RuntimeConfigError",
    "StateSchemaFromFutureError",
    "ToolCallError",
    "TurnLimitError",
    "UnversionedMessageError",
    "error_text",
    "said_retryable",
    "with_article",
]


def with_article(noun: str) -> str:
    """`noun` after "a" or "an", by its first letter, for text naming a type or a role that is
    only known at run time ("an AgentEnvelope", "a StateSnapshot", "an approver")."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def error_text(error: object) -> str:
    """`str(error)`, or what its failure was: an exception type of a tool's or an agent's (or
    the reason it carries) may fail to print itself, and quoting it must not fail what
    records it."""
    try:
        return str(error)
    except Exception as e:
        return f"(its text raised {type(e).__name__})"


def said_retryable(error: BaseException) -> bool:
    """Whether `error` is an LlmCallError that says the same call may succeed later. A client's
    or an agent's may hold any object there: one whose truth cannot be told says no."""
    try:
        return isinstance(error, LlmCallError) and bool(error.retryable)
    except Exception:
        return False


class BeamAgentsError(Exception):
    """Raised for any failure beam_agents detects; the root of every error in this module."""


class MessageDecodeError(BeamAgentsError):
    """Raised when bytes are not a serialized beam_agents message of the asked-for type."""

    def __init__(self, message: str, *, type_name: str | None, size: int) -> None:
        super().__init__(message)
        #: Full name of the message type tried, or None when no type was given.
        self.type_name = type_name
        #: Length of the rejected input in bytes.
        self.size = size


class UnversionedMessageError(BeamAgentsError):
    """Raised when a message outside the versioned keyed-state set is given to migration."""

    def __init__(self, *, type_name: str) -> None:
        super().__init__(
            f"{type_name} carries no state_schema_version migration; only MemoryBlob, "
            "Continuation and LlmCacheBlob are versioned keyed state"
        )
        self.type_name = type_name


class StateSchemaFromFutureError(BeamAgentsError):
    """Raised when a state blob is stamped with a version newer than this binary knows.

    A newer binary already committed this key. Roll that binary forward again; do not
    dead-letter the element, or every later element of the key would follow it.
    """

    def __init__(self, *, type_name: str, found_version: int, current_version: int) -> None:
        super().__init__(
            f"{type_name} has state_schema_version {found_version}, newer than this binary's "
            f"{current_version}: roll the newer binary forward, do not roll back"
        )
        self.type_name = type_name
        self.found_version = found_version
        self.current_version = current_version


class MissingMigrationError(BeamAgentsError):
    """Raised when no migration step is registered for (message type, from_version)."""

    def __init__(self, *, type_name: str, from_version: int) -> None:
        super().__init__(f"no migration registered for ({type_name}, {from_version})")
        self.type_name = type_name
        self.from_version = from_version


class DuplicateMigrationError(BeamAgentsError):
    """Raised when two migration steps are registered for the same (type, from_version)."""

    def __init__(self, *, type_name: str, from_version: int, first: str, second: str) -> None:
        super().__init__(
            f"two migrations registered for ({type_name}, {from_version}): {first} and {second}"
        )
        self.type_name = type_name
        self.from_version = from_version
        self.first = first
        self.second = second


class InvalidMigrationStepError(BeamAgentsError):
    """Raised when a migration step module is malformed (versions, message type, function)."""

    def __init__(self, reason: str, *, step: str) -> None:
        super().__init__(f"migration step {step}: {reason}")
        self.step = step
        self.reason = reason


class MigrationStepError(BeamAgentsError):
    """Raised when a migration step returns something other than the next version's message."""

    def __init__(self, reason: str, *, type_name: str, from_version: int, step: str) -> None:
        super().__init__(f"migration step {step} ({type_name}, {from_version}): {reason}")
        self.type_name = type_name
        self.from_version = from_version
        self.step = step
        self.reason = reason


class CanonicalJsonError(BeamAgentsError):
    """Raised when tool arguments hold a value canonical JSON cannot carry exactly."""

    def __init__(self, reason: str, *, path: str) -> None:
        super().__init__(f"{path}: {reason}")
        #: Where the value sits, as a JSONPath ("$.items[2].price").
        self.path = path
        self.reason = reason


class ApprovalEditError(BeamAgentsError, ValueError):
    """Raised when a person's edit of an approval's arguments is not one its request allows
    (beam_agents/intents/approval_edits.py), or a request names an argument no one can edit."""

    def __init__(self, reason: str, *, field: str) -> None:
        super().__init__(reason)
        #: The argument at fault ("$" for the edits as a whole).
        self.field = field
        self.reason = reason


class KeyringError(BeamAgentsError):
    """Raised when signing keys cannot be loaded or used (format, length, missing key)."""

    def __init__(self, reason: str, *, source: str) -> None:
        super().__init__(f"{source}: {reason}")
        #: Where the keys came from: an environment variable or a file path.
        self.source = source
        self.reason = reason


class ExecutionStoreError(BeamAgentsError):
    """Raised when an effector's execution store cannot be opened, read or written: a file that
    is no database, a lock held past the busy timeout, a full disk, a record that does not
    decode. The intent it was deciding is not done with: deliver it again (a claim the call left
    behind is then a lost call, settled by the tool's ToolSpec)."""

    def __init__(self, reason: str, *, path: str) -> None:
        super().__init__(f"{path}: {reason}")
        #: The store's path (":memory:" for an in-memory store).
        self.path = path
        self.reason = reason


class InputFileError(BeamAgentsError):
    """Raised when an operator command's input file cannot be used: not a regular file, too
    large, unreadable, or named by bytes that are not UTF-8."""

    def __init__(self, reason: str, *, path: str) -> None:
        super().__init__(f"{path}: {reason}")
        #: The path, printable: bytes that are not UTF-8 appear as backslash escapes.
        self.path = path
        self.reason = reason


class MemoryBudgetError(BeamAgentsError):
    """Raised when a value alone is larger than an agent's whole memory budget."""

    def __init__(self, *, key: str, size: int, budget: int) -> None:
        super().__init__(f"memory value {key!r} has {size} bytes, over the budget of {budget}")
        self.key = key
        self.size = size
        self.budget = budget


class AgentContractError(BeamAgentsError):
    """Raised when an agent breaks the runtime's contract: a wrong return type, a suspension
    with nothing pending, a call after it suspended."""

    def __init__(self, reason: str, *, agent: str) -> None:
        super().__init__(f"agent {agent}: {reason}")
        self.agent = agent
        self.reason = reason


class LlmCallError(BeamAgentsError):
    """Raised when an LLM call cannot be made or answered (the model client's failure, or a
    replay that may not call the model)."""

    def __init__(
        self,
        reason: str,
        *,
        model: str,
        retryable: bool,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        super().__init__(f"LLM call to {model!r} failed: {reason}")
        self.model = model
        self.reason = reason
        #: True when the same call may succeed later (rate limits, timeouts, 5xx).
        self.retryable = retryable
        #: The usage the provider reported for an answer the client refused: it was billed.
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens


class BudgetExceededError(BeamAgentsError):
    """Raised before a model call that would take a key or an activation past its budget
    (beam_agents.runtime.budget); the call is not made."""

    def __init__(self, reason: str, *, scope: str) -> None:
        super().__init__(f"budget exceeded: {reason}")
        self.reason = reason
        #: Which limit: "key tokens", "activation cost", ... or "config" (a model with no price).
        self.scope = scope


class CheckpointRejectedError(BeamAgentsError):
    """Raised when a stored agent checkpoint names a type outside its allowlist (or is not in
    the one encoding the adapter writes): decoding it could import and call anything, so it is
    refused before anything named by the data is imported."""

    def __init__(self, reason: str, *, type_names: tuple[str, ...], agent: str) -> None:
        super().__init__(f"agent {agent}: checkpoint rejected: {reason}")
        #: What the data named that is not allowed, "module.name" (or "kind:..." for a stored
        #: encoding other than msgpack).
        self.type_names = type_names
        self.agent = agent
        self.reason = reason


class ToolCallError(BeamAgentsError):
    """Raised by a tool when its call failed; the effector makes it the intent's ERROR result,
    whose error_message says whether the same call may succeed if asked again."""

    def __init__(self, reason: str, *, tool: str, retryable: bool) -> None:
        verdict = "retryable" if retryable else "not retryable"
        super().__init__(f"tool {tool!r} failed ({verdict}): {reason}")
        self.tool = tool
        self.reason = reason
        #: True when the call did not reach the tool (its server was down or unreachable).
        self.retryable = retryable


class TurnLimitError(BeamAgentsError):
    """Raised when an agent's model keeps asking for tools past the agent's turn limit."""

    def __init__(self, *, agent: str, turns: int) -> None:
        super().__init__(
            f"agent {agent}: the model still asked for tools after {turns} turns, its limit"
        )
        self.agent = agent
        self.turns = turns


class FlinkRestError(BeamAgentsError):
    """Raised by beam_agents.bus.flink.FlinkRest when Flink's REST API does not answer, answers
    with an HTTP error (a job it does not know: 404), or with bytes that are not JSON."""


class PrismNotFoundError(BeamAgentsError):
    """Raised when a pipeline asks for Beam's PrismRunner without `--prism_location` and no
    Prism built by `tools/engines.sh` is at hand (Beam would try to download one)."""


class ReadStalledError(BeamAgentsError):
    """Raised by beam_agents.bus.flink.ReadWatchdog when records wait unread on the loop's topic
    and the job moved none for its stall limit while every task ran: a stalled read, not a
    quiet topic."""

    def __init__(self, *, job_id: str, topic: str, stalled_s: float) -> None:
        super().__init__(
            f"job {job_id}: records wait unread on {topic} and the job moved none for "
            f"{stalled_s:.0f} s with every task running; its Kafka read has stalled (cancel "
            "it and restore it from its latest checkpoint)"
        )
        self.job_id = job_id
        self.topic = topic
        self.stalled_s = stalled_s


class RuntimeConfigError(BeamAgentsError, ValueError):
    """Raised when a RuntimeConfig is built with a value or a combination of values the
    runtime cannot keep its promises under (a ValueError too, as before it had a type)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        #: The RuntimeConfig field at fault (the first of the two, for a combination).
        self.field = field
