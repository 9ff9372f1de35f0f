"""The local loop: keys a second of an agent run locally in real Beam pipelines, beside the
driver's rate for the same agent and events in the same process.

Two paths a user meets first:
- `run_round` (what tests, `replay` and the demo drive): a one-step agent (one model call,
  then it completes) on `--keys` keys, one event each, in one round; its driver is RunAgent's
  per-key machine (`KeyDriver`) taking the same events and the round's closing export per key.
- `run_locally` (the tutorial's path): the tutorial's agent (a model call, a tool, an approval)
  on `--keys` keys, round by round until every key completed; its driver is
  `record_history`, the same machine answering intents at once, with recording on (so that
  driver is a little slower than an unrecorded one, and its ratio a little kinder).

The pipelines run on the DirectRunner, or what $BEAM_AGENTS_PIPELINE_OPTIONS names (Prism:
`BEAM_AGENTS_PIPELINE_OPTIONS="$(bash tools/engines.sh prism-options)"`), start-up included.
Goal (issue 41, point 7): at 1,000 keys, `run_round` at least 0.05 of the driver's keys/s.

    python benchmarks/local_loop_benchmark.py [--keys N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from driver_benchmark import _machine

from beam_agents import ScriptedLlmClient, agent, run_locally
from beam_agents._protos import AgentEnvelope
from beam_agents.ops.rounds import env_options, run_round
from beam_agents.runtime import RunAgent
from beam_agents.runtime.key_driver import KeyDriver
from beam_agents.testing.recorded_history import record_history

GOAL = 0.05
T0 = 1_764_460_800_000


def _model(request) -> str:
    return request.messages[-1]["content"].split()[-1]


@agent(name="bench.local_loop/v1")
def summarise(ctx, event: bytes) -> bytes:
    return ctx.llm([{"role": "user", "content": event.decode()}], model="m").text.encode()


@agent(name="bench.tutorial/v1")
def shop(ctx, event: bytes) -> bytes:
    item = ctx.llm([{"role": "user", "content": event.decode()}], model="shop-model").text
    stock = ctx.call_tool("stock.lookup", {"item": item})
    if not stock.ok or json.loads(stock.payload)["in_stock"] == 0:
        return b"out of stock"
    return b"ordered" if ctx.request_approval(f"Order one {item}?").ok else b"declined"


def _stock(args: dict, intent) -> bytes:
    return json.dumps({"item": args["item"], "in_stock": 3}).encode()


def _events(keys: int) -> list[AgentEnvelope]:
    return [
        AgentEnvelope(entity_key=b"k%06d" % i, event_time_ms=T0 + i, external_event=b"buy a pen")
        for i in range(keys)
    ]


def _driver_round(events: list[AgentEnvelope]) -> float:
    """Keys a second of the machine taking each key's event and the round's closing export."""
    machine = _machine(summarise)
    began = time.perf_counter()
    for event in events:
        driver = KeyDriver(machine, event.entity_key)
        driver.schedule(event)
        export = AgentEnvelope(entity_key=event.entity_key, event_time_ms=event.event_time_ms)
        export.export_request.release = True
        driver.schedule(export)
        while driver:
            driver.step()
    return len(events) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    args = parser.parse_args()
    events = _events(args.keys)
    runner = env_options().get_all_options().get("runner") or "DirectRunner"

    driver = _driver_round(events)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        outputs = run_round(
            # The driver's model (driver_benchmark._machine): the same answer.
            RunAgent(summarise, llm_client=ScriptedLlmClient(lambda request: "a summary")),
            events,
            workdir,
        )
    local = args.keys / (time.perf_counter() - began)
    assert len(outputs.completions) == args.keys, len(outputs.completions)

    began = time.perf_counter()
    history = record_history(
        shop,
        events,
        tools={"stock.lookup": _stock},
        approver=lambda intent: True,
        llm_client=ScriptedLlmClient(_model),
    )
    recorded = args.keys / (time.perf_counter() - began)
    began = time.perf_counter()
    run = run_locally(
        shop,
        [(e.entity_key, e.external_event) for e in events],
        tools={"stock.lookup": _stock},
        approver=lambda intent: True,
        llm_client=ScriptedLlmClient(_model),
    )
    tutorial = args.keys / (time.perf_counter() - began)
    assert sorted(run.completions) == [b"ordered"] * args.keys
    assert len(history) == 3 * args.keys

    print(f"{args.keys} keys, pipelines on {runner}, keys/s")
    print(f"  driver, one-step agent          {driver:10.0f}")
    print(f"  run_round, one-step agent       {local:10.0f}  ratio {local / driver:.3f}")
    print(f"  driver (recording), tutorial    {recorded:10.0f}")
    print(f"  run_locally, tutorial agent     {tutorial:10.0f}  ratio {tutorial / recorded:.3f}")
    verdict = "meets" if local / driver >= GOAL else "BELOW"
    print(f"goal: run_round at least {GOAL} of the driver's keys/s: {verdict}")


if __name__ == "__main__":
    main()
