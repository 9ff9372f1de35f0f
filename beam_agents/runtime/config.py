"""RuntimeConfig: the limits and policies of RunAgent, one frozen value carried to the workers.

Every duration is event time in milliseconds: the runtime never reads a wall clock.
"""

from __future__ import annotations

import dataclasses
import enum

from beam_agents.errors import RuntimeConfigError
from beam_agents.runtime.budget import UINT32_MAX, Budget

__all__ = ["AtDeadline", "DeadlinePolicy", "RuntimeConfig"]


class AtDeadline(enum.Enum):
    #: Resume the agent with EXPIRED results for the intents still unanswered.
    EXPIRE = "expire"
    #: Put an APPROVAL intent before a human and extend the deadline, up to max_escalations
    #: times per suspension; then EXPIRE.
    ESCALATE = "escalate"
    #: End the suspension (its state cleared) and dead-letter it, with its answers.
    DEAD_LETTER = "dead_letter"


@dataclasses.dataclass(frozen=True)
class DeadlinePolicy:
    action: AtDeadline = AtDeadline.EXPIRE
    max_escalations: int = 1
    #: How far each escalation moves the deadline.
    extension_ms: int = 24 * 60 * 60 * 1000


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    #: Bytes of memory values a key may hold; LRU entries beyond it are evicted.
    memory_budget_bytes: int | None = 1024 * 1024
    #: Recorded model calls a key's replay cache may hold, and their response bytes: LRU
    #: entries beyond either are evicted. A start that calls the model, and a function agent's
    #: resume, write back only their own seq's calls (`ReplayCache.from_blob(only_touched=)`);
    #: an agent with a resume of its own keeps earlier ones up to these limits.
    cache_max_entries: int = 256
    cache_max_bytes: int = 4 * 1024 * 1024
    #: A response over it is kept as a digest only and reads as a miss: a resume that asks
    #: again pays again, and may get another answer. So it is the model clients' own limit
    #: (`max_response_bytes`, 1 MiB): every answer a client accepts is one the cache replays.
    cache_max_response_bytes: int = 1024 * 1024
    #: expires_at_ms of an intent = its activation's event time + this.
    intent_ttl_ms: int = 60 * 60 * 1000
    #: A suspension's deadline unless the agent names one; at least intent_ttl_ms. A deadline
    #: never comes before its pending intents' expires_at_ms (one the agent names earlier is
    #: moved there): until then the effector may still run them, and an agent told EXPIRED for
    #: a call that then acts could make it again.
    suspend_deadline_ms: int = 24 * 60 * 60 * 1000
    #: An idle key's state is cleared this long after its latest activity (after its deadline,
    #: when suspended). Its seq is kept, so it never re-issues an intent_id.
    ttl_ms: int = 30 * 24 * 60 * 60 * 1000
    deadline_policy: DeadlinePolicy = DeadlinePolicy()
    #: How many times a resume that failed (the agent raised, broke the contract, or a model
    #: call failed for good) is tried again with the same answers before it is dead-lettered
    #: with them (`resume_failed`).
    resume_retries: int = 3
    #: The same for an activation that failed on LlmCallError(retryable=True), a model still
    #: busy or unreachable after its client's own retries: a resume keeps its answers, a start
    #: waits with its event first in the key's mailbox, and either is tried again with backoff
    #: this many times before it is a dead letter.
    retryable_resume_retries: int = 10
    #: At most this many calls to one model at once per worker process (None: no cap), so a
    #: burst of keys does not storm a provider.
    llm_concurrency: int | None = None
    #: Limits on the models' tokens and cost per key and per activation (None: usage is
    #: counted, nothing is limited).
    budget: Budget | None = None
    #: Event time from a failed resume to its first retry; it doubles on every further failure
    #: up to resume_backoff_max_ms.
    resume_backoff_ms: int = 60 * 1000
    resume_backoff_max_ms: int = 60 * 60 * 1000
    #: External events seen within this much event time of the key's latest are recognised as
    #: duplicates (by content, and by a transport's idempotency key where it has one).
    dedupe_window_ms: int = 24 * 60 * 60 * 1000
    #: At most this many marks of recent events are kept per key for deduplication (the most
    #: recent): an event leaves one, and a second when it carries a transport's idempotency
    #: key, so this many plain events, or half as many keyed ones, are remembered.
    dedupe_max_events: int = 1024
    #: How far one input may move the key's dedupe clock (the time its marks are stamped at,
    #: which the window counts back from) past the latest mark. An event stamped further ahead
    #: is handled all the same, its marks stamped at this bound; such an input cuts no mark by
    #: time and takes the marks it keeps as made at the bound (its clock or the key's is
    #: wrong), so a mark leaves the window only after inputs within the bound have moved the
    #: clock dedupe_window_ms past it. Keep it well below dedupe_window_ms; 0 stops the clock
    #: (marks then go by count alone).
    #: (The key's activity, which the TTL counts from, and its activations' "now" move by at
    #: most ttl_ms an input: a key idle that long is wiped.)
    max_clock_skew_ms: int = 60 * 60 * 1000
    #: The mailbox of a suspended key: events beyond these bounds are dead letters
    #: (`mailbox_full`) carrying the event.
    mailbox_max_events: int = 100
    mailbox_max_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        # A suspension counts in the TTL from its due time on (`_ttl_at`): a negative TTL would
        # come before it, and the TTL timer wipe the suspended key; a TTL of 0 ties with the
        # deadline timer, and a TTL firing on a due suspension sets both again at that time.
        _check_int("ttl_ms", self.ttl_ms, least=1)
        for name in (
            # A cap below 0 evicts what no cap evicts; an intent born expired; a deadline
            # before the suspension it ends.
            "cache_max_entries",
            "cache_max_bytes",
            "cache_max_response_bytes",
            "intent_ttl_ms",
            "suspend_deadline_ms",
            "resume_backoff_ms",
            "resume_backoff_max_ms",
            "dedupe_window_ms",
            "dedupe_max_events",
            "max_clock_skew_ms",
            "mailbox_max_events",
            "mailbox_max_bytes",
        ):
            _check_int(name, getattr(self, name))
        # A resume's (or a deferred start's) failures are counted in a uint32 of its
        # Continuation, up to the limit.
        for name in ("resume_retries", "retryable_resume_retries"):
            _check_int(name, getattr(self, name), most=UINT32_MAX)
        _check_int("memory_budget_bytes", self.memory_budget_bytes, optional=True)
        # An escalation that moves the deadline back ends the suspension it extends.
        for name in ("max_escalations", "extension_ms"):
            _check_int(f"deadline_policy.{name}", getattr(self.deadline_policy, name))
        _check_int("llm_concurrency", self.llm_concurrency, least=1, optional=True)
        if self.suspend_deadline_ms < self.intent_ttl_ms:
            raise RuntimeConfigError(
                f"RuntimeConfig.suspend_deadline_ms ({self.suspend_deadline_ms}) is shorter than "
                f"intent_ttl_ms ({self.intent_ttl_ms}): at the deadline the agent would be told "
                "EXPIRED for calls the effector may still run",
                field="suspend_deadline_ms",
            )

    def backoff_ms(self, failures: int) -> int:
        """Event time from the `failures`-th failed resume to its retry."""
        return min(self.resume_backoff_ms << min(failures - 1, 40), self.resume_backoff_max_ms)


def _check_int(
    field: str, value, *, least: int = 0, most: int | None = None, optional: bool = False
) -> None:
    """Refuses `value` for RuntimeConfig.`field` unless it is an int (not a bool) of at least
    `least` (and at most `most`), or None where the field is `optional`."""
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < least
        or (most is not None and value > most)
    ):
        bound = "a non-negative int" if least == 0 else f"an int >= {least}"
        if most is not None:
            bound += f" of at most {most}"
        raise RuntimeConfigError(
            f"RuntimeConfig.{field} must be {'None or ' if optional else ''}{bound}, not {value!r}",
            field=field,
        )
