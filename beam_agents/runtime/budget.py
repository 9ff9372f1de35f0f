"""Budgets: limits on the model usage of a key and of one activation, in tokens and in cost.

Usage is counted from each model response's token counts (an answer from the replay cache costs
nothing), priced by the budget's table per model, and kept in the key's LlmCacheBlob, an
activation that fails afterwards included (`Activations._keep_paid`), so it survives restarts,
travels in the StateSnapshot and shows in `beam-agents inspect`. Before a call the meter
estimates it (the request's canonical JSON length / 4 input tokens, plus its `max_tokens`,
`max_completion_tokens` or `max_output_tokens` output tokens) and refuses one that would take
the key or the activation past a limit: the call is not made, and BudgetExceededError ends the
activation as a `budget_exceeded` dead letter or, under `OnBudget.ASK`, puts an APPROVAL intent
before a person asking to raise the key's limits by `raise_tokens` and `raise_cost_micros`
(what they grant is kept in the blob).

A model's reported usage is taken as it comes in (`reported_tokens`): a count from 0 (a
negative one is none, so usage only grows) to 2**53 - 1 (what the replay cache's canonical JSON
carries exactly), and the key's totals saturate at the end of int64, so a server that reports
huge counts fills the key's budget instead of failing its bundle.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from collections.abc import Mapping

from beam_agents._protos import LlmCacheBlob
from beam_agents.errors import BudgetExceededError
from beam_agents.intents.identity import MAX_SAFE_INTEGER
from beam_agents.runtime.machine_state import INT64_MAX, saturating_add

__all__ = [
    "BUDGET_TOOL",
    "UINT32_MAX",
    "Budget",
    "BudgetMeter",
    "OnBudget",
    "Price",
    "reported_tokens",
]

#: The tool_name of the runtime's APPROVAL intents asking a person to raise a key's budget.
BUDGET_TOOL = "beam_agents.budget"
_CHARS_PER_TOKEN = 4


#: The largest count a uint32 field of the state holds.
UINT32_MAX = 2**32 - 1


def reported_tokens(count: object) -> int:
    """A token count a model client reported, as usage counts it: an int from 0 to
    MAX_SAFE_INTEGER. Anything that is no finite number (None, a string) is no count, and
    counts as none rather than failing an answer that was paid for."""
    if isinstance(count, bool) or not isinstance(count, numbers.Real):
        return 0
    if not math.isfinite(count):
        return MAX_SAFE_INTEGER if count > 0 else 0
    return max(0, min(int(count), MAX_SAFE_INTEGER))


class OnBudget(enum.Enum):
    #: The activation ends as a `budget_exceeded` dead letter (its event or answers inside).
    DEAD_LETTER = "dead_letter"
    #: The key waits on an APPROVAL intent asking a person to raise its limits.
    ASK = "ask"


@dataclasses.dataclass(frozen=True)
class Price:
    """A model's price, in millionths of a currency unit per million tokens."""

    input_per_million: int
    output_per_million: int

    def of(self, input_tokens: int, output_tokens: int) -> int:
        return (
            input_tokens * self.input_per_million + output_tokens * self.output_per_million
        ) // 1_000_000


@dataclasses.dataclass(frozen=True)
class Budget:
    """Limits (None: no limit); cost limits need a price for every model called."""

    key_tokens: int | None = None
    activation_tokens: int | None = None
    key_cost_micros: int | None = None
    activation_cost_micros: int | None = None
    prices: Mapping[str, Price] = dataclasses.field(default_factory=dict)
    on_exceed: OnBudget = OnBudget.DEAD_LETTER
    #: What one approval under OnBudget.ASK adds to the key's limits.
    raise_tokens: int = 0
    raise_cost_micros: int = 0

    def __post_init__(self) -> None:
        # Checked when the pipeline is built: a raise travels in the budget question's
        # canonical JSON, which holds integers only up to 2**53 - 1, so a larger one would fail
        # every question on the worker instead.
        limits = ("key_tokens", "activation_tokens", "key_cost_micros", "activation_cost_micros")
        for name in limits:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"Budget.{name} must be None or a non-negative int, not {value!r}")
        for name in ("raise_tokens", "raise_cost_micros"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= MAX_SAFE_INTEGER
            ):
                raise ValueError(
                    f"Budget.{name} must be an int from 0 to {MAX_SAFE_INTEGER}, not {value!r}"
                )


class BudgetMeter:
    """One activation's view of a key's usage and limits (see the module docstring)."""

    def __init__(self, budget: Budget, cache: LlmCacheBlob | None) -> None:
        self.budget = budget
        cache = cache if cache is not None else LlmCacheBlob()
        self._stored = (
            cache.input_tokens,
            cache.output_tokens,
            cache.cost_micros,
            cache.token_allowance,
            cache.cost_allowance_micros,
        )
        self.key_tokens = cache.input_tokens + cache.output_tokens
        self.key_cost = cache.cost_micros
        self.token_allowance = cache.token_allowance
        self.cost_allowance = cache.cost_allowance_micros
        self.grants = cache.budget_grants
        self.input_tokens = self.output_tokens = self.cost = 0

    def _price(self, model: str) -> Price | None:
        price = self.budget.prices.get(model)
        if price is None and (
            self.budget.key_cost_micros is not None
            or self.budget.activation_cost_micros is not None
        ):
            raise BudgetExceededError(
                f"no price for model {model!r} under a cost limit", scope="config"
            )
        return price

    def check(self, model: str, canonical_request: str, max_tokens: object) -> None:
        """Raises BudgetExceededError when the call would pass a limit; the call is not made."""
        budget = self.budget
        estimate_in = len(canonical_request) // _CHARS_PER_TOKEN
        estimate_out = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 0
        tokens = estimate_in + estimate_out
        price = self._price(model)
        cost = price.of(estimate_in, estimate_out) if price is not None else 0
        spent = self.input_tokens + self.output_tokens
        for scope, used, limit in (
            ("activation tokens", spent + tokens, budget.activation_tokens),
            (
                "key tokens",
                self.key_tokens + spent + tokens,
                None if budget.key_tokens is None else budget.key_tokens + self.token_allowance,
            ),
            ("activation cost", self.cost + cost, budget.activation_cost_micros),
            (
                "key cost",
                self.key_cost + self.cost + cost,
                None
                if budget.key_cost_micros is None
                else budget.key_cost_micros + self.cost_allowance,
            ),
        ):
            if limit is not None and used > limit:
                raise BudgetExceededError(
                    f"a call to {model} (about {tokens} tokens) would bring the {scope} to "
                    f"{used}, past {limit}",
                    scope=scope,
                )

    def record(self, model: str, input_tokens: int, output_tokens: int) -> int:
        """Counts a model's answer (its counts as `reported_tokens` took them); returns its
        cost."""
        price = self.budget.prices.get(model)
        cost = price.of(input_tokens, output_tokens) if price is not None else 0
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost += cost
        return cost

    def grant(self) -> None:
        """A person raised the key's limits (OnBudget.ASK approved)."""
        self.token_allowance += self.budget.raise_tokens
        self.cost_allowance += self.budget.raise_cost_micros
        self.grants += 1

    def write(self, blob: LlmCacheBlob) -> None:
        """Sets the key's usage and allowances, this activation's included, on `blob` (a new
        blob of the caller's)."""
        key_input, key_output, key_cost, _, _ = self._stored
        # int64 fields (uint32 for the grants): a total past their end stays at the end.
        blob.input_tokens = saturating_add(key_input, self.input_tokens)
        blob.output_tokens = saturating_add(key_output, self.output_tokens)
        blob.cost_micros = saturating_add(key_cost, self.cost)
        blob.token_allowance = min(self.token_allowance, INT64_MAX)
        blob.cost_allowance_micros = min(self.cost_allowance, INT64_MAX)
        blob.budget_grants = min(self.grants, UINT32_MAX)
