"""`beam-agents new NAME`: a small project to start an agent from, that passes its own test.

The project is what the tutorial (docs/tutorial.md) walks through:

    NAME/
      pyproject.toml        depends on beam-agents; pytest finds the tests
      README.md             the three commands: test, run locally, launch
      MODULE/agent.py       the agent: a model call, a tool call, a person's approval and
                            memory across events; its stand-in tools and scripted model
      MODULE/__init__.py
      tests/test_agent.py   the agent end to end on the DirectRunner (`run_locally`), with the
                            scripted model: two events, the second remembering the first
      tests/test_launch.py  launch.py's job: keys from the environment, a Pub/Sub message
                            delivered twice run once (its message id is the idempotency key)
      launch.py             the same agent as one streaming job on Kafka (Flink) or Pub/Sub
                            (Dataflow), with keys from the environment

MODULE is NAME as a Python module name (dashes become underscores). The templates are plain
text with one placeholder each for NAME and MODULE, and import only `beam_agents`' public API,
so what they show is what a user writes. Nothing is overwritten: an existing folder is refused.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

__all__ = ["new_project"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")

_PYPROJECT = """\
[project]
name = "@NAME@"
version = "0.1.0"
description = "An agent on beam_agents"
requires-python = ">=3.11"
dependencies = ["beam-agents"]

[project.optional-dependencies]
test = ["pytest"]

[tool.pytest.ini_options]
testpaths = ["tests"]
pythonpath = ["."]
"""

_README = """\
# @NAME@

An agent on [beam_agents](https://github.com/beam-agents/beam_agents): one durable agent per
key, on Apache Beam.

    python -m pytest                          # the agent end to end, on the DirectRunner
    python -m @MODULE@.agent                  # run it locally and print the conversation
    python launch.py --help                   # one streaming job on Flink (Kafka) or Dataflow

`@MODULE@/agent.py` is the agent; `tests/test_agent.py` runs it with a scripted model.

beam_agents is not on PyPI: install it from a checkout of it, with pytest, before the
commands above (`pip install BEAM_AGENTS pytest`, where BEAM_AGENTS is the checkout's
folder). On Dataflow, stage its wheel before this project's, in this order (launch.py's
docstring has the whole command); the workers install them in the order given:

    (cd BEAM_AGENTS && pip wheel --no-deps -w dist .)
    pip wheel --no-deps -w dist .
    python launch.py --bus=pubsub ... --runner=DataflowRunner \\
        --extra_package=BEAM_AGENTS/dist/beam_agents-0.1.0-py3-none-any.whl \\
        --extra_package=dist/@MODULE@-0.1.0-py3-none-any.whl
"""

_INIT = '''\
"""@NAME@: an agent on beam_agents (see agent.py)."""
'''

_AGENT = '''\
"""@NAME@'s agent: takes an order in words, asks the model what item it is, checks the stock
(a tool), asks a person to approve the order, and counts the orders it placed for the key
(memory that outlives the event).

Every call that touches the world is a signed ToolIntent executed once by the effector; the
function itself stays deterministic (no clock, no randomness, no I/O of its own): it runs again
from the top when answers arrive, with earlier calls answered and model calls replayed.
"""

from __future__ import annotations

import json

from beam_agents import LlmResponse, ScriptedLlmClient, agent, run_locally

MODEL = "gpt-4o-mini"
SYSTEM = "Name the one item the customer wants to order, in one lowercase word."


@agent(name="@MODULE@/v1")
def shop(ctx, event: bytes) -> bytes:
    orders = int(ctx.memory.get("orders", b"0"))
    reply = ctx.llm(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": event.decode()}],
        model=MODEL,
        temperature=0,
    )
    item = reply.text.strip()
    stock = ctx.call_tool("stock.lookup", {"item": item})  # the key suspends until answered
    if not stock.ok or stock.payload_unknown:
        return _done(item, "stock unknown", orders)
    if json.loads(stock.payload)["in_stock"] == 0:
        return _done(item, "out of stock", orders)
    approval = ctx.request_approval(f"Order one {item}?", item=item)
    if not approval.ok:
        return _done(item, "declined", orders)
    ctx.memory.put("orders", str(orders + 1).encode())
    return _done(item, "ordered", orders + 1)


def _done(item: str, outcome: str, orders: int) -> bytes:
    return json.dumps({"item": item, "outcome": outcome, "orders": orders}).encode()


# Stand-ins for the real tools: `tool(args, intent) -> bytes`. A tool with effects outside
# the pipeline passes intent.intent_id to the system it calls, as its idempotency key.
STOCK = {"pen": 3, "notebook": 1, "stapler": 0}


def stock_lookup(args: dict, intent) -> bytes:
    return json.dumps({"item": args["item"], "in_stock": STOCK.get(args["item"], 0)}).encode()


TOOLS = {"stock.lookup": stock_lookup}


def _item(request) -> LlmResponse:
    words = str(request.messages[-1]["content"]).lower().replace(",", " ").split()
    named = [word.strip(".!?") for word in words]
    return LlmResponse(next((w for w in named if w in STOCK), named[-1]), model=request.model)


def scripted_model() -> ScriptedLlmClient:
    """A stand-in for the model: the first item of STOCK the order names, else its last word.
    In production, a provider's client, e.g. OpenAIChatClient of
    beam_agents.integrations.llm.openai_chat."""
    return ScriptedLlmClient(_item)


if __name__ == "__main__":
    run = run_locally(
        shop,
        [b"I would like a pen", b"and a notebook please"],
        tools=TOOLS,
        approver=lambda intent: True,
        llm_client=scripted_model(),
    )
    print(run.transcript())
'''

_TEST = '''\
"""@NAME@'s agent end to end on the DirectRunner: each event's model call, tool call and
approval, fed back round by round by `run_locally`, and the memory the second event reads."""

from __future__ import annotations

import json

from beam_agents import run_locally

from @MODULE@.agent import TOOLS, scripted_model, shop


def _run(events, approves: bool, workdir):
    return run_locally(
        shop,
        events,
        tools=TOOLS,
        approver=lambda intent: approves,  # a person at the console
        llm_client=scripted_model(),
        workdir=workdir,
    )


def test_two_orders_are_approved_and_counted_across_events(tmp_path):
    run = _run([b"I would like a pen", b"and a notebook please"], True, tmp_path)
    assert run.dead_letters == []
    assert [json.loads(c) for c in run.completions] == [
        {"item": "pen", "outcome": "ordered", "orders": 1},
        {"item": "notebook", "outcome": "ordered", "orders": 2},
    ]
    asked = [json.loads(i.args_json) for i in run.intents if i.tool_name == "human.approval"]
    assert asked == [
        {"item": "pen", "question": "Order one pen?"},
        {"item": "notebook", "question": "Order one notebook?"},
    ]


def test_a_declined_order_is_not_counted_and_nothing_in_stock_asks_nobody(tmp_path):
    run = _run([b"a pen", b"a stapler"], False, tmp_path)
    assert [json.loads(c) for c in run.completions] == [
        {"item": "pen", "outcome": "declined", "orders": 0},
        {"item": "stapler", "outcome": "out of stock", "orders": 0},
    ]
'''

_TEST_LAUNCH = '''\
"""launch.py's job on the DirectRunner: its keys read from the environment, intents signed
and answers verified, and a Pub/Sub message delivered twice run once (its message id)."""

from __future__ import annotations

import base64
import json
import time

import apache_beam as beam
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_agents import INTENTS, AgentEnvelope, RunAgent

import launch
from @MODULE@.agent import shop


def _ring(name: str) -> str:
    return json.dumps({"active": name, "keys": {name: base64.b64encode(bytes(32)).decode()}})


def test_a_message_delivered_twice_runs_once_with_intents_signed(monkeypatch):
    monkeypatch.setenv("BEAM_AGENTS_SIGNING_KEYS", _ring("intents-1"))
    monkeypatch.setenv(launch.RESULT_KEYS, _ring("results-1"))
    monkeypatch.setenv(launch.APPROVAL_KEYS, _ring("approvals-1"))
    now = int(time.time() * 1000)
    event = AgentEnvelope(entity_key=b"customer-1", event_time_ms=now, external_event=b"a pen")
    again = AgentEnvelope(entity_key=b"customer-1", event_time_ms=now + 5, external_event=b"a pen")
    messages = [  # the same message id: Pub/Sub delivering one message twice
        PubsubMessage(event.SerializeToString(), {}, message_id="m-1"),
        PubsubMessage(again.SerializeToString(), {}, message_id="m-1"),
    ]
    with TestPipeline() as pipeline:
        events = pipeline | beam.Create(messages) | beam.Map(launch.keyed_by_message_id)
        outputs = events | RunAgent(shop, llm_client=launch.model(), **launch.keyrings())
        signed = outputs[INTENTS] | beam.MapTuple(lambda key, i: (i.tool_name, i.signing_key_id))
        assert_that(signed, equal_to([("stock.lookup", "intents-1")]))


def test_a_missing_answer_ring_names_its_variable(monkeypatch):
    monkeypatch.delenv(launch.RESULT_KEYS, raising=False)
    try:
        launch.ring(launch.RESULT_KEYS)
    except Exception as e:  # BeamAgentsError
        assert launch.RESULT_KEYS in str(e)
    else:
        raise AssertionError("a missing ring was read")
'''

_LAUNCH = '''\
"""@NAME@'s agent as one streaming job: RunAgent keyed by customer, its intents signed.

On Flink, the loop runs on Kafka (beam_agents' AgentLoop; the effector is its own process,
`beam-agents effector-service --tools @MODULE@.agent:TOOLS ...`):

    python launch.py --bus=kafka --kafka_bootstrap=HOST:PORT --expansion_service=HOST:PORT \\\\
        --topic_prefix=@MODULE@ --runner=FlinkRunner --flink_master=HOST:PORT --streaming

On Dataflow, events come from Pub/Sub and each output goes to its topic. The workers need
beam_agents' wheel and this project's: beam_agents is not on PyPI, so build its wheel in a
checkout of it (BEAM_AGENTS below) and stage it first. The workers install the
--extra_package files in the order given, each with its dependencies: this project's
dependency on beam-agents is then already met, where it would otherwise be looked up on PyPI.

    (cd BEAM_AGENTS && pip wheel --no-deps -w dist .)
    pip wheel --no-deps -w dist .
    python launch.py --bus=pubsub --input_subscription=projects/P/subscriptions/events \\\\
        --output_topic_prefix=projects/P/topics/@MODULE@- --runner=DataflowRunner \\\\
        --project=P --region=R --temp_location=gs://B/tmp --streaming \\\\
        --extra_package=BEAM_AGENTS/dist/beam_agents-0.1.0-py3-none-any.whl \\\\
        --extra_package=dist/@MODULE@-0.1.0-py3-none-any.whl

The keys are read on the workers, from their environment, and never pickled into the job
graph; each variable holds a ring as JSON, {"active": ID, "keys": {ID: base64}}:

    BEAM_AGENTS_SIGNING_KEYS   signs the agent's intents (the ring the effector verifies with)
    RESULT_SIGNING_KEYS        verifies the effector's results (the ring it signs them with)
    APPROVAL_SIGNING_KEYS      verifies people's approvals (the ring the console signs with)

An answer unsigned or signed by another key is then a `bad_answer_signature` dead letter, and
the key waits for the genuine one. On Pub/Sub, each event's message id is its idempotency key,
so a message Pub/Sub delivers twice runs the agent once. The model here is the scripted
stand-in: put your provider's client in `model()`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_agents import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    SNAPSHOTS,
    TRACES,
    AgentLoop,
    BeamAgentsError,
    Keyring,
    RunAgent,
    Topics,
)

from @MODULE@.agent import scripted_model, shop

OUTPUTS = (INTENTS, COMPLETIONS, ERRORS, TRACES, SNAPSHOTS)
RESULT_KEYS = "RESULT_SIGNING_KEYS"
APPROVAL_KEYS = "APPROVAL_SIGNING_KEYS"


def model():
    return scripted_model()  # e.g. OpenAIChatClient(...) of beam_agents.integrations.llm


def ring(variable: str) -> Keyring:
    """The ring $VARIABLE holds; called on the workers."""
    if variable not in os.environ:
        raise BeamAgentsError(f"${variable} is not set: the workers need it (see launch.py)")
    return Keyring.from_json(os.environ[variable], source=f"${variable}")


def keyrings() -> dict:
    """RunAgent's key loaders: intents signed, results and approvals verified."""
    return {
        "keyring_loader": Keyring.from_environment,
        "result_keyring_loader": functools.partial(ring, RESULT_KEYS),
        "approval_keyring_loader": functools.partial(ring, APPROVAL_KEYS),
    }


def keyed_by_message_id(message) -> tuple[bytes, str | None]:
    """A Pub/Sub message as RunAgent's (envelope, idempotency key): its message id, the same
    on every delivery of the message."""
    return message.data, message.message_id or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="@NAME@'s agent as a streaming job")
    parser.add_argument("--bus", choices=["kafka", "pubsub"], required=True)
    parser.add_argument("--kafka_bootstrap", help="kafka: the brokers")
    parser.add_argument("--expansion_service", help="kafka: Beam's Java expansion service")
    parser.add_argument("--topic_prefix", default="@MODULE@", help="kafka: the loop's topics")
    parser.add_argument("--input_subscription", help="pubsub: the events' subscription")
    parser.add_argument("--output_topic_prefix", help="pubsub: topic PREFIX+intents, ...")
    args, beam_args = parser.parse_known_args(argv)
    options = PipelineOptions(beam_args)
    options.view_as(StandardOptions).streaming = True
    keys = {**keyrings(), "llm_client": model()}
    with beam.Pipeline(options=options) as pipeline:
        if args.bus == "kafka":
            _ = pipeline | "Loop" >> AgentLoop(
                shop,
                bootstrap_servers=args.kafka_bootstrap,
                topics=Topics(args.topic_prefix),
                expansion_service=args.expansion_service,
                consumer_group=args.topic_prefix,
                **keys,
            )
        else:
            from apache_beam.io.gcp.pubsub import ReadFromPubSub, WriteToPubSub

            messages = pipeline | ReadFromPubSub(
                subscription=args.input_subscription, with_attributes=True
            )
            events = messages | "ByMessageId" >> beam.Map(keyed_by_message_id)
            outputs = events | "RunAgent" >> RunAgent(shop, **keys)
            for tag in OUTPUTS:
                _ = (
                    outputs[tag]
                    | f"Serialize{tag}" >> beam.MapTuple(_serialized).with_output_types(bytes)
                    | f"Publish{tag}" >> WriteToPubSub(args.output_topic_prefix + tag)
                )
    return 0


def _serialized(key: bytes, value) -> bytes:
    return value if isinstance(value, bytes) else value.SerializeToString(deterministic=True)


if __name__ == "__main__":
    sys.exit(main())
'''

_FILES = {
    "pyproject.toml": _PYPROJECT,
    "README.md": _README,
    "@MODULE@/__init__.py": _INIT,
    "@MODULE@/agent.py": _AGENT,
    "tests/test_agent.py": _TEST,
    "tests/test_launch.py": _TEST_LAUNCH,
    "launch.py": _LAUNCH,
}


def new_project(name: str, parent: str | Path = ".") -> Path:
    """Writes the project NAME under `parent` and returns its folder. Raises ValueError for a
    name that is no project name, or a folder that exists (nothing is overwritten)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is no project name: a letter, then letters, digits, '_' or '-'")
    module = name.replace("-", "_").lower()
    if keyword.iskeyword(module):
        raise ValueError(f"{name!r} is a Python keyword: choose another name")
    folder = Path(parent) / name
    if folder.exists():
        raise ValueError(f"{folder} exists: choose another name or folder")
    for path, template in _FILES.items():
        target = folder / path.replace("@MODULE@", module)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(template.replace("@NAME@", name).replace("@MODULE@", module))
    return folder
